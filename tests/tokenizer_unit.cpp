// Tokenizer on small hand-built vocabularies: merge order, ties, byte fallback, special
// partition, BOS/EOS, detokenization (whole and streaming), validation errors, and the
// heap-based merge against a naive O(n^2) oracle on random inputs.
#include "engine/tokenizer.h"
#include "gguf/gguf_reader.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <map>
#include <random>

namespace geist {
namespace {

constexpr const char *kSp = "\xE2\x96\x81";  // '▁'

struct VocabBuilder {
  Vocab v;
  VocabBuilder() {
    v.model = "llama";
    v.pre = "default";
    add("<pad>", 0, TokenType::Control);          // 0
    add("<eos>", 0, TokenType::Control);          // 1
    add("<bos>", 0, TokenType::Control);          // 2
    add("<unk>", 0, TokenType::Unknown);          // 3
    add("<start_of_turn>", 0, TokenType::Control);  // 4
    add("<end_of_turn>", 0, TokenType::Control);    // 5
    add("\n", 0, TokenType::UserDefined);           // 6
    add("  ", 0, TokenType::UserDefined);           // 7
    for (int b = 0; b < 256; ++b) {                 // 8 .. 263
      char buf[8];
      std::snprintf(buf, sizeof buf, "<0x%02X>", b);
      add(buf, 0, TokenType::Byte);
    }
    v.pad = 0;
    v.eos = 1;
    v.bos = 2;
    v.unk = 3;
    v.add_bos = true;
    v.add_space_prefix = false;
  }
  int32_t add(const std::string &text, float score, TokenType type = TokenType::Normal) {
    v.tokens.push_back(text);
    v.scores.push_back(score);
    v.types.push_back(type);
    return static_cast<int32_t>(v.tokens.size() - 1);
  }
  Tokenizer build() {
    auto r = Tokenizer::create(v);
    EXPECT_TRUE(r.is_ok()) << r.status().to_string();
    return std::move(r).value();
  }
};

int32_t byte_id(int b) { return 8 + b; }

std::vector<int32_t> enc(const Tokenizer &t, std::string_view s, bool bos = false,
                         bool special = false) {
  std::vector<int32_t> out;
  Status st = t.encode(s, bos, special, &out);
  EXPECT_TRUE(st.is_ok()) << st.to_string();
  return out;
}

TEST(Tokenizer, MergesHighestScoreFirst) {
  VocabBuilder b;
  const int32_t a = b.add("a", -10), bb = b.add("b", -10), c = b.add("c", -10);
  const int32_t ab = b.add("ab", -2), bc = b.add("bc", -1);
  Tokenizer t = b.build();
  // "bc" scores higher: a + bc.
  EXPECT_EQ(enc(t, "abc"), (std::vector<int32_t>{a, bc}));
  EXPECT_EQ(enc(t, "ab"), (std::vector<int32_t>{ab}));
  EXPECT_EQ(enc(t, "cab"), (std::vector<int32_t>{c, ab}));
  EXPECT_EQ(enc(t, "bab"), (std::vector<int32_t>{bb, ab}));
}

TEST(Tokenizer, MergesChainThroughNewNeighbours) {
  VocabBuilder b;
  b.add("a", -10);
  b.add("b", -10);
  b.add("c", -10);
  b.add("ab", -2);
  b.add("bc", -1);
  const int32_t abc = b.add("abc", -3);
  Tokenizer t = b.build();
  // bc first, then a + bc -> abc.
  EXPECT_EQ(enc(t, "abc"), (std::vector<int32_t>{abc}));
}

TEST(Tokenizer, TiesGoLeftmost) {
  VocabBuilder b;
  const int32_t a = b.add("a", -10);
  b.add("b", -10);
  const int32_t c = b.add("c", -10);
  const int32_t ab = b.add("ab", -1), bc = b.add("bc", -1), aa = b.add("aa", -1);
  Tokenizer t = b.build();
  EXPECT_EQ(enc(t, "abc"), (std::vector<int32_t>{ab, c}));
  EXPECT_EQ(enc(t, "aaa"), (std::vector<int32_t>{aa, a}));
  EXPECT_EQ(enc(t, "aaaaa"), (std::vector<int32_t>{aa, aa, a}));
  (void)bc;
}

TEST(Tokenizer, SpacesBecomeEscapedAndMerge) {
  VocabBuilder b;
  const int32_t sp = b.add(kSp, -5);
  const int32_t h = b.add("h", -10), i = b.add("i", -10);
  const int32_t sph = b.add(std::string(kSp) + "h", -3);
  const int32_t hi = b.add("hi", -1);
  const int32_t sphi = b.add(std::string(kSp) + "hi", -4);
  Tokenizer t = b.build();
  EXPECT_EQ(enc(t, "hi"), (std::vector<int32_t>{hi}));
  EXPECT_EQ(enc(t, " hi"), (std::vector<int32_t>{sphi}));
  EXPECT_EQ(enc(t, "hi h"), (std::vector<int32_t>{hi, sph}));
  EXPECT_EQ(enc(t, "i "), (std::vector<int32_t>{i, sp}));
  // Two spaces are a USER_DEFINED token and are split off before merging.
  EXPECT_EQ(enc(t, "h  i"), (std::vector<int32_t>{h, 7, i}));
  EXPECT_EQ(enc(t, "   "), (std::vector<int32_t>{7, sp}));
}

TEST(Tokenizer, SpacePrefixWhenVocabAsks) {
  VocabBuilder b;
  b.add(kSp, -5);
  b.add("h", -10);
  b.add("i", -10);
  b.add("hi", -1);
  const int32_t sphi = b.add(std::string(kSp) + "hi", -4);
  b.v.add_space_prefix = true;
  Tokenizer t = b.build();
  EXPECT_EQ(enc(t, "hi"), (std::vector<int32_t>{sphi}));
  // Also after a special token.
  EXPECT_EQ(enc(t, "<bos>hi", false, true), (std::vector<int32_t>{2, sphi}));
}

TEST(Tokenizer, ByteFallback) {
  VocabBuilder b;
  const int32_t a = b.add("a", -10);
  Tokenizer t = b.build();
  // 'é' is not in the vocab: its two UTF-8 bytes.
  EXPECT_EQ(enc(t, "a\xC3\xA9"), (std::vector<int32_t>{a, byte_id(0xC3), byte_id(0xA9)}));
  // Invalid UTF-8: each bad byte on its own, valid characters after it still tokenize.
  EXPECT_EQ(enc(t, "\xFF"), (std::vector<int32_t>{byte_id(0xFF)}));
  EXPECT_EQ(enc(t, "\xC3" "a"), (std::vector<int32_t>{byte_id(0xC3), a}));
  EXPECT_EQ(enc(t, "a\xE2\x96"), (std::vector<int32_t>{a, byte_id(0xE2), byte_id(0x96)}));
  EXPECT_EQ(enc(t, std::string_view("\0a", 2)), (std::vector<int32_t>{byte_id(0), a}));
}

TEST(Tokenizer, ByteFallbackWithoutByteTokens) {
  Vocab v;
  v.model = "llama";
  v.tokens = {"<unk>", "a", "x"};
  v.types = {TokenType::Unknown, TokenType::Normal, TokenType::Normal};
  v.scores = {0, -1, -1};
  v.unk = 0;
  auto t = Tokenizer::create(v);
  ASSERT_TRUE(t.is_ok()) << t.status().to_string();
  // A 1-byte token stands in for a missing <0xXX>; else unk.
  EXPECT_EQ(enc(*t, "ax\xC3\xA9"), (std::vector<int32_t>{1, 2, 0, 0}));
  v.unk = -1;
  auto t2 = Tokenizer::create(v);
  ASSERT_TRUE(t2.is_ok());
  std::vector<int32_t> out = {42};
  Status st = t2->encode("a\xC3\xA9", false, false, &out);
  EXPECT_EQ(st.code(), GEIST_E_UNSUPPORTED);
  EXPECT_NE(st.message().find("0xC3"), std::string::npos) << st.message();
  EXPECT_EQ(out, std::vector<int32_t>{42});  // untouched on error
}

TEST(Tokenizer, SpecialPartition) {
  VocabBuilder b;
  const int32_t u = b.add("u", -10), s = b.add("s", -10), e = b.add("e", -10);
  const int32_t r = b.add("r", -10);
  Tokenizer t = b.build();
  // CONTROL only with parse_special.
  EXPECT_EQ(enc(t, "<start_of_turn>user\n", false, true),
            (std::vector<int32_t>{4, u, s, e, r, 6}));
  std::vector<int32_t> off = enc(t, "<start_of_turn>user\n", false, false);
  ASSERT_FALSE(off.empty());
  EXPECT_EQ(off.front(), byte_id('<'));
  EXPECT_EQ(off.back(), 6);  // USER_DEFINED "\n" always matched
  // UNKNOWN counts as special.
  EXPECT_EQ(enc(t, "<unk>", false, true), (std::vector<int32_t>{3}));
  EXPECT_EQ(enc(t, "<unk>", false, false).size(), 5u);
  // Adjacent and repeated.
  EXPECT_EQ(enc(t, "<eos><eos>\n\n", false, true), (std::vector<int32_t>{1, 1, 6, 6}));
  EXPECT_EQ(enc(t, "<eos", false, true).size(), 4u);
}

TEST(Tokenizer, SpecialPartitionLongestFirstGlobally) {
  VocabBuilder b;
  const int32_t x = b.add("x", -10), y = b.add("y", -10);
  const int32_t xy = b.add("xy", 0, TokenType::UserDefined);
  const int32_t yzw = b.add("yzw", 0, TokenType::UserDefined);
  b.add("z", -10);
  b.add("w", -10);
  Tokenizer t = b.build();
  // llama.cpp splits on the longest special text first, wherever it is.
  EXPECT_EQ(enc(t, "xyzw"), (std::vector<int32_t>{x, yzw}));
  EXPECT_EQ(enc(t, "xyxyzw"), (std::vector<int32_t>{xy, x, yzw}));
  EXPECT_EQ(enc(t, "xyy"), (std::vector<int32_t>{xy, y}));
}

TEST(Tokenizer, BosAndEos) {
  VocabBuilder b;
  const int32_t a = b.add("a", -1);
  Tokenizer t = b.build();
  EXPECT_EQ(enc(t, "a", true), (std::vector<int32_t>{2, a}));
  EXPECT_EQ(enc(t, "a", false), (std::vector<int32_t>{a}));
  EXPECT_EQ(enc(t, "", true), (std::vector<int32_t>{2}));
  EXPECT_TRUE(enc(t, "", false).empty());
  b.v.add_bos = false;
  b.v.add_eos = true;
  Tokenizer t2 = b.build();
  EXPECT_EQ(enc(t2, "a", true), (std::vector<int32_t>{a, 1}));
  EXPECT_EQ(enc(t2, "a", false), (std::vector<int32_t>{a}));
  // Appends.
  std::vector<int32_t> out = {7};
  ASSERT_TRUE(t.encode("a", false, false, &out).is_ok());
  EXPECT_EQ(out, (std::vector<int32_t>{7, a}));
  EXPECT_EQ(t.encode("a", false, false, nullptr).code(), GEIST_E_INVALID_ARGUMENT);
}

TEST(Tokenizer, Pieces) {
  VocabBuilder b;
  const int32_t sphi = b.add(std::string(kSp) + "hi" + kSp, -1);
  const int32_t unused = b.add("<unused0>", 0, TokenType::Unused);
  Tokenizer t = b.build();
  EXPECT_EQ(t.token_to_piece(sphi), " hi ");
  EXPECT_EQ(t.token_to_piece(byte_id(0x41)), "A");
  EXPECT_EQ(t.token_to_piece(byte_id(0)), std::string(1, '\0'));
  EXPECT_EQ(t.token_to_piece(2), "");
  EXPECT_EQ(t.token_to_piece(2, true), "<bos>");
  EXPECT_EQ(t.token_to_piece(3), "");
  EXPECT_EQ(t.token_to_piece(3, true), "<unk>");
  EXPECT_EQ(t.token_to_piece(6), "\n");
  EXPECT_EQ(t.token_to_piece(7), "  ");  // USER_DEFINED verbatim
  EXPECT_EQ(t.token_to_piece(unused, true), "");
  EXPECT_EQ(t.token_to_piece(-1), "");
  EXPECT_EQ(t.token_to_piece(t.n_vocab()), "");
  EXPECT_FALSE(t.is_valid(t.n_vocab()));
  EXPECT_EQ(t.decode({2, sphi, byte_id(0xC3), byte_id(0xA9), 5, 6}), " hi \xC3\xA9\n");
  EXPECT_EQ(t.decode({2, sphi, 5}, true), "<bos> hi <end_of_turn>");
}

TEST(Tokenizer, RoundTrip) {
  VocabBuilder b;
  b.add(kSp, -5);
  b.add("h", -10);
  b.add("i", -10);
  b.add("hi", -1);
  Tokenizer t = b.build();
  for (std::string s : {"hi hi  h\n\ni", "\xC3\xA9\xF0\x9F\x98\x80 x", "\xFF\xFE a", ""}) {
    EXPECT_EQ(t.decode(enc(t, s, true)), s);
  }
}

TEST(Tokenizer, StreamDecoderHoldsPartialUtf8) {
  VocabBuilder b;
  const int32_t a = b.add("a", -1);
  Tokenizer t = b.build();
  StreamDecoder d(t);
  EXPECT_EQ(d.push(a), "a");
  EXPECT_EQ(d.push(byte_id(0xF0)), "");
  EXPECT_EQ(d.push(byte_id(0x9F)), "");
  EXPECT_EQ(d.push(byte_id(0x98)), "");
  EXPECT_EQ(d.push(byte_id(0x80)), "\xF0\x9F\x98\x80");
  EXPECT_EQ(d.push(2), "");  // control, not rendered
  EXPECT_EQ(d.flush(), "");
  // A sequence that cannot complete becomes U+FFFD as soon as that is known.
  EXPECT_EQ(d.push(byte_id(0xC3)), "");
  EXPECT_EQ(d.push(a), "\xEF\xBF\xBD" "a");
  EXPECT_EQ(d.push(byte_id(0xFF)), "\xEF\xBF\xBD");
  EXPECT_EQ(d.push(byte_id(0x80)), "\xEF\xBF\xBD");
  // Held bytes at the end: one U+FFFD.
  EXPECT_EQ(d.push(byte_id(0xE2)), "");
  EXPECT_EQ(d.push(byte_id(0x96)), "");
  EXPECT_EQ(d.flush(), "\xEF\xBF\xBD");
  EXPECT_EQ(d.flush(), "");
  // Surrogates and overlongs are ill-formed.
  EXPECT_EQ(d.push(byte_id(0xED)), "");
  EXPECT_EQ(d.push(byte_id(0xA0)), "\xEF\xBF\xBD\xEF\xBF\xBD");
  StreamDecoder ds(t, true);
  EXPECT_EQ(ds.push(2), "<bos>");
}

TEST(Tokenizer, Utf8Step) {
  size_t len = 0;
  auto step = [&](std::string_view s) {
    return utf8_step(reinterpret_cast<const uint8_t *>(s.data()), s.size(), &len);
  };
  EXPECT_EQ(step("a"), Utf8Step::Valid);
  EXPECT_EQ(len, 1u);
  EXPECT_EQ(step("\xE2\x96\x81z"), Utf8Step::Valid);
  EXPECT_EQ(len, 3u);
  EXPECT_EQ(step("\xE2\x96"), Utf8Step::Incomplete);
  EXPECT_EQ(len, 2u);
  EXPECT_EQ(step("\xE2\x41"), Utf8Step::Invalid);
  EXPECT_EQ(len, 1u);
  EXPECT_EQ(step("\xF0\x9F\x98\x41"), Utf8Step::Invalid);
  EXPECT_EQ(len, 3u);
  EXPECT_EQ(step("\xC0\x80"), Utf8Step::Invalid);  // overlong
  EXPECT_EQ(step("\xF4\x90\x80\x80"), Utf8Step::Invalid);  // > U+10FFFF
  EXPECT_EQ(step("\x80"), Utf8Step::Invalid);
}

TEST(Tokenizer, EogAndLookup) {
  VocabBuilder b;
  Tokenizer t = b.build();
  EXPECT_TRUE(t.is_eog(1));
  EXPECT_TRUE(t.is_eog(5));  // "<end_of_turn>" by text
  EXPECT_FALSE(t.is_eog(2));
  EXPECT_FALSE(t.is_eog(-1));
  EXPECT_EQ(t.find_token("<end_of_turn>"), std::optional<int32_t>(5));
  EXPECT_EQ(t.find_token("<0x41>"), std::optional<int32_t>(byte_id(0x41)));
  EXPECT_EQ(t.find_token("nope"), std::nullopt);
  EXPECT_EQ(t.find_token(""), std::nullopt);
  EXPECT_EQ(t.bos(), 2);
  EXPECT_EQ(t.eos(), 1);
  EXPECT_EQ(t.n_vocab(), 264);
  EXPECT_EQ(t.vocab().tokens[4], "<start_of_turn>");
}

TEST(Tokenizer, CreateRejectsBadVocab) {
  {
    VocabBuilder b;
    b.v.model = "gpt2";
    auto r = Tokenizer::create(b.v);
    EXPECT_EQ(r.status().code(), GEIST_E_UNSUPPORTED);
    EXPECT_NE(r.status().message().find("gpt2"), std::string::npos);
  }
  {
    VocabBuilder b;
    b.v.scores.pop_back();
    EXPECT_EQ(Tokenizer::create(b.v).status().code(), GEIST_E_BAD_FORMAT);
  }
  {
    VocabBuilder b;
    b.v.types.push_back(TokenType::Normal);
    EXPECT_EQ(Tokenizer::create(b.v).status().code(), GEIST_E_BAD_FORMAT);
  }
  {
    VocabBuilder b;
    b.v.bos = 100000;
    auto r = Tokenizer::create(b.v);
    EXPECT_EQ(r.status().code(), GEIST_E_BAD_FORMAT);
    EXPECT_NE(r.status().message().find("bos"), std::string::npos) << r.status().message();
  }
  {
    VocabBuilder b;
    b.v.types[10] = static_cast<TokenType>(9);
    EXPECT_EQ(Tokenizer::create(b.v).status().code(), GEIST_E_BAD_FORMAT);
  }
  {
    VocabBuilder b;
    b.v.scores[10] = std::nanf("");
    EXPECT_EQ(Tokenizer::create(b.v).status().code(), GEIST_E_BAD_FORMAT);
  }
  {
    Vocab v;
    v.model = "llama";
    EXPECT_EQ(Tokenizer::create(v).status().code(), GEIST_E_BAD_FORMAT);
  }
}

// Naive oracle: rescan all adjacent pairs after every merge.
std::vector<int32_t> naive_encode(const Vocab &v, const std::string &s) {
  std::map<std::string, int32_t> ids;
  for (size_t i = 0; i < v.tokens.size(); ++i) ids[v.tokens[i]] = static_cast<int32_t>(i);
  std::vector<std::string> sym;
  for (char c : s) {
    if (c == ' ') {
      sym.push_back(kSp);
    } else {
      sym.push_back(std::string(1, c));
    }
  }
  for (;;) {
    int best = -1;
    float best_score = 0;
    for (size_t i = 0; i + 1 < sym.size(); ++i) {
      auto it = ids.find(sym[i] + sym[i + 1]);
      if (it == ids.end()) continue;
      const float sc = v.scores[it->second];
      if (best < 0 || sc > best_score) {
        best = static_cast<int>(i);
        best_score = sc;
      }
    }
    if (best < 0) break;
    sym[best] += sym[best + 1];
    sym.erase(sym.begin() + best + 1);
  }
  std::vector<int32_t> out;
  for (const std::string &x : sym) {
    auto it = ids.find(x);
    if (it != ids.end()) {
      out.push_back(it->second);
    } else {
      for (unsigned char c : x) out.push_back(8 + c);
    }
  }
  return out;
}

TEST(Tokenizer, HeapMergeMatchesNaiveOracle) {
  std::mt19937 rng(1234);
  const std::string alphabet = "abcd ";
  for (int round = 0; round < 20; ++round) {
    VocabBuilder b;
    std::map<std::string, bool> seen;
    for (char c : std::string("abc")) b.add(std::string(1, c), -100);  // 'd' falls to bytes
    b.add(kSp, -100);
    for (int k = 0; k < 60; ++k) {
      std::string tok;
      const int len = 2 + static_cast<int>(rng() % 4);
      for (int j = 0; j < len; ++j) {
        const char c = alphabet[rng() % alphabet.size()];
        if (c == ' ') {
          tok += kSp;
        } else {
          tok.push_back(c);
        }
      }
      if (seen[tok]) continue;
      seen[tok] = true;
      // Few distinct scores so that ties are common.
      b.add(tok, -static_cast<float>(rng() % 5));
    }
    b.v.tokens[7] = "<two-spaces-disabled>";  // keep the oracle free of the partition
    Tokenizer t = b.build();
    for (int k = 0; k < 30; ++k) {
      std::string s;
      const int len = static_cast<int>(rng() % 40);
      for (int j = 0; j < len; ++j) s.push_back(alphabet[rng() % (alphabet.size() - 1)]);
      for (int j = 0; j + 1 < len; j += 7) s[j] = ' ';  // single spaces only
      ASSERT_EQ(enc(t, s), naive_encode(b.v, s)) << "round " << round << " text '" << s << "'";
    }
  }
}

TEST(Tokenizer, LongInputIsFast) {
  VocabBuilder b;
  b.add(kSp, -5);
  b.add("a", -10);
  b.add("aa", -3);
  b.add("aaaa", -2);
  Tokenizer t = b.build();
  std::string s;
  for (int i = 0; i < 100000; ++i) s.push_back(i % 9 == 8 ? ' ' : 'a');
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<int32_t> out = enc(t, s, true);
  const double sec =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(sec, 0.5);
  EXPECT_EQ(t.decode(out), s);
  // A run of 100k user-defined matches (two spaces) through the partition.
  std::string spaces(100001, ' ');
  out.clear();
  ASSERT_TRUE(t.encode(spaces, false, true, &out).is_ok());
  EXPECT_EQ(out.size(), 50001u);
  EXPECT_EQ(t.decode(out), spaces);
}


// ---------------------------------------------------------------------------------------
// from_gguf on small GGUF images built in memory (v3, no tensors).

class GgufImage {
 public:
  void str(const std::string &s) {
    u64(s.size());
    bytes_.insert(bytes_.end(), s.begin(), s.end());
  }
  void u32(uint32_t v) { raw(&v, 4); }
  void u64(uint64_t v) { raw(&v, 8); }
  void kv_str(const std::string &k, const std::string &v) {
    str(k);
    u32(8);
    str(v);
    ++n_kv_;
  }
  void kv_u32(const std::string &k, uint32_t v) {
    str(k);
    u32(4);
    u32(v);
    ++n_kv_;
  }
  void kv_bool(const std::string &k, bool v) {
    str(k);
    u32(7);
    bytes_.push_back(v ? 1 : 0);
    ++n_kv_;
  }
  void kv_strings(const std::string &k, const std::vector<std::string> &v) {
    str(k);
    u32(9);
    u32(8);
    u64(v.size());
    for (const auto &s : v) str(s);
    ++n_kv_;
  }
  // elem_type 4 = u32, 5 = i32, 6 = f32: 4-byte elements.
  template <typename T>
  void kv_array4(const std::string &k, uint32_t elem_type, const std::vector<T> &v) {
    static_assert(sizeof(T) == 4);
    str(k);
    u32(9);
    u32(elem_type);
    u64(v.size());
    for (const T &x : v) raw(&x, 4);
    ++n_kv_;
  }
  std::vector<uint8_t> finish() const {
    std::vector<uint8_t> out = {'G', 'G', 'U', 'F', 3, 0, 0, 0};
    auto put64 = [&out](uint64_t v) {
      for (int i = 0; i < 8; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
    };
    put64(0);  // tensors
    put64(n_kv_);
    out.insert(out.end(), bytes_.begin(), bytes_.end());
    while (out.size() % 32) out.push_back(0);
    return out;
  }

 private:
  void raw(const void *p, size_t n) {
    const auto *b = static_cast<const uint8_t *>(p);
    bytes_.insert(bytes_.end(), b, b + n);
  }
  std::vector<uint8_t> bytes_;
  uint64_t n_kv_ = 0;
};

struct GgufCase {
  std::string model = "llama";
  bool with_tokens = true, with_scores = true, scores_f32 = true, types_u32 = false;
  size_t n_scores = 4;
};

Result<Tokenizer> tokenizer_from_image(const GgufCase &c, std::vector<uint8_t> *keep) {
  GgufImage g;
  g.kv_str("tokenizer.ggml.model", c.model);
  g.kv_str("tokenizer.ggml.pre", "default");
  if (c.with_tokens) g.kv_strings("tokenizer.ggml.tokens", {"<pad>", "<eos>", "<bos>", "a"});
  if (c.with_scores) {
    std::vector<float> s(c.n_scores, 0.0f);
    if (c.scores_f32) {
      g.kv_array4("tokenizer.ggml.scores", 6, s);
    } else {
      g.kv_array4("tokenizer.ggml.scores", 5, std::vector<int32_t>(c.n_scores, 0));
    }
  }
  const std::vector<int32_t> types = {3, 3, 3, 1};
  if (c.types_u32) {
    g.kv_array4("tokenizer.ggml.token_type", 4,
                std::vector<uint32_t>(types.begin(), types.end()));
  } else {
    g.kv_array4("tokenizer.ggml.token_type", 5, types);
  }
  g.kv_u32("tokenizer.ggml.bos_token_id", 2);
  g.kv_u32("tokenizer.ggml.eos_token_id", 1);
  g.kv_u32("tokenizer.ggml.padding_token_id", 0);
  g.kv_bool("tokenizer.ggml.add_space_prefix", false);
  *keep = g.finish();
  auto f = gguf::GgufFile::from_memory(keep->data(), keep->size());
  if (!f.is_ok()) return f.status();
  return Tokenizer::from_gguf(**f);
}

TEST(TokenizerGguf, ReadsKeys) {
  std::vector<uint8_t> buf;
  for (bool u32 : {false, true}) {
    GgufCase c;
    c.types_u32 = u32;
    auto t = tokenizer_from_image(c, &buf);
    ASSERT_TRUE(t.is_ok()) << t.status().to_string();
    EXPECT_EQ(t->n_vocab(), 4);
    EXPECT_EQ(t->bos(), 2);
    EXPECT_EQ(t->eos(), 1);
    EXPECT_EQ(t->vocab().pad, 0);
    EXPECT_EQ(t->vocab().unk, 0);  // llama.cpp's SPM default when the key is absent
    EXPECT_TRUE(t->vocab().add_bos);
    EXPECT_FALSE(t->vocab().add_space_prefix);
    EXPECT_EQ(t->token_type(0), TokenType::Control);
    EXPECT_EQ(enc(*t, "a", true), (std::vector<int32_t>{2, 3}));
  }
}

TEST(TokenizerGguf, Errors) {
  std::vector<uint8_t> buf;
  {
    GgufCase c;
    c.model = "gpt2";
    auto t = tokenizer_from_image(c, &buf);
    EXPECT_EQ(t.status().code(), GEIST_E_UNSUPPORTED);
    EXPECT_NE(t.status().message().find("gpt2"), std::string::npos);
  }
  {
    GgufCase c;
    c.model = "gemma4";  // a BPE vocabulary without merges
    auto t = tokenizer_from_image(c, &buf);
    EXPECT_EQ(t.status().code(), GEIST_E_BAD_FORMAT);
    EXPECT_NE(t.status().message().find("merges"), std::string::npos) << t.status().message();
  }
  {
    GgufCase c;
    c.with_tokens = false;
    auto t = tokenizer_from_image(c, &buf);
    EXPECT_EQ(t.status().code(), GEIST_E_BAD_FORMAT);
    EXPECT_NE(t.status().message().find("tokenizer.ggml.tokens"), std::string::npos)
        << t.status().message();
  }
  {
    GgufCase c;
    c.n_scores = 3;
    auto t = tokenizer_from_image(c, &buf);
    EXPECT_EQ(t.status().code(), GEIST_E_BAD_FORMAT);
    EXPECT_NE(t.status().message().find("tokenizer.ggml.scores"), std::string::npos)
        << t.status().message();
  }
  {
    GgufCase c;
    c.scores_f32 = false;
    auto t = tokenizer_from_image(c, &buf);
    EXPECT_EQ(t.status().code(), GEIST_E_BAD_FORMAT);
    EXPECT_NE(t.status().message().find("f32"), std::string::npos) << t.status().message();
  }
  {
    GgufCase c;
    c.with_scores = false;  // optional: all scores 0
    auto t = tokenizer_from_image(c, &buf);
    EXPECT_TRUE(t.is_ok()) << t.status().to_string();
  }
}
}  // namespace
}  // namespace geist
