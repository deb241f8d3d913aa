// The Gemma 3 tokenizer of the default model against llama.cpp's tokenizations
// (tests/data/tokenizer/gemma3_ref.jsonl, made by scripts/gen_tokenizer_ref.py): every case's
// ids and both detokenizations must match exactly. Invalid UTF-8 inputs are the one place
// where geist deliberately differs (see InvalidUtf8 below).
#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <set>
#include <nlohmann/json.hpp>
#include <thread>

#include "engine/tokenizer.h"
#include "gguf/gguf_reader.h"
#include "test_util.h"

namespace geist {
namespace {

using nlohmann::json;

struct RefCase {
  std::string name;
  std::string text;
  bool add_bos = false, special = false, invalid_utf8 = false;
  std::vector<int32_t> ids;
  std::string decoded, decoded_special;
};

std::string from_hex(const std::string &h) {
  std::string out;
  for (size_t i = 0; i + 1 < h.size(); i += 2) {
    out.push_back(static_cast<char>(std::stoi(h.substr(i, 2), nullptr, 16)));
  }
  return out;
}

std::string bytes_field(const json &j, const std::string &key) {
  if (j.contains(key)) return j[key].get<std::string>();
  return from_hex(j.at(key + "_hex").get<std::string>());
}

std::vector<RefCase> load_cases(json *header) {
  std::ifstream f(test::data_path("tokenizer/gemma3_ref.jsonl"));
  EXPECT_TRUE(f.good()) << "missing tests/data/tokenizer/gemma3_ref.jsonl";
  std::vector<RefCase> cases;
  std::string line;
  while (std::getline(f, line)) {
    if (line.empty()) continue;
    json j = json::parse(line);
    if (j.contains("header")) {
      *header = j["header"];
      continue;
    }
    RefCase c;
    c.name = j.at("name").get<std::string>();
    c.text = bytes_field(j, "text");
    c.add_bos = j.at("add_bos").get<bool>();
    c.special = j.at("special").get<bool>();
    c.invalid_utf8 = j.at("invalid_utf8").get<bool>();
    c.ids = j.at("ids").get<std::vector<int32_t>>();
    c.decoded = bytes_field(j, "decoded");
    c.decoded_special = bytes_field(j, "decoded_special");
    cases.push_back(std::move(c));
  }
  return cases;
}

std::string show_ids(const std::vector<int32_t> &ids) {
  std::string s = "[";
  for (size_t i = 0; i < ids.size(); ++i) s += (i ? ", " : "") + std::to_string(ids[i]);
  return s + "]";
}

std::string escape(const std::string &s) {
  std::string out;
  for (unsigned char c : s) {
    if (c == '\n') {
      out += "\\n";
    } else if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else {
      out.push_back(static_cast<char>(c));
    }
  }
  return out;
}

class Gemma3Tokenizer : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string path = test::default_model_path();
    if (path.empty()) return;
    auto f = gguf::GgufFile::open(path);
    ASSERT_TRUE(f.is_ok()) << f.status().to_string();
    auto t = Tokenizer::from_gguf(**f);
    ASSERT_TRUE(t.is_ok()) << t.status().to_string();
    tok_ = new Tokenizer(std::move(t).value());
  }
  static void TearDownTestSuite() {
    delete tok_;
    tok_ = nullptr;
  }
  static Tokenizer *tok_;
};
Tokenizer *Gemma3Tokenizer::tok_ = nullptr;

#define REQUIRE_TOKENIZER()         \
  GEIST_REQUIRE_MODEL(model_path_); \
  ASSERT_NE(tok_, nullptr);         \
  (void)model_path_

TEST_F(Gemma3Tokenizer, VocabFromGguf) {
  REQUIRE_TOKENIZER();
  const Tokenizer &t = *tok_;
  EXPECT_EQ(t.n_vocab(), 262144);
  EXPECT_EQ(t.bos(), 2);
  EXPECT_EQ(t.eos(), 1);
  EXPECT_EQ(t.vocab().unk, 3);
  EXPECT_EQ(t.vocab().pad, 0);
  EXPECT_EQ(t.vocab().eot, 106);
  EXPECT_TRUE(t.vocab().add_bos);
  EXPECT_FALSE(t.vocab().add_eos);
  EXPECT_FALSE(t.vocab().add_space_prefix);
  EXPECT_EQ(t.vocab().model, "llama");
  EXPECT_EQ(t.find_token("<start_of_turn>"), std::optional<int32_t>(105));
  EXPECT_EQ(t.find_token("<end_of_turn>"), std::optional<int32_t>(106));
  EXPECT_EQ(t.token_type(105), TokenType::Control);
  EXPECT_TRUE(t.is_eog(1));
  EXPECT_TRUE(t.is_eog(106));
  EXPECT_FALSE(t.is_eog(2));
  EXPECT_FALSE(t.is_eog(105));
}

TEST_F(Gemma3Tokenizer, MatchesLlamaCpp) {
  REQUIRE_TOKENIZER();
  const Tokenizer &t = *tok_;
  json header;
  const std::vector<RefCase> cases = load_cases(&header);
  ASSERT_GE(cases.size(), 800u);
  std::printf("reference: llama_cpp %s, %zu cases\n",
              header.value("llama_cpp_version", std::string("?")).c_str(), cases.size());
  size_t n_ok = 0, n_checked = 0;
  std::set<std::string> strings;
  for (const RefCase &c : cases) {
    if (c.invalid_utf8) continue;  // see InvalidUtf8
    strings.insert(c.name);
    ++n_checked;
    std::vector<int32_t> ids;
    ASSERT_TRUE(t.encode(c.text, c.add_bos, c.special, &ids).is_ok());
    const std::string where = c.name + " (add_bos=" + std::to_string(c.add_bos) +
                              ", special=" + std::to_string(c.special) + ") text \"" +
                              escape(c.text) + "\"";
    if (ids != c.ids) {
      size_t k = 0;
      while (k < ids.size() && k < c.ids.size() && ids[k] == c.ids[k]) ++k;
      ADD_FAILURE() << "ids differ in " << where << "\n  first difference at index " << k
                    << "\n  geist:     " << show_ids(ids) << "\n  llama.cpp: " << show_ids(c.ids);
      continue;
    }
    const std::string dec = t.decode(c.ids), dec_sp = t.decode(c.ids, true);
    if (dec != c.decoded || dec_sp != c.decoded_special) {
      ADD_FAILURE() << "decode differs in " << where << "\n  geist:     \"" << escape(dec)
                    << "\" / \"" << escape(dec_sp) << "\"\n  llama.cpp: \"" << escape(c.decoded)
                    << "\" / \"" << escape(c.decoded_special) << "\"";
      continue;
    }
    ++n_ok;
  }
  std::printf("%zu of %zu cases (%zu strings) match llama.cpp exactly\n", n_ok, n_checked,
              strings.size());
  EXPECT_GE(strings.size(), 200u);
  EXPECT_EQ(n_ok, n_checked);
}

// llama.cpp groups an ill-formed sequence by its lead byte ("\xE2AB" -> three byte tokens);
// geist treats each byte of an ill-formed sequence as its own symbol, so the valid
// characters after it tokenize normally. Where the two agree the ids must match; where
// they differ, geist's ids must still decode to the input bytes. Decoding of llama.cpp's
// ids must match in every case.
TEST_F(Gemma3Tokenizer, InvalidUtf8) {
  REQUIRE_TOKENIZER();
  const Tokenizer &t = *tok_;
  json header;
  size_t n = 0, n_same = 0;
  for (const RefCase &c : load_cases(&header)) {
    if (!c.invalid_utf8) continue;
    ++n;
    std::vector<int32_t> ids;
    ASSERT_TRUE(t.encode(c.text, c.add_bos, c.special, &ids).is_ok());
    EXPECT_EQ(t.decode(c.ids), c.decoded) << c.name;
    EXPECT_EQ(t.decode(c.ids, true), c.decoded_special) << c.name;
    if (ids == c.ids) {
      ++n_same;
      continue;
    }
    std::vector<int32_t> body = ids;
    if (c.add_bos && !body.empty() && body[0] == t.bos()) body.erase(body.begin());
    EXPECT_EQ(t.decode(body), c.text) << c.name;
    std::printf("NOTE: %s (add_bos=%d, special=%d): geist %s, llama.cpp %s\n", c.name.c_str(),
                c.add_bos, c.special, show_ids(ids).c_str(), show_ids(c.ids).c_str());
  }
  std::printf("invalid UTF-8: %zu of %zu cases identical to llama.cpp\n", n_same, n);
  EXPECT_GT(n, 0u);
  // The designed difference, pinned: 0xE2 alone, then "AB" as ordinary text.
  std::vector<int32_t> ids;
  ASSERT_TRUE(t.encode("\xE2" "AB", false, false, &ids).is_ok());
  std::vector<int32_t> ab;
  ASSERT_TRUE(t.encode("AB", false, false, &ab).is_ok());
  ASSERT_FALSE(ids.empty());
  EXPECT_EQ(ids[0], *t.find_token("<0xE2>"));
  EXPECT_EQ(std::vector<int32_t>(ids.begin() + 1, ids.end()), ab);
}

TEST_F(Gemma3Tokenizer, StreamingEqualsWholeDecode) {
  REQUIRE_TOKENIZER();
  const Tokenizer &t = *tok_;
  json header;
  for (const RefCase &c : load_cases(&header)) {
    if (c.invalid_utf8) continue;
    StreamDecoder d(t);
    std::string s;
    for (int32_t id : c.ids) s += d.push(id);
    s += d.flush();
    ASSERT_EQ(s, c.decoded) << c.name;  // valid input: streaming loses nothing
  }
}

TEST_F(Gemma3Tokenizer, FastAndThreadSafe) {
  REQUIRE_TOKENIZER();
  const Tokenizer &t = *tok_;
  json header;
  std::string text;
  for (const RefCase &c : load_cases(&header)) {
    // Texts that round-trip (not those with a literal '▁', which decodes to ' ').
    if (!c.invalid_utf8 && !c.add_bos && !c.special && c.decoded == c.text) text += c.text;
  }
  while (text.size() < 100000) text += text;
  text.resize(100000);
  while ((static_cast<unsigned char>(text.back()) & 0xC0) == 0x80) text.pop_back();
  std::vector<int32_t> ids;
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(t.encode(text, true, false, &ids).is_ok());
  const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("encoded %zu bytes into %zu tokens in %.1f ms\n", text.size(), ids.size(),
              sec * 1e3);
  EXPECT_LT(sec, 1.0);
  EXPECT_EQ(t.decode(ids), text);
  // The same result from several threads at once.
  std::vector<std::vector<int32_t>> got(4);
  std::vector<std::thread> th;
  for (auto &g : got) th.emplace_back([&t, &text, &g] { (void)t.encode(text, true, false, &g); });
  for (auto &x : th) x.join();
  for (const auto &g : got) EXPECT_EQ(g, ids);
}

}  // namespace
}  // namespace geist
