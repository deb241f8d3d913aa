// The gemma4 BPE tokenizer against the HF `tokenizers` package: the tiny Gemma 4 GGUFs
// carry a synthetic vocabulary built with that package (scripts/make_gemma4_vocab.py), and
// tests/data/tokenizer/gemma4_ref.jsonl holds what HF made of 228 strings (plain and
// escaped spaces, newline runs, byte fallback for CJK and emoji, special-token texts,
// random slices of a public-domain text). Also: BOS is always added, decode inverts
// encode, and the Gemma 4 turn markers end generation.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "engine/tokenizer.h"
#include "gguf/gguf_reader.h"
#include "test_util.h"

namespace geist {
namespace {

Tokenizer load() {
  auto f = gguf::GgufFile::open(test::data_path("gemma4/tiny_gemma4_a_q8_0.gguf"));
  EXPECT_TRUE(f.is_ok()) << f.status().to_string();
  auto t = Tokenizer::from_gguf(**f);
  EXPECT_TRUE(t.is_ok()) << t.status().to_string();
  return std::move(t).value();
}

TEST(Gemma4Tokenizer, MatchesHfTokenizers) {
  const Tokenizer tok = load();
  EXPECT_EQ(tok.vocab().model, "gemma4");
  const std::vector<uint8_t> raw = test::read_file(test::data_path("tokenizer/gemma4_ref.jsonl"));
  std::istringstream in(std::string(raw.begin(), raw.end()));
  std::string line;
  int n = 0, ok = 0;
  while (std::getline(in, line)) {
    const nlohmann::json j = nlohmann::json::parse(line);
    const std::string text = j["text"].get<std::string>();
    const std::vector<int32_t> want = j["ids"].get<std::vector<int32_t>>();
    std::vector<int32_t> got;
    // HF matches added (special) tokens inside the text, as parse_special does.
    ASSERT_TRUE(tok.encode(text, false, true, &got));
    ++n;
    if (got == want) {
      ++ok;
    } else {
      ADD_FAILURE() << "text " << nlohmann::json(text).dump() << "\n  geist " << nlohmann::json(got).dump()
                    << "\n  hf    " << nlohmann::json(want).dump();
    }
  }
  std::printf("%d / %d strings tokenized as HF tokenizers does\n", ok, n);
  EXPECT_GE(n, 200);
}

TEST(Gemma4Tokenizer, BosForcedDecodeInverts) {
  const Tokenizer tok = load();
  std::vector<int32_t> ids;
  ASSERT_TRUE(tok.encode("In the beginning \xE4\xB8\xAD\n\nend", true, false, &ids));
  ASSERT_FALSE(ids.empty());
  EXPECT_EQ(ids[0], 2);  // <bos>
  EXPECT_EQ(tok.decode(std::vector<int32_t>(ids.begin() + 1, ids.end())), "In the beginning \xE4\xB8\xAD\n\nend");
  const auto turn_end = tok.find_token("<turn|>");
  ASSERT_TRUE(turn_end.has_value());
  EXPECT_TRUE(tok.is_eog(*turn_end));
  EXPECT_TRUE(tok.is_eog(1));  // <eos>
}

}  // namespace
}  // namespace geist
