// geist serve's model-free units: request parsing and its OpenAI-shaped errors, stop
// strings over streamed text, and the prefix cache's LRU and byte accounting.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "openai_api.h"
#include "prefix_cache.h"
#include "stop_matcher.h"

namespace geist::serve {
namespace {

GenRequest chat_ok(const std::string &body) {
  GenRequest r;
  ApiError e;
  EXPECT_TRUE(parse_gen_request(Endpoint::kChat, body, &r, &e)) << e.message;
  return r;
}

ApiError chat_err(const std::string &body, Endpoint ep = Endpoint::kChat) {
  GenRequest r;
  ApiError e;
  EXPECT_FALSE(parse_gen_request(ep, body, &r, &e)) << body;
  EXPECT_EQ(e.http_status, 400);
  EXPECT_EQ(e.type, "invalid_request_error");
  return e;
}

const char kMsgs[] =
    R"("messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Hi"}])";

TEST(ServeApiUnit, ChatFieldsMapToTheRequest) {
  GenRequest r =
      chat_ok(std::string("{") + kMsgs +
              R"(,"model":"m","max_tokens":7,"temperature":0,"top_p":0.5,"top_k":3,"min_p":0.1,
                             "seed":42,"stop":["a","","bc"],"stream":true,"stream_options":{"include_usage":true},
                             "logprobs":true,"top_logprobs":2,"repeat_penalty":1.1,"frequency_penalty":0,
                             "some_unknown_field":{"x":1}})");
  ASSERT_EQ(r.messages.size(), 2u);
  EXPECT_EQ(r.messages[0].role, "system");
  EXPECT_EQ(r.messages[1].content, "Hi");
  EXPECT_EQ(r.model, "m");
  EXPECT_EQ(r.max_tokens, 7);
  EXPECT_EQ(*r.sampling.temperature, 0.0);
  EXPECT_EQ(*r.sampling.top_p, 0.5);
  EXPECT_EQ(*r.sampling.top_k, 3);
  EXPECT_DOUBLE_EQ(*r.sampling.min_p, 0.1);
  EXPECT_EQ(*r.sampling.seed, 42u);
  EXPECT_DOUBLE_EQ(*r.sampling.repeat_penalty, 1.1);
  EXPECT_EQ(r.stop, (std::vector<std::string>{"a", "bc"}));  // the empty one matches nothing
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
  EXPECT_TRUE(r.logprobs);
  EXPECT_EQ(r.top_logprobs, 2);
  EXPECT_TRUE(r.cache_prompt);
}

TEST(ServeApiUnit, DefaultsNullsPartsAndNewNames) {
  GenRequest r = chat_ok(std::string("{") + kMsgs + R"(,"temperature":null,"seed":-1,"stop":"x"})");
  EXPECT_FALSE(r.sampling.temperature.has_value());
  EXPECT_FALSE(r.sampling.seed.has_value());  // -1: random
  EXPECT_EQ(r.max_tokens, -1);
  EXPECT_EQ(r.stop, (std::vector<std::string>{"x"}));
  r = chat_ok(R"({"messages":[{"role":"developer","content":"S"},
                 {"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}],
                 "max_tokens":5,"max_completion_tokens":9,"seed":18446744073709551615})");
  EXPECT_EQ(r.messages[0].role, "system");
  EXPECT_EQ(r.messages[1].content, "ab");
  EXPECT_EQ(r.max_tokens, 9);
  EXPECT_EQ(*r.sampling.seed, 18446744073709551615ull);
}

TEST(ServeApiUnit, CompletionPrompts) {
  GenRequest r;
  ApiError e;
  ASSERT_TRUE(
      parse_gen_request(Endpoint::kCompletions, R"({"prompt":"Once","logprobs":3})", &r, &e));
  EXPECT_EQ(r.prompt, "Once");
  EXPECT_FALSE(r.prompt_is_tokens);
  EXPECT_TRUE(r.logprobs);
  EXPECT_EQ(r.top_logprobs, 3);
  ASSERT_TRUE(parse_gen_request(Endpoint::kCompletions, R"({"prompt":[2, 100, 7]})", &r, &e));
  EXPECT_TRUE(r.prompt_is_tokens);
  EXPECT_EQ(r.prompt_tokens, (std::vector<int32_t>{2, 100, 7}));
  ASSERT_TRUE(parse_gen_request(Endpoint::kCompletions, R"({"prompt":["one"]})", &r, &e));
  EXPECT_EQ(r.prompt, "one");
  EXPECT_EQ(chat_err(R"({"prompt":["a","b"]})", Endpoint::kCompletions).param, "prompt");
  EXPECT_EQ(chat_err(R"({"prompt":[1,-2]})", Endpoint::kCompletions).param, "prompt");
  EXPECT_EQ(chat_err(R"({"prompt":[1,2.5]})", Endpoint::kCompletions).param, "prompt");
  EXPECT_EQ(chat_err(R"({"prompt":5})", Endpoint::kCompletions).code, "invalid_type");
  EXPECT_EQ(chat_err(R"({})", Endpoint::kCompletions).code, "missing_required_parameter");
  EXPECT_EQ(chat_err(R"({"prompt":"x","logprobs":6})", Endpoint::kCompletions).param, "logprobs");
  EXPECT_EQ(chat_err(R"({"prompt":"x","echo":true})", Endpoint::kCompletions).param, "echo");
  EXPECT_EQ(chat_err(R"({"prompt":"x","best_of":2})", Endpoint::kCompletions).param, "best_of");
}

TEST(ServeApiUnit, InvalidRequestsNameTheParameter) {
  EXPECT_EQ(chat_err("{").code, "invalid_json");
  EXPECT_EQ(chat_err("").code, "invalid_json");
  EXPECT_EQ(chat_err("[1]").code, "invalid_type");
  EXPECT_EQ(chat_err(R"({"messages":null})").code, "missing_required_parameter");
  EXPECT_EQ(chat_err(R"({"messages":"hi"})").param, "messages");
  EXPECT_EQ(chat_err(R"({"messages":[]})").param, "messages");
  EXPECT_EQ(chat_err(R"({"messages":[1]})").param, "messages[0]");
  EXPECT_EQ(chat_err(R"({"messages":[{"content":"x"}]})").param, "messages[0].role");
  EXPECT_EQ(chat_err(R"({"messages":[{"role":"tool","content":"x"}]})").code, "unsupported_value");
  EXPECT_EQ(chat_err(R"({"messages":[{"role":"user"}]})").param, "messages[0].content");
  EXPECT_EQ(chat_err(R"({"messages":[{"role":"user","content":7}]})").param, "messages[0].content");
  EXPECT_EQ(chat_err(R"({"messages":[{"role":"user","content":[{"type":"image_url"}]}]})").code,
            "unsupported_value");
  const std::string m = std::string("{") + kMsgs;
  EXPECT_EQ(chat_err(m + R"(,"n":2})").param, "n");
  EXPECT_EQ(chat_err(m + R"(,"n":"1"})").param, "n");
  EXPECT_EQ(chat_err(m + R"(,"temperature":"hot"})").code, "invalid_type");
  EXPECT_EQ(chat_err(m + R"(,"temperature":2.5})").param, "temperature");
  EXPECT_EQ(chat_err(m + R"(,"top_p":-0.1})").param, "top_p");
  EXPECT_EQ(chat_err(m + R"(,"min_p":1.5})").param, "min_p");
  EXPECT_EQ(chat_err(m + R"(,"repeat_penalty":0})").param, "repeat_penalty");
  EXPECT_EQ(chat_err(m + R"(,"top_k":1.5})").param, "top_k");
  EXPECT_EQ(chat_err(m + R"(,"max_tokens":-1})").param, "max_tokens");
  EXPECT_EQ(chat_err(m + R"(,"max_tokens":1e3})").param, "max_tokens");
  EXPECT_EQ(chat_err(m + R"(,"max_tokens":99999999999999999999})").param, "max_tokens");
  EXPECT_EQ(chat_err(m + R"(,"seed":-2})").param, "seed");
  EXPECT_EQ(chat_err(m + R"(,"seed":1.5})").param, "seed");
  EXPECT_EQ(chat_err(m + R"(,"stop":5})").param, "stop");
  EXPECT_EQ(chat_err(m + R"(,"stop":["a",1]})").param, "stop");
  EXPECT_EQ(
      chat_err(m +
               R"(,"stop":["a","b","c","d","e","f","g","h","i","j","k","l","m","n","o","p","q"]})")
          .param,
      "stop");
  EXPECT_EQ(chat_err(m + R"(,"stream":"yes"})").param, "stream");
  EXPECT_EQ(chat_err(m + R"(,"stream_options":{"include_usage":1}})").param,
            "stream_options.include_usage");
  EXPECT_EQ(chat_err(m + R"(,"logprobs":1})").param, "logprobs");
  EXPECT_EQ(chat_err(m + R"(,"top_logprobs":21,"logprobs":true})").param, "top_logprobs");
  EXPECT_EQ(chat_err(m + R"(,"top_logprobs":2})").param, "top_logprobs");
  EXPECT_EQ(chat_err(m + R"(,"tools":[{"type":"function"}]})").param, "tools");
  EXPECT_EQ(chat_err(m + R"(,"response_format":{"type":"json_object"}})").param, "response_format");
  EXPECT_EQ(chat_err(m + R"(,"model":3})").param, "model");
  EXPECT_EQ(chat_err(m + R"(,"cache_prompt":"no"})").param, "cache_prompt");
}

TEST(ServeApiUnit, ErrorJsonShape) {
  ApiError e = ApiError::invalid("bad", "temperature");
  const nlohmann::json j = e.to_json();
  EXPECT_EQ(j["error"]["message"], "bad");
  EXPECT_EQ(j["error"]["type"], "invalid_request_error");
  EXPECT_EQ(j["error"]["param"], "temperature");
  EXPECT_EQ(j["error"]["code"], "invalid_value");
  e.param.clear();
  e.code.clear();
  EXPECT_TRUE(e.to_json()["error"]["param"].is_null());
  EXPECT_TRUE(e.to_json()["error"]["code"].is_null());
}

TEST(ServeApiUnit, DeepNestingAndJunkAreErrorsNotCrashes) {
  const std::string deep = std::string(200000, '[') + std::string(200000, ']');
  chat_err(deep);
  chat_err(std::string("{\"messages\":") + std::string(100000, '[') + "]");
  chat_err(std::string("\xff\xfe{}", 4));
  GenRequest r;
  ApiError e;
  // Invalid UTF-8 inside a string is refused by the JSON parser.
  EXPECT_FALSE(parse_gen_request(Endpoint::kCompletions, "{\"prompt\":\"\xc3\x28\"}", &r, &e));
}

TEST(ServeApiUnit, TokenizeRequests) {
  TokenizeRequest t;
  ApiError e;
  ASSERT_TRUE(
      parse_tokenize_request(R"({"content":"hi","add_special":true,"with_pieces":true})", &t, &e));
  EXPECT_EQ(t.content, "hi");
  EXPECT_TRUE(t.add_special);
  EXPECT_TRUE(t.parse_special);
  EXPECT_TRUE(t.with_pieces);
  EXPECT_FALSE(parse_tokenize_request(R"({"content":1})", &t, &e));
  EXPECT_EQ(e.param, "content");
  std::vector<int32_t> ids;
  ASSERT_TRUE(parse_detokenize_request(R"({"tokens":[1,2,3]})", &ids, &e));
  EXPECT_EQ(ids, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_FALSE(parse_detokenize_request(R"({"tokens":[1,-1]})", &ids, &e));
  EXPECT_FALSE(parse_detokenize_request(R"({"tokens":[4294967296]})", &ids, &e));
  EXPECT_FALSE(parse_detokenize_request(R"({"tokens":"1"})", &ids, &e));
  EXPECT_FALSE(parse_detokenize_request(R"({})", &ids, &e));
}

// Feeds pieces and returns everything emitted plus the flush.
std::string run_stop(std::vector<std::string> stops, const std::vector<std::string> &pieces,
                     bool *stopped) {
  StopMatcher m(std::move(stops));
  std::string out;
  for (const std::string &p : pieces) out += m.push(p);
  *stopped = m.stopped();
  return out + m.flush();
}

TEST(ServeApiUnit, StopStringsSpanPiecesAndAreNeverEmitted) {
  bool stopped = false;
  EXPECT_EQ(run_stop({"END"}, {"abc E", "N", "D tail"}, &stopped), "abc ");
  EXPECT_TRUE(stopped);
  EXPECT_EQ(run_stop({"END"}, {"abc E", "N", "x"}, &stopped), "abc ENx");
  EXPECT_FALSE(stopped);
  EXPECT_EQ(run_stop({"END"}, {"abc EN"}, &stopped), "abc EN");  // held back, then flushed
  EXPECT_FALSE(stopped);
  // The earliest match of several wins, whichever string it is.
  EXPECT_EQ(run_stop({"zz", "b"}, {"a", "bzz"}, &stopped), "a");
  EXPECT_EQ(run_stop({"aab"}, {"a", "a", "a", "b"}, &stopped), "a");
  EXPECT_TRUE(stopped);
  EXPECT_EQ(run_stop({}, {"x", "y"}, &stopped), "xy");
  EXPECT_EQ(run_stop({"\n\n"}, {"line\n", "\nnext"}, &stopped), "line");
  // Nothing that could still become a stop string is emitted early.
  StopMatcher m({"<end>"});
  EXPECT_EQ(m.push("text <e"), "text ");
  EXPECT_EQ(m.push("n"), "");
  EXPECT_EQ(m.push("x"), "<enx");
  EXPECT_EQ(m.push("<end>more"), "");
  EXPECT_TRUE(m.stopped());
  EXPECT_EQ(m.push("after"), "");
  EXPECT_EQ(m.flush(), "");
}

std::shared_ptr<const std::vector<uint8_t>> image(size_t n) {
  return std::make_shared<const std::vector<uint8_t>>(n, uint8_t(7));
}

TEST(ServeApiUnit, PrefixCacheFindsTheLongestPrefix) {
  PrefixCache c(1 << 20);
  ASSERT_TRUE(c.insert({1, 2, 3}, image(10)));
  ASSERT_TRUE(c.insert({1, 2, 3, 4, 5}, image(10)));
  ASSERT_TRUE(c.insert({1, 9}, image(10)));
  const int32_t p[] = {1, 2, 3, 4, 5, 6};
  const PrefixCache::Entry *e = c.find_longest_prefix(p, 6, 6);
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->tokens.size(), 5u);
  e = c.find_longest_prefix(p, 6, 4);  // capped length
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->tokens.size(), 3u);
  EXPECT_EQ(c.find_longest_prefix(p, 2, 2), nullptr);  // {1,2} is no entry
  const int32_t q[] = {1, 2, 7};
  EXPECT_EQ(c.longest_common_prefix(q, 3), 2u);
  EXPECT_TRUE(c.touch(p, 3));
  EXPECT_FALSE(c.touch(p, 4));
  // Same tokens again: replaced, not duplicated.
  ASSERT_TRUE(c.insert({1, 2, 3}, image(20)));
  EXPECT_EQ(c.size(), 3u);
}

TEST(ServeApiUnit, PrefixCacheHoldsItsByteCapAndEvictsLeastRecentlyUsed) {
  const size_t cost = PrefixCache::entry_cost(2, 1000);
  EXPECT_EQ(cost, 1000 + 2 * sizeof(int32_t) + PrefixCache::kEntryOverhead);
  PrefixCache c(3 * cost);  // room for exactly three
  for (int32_t k = 0; k < 3; ++k) {
    ASSERT_TRUE(c.make_room(cost));
    ASSERT_TRUE(c.insert({k, k}, image(1000)));
  }
  EXPECT_EQ(c.bytes(), 3 * cost);
  const int32_t zero[] = {0, 0};
  ASSERT_NE(c.find_longest_prefix(zero, 2, 2), nullptr);  // {0,0} is now the most recent
  ASSERT_TRUE(c.make_room(cost));
  EXPECT_EQ(c.evictions(), 1u);
  ASSERT_TRUE(c.insert({3, 3}, image(1000)));
  const int32_t one[] = {1, 1};
  EXPECT_EQ(c.find_longest_prefix(one, 2, 2), nullptr);  // the LRU one went
  EXPECT_NE(c.find_longest_prefix(zero, 2, 2), nullptr);
  EXPECT_LE(c.bytes(), c.capacity());
  // Larger than the whole cache: refused, nothing evicted.
  EXPECT_FALSE(c.make_room(3 * cost + 1));
  EXPECT_EQ(c.size(), 3u);
  EXPECT_FALSE(c.insert({9, 9, 9}, image(3 * cost)));
  EXPECT_LE(c.bytes(), c.capacity());
  // Many inserts of varying size never exceed the cap.
  for (int32_t k = 0; k < 200; ++k) {
    const size_t n = 100 + size_t(k * 37 % 900);
    if (c.make_room(PrefixCache::entry_cost(1, n))) c.insert({100 + k}, image(n));
    ASSERT_LE(c.bytes(), c.capacity());
  }
  PrefixCache off(0);
  EXPECT_FALSE(off.make_room(1));
}

TEST(ServeApiUnit, TokensHashAndCommonPrefix) {
  const int32_t a[] = {1, 2, 3}, b[] = {1, 2, 4};
  EXPECT_NE(tokens_hash(a, 3), tokens_hash(b, 3));
  EXPECT_EQ(tokens_hash(a, 2), tokens_hash(b, 2));
  EXPECT_EQ(common_prefix(a, 3, b, 3), 2u);
  EXPECT_EQ(common_prefix(a, 0, b, 3), 0u);
  EXPECT_EQ(common_prefix(a, 3, a, 3), 3u);
}

}  // namespace
}  // namespace geist::serve
