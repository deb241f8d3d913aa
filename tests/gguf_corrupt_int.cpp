// Corrupt-file corpus for the GGUF reader: one case per error kind, each asserting the
// exact status code and a substring of the message. The cases are made in the test by
// patching tests/data/tiny.gguf at offsets found by walking its structure (Layout
// below), or by a small test-local writer (MiniWriter) where a patch cannot express the
// case. Every case is also written to ${TMPDIR:-/tmp}/geist_gguf_corrupt_corpus as seed
// input for scripts/fuzz_gguf.sh.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>

#include "gguf/gguf_reader.h"
#include "test_util.h"

namespace geist::gguf {
namespace {

using Bytes = std::vector<uint8_t>;

template <typename T>
T get(const Bytes &b, size_t off) {
  T v;
  std::memcpy(&v, b.data() + off, sizeof(T));
  return v;
}
template <typename T>
void put(Bytes &b, size_t off, T v) {
  std::memcpy(b.data() + off, &v, sizeof(T));
}

// Offsets of every field of a well-formed GGUF, found by an independent walk.
struct Layout {
  struct Kv {
    std::string key;
    uint32_t type;
    size_t key_len_off, type_off, value_off;
  };
  struct Ti {
    std::string name;
    uint32_t n_dims;
    size_t name_len_off, n_dims_off, ne_off, type_off, offset_off;
  };
  std::vector<Kv> kvs;
  std::vector<Ti> tis;
  size_t infos_end = 0;

  const Kv &kv(const std::string &k) const {
    for (const Kv &e : kvs)
      if (e.key == k) return e;
    ADD_FAILURE() << "no key " << k;
    return kvs.at(0);
  }
  const Ti &ti(const std::string &n) const {
    for (const Ti &e : tis)
      if (e.name == n) return e;
    ADD_FAILURE() << "no tensor " << n;
    return tis.at(0);
  }
};

size_t scalar_bytes(uint32_t t) {
  static const size_t kSize[] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
  return t < 13 ? kSize[t] : 0;
}

// Skips one value of type t at off (trusted input); returns the offset after it.
size_t skip_value(const Bytes &b, size_t off, uint32_t t) {
  if (t == 8) return off + 8 + get<uint64_t>(b, off);
  if (t != 9) return off + scalar_bytes(t);
  uint32_t et = get<uint32_t>(b, off);
  uint64_t n = get<uint64_t>(b, off + 4);
  off += 12;
  for (uint64_t i = 0; i < n; ++i) off = skip_value(b, off, et);
  return off;
}

Layout walk(const Bytes &b) {
  Layout L;
  uint64_t n_t = get<uint64_t>(b, 8), n_kv = get<uint64_t>(b, 16);
  size_t off = 24;
  for (uint64_t i = 0; i < n_kv; ++i) {
    Layout::Kv kv;
    kv.key_len_off = off;
    uint64_t len = get<uint64_t>(b, off);
    kv.key.assign(reinterpret_cast<const char *>(b.data() + off + 8), len);
    kv.type_off = off + 8 + len;
    kv.type = get<uint32_t>(b, kv.type_off);
    kv.value_off = kv.type_off + 4;
    off = skip_value(b, kv.value_off, kv.type);
    L.kvs.push_back(kv);
  }
  for (uint64_t i = 0; i < n_t; ++i) {
    Layout::Ti t;
    t.name_len_off = off;
    uint64_t len = get<uint64_t>(b, off);
    t.name.assign(reinterpret_cast<const char *>(b.data() + off + 8), len);
    t.n_dims_off = off + 8 + len;
    t.n_dims = get<uint32_t>(b, t.n_dims_off);
    t.ne_off = t.n_dims_off + 4;
    t.type_off = t.ne_off + 8 * t.n_dims;
    t.offset_off = t.type_off + 4;
    off = t.offset_off + 8;
    L.tis.push_back(t);
  }
  L.infos_end = off;
  return L;
}

// Minimal GGUF writer for cases a byte patch cannot make. Little-endian, v3.
struct MiniWriter {
  Bytes kv, ti, data;
  uint64_t n_kv = 0, n_t = 0;
  uint32_t alignment = 32;

  static void raw(Bytes &b, const void *p, size_t n) {
    const uint8_t *c = static_cast<const uint8_t *>(p);
    b.insert(b.end(), c, c + n);
  }
  template <typename T>
  static void num(Bytes &b, T v) {
    raw(b, &v, sizeof v);
  }
  static void str(Bytes &b, std::string_view s) {
    num<uint64_t>(b, s.size());
    raw(b, s.data(), s.size());
  }
  void key(std::string_view k, uint32_t type) {
    str(kv, k);
    num<uint32_t>(kv, type);
    ++n_kv;
  }
  void tensor(std::string_view name, std::vector<int64_t> ne, uint32_t type, uint64_t off) {
    str(ti, name);
    num<uint32_t>(ti, static_cast<uint32_t>(ne.size()));
    for (int64_t d : ne) num<int64_t>(ti, d);
    num<uint32_t>(ti, type);
    num<uint64_t>(ti, off);
    ++n_t;
  }
  Bytes finish() const {
    Bytes b = {'G', 'G', 'U', 'F'};
    num<uint32_t>(b, 3);
    num<uint64_t>(b, n_t);
    num<uint64_t>(b, n_kv);
    raw(b, kv.data(), kv.size());
    raw(b, ti.data(), ti.size());
    while (b.size() % alignment != 0) b.push_back(0);
    raw(b, data.data(), data.size());
    return b;
  }
};

std::string corpus_dir() {
  const char *t = std::getenv("TMPDIR");
  return std::string(t != nullptr && *t != 0 ? t : "/tmp") + "/geist_gguf_corrupt_corpus";
}

void save_to_corpus(const std::string &name, const Bytes &b) {
  std::error_code ec;
  std::filesystem::create_directories(corpus_dir(), ec);
  std::ofstream(corpus_dir() + "/" + name + ".gguf", std::ios::binary)
      .write(reinterpret_cast<const char *>(b.data()), static_cast<std::streamsize>(b.size()));
}

class GgufCorrupt : public ::testing::Test {
 protected:
  void SetUp() override {
    tiny_ = test::read_file(test::data_path("tiny.gguf"));
    ASSERT_GT(tiny_.size(), 24u);
    L_ = walk(tiny_);
    ASSERT_EQ(L_.kvs.size(), get<uint64_t>(tiny_, 16));
    data_offset_ = (L_.infos_end + 63) / 64 * 64;  // tiny.gguf uses general.alignment 64
  }

  // Parses b; expects the code and a message containing every substring.
  void expect_error(const std::string &name, const Bytes &b, geist_status code,
                    std::vector<std::string> substrings) {
    SCOPED_TRACE(name);
    save_to_corpus(name, b);
    auto r = GgufFile::from_memory(b.data(), b.size());
    ASSERT_FALSE(r.is_ok()) << name << " parsed";
    EXPECT_EQ(r.status().code(), code) << r.status().to_string();
    for (const std::string &s : substrings) {
      EXPECT_NE(r.status().message().find(s), std::string::npos)
          << "message '" << r.status().message() << "' lacks '" << s << "'";
    }
  }
  // tiny.gguf with one patch applied.
  Bytes patched(const std::function<void(Bytes &)> &patch) const {
    Bytes b = tiny_;
    patch(b);
    return b;
  }

  Bytes tiny_;
  Layout L_;
  uint64_t data_offset_ = 0;
};

TEST_F(GgufCorrupt, EmptyAndMissingFiles) {
  expect_error("empty", {}, GEIST_E_BAD_FORMAT, {"empty"});
  auto missing = GgufFile::open(test::data_path("does_not_exist.gguf"));
  EXPECT_EQ(missing.status().code(), GEIST_E_IO);
  EXPECT_NE(missing.status().message().find("does_not_exist.gguf"), std::string::npos);
  EXPECT_NE(missing.status().message().find("No such file"), std::string::npos);

  std::string empty = corpus_dir() + "_empty_file.gguf";
  std::ofstream(empty, std::ios::binary).close();
  auto e = GgufFile::open(empty);
  EXPECT_EQ(e.status().code(), GEIST_E_IO);
  EXPECT_NE(e.status().message().find("empty"), std::string::npos) << e.status().message();
  std::filesystem::remove(empty);

  auto dir = GgufFile::open(std::string(GEIST_TEST_DATA_DIR));
  EXPECT_EQ(dir.status().code(), GEIST_E_IO);
  EXPECT_EQ(GgufFile::from_memory(nullptr, 10).status().code(), GEIST_E_INVALID_ARGUMENT);
}

TEST_F(GgufCorrupt, HeaderMagicAndVersion) {
  expect_error("bad_magic", patched([](Bytes &b) { b[0] = 'X'; }), GEIST_E_BAD_FORMAT,
               {"bad magic", "58 47 55 46"});
  expect_error("short_header", Bytes(tiny_.begin(), tiny_.begin() + 10), GEIST_E_BAD_FORMAT,
               {"10 bytes", "header"});
  for (uint32_t v : {0u, 1u, 4u, 0xffffffffu}) {
    expect_error("version_" + std::to_string(v), patched([&](Bytes &b) { put<uint32_t>(b, 4, v); }),
                 GEIST_E_UNSUPPORTED, {"version " + std::to_string(v) + " is not supported"});
  }
  expect_error("big_endian", patched([](Bytes &b) { put<uint32_t>(b, 4, 0x03000000u); }),
               GEIST_E_UNSUPPORTED, {"big-endian"});
  // Version 2 has the same layout as 3.
  Bytes v2 = patched([](Bytes &b) { put<uint32_t>(b, 4, 2); });
  auto r = GgufFile::from_memory(v2.data(), v2.size());
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(r.value()->version(), 2u);
}

TEST_F(GgufCorrupt, EveryTruncationFails) {
  auto full = GgufFile::from_memory(tiny_.data(), tiny_.size());
  ASSERT_TRUE(full.is_ok());
  size_t data_end = 0;  // end of the last tensor's bytes; after it only padding follows
  for (const TensorInfo &t : full.value()->tensors()) {
    data_end = std::max<size_t>(data_end, full.value()->data_offset() + t.offset + t.n_bytes);
  }
  ASSERT_LE(data_end, tiny_.size());
  for (size_t n = 0; n <= tiny_.size(); ++n) {
    Bytes b(tiny_.begin(), tiny_.begin() + static_cast<std::ptrdiff_t>(n));
    auto r = GgufFile::from_memory(b.data(), b.size());
    if (n >= data_end) {
      EXPECT_TRUE(r.is_ok()) << "prefix " << n << ": " << r.status().to_string();
      continue;
    }
    ASSERT_FALSE(r.is_ok()) << "prefix of " << n << " bytes parsed";
    EXPECT_EQ(r.status().code(), GEIST_E_BAD_FORMAT) << n << ": " << r.status().to_string();
    EXPECT_FALSE(r.status().message().empty());
    if (n % 97 == 0) save_to_corpus("truncated_" + std::to_string(n), b);
  }
  // Cut inside the tensor infos: named as truncation, with the offset.
  const Layout::Ti &t = L_.ti("blk.0.attn_k.weight");
  expect_error("truncated_in_ne", Bytes(tiny_.begin(), tiny_.begin() + t.ne_off + 3),
               GEIST_E_BAD_FORMAT,
               {"truncated", "tensor 'blk.0.attn_k.weight'", "offset " + std::to_string(t.ne_off)});
  // Cut in the padding before the data section.
  expect_error("truncated_in_padding", Bytes(tiny_.begin(), tiny_.begin() + L_.infos_end + 1),
               GEIST_E_BAD_FORMAT, {"data section would start"});
}

TEST_F(GgufCorrupt, CountsThatCannotFit) {
  expect_error("kv_count_max", patched([](Bytes &b) { put<uint64_t>(b, 16, UINT64_MAX); }),
               GEIST_E_BAD_FORMAT, {"kv_count 18446744073709551615"});
  uint64_t just_over = (tiny_.size() - 24) / 13 + 1;  // smallest KV is 13 bytes
  expect_error("kv_count_just_over", patched([&](Bytes &b) { put<uint64_t>(b, 16, just_over); }),
               GEIST_E_BAD_FORMAT, {"kv_count " + std::to_string(just_over), "cannot fit"});
  expect_error("tensor_count_max", patched([](Bytes &b) { put<uint64_t>(b, 8, UINT64_MAX); }),
               GEIST_E_BAD_FORMAT, {"tensor_count 18446744073709551615"});
  expect_error("tensor_count_huge", patched([](Bytes &b) { put<uint64_t>(b, 8, 1ull << 40); }),
               GEIST_E_BAD_FORMAT, {"tensor_count", "cannot fit"});
  const Layout::Kv &tok = L_.kv("tokenizer.ggml.tokens");
  expect_error("array_count_huge",
               patched([&](Bytes &b) { put<uint64_t>(b, tok.value_off + 4, UINT64_MAX / 2); }),
               GEIST_E_BAD_FORMAT,
               {"key 'tokenizer.ggml.tokens'", "STRING elements", "cannot fit",
                "offset " + std::to_string(tok.value_off + 4)});
  const Layout::Kv &sc = L_.kv("tokenizer.ggml.scores");
  expect_error("float_array_count_huge",
               patched([&](Bytes &b) { put<uint64_t>(b, sc.value_off + 4, 1ull << 61); }),
               GEIST_E_BAD_FORMAT, {"key 'tokenizer.ggml.scores'", "FLOAT32", "cannot fit"});
}

TEST_F(GgufCorrupt, StringLengths) {
  const Layout::Kv &name = L_.kv("general.name");
  expect_error(
      "key_len_huge", patched([&](Bytes &b) { put<uint64_t>(b, name.key_len_off, UINT64_MAX); }),
      GEIST_E_BAD_FORMAT,
      {"key at offset " + std::to_string(name.key_len_off), "length 18446744073709551615"});
  expect_error("string_value_len_huge",
               patched([&](Bytes &b) { put<uint64_t>(b, name.value_off, 1ull << 62); }),
               GEIST_E_BAD_FORMAT, {"key 'general.name'", "string value", "has length"});
  const Layout::Kv &tok = L_.kv("tokenizer.ggml.tokens");
  expect_error("array_string_len_huge",
               patched([&](Bytes &b) { put<uint64_t>(b, tok.value_off + 12, tiny_.size()); }),
               GEIST_E_BAD_FORMAT, {"key 'tokenizer.ggml.tokens'", "array string"});
  const Layout::Ti &t = L_.tis.at(0);
  expect_error("tensor_name_len_huge",
               patched([&](Bytes &b) { put<uint64_t>(b, t.name_len_off, UINT64_MAX - 7); }),
               GEIST_E_BAD_FORMAT, {"tensor info 0", "name", "has length"});
}

TEST_F(GgufCorrupt, ValueTypesAndBools) {
  const Layout::Kv &u8 = L_.kv("test.u8");
  expect_error("unknown_value_type", patched([&](Bytes &b) { put<uint32_t>(b, u8.type_off, 13); }),
               GEIST_E_UNSUPPORTED,
               {"key 'test.u8'", "unknown value type 13", "offset " + std::to_string(u8.type_off)});
  expect_error("unknown_value_type_big",
               patched([&](Bytes &b) { put<uint32_t>(b, u8.type_off, 0x80000000u); }),
               GEIST_E_UNSUPPORTED, {"key 'test.u8'", "unknown value type 2147483648"});
  const Layout::Kv &arr = L_.kv("test.arr_i16");
  expect_error("unknown_array_elem_type",
               patched([&](Bytes &b) { put<uint32_t>(b, arr.value_off, 99); }), GEIST_E_UNSUPPORTED,
               {"key 'test.arr_i16'", "unknown array element type 99"});
  const Layout::Kv &bos = L_.kv("tokenizer.ggml.add_bos_token");
  ASSERT_EQ(bos.type, 7u);
  expect_error("bad_bool", patched([&](Bytes &b) { b[bos.value_off] = 2; }), GEIST_E_BAD_FORMAT,
               {"key 'tokenizer.ggml.add_bos_token'", "is 2, not 0 or 1",
                "offset " + std::to_string(bos.value_off)});
  const Layout::Kv &ab = L_.kv("test.arr_bool");
  expect_error("bad_bool_array", patched([&](Bytes &b) { b[ab.value_off + 12 + 2] = 0xff; }),
               GEIST_E_BAD_FORMAT, {"key 'test.arr_bool'", "element 2", "is 255"});
  // A control character in a key is shown escaped.
  expect_error("bad_type_escaped_key", patched([&](Bytes &b) {
                 b[u8.key_len_off + 8] = '\n';
                 put<uint32_t>(b, u8.type_off, 77);
               }),
               GEIST_E_UNSUPPORTED, {"key '\\x0aest.u8'"});
}

TEST_F(GgufCorrupt, DuplicateKeysAndTensorNames) {
  const Layout::Kv &u8 = L_.kv("test.u8");
  const Layout::Kv &i8 = L_.kv("test.i8");
  expect_error("duplicate_key", patched([&](Bytes &b) { b[u8.key_len_off + 8 + 5] = 'i'; }),
               GEIST_E_BAD_FORMAT,
               {"duplicate metadata key 'test.i8'", std::to_string(u8.key_len_off),
                std::to_string(i8.key_len_off)});
  const Layout::Ti &q = L_.ti("blk.0.attn_q.weight");
  expect_error("duplicate_tensor",
               patched([&](Bytes &b) { b[q.name_len_off + 8 + std::strlen("blk.0.attn_")] = 'k'; }),
               GEIST_E_BAD_FORMAT, {"duplicate tensor name 'blk.0.attn_k.weight'"});
}

TEST_F(GgufCorrupt, TensorDims) {
  const Layout::Ti &emb = L_.ti("token_embd.weight");
  for (uint32_t n : {0u, 5u, 0xffffffffu}) {
    expect_error("n_dims_" + std::to_string(n),
                 patched([&](Bytes &b) { put<uint32_t>(b, emb.n_dims_off, n); }),
                 GEIST_E_BAD_FORMAT,
                 {"tensor 'token_embd.weight'",
                  "n_dims " + std::to_string(n) + " at offset " + std::to_string(emb.n_dims_off)});
  }
  expect_error("ne_negative", patched([&](Bytes &b) { put<int64_t>(b, emb.ne_off + 8, -1); }),
               GEIST_E_BAD_FORMAT, {"tensor 'token_embd.weight'", "ne[1] = -1", "negative"});
  expect_error("ne_min", patched([&](Bytes &b) {
                 put<int64_t>(b, emb.ne_off, std::numeric_limits<int64_t>::min());
               }),
               GEIST_E_BAD_FORMAT, {"ne[0] = -9223372036854775808"});
  expect_error("ne_huge_outside",
               patched([&](Bytes &b) { put<int64_t>(b, emb.ne_off + 8, 1ll << 40); }),
               GEIST_E_BAD_FORMAT, {"tensor 'token_embd.weight'", "lies outside the file"});
  const Layout::Ti &t4 = L_.ti("test.f32_4d");
  ASSERT_EQ(t4.n_dims, 4u);
  expect_error("n_elements_overflow", patched([&](Bytes &b) {
                 for (int d = 0; d < 3; ++d) put<int64_t>(b, t4.ne_off + 8 * d, 1ll << 21);
               }),
               GEIST_E_BAD_FORMAT, {"tensor 'test.f32_4d'", "element count", "overflows int64"});
  expect_error("ne_max_overflow", patched([&](Bytes &b) {
                 put<int64_t>(b, emb.ne_off + 8, std::numeric_limits<int64_t>::max());
               }),
               GEIST_E_BAD_FORMAT, {"overflows int64"});
  expect_error("n_bytes_overflow", patched([&](Bytes &b) {
                 put<int64_t>(b, t4.ne_off, 1ll << 31);
                 put<int64_t>(b, t4.ne_off + 8, 1ll << 31);
                 put<int64_t>(b, t4.ne_off + 16, 1);
                 put<int64_t>(b, t4.ne_off + 24, 1);
               }),
               GEIST_E_BAD_FORMAT, {"tensor 'test.f32_4d'", "data size", "overflows"});
  expect_error(
      "ne0_not_block_multiple", patched([&](Bytes &b) { put<int64_t>(b, emb.ne_off, 63); }),
      GEIST_E_BAD_FORMAT,
      {"tensor 'token_embd.weight'", "ne[0] = 63 is not a multiple of the Q8_0 block size 32"});
  // Zero-element tensors are accepted (n_bytes 0).
  Bytes zero = patched([&](Bytes &b) { put<int64_t>(b, emb.ne_off + 8, 0); });
  auto r = GgufFile::from_memory(zero.data(), zero.size());
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(r.value()->tensor("token_embd.weight")->n_bytes, 0u);
  EXPECT_EQ(r.value()->tensor("token_embd.weight")->n_elements(), 0);
}

TEST_F(GgufCorrupt, TensorTypes) {
  const Layout::Ti &emb = L_.ti("token_embd.weight");
  for (uint32_t ty : {4u, 5u, 31u, 63u, 64u, 1000u}) {
    expect_error("tensor_type_" + std::to_string(ty),
                 patched([&](Bytes &b) { put<uint32_t>(b, emb.type_off, ty); }),
                 GEIST_E_UNSUPPORTED,
                 {"tensor 'token_embd.weight'", "unknown tensor type id " + std::to_string(ty),
                  "offset " + std::to_string(emb.type_off)});
  }
  // A known type without a dequantizer (Q8_K, block 256) is accepted by the reader; the
  // shape must still fit its block size.
  expect_error("known_type_bad_block",
               patched([&](Bytes &b) { put<uint32_t>(b, emb.type_off, 15); }), GEIST_E_BAD_FORMAT,
               {"not a multiple of the Q8_K block size 256"});
  Bytes i8 = patched([&](Bytes &b) { put<uint32_t>(b, emb.type_off, 24); });  // I8, 512 bytes
  auto r = GgufFile::from_memory(i8.data(), i8.size());
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(r.value()->tensor("token_embd.weight")->type, quant::GgmlType::I8);
}

TEST_F(GgufCorrupt, TensorOffsets) {
  const Layout::Ti &last = L_.tis.back();
  uint64_t last_off = get<uint64_t>(tiny_, last.offset_off);
  expect_error("offset_misaligned",
               patched([&](Bytes &b) { put<uint64_t>(b, last.offset_off, last_off + 1); }),
               GEIST_E_BAD_FORMAT,
               {"tensor '" + last.name + "'", "offset " + std::to_string(last_off + 1),
                "not a multiple of the alignment 64"});
  expect_error("offset_outside",
               patched([&](Bytes &b) { put<uint64_t>(b, last.offset_off, last_off + 64 * 40); }),
               GEIST_E_BAD_FORMAT,
               {"tensor '" + last.name + "'", "lies outside the file",
                "size " + std::to_string(tiny_.size())});
  expect_error("offset_max",
               patched([&](Bytes &b) { put<uint64_t>(b, last.offset_off, UINT64_MAX - 63); }),
               GEIST_E_BAD_FORMAT,
               {"[offset " + std::to_string(data_offset_) +
                " + 18446744073709551552, 96 bytes) lies outside"});
  const Layout::Ti &norm = L_.ti("blk.0.attn_norm.weight");
  expect_error("overlap", patched([&](Bytes &b) { put<uint64_t>(b, norm.offset_off, 512); }),
               GEIST_E_BAD_FORMAT,
               {"tensor 'blk.0.attn_norm.weight'",
                "[offset " + std::to_string(data_offset_ + 512) + ", 256 bytes)",
                "overlaps tensor 'token_embd.weight' [offset " + std::to_string(data_offset_) +
                    ", 544 bytes)"});
}

TEST_F(GgufCorrupt, Alignment) {
  const Layout::Kv &al = L_.kv("general.alignment");
  ASSERT_EQ(al.type, 4u);
  for (uint32_t a : {0u, 48u, 3u, 0xffffffffu}) {
    expect_error(
        "alignment_" + std::to_string(a),
        patched([&](Bytes &b) { put<uint32_t>(b, al.value_off, a); }), GEIST_E_BAD_FORMAT,
        {"'general.alignment'", "is " + std::to_string(a) + ", not a nonzero power of two"});
  }
  expect_error("alignment_wrong_type", patched([&](Bytes &b) { put<uint32_t>(b, al.type_off, 5); }),
               GEIST_E_BAD_FORMAT, {"'general.alignment'", "has type INT32, expected UINT32"});
  // A smaller power of two keeps every offset aligned but moves the data section.
  Bytes a16 = patched([&](Bytes &b) { put<uint32_t>(b, al.value_off, 16); });
  auto r = GgufFile::from_memory(a16.data(), a16.size());
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(r.value()->alignment(), 16u);
  EXPECT_EQ(r.value()->data_offset(), (L_.infos_end + 15) / 16 * 16);
}

TEST_F(GgufCorrupt, WriterCases) {
  {  // Nested arrays: up to kMaxArrayDepth levels parse, one more is refused.
    for (int depth : {kMaxArrayDepth, kMaxArrayDepth + 1}) {
      MiniWriter w;
      w.key("nest", 9);
      for (int d = 1; d < depth; ++d) {
        MiniWriter::num<uint32_t>(w.kv, 9);
        MiniWriter::num<uint64_t>(w.kv, 1);
      }
      MiniWriter::num<uint32_t>(w.kv, 0);  // innermost: u8[1]
      MiniWriter::num<uint64_t>(w.kv, 1);
      w.kv.push_back(7);
      Bytes b = w.finish();
      if (depth == kMaxArrayDepth) {
        auto r = GgufFile::from_memory(b.data(), b.size());
        ASSERT_TRUE(r.is_ok()) << r.status().to_string();
        EXPECT_EQ(r.value()->find("nest")->elem_type, ValueType::ARRAY);
      } else {
        expect_error("nested_too_deep", b, GEIST_E_UNSUPPORTED, {"key 'nest'", "nested deeper"});
      }
    }
  }
  {  // A huge key is cut in messages.
    MiniWriter w;
    w.key(std::string(100000, 'k'), 200);
    Bytes b = w.finish();
    expect_error("long_key_bad_type", b, GEIST_E_UNSUPPORTED,
                 {"kkkk'...", "unknown value type 200"});
    auto r = GgufFile::from_memory(b.data(), b.size());
    EXPECT_LT(r.status().message().size(), 300u);
  }
  {  // Empty file structure: no KVs, no tensors, no padding needed.
    MiniWriter w;
    Bytes b = w.finish();
    auto r = GgufFile::from_memory(b.data(), b.size());
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
    EXPECT_TRUE(r.value()->metadata().empty());
  }
  {  // Tensor data section missing entirely.
    MiniWriter w;
    w.tensor("t", {32}, 0, 0);
    Bytes b = w.finish();
    expect_error("no_data_section", b, GEIST_E_BAD_FORMAT, {"tensor 't'", "lies outside the file"});
    w.data.resize(128);
    b = w.finish();
    EXPECT_TRUE(GgufFile::from_memory(b.data(), b.size()).is_ok());
  }
  {  // Zero-byte tensors may share an offset with others; empty key is allowed once.
    MiniWriter w;
    w.key("", 0);
    w.kv.push_back(1);
    w.tensor("a", {32, 0}, 0, 0);
    w.tensor("b", {32}, 0, 0);
    w.data.resize(128);
    Bytes b = w.finish();
    auto r = GgufFile::from_memory(b.data(), b.size());
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
    EXPECT_NE(r.value()->find(""), nullptr);
  }
}

}  // namespace
}  // namespace geist::gguf
