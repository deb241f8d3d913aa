// GgufFile against tests/data/tiny.gguf, written by an independent writer (gguf-py,
// scripts/make_test_gguf.py), and its description tests/data/tiny_expect.json.
// Both open() (mmap) and from_memory() are checked, plus the real model if present.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "gguf/gguf_reader.h"
#include "test_util.h"

namespace geist::gguf {
namespace {

using nlohmann::json;

json load_expect() {
  std::ifstream f(test::data_path("tiny_expect.json"));
  EXPECT_TRUE(f.good()) << "missing tests/data/tiny_expect.json";
  return json::parse(f);
}

std::string fnv1a64(const uint8_t *p, size_t n) {
  uint64_t h = 0xCBF29CE484222325ull;
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001B3ull;
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

bool is_int_type(const std::string &t) {
  return t == "UINT8" || t == "INT8" || t == "UINT16" || t == "INT16" || t == "UINT32" ||
         t == "INT32" || t == "UINT64" || t == "INT64";
}
bool is_float_type(const std::string &t) {
  return t == "FLOAT32" || t == "FLOAT64";
}

// One scalar (of JSON type name `type`) compared through every accessor that must accept it.
void check_scalar(const std::string &key, const std::string &type, const Value &v, const json &e) {
  SCOPED_TRACE(key);
  if (type == "STRING") {
    ASSERT_TRUE(v.as_string());
    EXPECT_EQ(*v.as_string(), e.get<std::string>());
    EXPECT_FALSE(v.as_uint());
    EXPECT_FALSE(v.as_float());
  } else if (type == "BOOL") {
    ASSERT_TRUE(v.as_bool());
    EXPECT_EQ(*v.as_bool(), e.get<bool>());
    EXPECT_FALSE(v.as_int());
    EXPECT_EQ(v.to_string(), e.get<bool>() ? "true" : "false");
  } else if (is_float_type(type)) {
    ASSERT_TRUE(v.as_float());
    EXPECT_EQ(*v.as_float(), e.get<double>());
    EXPECT_FALSE(v.as_int());
  } else {
    ASSERT_TRUE(is_int_type(type)) << type;
    if (e.is_number_unsigned()) {
      uint64_t u = e.get<uint64_t>();
      ASSERT_TRUE(v.as_uint());
      EXPECT_EQ(*v.as_uint(), u);
      EXPECT_EQ(v.as_int().has_value(), u <= uint64_t(INT64_MAX));
      EXPECT_EQ(v.to_string(), std::to_string(u));
    } else {
      int64_t s = e.get<int64_t>();
      ASSERT_TRUE(v.as_int());
      EXPECT_EQ(*v.as_int(), s);
      EXPECT_EQ(v.as_uint().has_value(), s >= 0);
      EXPECT_EQ(v.to_string(), std::to_string(s));
    }
    ASSERT_TRUE(v.as_float());
    EXPECT_EQ(*v.as_float(), e.get<double>());
    EXPECT_FALSE(v.as_string());
    EXPECT_FALSE(v.as_bool());
  }
}

void check_array(const std::string &key, const Value &v, const json &e) {
  SCOPED_TRACE(key);
  std::string et = e["elem_type"];
  EXPECT_STREQ(value_type_name(v.elem_type), et.c_str());
  EXPECT_FALSE(v.as_uint());
  EXPECT_FALSE(v.as_string());
  if (et == "ARRAY") {
    EXPECT_EQ(v.count, e["count"].get<uint64_t>());
    EXPECT_FALSE(v.array_int(0));
    return;
  }
  const json &vals = e["value"];
  ASSERT_EQ(v.count, vals.size());
  EXPECT_FALSE(v.array_int(v.count));
  EXPECT_FALSE(v.array_float(v.count));
  for (size_t i = 0; i < vals.size(); ++i) {
    if (et == "STRING") {
      ASSERT_EQ(v.strings.size(), vals.size());
      EXPECT_EQ(v.strings[i], vals[i].get<std::string>());
      EXPECT_FALSE(v.array_int(i));
    } else if (et == "BOOL") {
      EXPECT_EQ(v.data[i], vals[i].get<bool>() ? 1 : 0);
    } else if (is_float_type(et)) {
      ASSERT_TRUE(v.array_float(i));
      EXPECT_EQ(*v.array_float(i), vals[i].get<double>());
      EXPECT_FALSE(v.array_int(i));
    } else {
      ASSERT_TRUE(v.array_float(i));
      EXPECT_EQ(*v.array_float(i), vals[i].get<double>());
      if (vals[i].is_number_unsigned() && vals[i].get<uint64_t>() > uint64_t(INT64_MAX)) {
        EXPECT_FALSE(v.array_int(i));
      } else {
        ASSERT_TRUE(v.array_int(i));
        EXPECT_EQ(*v.array_int(i), vals[i].get<int64_t>());
      }
    }
  }
}

void check_file(const GgufFile &f, const json &ex) {
  EXPECT_EQ(f.version(), ex["version"].get<uint32_t>());
  EXPECT_EQ(f.alignment(), ex["alignment"].get<size_t>());
  EXPECT_EQ(f.data_offset(), ex["data_offset"].get<uint64_t>());
  EXPECT_EQ(f.file_size(), ex["file_size"].get<size_t>());

  const json &kv = ex["kv"];
  ASSERT_EQ(f.metadata().size(), kv.size());
  for (size_t i = 0; i < kv.size(); ++i) {
    const std::string key = kv[i]["key"], type = kv[i]["type"];
    EXPECT_EQ(f.metadata()[i].first, key) << "file order";
    const Value *v = f.find(key);
    ASSERT_NE(v, nullptr) << key;
    EXPECT_EQ(v, &f.metadata()[i].second);
    EXPECT_STREQ(value_type_name(v->type), type.c_str()) << key;
    if (type == "ARRAY") {
      check_array(key, *v, kv[i]);
    } else {
      check_scalar(key, type, *v, kv[i]["value"]);
    }
  }
  EXPECT_EQ(f.find("no.such.key"), nullptr);
  EXPECT_EQ(f.find(""), nullptr);
  EXPECT_EQ(f.find("zzzz"), nullptr);

  const json &ts = ex["tensors"];
  ASSERT_EQ(f.tensors().size(), ts.size());
  for (size_t i = 0; i < ts.size(); ++i) {
    const TensorInfo &t = f.tensors()[i];
    const std::string name = ts[i]["name"];
    SCOPED_TRACE(name);
    EXPECT_EQ(t.name, name);
    EXPECT_EQ(f.tensor(name), &t);
    EXPECT_STREQ(quant::type_name(t.type), ts[i]["type"].get<std::string>().c_str());
    EXPECT_EQ(t.n_dims, ts[i]["n_dims"].get<uint32_t>());
    int64_t n = 1;
    for (int d = 0; d < 4; ++d) {
      EXPECT_EQ(t.ne[d], ts[i]["ne"][d].get<int64_t>()) << "dim " << d;
      n *= t.ne[d];
    }
    EXPECT_EQ(t.n_elements(), n);
    EXPECT_EQ(t.offset, ts[i]["offset"].get<uint64_t>());
    EXPECT_EQ(t.n_bytes, ts[i]["n_bytes"].get<size_t>());
    EXPECT_EQ(t.data, f.base() + f.data_offset() + t.offset);
    EXPECT_EQ(t.offset % f.alignment(), 0u);
    EXPECT_EQ(fnv1a64(t.data, t.n_bytes), ts[i]["fnv1a64"].get<std::string>());
  }
  EXPECT_EQ(f.tensor("no.such.tensor"), nullptr);
}

TEST(GgufReader, OpenTinyMatchesExpectation) {
  json ex = load_expect();
  auto r = GgufFile::open(test::data_path("tiny.gguf"));
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(r.value()->path(), test::data_path("tiny.gguf"));
  r.value()->advise_willneed();
  check_file(*r.value(), ex);
}

TEST(GgufReader, FromMemoryTinyBorrowsBuffer) {
  json ex = load_expect();
  std::vector<uint8_t> bytes = test::read_file(test::data_path("tiny.gguf"));
  auto r = GgufFile::from_memory(bytes.data(), bytes.size());
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  const GgufFile &f = *r.value();
  EXPECT_EQ(f.base(), bytes.data()) << "from_memory must not copy";
  EXPECT_EQ(f.path(), "");
  f.advise_willneed();  // no-op
  check_file(f, ex);
  // String values are views into the caller's buffer.
  const Value *name = f.find("general.name");
  ASSERT_NE(name, nullptr);
  EXPECT_GE(reinterpret_cast<const uint8_t *>(name->str.data()), bytes.data());
  EXPECT_LT(reinterpret_cast<const uint8_t *>(name->str.data()), bytes.data() + bytes.size());
}

TEST(GgufReader, TypedGetters) {
  auto r = GgufFile::open(test::data_path("tiny.gguf"));
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  const GgufFile &f = *r.value();
  EXPECT_EQ(f.get_uint("gemma3.block_count").value(), 1u);
  EXPECT_EQ(f.get_string("general.architecture").value(), "gemma3");
  EXPECT_EQ(f.get_bool("tokenizer.ggml.add_bos_token").value(), true);
  EXPECT_EQ(f.get_float("gemma3.rope.freq_base").value(), 10000.0);
  EXPECT_EQ(f.get_float("gemma3.block_count").value(), 1.0) << "ints convert to float";

  auto missing = f.get_uint("gemma3.no_such_key");
  EXPECT_EQ(missing.status().code(), GEIST_E_BAD_FORMAT);
  EXPECT_NE(missing.status().message().find("'gemma3.no_such_key' is missing"), std::string::npos);
  auto wrong = f.get_uint("general.architecture");
  EXPECT_EQ(wrong.status().code(), GEIST_E_BAD_FORMAT);
  EXPECT_NE(wrong.status().message().find("'general.architecture'"), std::string::npos);
  EXPECT_EQ(f.get_uint("test.i8").status().code(), GEIST_E_BAD_FORMAT) << "negative -> uint";
  EXPECT_EQ(f.get_bool("test.u8").status().code(), GEIST_E_BAD_FORMAT);
  EXPECT_EQ(f.get_string("test.u8").status().code(), GEIST_E_BAD_FORMAT);
}

TEST(GgufReader, ToStringRendering) {
  auto r = GgufFile::open(test::data_path("tiny.gguf"));
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  const GgufFile &f = *r.value();
  EXPECT_EQ(f.find("general.architecture")->to_string(), "\"gemma3\"");
  EXPECT_EQ(f.find("test.f32")->to_string(), "-3.140625");
  EXPECT_EQ(f.find("test.arr_u8")->to_string(), "[0, 1, 255]");
  EXPECT_EQ(f.find("test.arr_u8")->to_string(2), "[0, 1, ... (3 UINT8 total)]");
  EXPECT_EQ(f.find("test.arr_empty")->to_string(), "[]");
  EXPECT_EQ(f.find("test.string")->to_string(), "\"line one\\nline \\\"two\\\" \xc3\xa9\"");
  EXPECT_EQ(f.find("test.arr_bool")->to_string(), "[true, false, true]");
}

TEST(GgufReader, DefaultValueAccessorsAreSafe) {
  Value v;  // no data
  EXPECT_FALSE(v.as_uint());
  EXPECT_FALSE(v.as_int());
  EXPECT_FALSE(v.as_float());
  EXPECT_FALSE(v.as_bool());
  EXPECT_FALSE(v.as_string());
  EXPECT_FALSE(v.array_int(0));
  EXPECT_EQ(v.to_string(), "?");
  EXPECT_STREQ(value_type_name(ValueType::COUNT), "UNKNOWN");
}

TEST(GgufReader, RealModelIfPresent) {
  GEIST_REQUIRE_MODEL(path);
  auto r = GgufFile::open(path);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  const GgufFile &f = *r.value();
  EXPECT_EQ(f.get_string("general.architecture").value(), "gemma3");
  const Value *tokens = f.find("tokenizer.ggml.tokens");
  ASSERT_NE(tokens, nullptr);
  EXPECT_EQ(tokens->strings.size(), tokens->count);
  EXPECT_GT(f.tensors().size(), 0u);
  const TensorInfo *emb = f.tensor("token_embd.weight");
  ASSERT_NE(emb, nullptr);
  EXPECT_EQ(static_cast<uint64_t>(emb->ne[1]), tokens->count);
  for (const TensorInfo &t : f.tensors()) {
    EXPECT_EQ(f.tensor(t.name), &t);
    EXPECT_LE(t.data + t.n_bytes, f.base() + f.file_size());
  }
}

}  // namespace
}  // namespace geist::gguf
