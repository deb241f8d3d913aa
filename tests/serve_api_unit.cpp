// geist serve's model-free units: request parsing and its OpenAI-shaped errors, stop
// strings over streamed text, the prefix cache's LRU and byte accounting, and the disk
// cache's file names and removal of stale temporary files.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "cache_files.h"
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

// The cache's bookkeeping over plain byte images (the server's are api::State).
struct Bytes : std::vector<uint8_t> {
  using std::vector<uint8_t>::vector;
};
size_t image_bytes(const Bytes &b) { return b.capacity(); }
std::shared_ptr<Bytes> new_image(size_t n, Bytes *) {
  auto b = std::make_shared<Bytes>();
  b->reserve(n);
  return b;
}
using ByteCache = PrefixCacheOf<Bytes>;

std::shared_ptr<Bytes> image(size_t n) {
  return std::make_shared<Bytes>(n, uint8_t(7));
}

TEST(ServeApiUnit, PrefixCacheFindsTheLongestPrefix) {
  ByteCache c(1 << 20);
  ASSERT_TRUE(c.insert({1, 2, 3}, image(10)));
  ASSERT_TRUE(c.insert({1, 2, 3, 4, 5}, image(10)));
  ASSERT_TRUE(c.insert({1, 9}, image(10)));
  const int32_t p[] = {1, 2, 3, 4, 5, 6};
  const ByteCache::Entry *e = c.find_longest_prefix(p, 6, 6);
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
  const size_t cost = ByteCache::entry_cost(2, 1000);
  EXPECT_EQ(cost, 1000 + 2 * sizeof(int32_t) + ByteCache::kEntryOverhead);
  ByteCache c(3 * cost);  // room for exactly three
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
    if (c.make_room(ByteCache::entry_cost(1, n))) c.insert({100 + k}, image(n));
    ASSERT_LE(c.bytes(), c.capacity());
  }
  ByteCache off(0);
  EXPECT_FALSE(off.make_room(1));
}

TEST(ServeApiUnit, PrefixCacheImageCapacityRoundsUpByAtMostAnEighth) {
  EXPECT_EQ(image_capacity(0), 0u);
  EXPECT_EQ(image_capacity(1), 1u);
  EXPECT_EQ(image_capacity(size_t(16) << 20), size_t(16) << 20);
  EXPECT_EQ(image_capacity((size_t(16) << 20) + 1), size_t(18)
                                                                     << 20);  // steps of 2 MiB
  for (size_t n :
       {size_t(7), size_t(1000), size_t(123457), size_t(20600000), SIZE_MAX - 5, SIZE_MAX}) {
    const size_t c = image_capacity(n);
    EXPECT_GE(c, n) << n;
    EXPECT_LE(c - n, n / 8) << n;
  }
}

// Collects the cache's image buffers (capacity charged) to compare with bytes().
size_t charged(const ByteCache &c) {
  size_t b = 0;
  for (const ByteCache::Entry &e : c.entries())
    b += ByteCache::entry_cost(e.tokens.size(), e.image->capacity());
  return b;
}

TEST(ServeApiUnit, PrefixCacheTakesImagesIntoEvictedBuffersWithinItsCap) {
  const size_t n = 100000, want = image_capacity(n);
  ASSERT_EQ(want, 106496u);  // 13 x 8192, the eighth of 65536
  const size_t cost = ByteCache::entry_cost(2, want);
  ByteCache c(2 * cost);  // room for exactly two
  std::vector<const uint8_t *> data;
  for (int32_t k = 0; k < 2; ++k) {
    std::shared_ptr<Bytes> b = c.image_buffer(2, n);
    ASSERT_NE(b, nullptr);
    EXPECT_EQ(b->capacity(), want);  // reserved at the rounded size, nothing to reuse yet
    b->assign(n, uint8_t(k));
    data.push_back(b->data());
    ASSERT_TRUE(c.insert({k, k}, b));
  }
  EXPECT_EQ(c.buffers_reused(), 0u);
  EXPECT_EQ(c.bytes(), 2 * cost);
  // Full: a slightly longer image takes the buffer of the entry evicted for it ({0,0}).
  std::shared_ptr<Bytes> b = c.image_buffer(2, n + 10);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(c.evictions(), 1u);
  EXPECT_EQ(c.buffers_reused(), 1u);
  EXPECT_EQ(b->data(), data[0]);
  EXPECT_LE(c.bytes() + ByteCache::entry_cost(2, b->capacity()), c.capacity());
  b->resize(n + 10);
  ASSERT_TRUE(c.insert({2, 2}, b));
  EXPECT_EQ(b->data(), data[0]);  // no reallocation
  EXPECT_EQ(c.bytes(), charged(c));
  // An image someone else still holds (a pending disk write) is evicted but not reused,
  // and keeps its bytes.
  std::shared_ptr<const std::vector<uint8_t>> held;
  for (const ByteCache::Entry &e : c.entries())
    if (e.tokens == std::vector<int32_t>{1, 1}) held = e.image;
  ASSERT_NE(held, nullptr);
  b = c.image_buffer(2, n);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(c.evictions(), 2u);
  EXPECT_EQ(c.buffers_reused(), 1u);
  EXPECT_NE(b->data(), held->data());
  EXPECT_EQ(*held, std::vector<uint8_t>(n, uint8_t(1)));
  // A buffer far larger than the image needs is not taken for it.
  ByteCache big(ByteCache::entry_cost(1, 8 * want));
  ASSERT_TRUE(big.insert({1}, image(8 * want)));
  b = big.image_buffer(1, n);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(big.evictions(), 1u);
  EXPECT_EQ(big.buffers_reused(), 0u);
  EXPECT_EQ(b->capacity(), want);
  // Too large for the cache: nullptr, nothing evicted.
  EXPECT_EQ(big.image_buffer(1, 9 * want), nullptr);
}

TEST(ServeApiUnit, PrefixCacheReusingBuffersNeverExceedsItsCap) {
  // Images of varying length through a cache of a few entries: what it charges is what its
  // buffers hold, and that plus the buffer being filled never exceeds the cap.
  ByteCache c(5 * ByteCache::entry_cost(4, 80000));
  for (int32_t k = 0; k < 400; ++k) {
    const size_t n = 20000 + size_t(k * 7919 % 60000);
    std::shared_ptr<Bytes> b = c.image_buffer(4, n);
    ASSERT_NE(b, nullptr);
    ASSERT_GE(b->capacity(), n);
    ASSERT_LE(c.bytes() + ByteCache::entry_cost(4, b->capacity()), c.capacity()) << k;
    const uint8_t *p = b->data();
    b->resize(n);
    ASSERT_TRUE(p == nullptr || b->data() == p) << k;  // filled in place
    ASSERT_TRUE(c.insert({k, k, k, k}, b));
    ASSERT_EQ(c.bytes(), charged(c));
    ASSERT_LE(c.bytes(), c.capacity());
  }
  EXPECT_GT(c.buffers_reused(), 100u);
}

TEST(ServeApiUnit, TokensHashAndCommonPrefix) {
  const int32_t a[] = {1, 2, 3}, b[] = {1, 2, 4};
  EXPECT_NE(tokens_hash(a, 3), tokens_hash(b, 3));
  EXPECT_EQ(tokens_hash(a, 2), tokens_hash(b, 2));
  EXPECT_EQ(common_prefix(a, 3, b, 3), 2u);
  EXPECT_EQ(common_prefix(a, 0, b, 3), 0u);
  EXPECT_EQ(common_prefix(a, 3, a, 3), 3u);
}

TEST(ServeApiUnit, CacheFileNames) {
  uint64_t h = 0;
  EXPECT_TRUE(cache_entry_name("00000000000000ff.geistsnap", &h));
  EXPECT_EQ(h, 0xffu);
  for (const char *bad : {"00000000000000FF.geistsnap", "00000000000000ff.geistsnap.tmp.12",
                          "0000000000000ff.geistsnap", "00000000000000ff.geistsnapx", "x.geistsnap"}) {
    EXPECT_FALSE(cache_entry_name(bad, &h)) << bad;
  }
  long pid = 0;
  EXPECT_EQ(cache_temp_name("d/00000000000000ff.geistsnap", 42), "d/00000000000000ff.geistsnap.tmp.42");
  EXPECT_TRUE(cache_temp_name_pid("00000000000000ff.geistsnap.tmp.42", &pid));
  EXPECT_EQ(pid, 42);
  for (const char *bad : {"00000000000000ff.geistsnap.tmp.", "00000000000000ff.geistsnap.tmp.042",
                          "00000000000000ff.geistsnap.tmp.0", "00000000000000ff.geistsnap.tmp.4x",
                          "00000000000000ff.geistsnap.tmp.1234567890", "00000000000000fF.geistsnap.tmp.42",
                          "00000000000000ff.geistsnap.tmp42", "notes.geistsnap.tmp.42", "00000000000000ff.geistsnap"}) {
    EXPECT_FALSE(cache_temp_name_pid(bad, &pid)) << bad;
  }
}

TEST(ServeApiUnit, OnlyStaleTemporaryFilesOfGeistAreRemoved) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("geist_serve_api_unit_" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const pid_t child = fork();  // a pid that no process has (once reaped)
  if (child == 0) _exit(0);
  ASSERT_GT(child, 0);
  ASSERT_EQ(waitpid(child, nullptr, 0), child);
  const std::string dead = std::to_string(child), self = std::to_string(getpid()),
                    parent = std::to_string(getppid());
  auto put = [&](const std::string &name, const std::string &bytes) {
    std::ofstream(dir / name, std::ios::binary) << bytes;
  };
  auto tmp = [](char c, const std::string &pid) { return std::string(16, c) + ".geistsnap.tmp." + pid; };
  const std::string magic = "GEISTSNP and the rest";
  // Removed: a gone writer's file with nothing, part of the magic, or the magic and more
  // written; this process's (a server calls this before it writes).
  put(tmp('1', dead), magic);
  put(tmp('2', dead), "");
  put(tmp('3', dead), "GEI");
  put(tmp('4', self), magic);
  // Kept: a running writer's, other bytes, a symlink, a directory, other names.
  put(tmp('5', parent), magic);
  put(tmp('6', dead), "not a snapshot");
  put("target", magic);
  fs::create_symlink(dir / "target", dir / tmp('7', dead));
  fs::create_directory(dir / tmp('8', dead));
  const std::vector<std::string> others = {std::string(16, 'a') + ".geistsnap", "notes.geistsnap.tmp." + dead,
                                           std::string(16, 'b') + ".geistsnap.tmp.0" + dead,
                                           std::string(16, 'B') + ".geistsnap.tmp." + dead, "target"};
  for (const std::string &o : others) {
    if (!fs::exists(dir / o)) put(o, magic);
  }
  size_t kept = 0;
  std::string why;
  EXPECT_EQ(cache_remove_stale_temps(dir.string(), &kept, &why), 4u);
  EXPECT_EQ(kept, 4u) << why;
  for (char c : {'1', '2', '3'}) EXPECT_FALSE(fs::exists(fs::symlink_status(dir / tmp(c, dead)))) << c;
  EXPECT_FALSE(fs::exists(dir / tmp('4', self)));
  EXPECT_TRUE(fs::is_regular_file(dir / tmp('5', parent)));
  EXPECT_TRUE(fs::is_regular_file(dir / tmp('6', dead)));
  EXPECT_TRUE(fs::is_symlink(dir / tmp('7', dead)));
  EXPECT_TRUE(fs::is_directory(dir / tmp('8', dead)));
  for (const std::string &o : others) EXPECT_TRUE(fs::is_regular_file(dir / o)) << o;
  std::ifstream t(dir / "target", std::ios::binary);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(t), {}), magic);
  EXPECT_EQ(cache_remove_stale_temps((dir / "absent").string(), &kept), 0u);
  EXPECT_EQ(kept, 0u);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace geist::serve
