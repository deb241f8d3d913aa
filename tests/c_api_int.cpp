// The public C ABI's contract (include/geist/geist.h) on the tiny model, through the C
// functions only: NULL handles and pointers, the error slots (thread-local last error,
// per-session error), the size-query protocols, state and context errors that leave the
// session unchanged (logits compared by bytes), pin/reset against a prefill from scratch,
// a model freed before its sessions, load errors, load_from_memory, params validation and
// defaults, set_sampling, stats counters, snapshots. Runtime: a few seconds.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "geist/geist.h"
#include "test_util.h"

namespace {

// Tiny model facts (scripts/make_tiny_gemma3.py).
constexpr size_t kVocab = 569;
constexpr int64_t kTrainCtx = 512;
constexpr geist_token kEos = 1, kBos = 2, kStartOfTurn = 4, kEndOfTurn = 5;
constexpr int kSlidingLayers = 5, kWindow = 8;

std::string tiny_path() {
  return geist::test::data_path("tiny_gemma3.gguf");
}

using SessionPtr = std::unique_ptr<geist_session, decltype(&geist_session_free)>;
using ModelPtr = std::unique_ptr<geist_model, decltype(&geist_model_free)>;

// n pseudo-random ordinary token ids (no control tokens), different per salt.
std::vector<geist_token> seq(size_t n, uint32_t salt) {
  std::vector<geist_token> t(n);
  uint32_t x = 2463534242u ^ (salt * 2654435761u);
  for (auto &id : t) {
    x ^= x << 13, x ^= x >> 17, x ^= x << 5;
    id = static_cast<geist_token>(10 + x % (kVocab - 10));
  }
  return t;
}

std::vector<geist_token> cat(std::vector<geist_token> a, const std::vector<geist_token> &b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// The session's logits, copied ([n_vocab] floats), or empty if it has none.
std::vector<float> logits_of(const geist_session *s) {
  size_t nv = 12345;
  const float *l = geist_session_logits(s, &nv);
  if (!l) {
    EXPECT_EQ(nv, 0u);
    return {};
  }
  EXPECT_EQ(nv, kVocab);
  return std::vector<float>(l, l + nv);
}

::testing::AssertionResult same_bytes(const std::vector<float> &a, const std::vector<float> &b) {
  if (a.empty() || a.size() != b.size()) {
    return ::testing::AssertionFailure() << "sizes " << a.size() << " and " << b.size();
  }
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) {
      return ::testing::AssertionFailure()
             << "first difference at " << i << ": " << a[i] << " vs " << b[i];
    }
  }
  return ::testing::AssertionSuccess();
}

std::vector<geist_token> tokens_of(const geist_session *s) {
  size_t n = 0;
  std::vector<geist_token> t(geist_session_n_tokens(s) + 1);
  EXPECT_EQ(geist_session_tokens(s, t.data(), t.size(), &n), GEIST_OK) << geist_last_error();
  t.resize(n);
  return t;
}

struct geist_session_stats stats_of(const geist_session *s) {
  struct geist_session_stats st;
  std::memset(&st, 0xAB, sizeof st);
  EXPECT_EQ(geist_session_stats(s, &st), GEIST_OK);
  return st;
}

// Everything a failed call must leave as it was.
struct State {
  size_t n_tokens, n_pinned;
  std::vector<geist_token> tokens;
  std::vector<float> logits;
  explicit State(const geist_session *s)
      : n_tokens(geist_session_n_tokens(s)),
        n_pinned(geist_session_n_pinned(s)),
        tokens(tokens_of(s)),
        logits(logits_of(s)) {}
};

#define EXPECT_UNCHANGED(s, before)                          \
  do {                                                       \
    const State now_(s);                                     \
    EXPECT_EQ(now_.n_tokens, (before).n_tokens);             \
    EXPECT_EQ(now_.n_pinned, (before).n_pinned);             \
    EXPECT_EQ(now_.tokens, (before).tokens);                 \
    if ((before).logits.empty()) {                           \
      EXPECT_TRUE(now_.logits.empty());                      \
    } else {                                                 \
      EXPECT_TRUE(same_bytes(now_.logits, (before).logits)); \
    }                                                        \
  } while (0)

// Puts a message unique to this call into geist_last_error() (a failed load of a path
// that names it), so a check after the call under test can tell whether it wrote its own.
std::string prime_last_error() {
  static int counter = 0;
  const std::string path = "/nonexistent/geist-marker-" + std::to_string(++counter);
  geist_model *m = nullptr;
  EXPECT_EQ(geist_model_load(path.c_str(), nullptr, &m), GEIST_E_IO);
  const std::string msg = geist_last_error();
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
  return msg;
}

// Same for the session's slot: prefill_logits from a row past the end, a row number
// unique to this call (checked before anything else, so it fails in any state).
std::string prime_session_error(geist_session *s) {
  static size_t counter = 0;
  const geist_token t = 10;
  float out = 0;
  const size_t first = 1000 + ++counter;
  EXPECT_EQ(geist_session_prefill_logits(s, &t, 1, first, &out, 1), GEIST_E_INVALID_ARGUMENT);
  const std::string msg = geist_session_error(s);
  EXPECT_NE(msg.find(std::to_string(first)), std::string::npos) << msg;
  return msg;
}

// The call returns `status` and writes a fresh, non-empty, one-line geist_last_error().
#define EXPECT_FAILS(call, status)                                              \
  do {                                                                          \
    const std::string before_ = prime_last_error();                             \
    EXPECT_EQ((call), (status)) << #call;                                       \
    const std::string after_ = geist_last_error();                              \
    EXPECT_FALSE(after_.empty()) << #call;                                      \
    EXPECT_NE(after_, before_) << #call << " did not set geist_last_error()";   \
    EXPECT_EQ(after_.find('\n'), std::string::npos) << #call << ": " << after_; \
  } while (0)

// As EXPECT_FAILS, and the session's own slot holds the same message.
#define EXPECT_SESSION_FAILS(s, call, status)                          \
  do {                                                                 \
    const std::string sbefore_ = prime_session_error(s);               \
    EXPECT_FAILS(call, status);                                        \
    EXPECT_NE(std::string(geist_session_error(s)), sbefore_)           \
        << #call << " did not set geist_session_error()";              \
    EXPECT_STREQ(geist_session_error(s), geist_last_error()) << #call; \
  } while (0)

class CApi : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ASSERT_EQ(geist_model_load(tiny_path().c_str(), nullptr, &model_), GEIST_OK)
        << geist_last_error();
  }
  static void TearDownTestSuite() {
    geist_model_free(model_);
    model_ = nullptr;
  }
  void SetUp() override { ASSERT_NE(model_, nullptr) << "the tiny model did not load"; }

  // A greedy single-threaded session.
  static SessionPtr make(int64_t n_ctx = 0, int32_t chunk = 256, geist_model *m = model_) {
    geist_session_params p = geist_session_params_default();
    p.n_ctx = n_ctx;
    p.n_threads = 1;
    p.chunk = chunk;
    p.sampling.temperature = 0;
    geist_session *s = nullptr;
    EXPECT_EQ(geist_session_create(m, &p, &s), GEIST_OK) << geist_last_error();
    return SessionPtr(s, geist_session_free);
  }
  // Logits after prefilling t into a fresh session (chunk as given).
  static std::vector<float> scratch(const std::vector<geist_token> &t, int32_t chunk = 7) {
    SessionPtr s = make(64, chunk);
    EXPECT_EQ(geist_session_prefill_tokens(s.get(), t.data(), t.size()), GEIST_OK)
        << geist_last_error();
    return logits_of(s.get());
  }
  static std::vector<geist_token> tokenize(const std::string &text, int add_bos,
                                           int parse_special) {
    std::vector<geist_token> t(text.size() + 2);
    size_t n = 0;
    EXPECT_EQ(geist_tokenize(model_, text.data(), text.size(), add_bos, parse_special, t.data(),
                             t.size(), &n),
              GEIST_OK)
        << geist_last_error();
    t.resize(n);
    return t;
  }

  static geist_model *model_;
};
geist_model *CApi::model_ = nullptr;

// ---- Names, version --------------------------------------------------------------

TEST(CApiStatic, StatusNamesAndVersion) {
  EXPECT_STREQ(geist_status_name(GEIST_OK), "GEIST_OK");
  EXPECT_STREQ(geist_status_name(GEIST_E_BAD_FORMAT), "GEIST_E_BAD_FORMAT");
  EXPECT_STREQ(geist_status_name(GEIST_E_MISMATCH), "GEIST_E_MISMATCH");
  std::vector<std::string> seen;
  for (int i = 0; i < GEIST_STATUS_COUNT; ++i) {
    const char *name = geist_status_name(static_cast<geist_status>(i));
    ASSERT_NE(name, nullptr);
    EXPECT_EQ(std::string(name).rfind("GEIST_", 0), 0u) << name;
    for (const std::string &o : seen) EXPECT_NE(o, name) << "status " << i;
    seen.push_back(name);
  }
  ASSERT_NE(geist_status_name(GEIST_STATUS_COUNT), nullptr);
  ASSERT_NE(geist_status_name(static_cast<geist_status>(-1)), nullptr);
  ASSERT_NE(geist_status_name(static_cast<geist_status>(1000)), nullptr);
  ASSERT_NE(geist_version(), nullptr);
  EXPECT_EQ(std::string(geist_version()).rfind("0.1.0", 0), 0u) << geist_version();
}

// examples/python/pinned_prefix.py declares these structs by hand (ctypes); a field
// appended to the header must be appended there too.
TEST(CApiStatic, StructLayoutsOfThePythonExample) {
  EXPECT_EQ(sizeof(geist_sampling_params), 40u);
  EXPECT_EQ(offsetof(geist_sampling_params, temperature), 4u);
  EXPECT_EQ(offsetof(geist_sampling_params, repeat_last_n), 24u);
  EXPECT_EQ(offsetof(geist_sampling_params, seed), 32u);
  EXPECT_EQ(sizeof(geist_session_params), 72u);
  EXPECT_EQ(offsetof(geist_session_params, n_threads), 4u);
  EXPECT_EQ(offsetof(geist_session_params, n_ctx), 8u);
  EXPECT_EQ(offsetof(geist_session_params, chunk), 16u);
  EXPECT_EQ(offsetof(geist_session_params, type_k), 20u);
  EXPECT_EQ(offsetof(geist_session_params, type_v), 24u);
  EXPECT_EQ(offsetof(geist_session_params, sampling), 32u);
  EXPECT_EQ(sizeof(struct geist_session_stats), 19 * 8u);
  EXPECT_EQ(offsetof(struct geist_session_stats, kv_bytes_reserved), 14 * 8u);
  EXPECT_EQ(offsetof(struct geist_session_stats, last_decode_seconds), 17 * 8u);
  EXPECT_EQ(offsetof(struct geist_session_stats, scratch_bytes), 18 * 8u);
}

TEST(CApiStatic, LastErrorIsThreadLocal) {
  std::string fresh = "unset", other_msg;
  geist_status other_st = GEIST_OK;
  const std::string mine = prime_last_error();
  std::thread t([&] {
    fresh = geist_last_error();  // nothing failed on this thread yet
    geist_model *m = nullptr;
    other_st = geist_model_load(nullptr, nullptr, &m);
    other_msg = geist_last_error();
  });
  t.join();
  EXPECT_EQ(fresh, "");
  EXPECT_EQ(other_st, GEIST_E_INVALID_ARGUMENT);
  EXPECT_FALSE(other_msg.empty());
  EXPECT_NE(other_msg, mine);
  EXPECT_EQ(std::string(geist_last_error()), mine)
      << "a failure on another thread changed this thread's message";
}

// ---- NULL handles and pointers ---------------------------------------------------

TEST_F(CApi, NullArgumentsOfModelFunctions) {
  int dummy = 0;
  geist_model *const junk = reinterpret_cast<geist_model *>(&dummy);
  geist_model *m = junk;
  EXPECT_FAILS(geist_model_load(nullptr, nullptr, &m), GEIST_E_INVALID_ARGUMENT);
  EXPECT_EQ(m, nullptr);
  EXPECT_FAILS(geist_model_load(tiny_path().c_str(), nullptr, nullptr), GEIST_E_INVALID_ARGUMENT);
  const char bytes[16] = "GGUF";
  m = junk;
  EXPECT_FAILS(geist_model_load_from_memory(nullptr, 16, nullptr, &m), GEIST_E_INVALID_ARGUMENT);
  EXPECT_EQ(m, nullptr);
  m = junk;
  EXPECT_FAILS(geist_model_load_from_memory(bytes, 0, nullptr, &m), GEIST_E_INVALID_ARGUMENT);
  EXPECT_EQ(m, nullptr);
  EXPECT_FAILS(geist_model_load_from_memory(bytes, sizeof bytes, nullptr, nullptr),
               GEIST_E_INVALID_ARGUMENT);
  geist_model_free(nullptr);

  geist_model_info info;
  EXPECT_FAILS(geist_model_get_info(nullptr, &info), GEIST_E_INVALID_ARGUMENT);
  EXPECT_FAILS(geist_model_get_info(model_, nullptr), GEIST_E_INVALID_ARGUMENT);

  geist_token t[8];
  size_t n = 777;
  EXPECT_FAILS(geist_tokenize(nullptr, "a", 1, 0, 0, t, 8, &n), GEIST_E_INVALID_ARGUMENT);
  EXPECT_FAILS(geist_tokenize(model_, "a", 1, 0, 0, t, 8, nullptr), GEIST_E_INVALID_ARGUMENT);
  EXPECT_FAILS(geist_tokenize(model_, nullptr, 1, 0, 0, t, 8, &n), GEIST_E_INVALID_ARGUMENT);
  EXPECT_FAILS(geist_tokenize(model_, "a", 1, 0, 0, nullptr, 8, &n), GEIST_E_INVALID_ARGUMENT);
  // NULL text of length 0 is the empty text.
  EXPECT_EQ(geist_tokenize(model_, nullptr, 0, 0, 0, nullptr, 0, &n), GEIST_OK)
      << geist_last_error();
  EXPECT_EQ(n, 0u);
  EXPECT_EQ(geist_tokenize(model_, nullptr, 0, 1, 0, t, 8, &n), GEIST_OK) << geist_last_error();
  ASSERT_EQ(n, 1u);
  EXPECT_EQ(t[0], kBos);

  char buf[32];
  EXPECT_FAILS(geist_token_to_piece(nullptr, 10, buf, sizeof buf, &n), GEIST_E_INVALID_ARGUMENT);
  EXPECT_FAILS(geist_token_to_piece(model_, 10, buf, sizeof buf, nullptr),
               GEIST_E_INVALID_ARGUMENT);
  EXPECT_FAILS(geist_token_to_piece(model_, 10, nullptr, 4, &n), GEIST_E_INVALID_ARGUMENT);
  EXPECT_FAILS(geist_token_to_piece(model_, -1, buf, sizeof buf, &n), GEIST_E_INVALID_ARGUMENT);
  EXPECT_FAILS(geist_token_to_piece(model_, static_cast<geist_token>(kVocab), buf, sizeof buf, &n),
               GEIST_E_INVALID_ARGUMENT);

  const geist_token ids[2] = {10, 11}, bad[2] = {10, static_cast<geist_token>(kVocab)};
  EXPECT_FAILS(geist_detokenize(nullptr, ids, 2, 0, buf, sizeof buf, &n), GEIST_E_INVALID_ARGUMENT);
  EXPECT_FAILS(geist_detokenize(model_, ids, 2, 0, buf, sizeof buf, nullptr),
               GEIST_E_INVALID_ARGUMENT);
  EXPECT_FAILS(geist_detokenize(model_, nullptr, 2, 0, buf, sizeof buf, &n),
               GEIST_E_INVALID_ARGUMENT);
  EXPECT_FAILS(geist_detokenize(model_, ids, 2, 0, nullptr, 4, &n), GEIST_E_INVALID_ARGUMENT);
  EXPECT_FAILS(geist_detokenize(model_, bad, 2, 0, buf, sizeof buf, &n), GEIST_E_INVALID_ARGUMENT);
  EXPECT_EQ(geist_detokenize(model_, nullptr, 0, 0, nullptr, 0, &n), GEIST_OK)
      << geist_last_error();
  EXPECT_EQ(n, 0u);

  EXPECT_EQ(geist_token_is_eog(nullptr, kEos), 0);
  EXPECT_EQ(geist_token_is_eog(model_, -1), 0);
  EXPECT_EQ(geist_token_is_eog(model_, static_cast<geist_token>(kVocab)), 0);
  EXPECT_EQ(geist_token_is_eog(model_, std::numeric_limits<geist_token>::max()), 0);
  EXPECT_EQ(geist_token_is_eog(model_, kEos), 1);
  EXPECT_EQ(geist_token_is_eog(model_, kEndOfTurn), 1);
  EXPECT_EQ(geist_token_is_eog(model_, kBos), 0);
  EXPECT_EQ(geist_token_is_eog(model_, kStartOfTurn), 0);

  int sdummy = 0;
  geist_session *s = reinterpret_cast<geist_session *>(&sdummy);
  EXPECT_FAILS(geist_session_create(nullptr, nullptr, &s), GEIST_E_INVALID_ARGUMENT);
  EXPECT_EQ(s, nullptr);
  EXPECT_FAILS(geist_session_create(model_, nullptr, nullptr), GEIST_E_INVALID_ARGUMENT);
}

// The kernels' tier as the API reports it: the tier the CPU supports unless GEIST_ISA
// lowered it, and weights repacked exactly when a SIMD tier is in use.
TEST_F(CApi, BackendInfo) {
  EXPECT_FAILS(geist_model_get_backend(nullptr, nullptr), GEIST_E_INVALID_ARGUMENT);
  geist_backend_info b;
  EXPECT_FAILS(geist_model_get_backend(model_, nullptr), GEIST_E_INVALID_ARGUMENT);
  ASSERT_EQ(geist_model_get_backend(model_, &b), GEIST_OK);
  const std::string isa = b.isa, best = b.isa_best;
  EXPECT_TRUE(isa == "generic" || isa == "avx2" || isa == "avx2vnni" || isa == "avx512") << isa;
  const char *env = std::getenv("GEIST_ISA");
  if (!env || !*env) {
    EXPECT_EQ(isa, best);
  }
  EXPECT_EQ(std::string(b.isa_detail).rfind(isa, 0), 0u) << b.isa_detail;
  EXPECT_EQ(b.packed_bytes > 0, isa != "generic");
  EXPECT_GE(b.repack_seconds, 0.0);
}

TEST_F(CApi, NullSessionHandle) {
  const geist_token t[2] = {10, 11};
  geist_token tok = -5;
  float out[2 * kVocab];
  size_t n = 777;
  char buf[64];
  const geist_sampling_params sp = geist_sampling_params_default();
  struct geist_session_stats st;
  geist_session_free(nullptr);
  EXPECT_STREQ(geist_session_error(nullptr), "");
  EXPECT_FAILS(geist_session_prefill_tokens(nullptr, t, 2), GEIST_E_INVALID_ARGUMENT);
  EXPECT_FAILS(geist_session_prefill_logits(nullptr, t, 2, 0, out, 2 * kVocab),
               GEIST_E_INVALID_ARGUMENT);
  EXPECT_FAILS(geist_session_pin_prefix(nullptr, t, 2), GEIST_E_INVALID_ARGUMENT);
  EXPECT_FAILS(geist_session_unpin(nullptr), GEIST_E_INVALID_ARGUMENT);
  EXPECT_FAILS(geist_session_reset(nullptr), GEIST_E_INVALID_ARGUMENT);
  EXPECT_FAILS(geist_session_wait(nullptr), GEIST_E_INVALID_ARGUMENT);
  EXPECT_FAILS(geist_session_clear(nullptr), GEIST_E_INVALID_ARGUMENT);
  EXPECT_FAILS(geist_session_decode_step(nullptr, &tok), GEIST_E_INVALID_ARGUMENT);
  EXPECT_FAILS(geist_session_sample(nullptr, &tok), GEIST_E_INVALID_ARGUMENT);
  EXPECT_EQ(tok, -5);
  EXPECT_FAILS(geist_session_set_sampling(nullptr, &sp), GEIST_E_INVALID_ARGUMENT);
  size_t nv = 99;
  EXPECT_EQ(geist_session_logits(nullptr, &nv), nullptr);
  EXPECT_EQ(nv, 0u);
  EXPECT_EQ(geist_session_logits(nullptr, nullptr), nullptr);
  EXPECT_EQ(geist_session_n_tokens(nullptr), 0u);
  EXPECT_EQ(geist_session_n_pinned(nullptr), 0u);
  EXPECT_EQ(geist_session_n_ctx(nullptr), 0u);
  EXPECT_EQ(geist_session_n_vocab(nullptr), 0u);
  EXPECT_FAILS(geist_session_tokens(nullptr, &tok, 1, &n), GEIST_E_INVALID_ARGUMENT);
  EXPECT_FAILS(geist_session_snapshot_size(nullptr, &n), GEIST_E_INVALID_ARGUMENT);
  EXPECT_FAILS(geist_session_snapshot(nullptr, buf, sizeof buf, &n), GEIST_E_INVALID_ARGUMENT);
  EXPECT_FAILS(geist_session_restore(nullptr, buf, sizeof buf), GEIST_E_INVALID_ARGUMENT);
  const std::string path = ::testing::TempDir() + "/c_api_int_null.snap";
  EXPECT_FAILS(geist_session_save_file(nullptr, path.c_str()), GEIST_E_INVALID_ARGUMENT);
  EXPECT_FAILS(geist_session_load_file(nullptr, path.c_str()), GEIST_E_INVALID_ARGUMENT);
  EXPECT_FAILS(geist_session_stats(nullptr, &st), GEIST_E_INVALID_ARGUMENT);
  std::ifstream f(path);
  EXPECT_FALSE(f.good()) << "save_file(NULL) wrote " << path;
}

TEST_F(CApi, NullPointersIntoSession) {
  SessionPtr sp = make(64, 4);
  geist_session *s = sp.get();
  const std::vector<geist_token> t = seq(5, 1);
  ASSERT_EQ(geist_session_pin_prefix(s, t.data(), 3), GEIST_OK);
  ASSERT_EQ(geist_session_prefill_tokens(s, t.data() + 3, 2), GEIST_OK);
  const State before(s);
  float out[2 * kVocab];
  EXPECT_SESSION_FAILS(s, geist_session_prefill_tokens(s, nullptr, 2), GEIST_E_INVALID_ARGUMENT);
  EXPECT_SESSION_FAILS(s, geist_session_prefill_tokens(s, t.data(), 0), GEIST_E_INVALID_ARGUMENT);
  EXPECT_SESSION_FAILS(s, geist_session_prefill_logits(s, nullptr, 2, 0, out, 2 * kVocab),
                       GEIST_E_INVALID_ARGUMENT);
  EXPECT_SESSION_FAILS(s, geist_session_prefill_logits(s, t.data(), 2, 0, nullptr, 2 * kVocab),
                       GEIST_E_INVALID_ARGUMENT);
  EXPECT_SESSION_FAILS(s, geist_session_prefill_logits(s, t.data(), 2, 2, out, 2 * kVocab),
                       GEIST_E_INVALID_ARGUMENT);
  EXPECT_SESSION_FAILS(s, geist_session_prefill_logits(s, t.data(), 0, 0, out, 2 * kVocab),
                       GEIST_E_INVALID_ARGUMENT);
  EXPECT_SESSION_FAILS(s, geist_session_pin_prefix(s, nullptr, 2), GEIST_E_INVALID_ARGUMENT);
  EXPECT_SESSION_FAILS(s, geist_session_pin_prefix(s, t.data(), 0), GEIST_E_INVALID_ARGUMENT);
  EXPECT_SESSION_FAILS(s, geist_session_decode_step(s, nullptr), GEIST_E_INVALID_ARGUMENT);
  EXPECT_SESSION_FAILS(s, geist_session_sample(s, nullptr), GEIST_E_INVALID_ARGUMENT);
  EXPECT_SESSION_FAILS(s, geist_session_set_sampling(s, nullptr), GEIST_E_INVALID_ARGUMENT);
  EXPECT_SESSION_FAILS(s, geist_session_tokens(s, nullptr, 0, nullptr), GEIST_E_INVALID_ARGUMENT);
  EXPECT_SESSION_FAILS(s, geist_session_snapshot_size(s, nullptr), GEIST_E_INVALID_ARGUMENT);
  EXPECT_SESSION_FAILS(s, geist_session_snapshot(s, nullptr, 0, nullptr), GEIST_E_INVALID_ARGUMENT);
  EXPECT_SESSION_FAILS(s, geist_session_restore(s, nullptr, 100), GEIST_E_INVALID_ARGUMENT);
  EXPECT_SESSION_FAILS(s, geist_session_save_file(s, nullptr), GEIST_E_INVALID_ARGUMENT);
  EXPECT_SESSION_FAILS(s, geist_session_load_file(s, nullptr), GEIST_E_INVALID_ARGUMENT);
  EXPECT_SESSION_FAILS(s, geist_session_stats(s, nullptr), GEIST_E_INVALID_ARGUMENT);
  EXPECT_UNCHANGED(s, before);
  // Getters with a NULL out-pointer.
  EXPECT_NE(geist_session_logits(s, nullptr), nullptr);
}

TEST_F(CApi, SessionErrorIsPerSession) {
  SessionPtr a = make(64), b = make(64);
  EXPECT_STREQ(geist_session_error(a.get()), "");
  EXPECT_STREQ(geist_session_error(b.get()), "");
  geist_token tok;
  EXPECT_EQ(geist_session_decode_step(a.get(), &tok), GEIST_E_STATE);
  EXPECT_STRNE(geist_session_error(a.get()), "");
  EXPECT_STREQ(geist_session_error(b.get()), "")
      << "a failure on one session wrote another's message";
  EXPECT_STREQ(geist_session_error(a.get()), geist_last_error());
  // A model-level failure does not touch a session's slot.
  const std::string msg = geist_session_error(a.get());
  prime_last_error();
  EXPECT_EQ(std::string(geist_session_error(a.get())), msg);
}

// Two threads on one session (forbidden by the header): the second thread's calls are
// refused with GEIST_E_STATE while the first is inside one, instead of corrupting the
// session. Every call that was not refused took effect exactly once.
TEST_F(CApi, SecondThreadOnASessionIsRefused) {
  SessionPtr s = make(4096, 16);
  std::vector<geist_token> t(64);
  for (size_t i = 0; i < t.size(); ++i) t[i] = geist_token(3 + i % 200);
  std::atomic<bool> stop{false};
  std::atomic<int> a_ok{0}, a_refused{0}, b_ok{0}, b_refused{0}, other{0};
  std::string other_msg;
  auto worker = [&](std::atomic<int> *ok, std::atomic<int> *refused, size_t n) {
    while (!stop.load()) {
      const geist_status st = geist_session_prefill_tokens(s.get(), t.data(), n);
      if (st == GEIST_OK) {
        ok->fetch_add(1);
      } else if (st == GEIST_E_STATE) {
        EXPECT_NE(std::string(geist_last_error()).find("in use by another thread"), std::string::npos)
            << geist_last_error();
        refused->fetch_add(1);
      } else if (st == GEIST_E_CONTEXT_FULL) {
        size_t dummy = 0;
        if (geist_session_snapshot_size(s.get(), &dummy) == GEIST_OK) geist_session_clear(s.get());
      } else {
        other.fetch_add(1);
      }
    }
  };
  std::thread a(worker, &a_ok, &a_refused, size_t(64)), b(worker, &b_ok, &b_refused, size_t(1));
  const auto t0 = std::chrono::steady_clock::now();
  while (a_refused.load() + b_refused.load() < 20 &&
         std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  stop = true;
  a.join();
  b.join();
  EXPECT_EQ(other.load(), 0);
  EXPECT_GT(a_refused.load() + b_refused.load(), 0) << "the threads never overlapped in 5 s";
  EXPECT_GT(a_ok.load() + b_ok.load(), 0);
  // The session is intact: it still prefills and decodes, and its tokens are consistent.
  ASSERT_EQ(geist_session_clear(s.get()), GEIST_OK);
  ASSERT_EQ(geist_session_prefill_tokens(s.get(), t.data(), t.size()), GEIST_OK) << geist_last_error();
  geist_token next = -1;
  EXPECT_EQ(geist_session_decode_step(s.get(), &next), GEIST_OK);
  EXPECT_EQ(geist_session_n_tokens(s.get()), t.size() + 1);
  EXPECT_EQ(logits_of(s.get()).size(), size_t(geist_session_n_vocab(s.get())));
}

// ---- Size queries ----------------------------------------------------------------

TEST_F(CApi, TokenizeSizeQuery) {
  const std::string text = "<start_of_turn>user\nhello world, this is a test";
  size_t needed = 0;
  EXPECT_FAILS(geist_tokenize(model_, text.data(), text.size(), 1, 1, nullptr, 0, &needed),
               GEIST_E_BUFFER_TOO_SMALL);
  const std::vector<geist_token> ref = tokenize(text, 1, 1);
  ASSERT_GE(ref.size(), 4u);
  EXPECT_EQ(needed, ref.size());
  EXPECT_EQ(ref[0], kBos);
  EXPECT_EQ(ref[1], kStartOfTurn);
  std::vector<geist_token> buf(needed + 3, -7);
  size_t n = 0;
  EXPECT_FAILS(geist_tokenize(model_, text.data(), text.size(), 1, 1, buf.data(), needed - 1, &n),
               GEIST_E_BUFFER_TOO_SMALL);
  EXPECT_EQ(n, needed);
  EXPECT_EQ(buf, std::vector<geist_token>(needed + 3, -7)) << "a too-small buffer was written";
  ASSERT_EQ(geist_tokenize(model_, text.data(), text.size(), 1, 1, buf.data(), buf.size(), &n),
            GEIST_OK);
  EXPECT_EQ(n, needed);
  EXPECT_EQ(std::vector<geist_token>(buf.begin(), buf.begin() + n), ref);
  EXPECT_EQ(buf[n], -7);
  // parse_special: the marker is one control token only when asked.
  EXPECT_EQ(tokenize("<start_of_turn>", 0, 1), std::vector<geist_token>{kStartOfTurn});
  const std::vector<geist_token> plain = tokenize("<start_of_turn>", 0, 0);
  EXPECT_GT(plain.size(), 1u);
  for (geist_token t : plain) EXPECT_NE(t, kStartOfTurn);
  // add_bos=0: no BOS.
  const std::vector<geist_token> nobos = tokenize(text, 0, 1);
  EXPECT_EQ(nobos, std::vector<geist_token>(ref.begin() + 1, ref.end()));
}

TEST_F(CApi, TokenToPieceSizeQuery) {
  size_t needed = 0;
  EXPECT_FAILS(geist_token_to_piece(model_, kBos, nullptr, 0, &needed), GEIST_E_BUFFER_TOO_SMALL);
  EXPECT_EQ(needed, 5u);  // "<bos>"
  char buf[16];
  std::memset(buf, '#', sizeof buf);
  size_t n = 0;
  EXPECT_FAILS(geist_token_to_piece(model_, kBos, buf, needed - 1, &n), GEIST_E_BUFFER_TOO_SMALL);
  EXPECT_EQ(n, needed);
  EXPECT_EQ(std::string(buf, sizeof buf), std::string(sizeof buf, '#'));
  ASSERT_EQ(geist_token_to_piece(model_, kBos, buf, needed, &n), GEIST_OK);
  EXPECT_EQ(std::string(buf, n), "<bos>");
  EXPECT_EQ(buf[n], '#') << "the piece is not NUL-terminated";
  // Every id has a piece; the pieces of a tokenized text spell it.
  const std::string text = "hello world";
  std::string spelled;
  for (geist_token t : tokenize(text, 0, 0)) {
    ASSERT_EQ(geist_token_to_piece(model_, t, buf, sizeof buf, &n), GEIST_OK) << geist_last_error();
    spelled.append(buf, n);
  }
  EXPECT_EQ(spelled, text);  // pieces render SPM's U+2581 as a space
}

TEST_F(CApi, DetokenizeSizeQuery) {
  const std::string text = "hello world, this is a test";
  const std::vector<geist_token> ids = cat({kBos}, tokenize(text, 0, 0));
  size_t needed = 0;
  EXPECT_FAILS(geist_detokenize(model_, ids.data(), ids.size(), 0, nullptr, 0, &needed),
               GEIST_E_BUFFER_TOO_SMALL);
  EXPECT_EQ(needed, text.size());
  std::string buf(needed + 4, '#');
  size_t n = 0;
  EXPECT_FAILS(geist_detokenize(model_, ids.data(), ids.size(), 0, buf.data(), needed - 1, &n),
               GEIST_E_BUFFER_TOO_SMALL);
  EXPECT_EQ(n, needed);
  EXPECT_EQ(buf, std::string(needed + 4, '#'));
  ASSERT_EQ(geist_detokenize(model_, ids.data(), ids.size(), 0, buf.data(), buf.size(), &n),
            GEIST_OK);
  EXPECT_EQ(buf.substr(0, n), text);  // BOS dropped
  ASSERT_EQ(geist_detokenize(model_, ids.data(), ids.size(), 1, buf.data(), buf.size(), &n),
            GEIST_E_BUFFER_TOO_SMALL);
  EXPECT_EQ(n, text.size() + 5);  // "<bos>" rendered
}

TEST_F(CApi, SessionTokensSizeQuery) {
  SessionPtr sp = make(64);
  geist_session *s = sp.get();
  size_t n = 777;
  EXPECT_EQ(geist_session_tokens(s, nullptr, 0, &n), GEIST_OK) << "empty session";
  EXPECT_EQ(n, 0u);
  const std::vector<geist_token> t = seq(6, 2);
  ASSERT_EQ(geist_session_prefill_tokens(s, t.data(), t.size()), GEIST_OK);
  EXPECT_SESSION_FAILS(s, geist_session_tokens(s, nullptr, 0, &n), GEIST_E_BUFFER_TOO_SMALL);
  EXPECT_EQ(n, t.size());
  std::vector<geist_token> buf(8, -7);
  EXPECT_SESSION_FAILS(s, geist_session_tokens(s, buf.data(), 5, &n), GEIST_E_BUFFER_TOO_SMALL);
  EXPECT_EQ(n, t.size());
  EXPECT_EQ(buf, std::vector<geist_token>(8, -7)) << "a too-small buffer was written";
  ASSERT_EQ(geist_session_tokens(s, buf.data(), buf.size(), &n), GEIST_OK);
  EXPECT_EQ(n, t.size());
  EXPECT_EQ(std::vector<geist_token>(buf.begin(), buf.begin() + 6), t);
  EXPECT_EQ(buf[6], -7);
}

TEST_F(CApi, SnapshotSizeQuery) {
  SessionPtr sp = make(64, 4);
  geist_session *s = sp.get();
  const std::vector<geist_token> t = seq(12, 3);
  ASSERT_EQ(geist_session_pin_prefix(s, t.data(), 9), GEIST_OK);
  ASSERT_EQ(geist_session_prefill_tokens(s, t.data() + 9, 3), GEIST_OK);
  size_t size = 0, w = 0;
  ASSERT_EQ(geist_session_snapshot_size(s, &size), GEIST_OK);
  ASSERT_GT(size, kVocab * sizeof(float));  // it holds the logits at least
  EXPECT_SESSION_FAILS(s, geist_session_snapshot(s, nullptr, 0, &w), GEIST_E_BUFFER_TOO_SMALL);
  EXPECT_EQ(w, size);
  std::vector<uint8_t> buf(size + 8, 0x5A);
  w = 0;
  EXPECT_SESSION_FAILS(s, geist_session_snapshot(s, buf.data(), size - 1, &w),
                       GEIST_E_BUFFER_TOO_SMALL);
  EXPECT_EQ(w, size);
  EXPECT_EQ(buf, std::vector<uint8_t>(size + 8, 0x5A)) << "a too-small buffer was written";
  w = 0;
  ASSERT_EQ(geist_session_snapshot(s, buf.data(), buf.size(), &w), GEIST_OK) << geist_last_error();
  EXPECT_EQ(w, size);
  EXPECT_EQ(buf[size], 0x5A);
  // Documented: "buf may be NULL if cap 0", so NULL with cap > 0 is an invalid argument.
  EXPECT_SESSION_FAILS(s, geist_session_snapshot(s, nullptr, size, &w), GEIST_E_INVALID_ARGUMENT);
}

// ---- Saved states -------------------------------------------------------------------

using StatePtr = std::unique_ptr<geist_state, decltype(&geist_state_free)>;
StatePtr new_state() {
  geist_state *st = nullptr;
  EXPECT_EQ(geist_state_create(&st), GEIST_OK) << geist_last_error();
  return StatePtr(st, geist_state_free);
}

TEST_F(CApi, SavedStates) {
  SessionPtr a = make(64, 4), b = make(64, 16);
  const std::vector<geist_token> t = seq(20, 7);
  ASSERT_EQ(geist_session_pin_prefix(a.get(), t.data(), 9), GEIST_OK);
  ASSERT_EQ(geist_session_prefill_tokens(a.get(), t.data() + 9, 11), GEIST_OK);
  StatePtr st = new_state();
  EXPECT_EQ(geist_state_bytes(st.get()), 0u);
  size_t n = 7, size = 0, w = 0, want = 0;
  EXPECT_EQ(geist_state_tokens(st.get(), nullptr, 0, &n), GEIST_OK);
  EXPECT_EQ(n, 0u);
  EXPECT_EQ(geist_state_snapshot_size(st.get(), &size), GEIST_E_STATE);
  EXPECT_SESSION_FAILS(b.get(), geist_session_load_state(b.get(), st.get()), GEIST_E_STATE);

  ASSERT_EQ(geist_session_state_bytes(a.get(), &want), GEIST_OK);
  ASSERT_EQ(geist_session_save_state(a.get(), st.get()), GEIST_OK) << geist_last_error();
  EXPECT_GE(geist_state_bytes(st.get()), want);
  EXPECT_LE(geist_state_bytes(st.get()), want + want / 8);
  std::vector<geist_token> got(t.size());
  ASSERT_EQ(geist_state_tokens(st.get(), got.data(), got.size(), &n), GEIST_OK);
  EXPECT_EQ(got, t);
  EXPECT_EQ(geist_state_tokens(st.get(), got.data(), 3, &n), GEIST_E_BUFFER_TOO_SMALL);
  EXPECT_EQ(n, t.size());
  // Its snapshot is the session's.
  ASSERT_EQ(geist_state_snapshot_size(st.get(), &size), GEIST_OK);
  std::vector<uint8_t> img(size), ref(size);
  EXPECT_EQ(geist_state_snapshot(st.get(), img.data(), size - 1, &w), GEIST_E_BUFFER_TOO_SMALL);
  EXPECT_EQ(w, size);
  EXPECT_EQ(geist_state_snapshot(st.get(), nullptr, size, &w), GEIST_E_INVALID_ARGUMENT);
  ASSERT_EQ(geist_state_snapshot(st.get(), img.data(), size, &w), GEIST_OK);
  ASSERT_EQ(geist_session_snapshot(a.get(), ref.data(), ref.size(), &w), GEIST_OK);
  EXPECT_EQ(img, ref);

  // Loaded into another session (another chunk): the same logits, pin and decode.
  ASSERT_EQ(geist_session_load_state(b.get(), st.get()), GEIST_OK) << geist_last_error();
  EXPECT_EQ(logits_of(a.get()), logits_of(b.get()));
  EXPECT_EQ(geist_session_n_pinned(b.get()), 9u);
  geist_token ta = -1, tb = -2;
  ASSERT_EQ(geist_session_decode_step(a.get(), &ta), GEIST_OK);
  ASSERT_EQ(geist_session_decode_step(b.get(), &tb), GEIST_OK);
  EXPECT_EQ(ta, tb);
  EXPECT_EQ(logits_of(a.get()), logits_of(b.get()));
  ASSERT_EQ(geist_session_reset(b.get()), GEIST_OK);
  EXPECT_EQ(geist_session_n_tokens(b.get()), 9u);

  // NULLs.
  EXPECT_EQ(geist_state_create(nullptr), GEIST_E_INVALID_ARGUMENT);
  EXPECT_SESSION_FAILS(a.get(), geist_session_save_state(a.get(), nullptr), GEIST_E_INVALID_ARGUMENT);
  EXPECT_SESSION_FAILS(a.get(), geist_session_load_state(a.get(), nullptr), GEIST_E_INVALID_ARGUMENT);
  EXPECT_EQ(geist_session_save_state(nullptr, st.get()), GEIST_E_INVALID_ARGUMENT);
  EXPECT_EQ(geist_session_state_bytes(a.get(), nullptr), GEIST_E_INVALID_ARGUMENT);
  EXPECT_EQ(geist_state_bytes(nullptr), 0u);
  EXPECT_EQ(geist_state_tokens(nullptr, nullptr, 0, &n), GEIST_E_INVALID_ARGUMENT);
  EXPECT_EQ(geist_state_snapshot_size(st.get(), nullptr), GEIST_E_INVALID_ARGUMENT);
  geist_state_free(nullptr);
  // The state outlives its session.
  a.reset();
  SessionPtr c = make(64, 1);
  ASSERT_EQ(geist_session_load_state(c.get(), st.get()), GEIST_OK) << geist_last_error();
  EXPECT_EQ(geist_session_n_tokens(c.get()), t.size());
}

// A state saved into by one thread while others load from it: every call either works or
// is refused with GEIST_E_STATE, and every load sees a whole state (one of the two saved).
TEST_F(CApi, SavedStateSharedBetweenThreads) {
  const std::vector<geist_token> t = seq(24, 9);
  SessionPtr s1 = make(64, 8), s2 = make(64, 8);
  ASSERT_EQ(geist_session_prefill_tokens(s1.get(), t.data(), 24), GEIST_OK);
  ASSERT_EQ(geist_session_prefill_tokens(s2.get(), t.data(), 12), GEIST_OK);
  const std::vector<float> l1 = logits_of(s1.get()), l2 = logits_of(s2.get());
  StatePtr st = new_state();
  ASSERT_EQ(geist_session_save_state(s1.get(), st.get()), GEIST_OK);
  std::atomic<bool> stop{false};
  std::atomic<int> saves{0}, loads{0}, refused{0}, other{0}, torn{0};
  std::thread saver([&] {
    for (int i = 0; !stop.load(); ++i) {
      const geist_status r = geist_session_save_state((i % 2 ? s1 : s2).get(), st.get());
      (r == GEIST_OK ? saves : r == GEIST_E_STATE ? refused : other).fetch_add(1);
    }
  });
  auto loader = [&] {
    SessionPtr l = make(64, 8);
    while (!stop.load()) {
      const geist_status r = geist_session_load_state(l.get(), st.get());
      if (r == GEIST_OK) {
        loads.fetch_add(1);
        const std::vector<float> g = logits_of(l.get());
        if (g != l1 && g != l2) torn.fetch_add(1);
      } else {
        (r == GEIST_E_STATE ? refused : other).fetch_add(1);
      }
    }
  };
  std::thread r1(loader), r2(loader);
  const auto t0 = std::chrono::steady_clock::now();
  while ((saves.load() < 20 || loads.load() < 20) && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  stop = true;
  saver.join();
  r1.join();
  r2.join();
  EXPECT_EQ(other.load(), 0);
  EXPECT_EQ(torn.load(), 0);
  EXPECT_GT(saves.load(), 0);
  EXPECT_GT(loads.load(), 0);
}

TEST_F(CApi, PrefillLogitsBufferTooSmall) {
  SessionPtr sp = make(64, 4);
  geist_session *s = sp.get();
  const std::vector<geist_token> t = seq(10, 4);
  ASSERT_EQ(geist_session_prefill_tokens(s, t.data(), 4), GEIST_OK);
  const State before(s);
  std::vector<float> out(6 * kVocab, -1.0f);
  EXPECT_SESSION_FAILS(
      s, geist_session_prefill_logits(s, t.data() + 4, 6, 1, out.data(), 5 * kVocab - 1),
      GEIST_E_BUFFER_TOO_SMALL);
  EXPECT_UNCHANGED(s, before);
  EXPECT_EQ(out, std::vector<float>(6 * kVocab, -1.0f));
  EXPECT_EQ(stats_of(s).n_prefill_tokens, 4u) << "nothing is computed on BUFFER_TOO_SMALL";
  // Exactly enough: rows 1..5 of the call are positions 5..9; each equals a prefix prefill.
  ASSERT_EQ(geist_session_prefill_logits(s, t.data() + 4, 6, 1, out.data(), 5 * kVocab), GEIST_OK);
  EXPECT_EQ(out[5 * kVocab], -1.0f);
  for (size_t i = 1; i < 6; ++i) {
    const std::vector<float> row(out.begin() + (i - 1) * kVocab, out.begin() + i * kVocab);
    EXPECT_TRUE(same_bytes(row, scratch(std::vector<geist_token>(t.begin(), t.begin() + 5 + i))))
        << "row " << i;
  }
  EXPECT_TRUE(same_bytes(logits_of(s), scratch(t)));
}

// ---- State and context errors leave the session unchanged ------------------------

TEST_F(CApi, DecodeOnEmptySessionIsStateError) {
  SessionPtr sp = make(64);
  geist_session *s = sp.get();
  geist_token tok = -5;
  EXPECT_EQ(logits_of(s), std::vector<float>());
  EXPECT_SESSION_FAILS(s, geist_session_decode_step(s, &tok), GEIST_E_STATE);
  EXPECT_SESSION_FAILS(s, geist_session_sample(s, &tok), GEIST_E_STATE);
  EXPECT_EQ(tok, -5);
  EXPECT_EQ(geist_session_n_tokens(s), 0u);
  const std::vector<geist_token> t = seq(3, 5);
  ASSERT_EQ(geist_session_prefill_tokens(s, t.data(), t.size()), GEIST_OK);
  EXPECT_EQ(geist_session_decode_step(s, &tok), GEIST_OK) << geist_session_error(s);
  EXPECT_EQ(geist_session_n_tokens(s), 4u);
  EXPECT_EQ(geist_session_wait(s), GEIST_OK) << "nothing is queued on the CPU";
  EXPECT_EQ(geist_session_n_tokens(s), 4u);
  ASSERT_EQ(geist_session_clear(s), GEIST_OK);
  EXPECT_SESSION_FAILS(s, geist_session_decode_step(s, &tok), GEIST_E_STATE);
  ASSERT_EQ(geist_session_reset(s), GEIST_OK);  // no pin: reset empties
  EXPECT_SESSION_FAILS(s, geist_session_decode_step(s, &tok), GEIST_E_STATE);
  EXPECT_EQ(stats_of(s).n_decode_tokens, 1u);
}

TEST_F(CApi, ContextFullLeavesSessionUnchanged) {
  SessionPtr sp = make(16, 4);
  geist_session *s = sp.get();
  ASSERT_EQ(geist_session_n_ctx(s), 16u);
  const std::vector<geist_token> t = seq(17, 6);
  EXPECT_SESSION_FAILS(s, geist_session_prefill_tokens(s, t.data(), 17), GEIST_E_CONTEXT_FULL);
  EXPECT_EQ(geist_session_n_tokens(s), 0u);
  EXPECT_EQ(logits_of(s), std::vector<float>());
  ASSERT_EQ(geist_session_pin_prefix(s, t.data(), 4), GEIST_OK);
  ASSERT_EQ(geist_session_prefill_tokens(s, t.data() + 4, 11), GEIST_OK);
  geist_token tok = -5;
  ASSERT_EQ(geist_session_decode_step(s, &tok), GEIST_OK);  // 16 of 16
  const State full(s);
  ASSERT_EQ(full.n_tokens, 16u);
  const uint64_t decoded = stats_of(s).n_decode_tokens, prefilled = stats_of(s).n_prefill_tokens;
  tok = -5;
  EXPECT_SESSION_FAILS(s, geist_session_decode_step(s, &tok), GEIST_E_CONTEXT_FULL);
  EXPECT_EQ(tok, -5);
  EXPECT_UNCHANGED(s, full);
  EXPECT_SESSION_FAILS(s, geist_session_prefill_tokens(s, t.data(), 1), GEIST_E_CONTEXT_FULL);
  EXPECT_UNCHANGED(s, full);
  std::vector<float> out(kVocab);
  EXPECT_SESSION_FAILS(s, geist_session_prefill_logits(s, t.data(), 1, 0, out.data(), kVocab),
                       GEIST_E_CONTEXT_FULL);
  EXPECT_UNCHANGED(s, full);
  EXPECT_SESSION_FAILS(s, geist_session_pin_prefix(s, t.data(), 17), GEIST_E_CONTEXT_FULL);
  EXPECT_UNCHANGED(s, full);
  EXPECT_EQ(stats_of(s).n_decode_tokens, decoded);
  EXPECT_EQ(stats_of(s).n_prefill_tokens, prefilled);
  // Sampling does not append, so it still works when the context is full.
  EXPECT_EQ(geist_session_sample(s, &tok), GEIST_OK) << geist_session_error(s);
  EXPECT_UNCHANGED(s, full);
  // And the session still works: back to the pin, the same continuation fits again.
  ASSERT_EQ(geist_session_reset(s), GEIST_OK);
  EXPECT_EQ(geist_session_n_tokens(s), 4u);
  ASSERT_EQ(geist_session_prefill_tokens(s, t.data() + 4, 12), GEIST_OK);
  EXPECT_TRUE(
      same_bytes(logits_of(s), scratch(std::vector<geist_token>(t.begin(), t.begin() + 16))));
}

TEST_F(CApi, BadTokenIdLeavesSessionUnchanged) {
  SessionPtr sp = make(64, 4);
  geist_session *s = sp.get();
  std::vector<geist_token> t = seq(8, 7);
  ASSERT_EQ(geist_session_prefill_tokens(s, t.data(), 5), GEIST_OK);
  const State before(s);
  for (geist_token bad :
       {-1, static_cast<geist_token>(kVocab), std::numeric_limits<geist_token>::min()}) {
    std::vector<geist_token> b = {t[5], t[6], bad};
    EXPECT_SESSION_FAILS(s, geist_session_prefill_tokens(s, b.data(), b.size()),
                         GEIST_E_INVALID_ARGUMENT);
    EXPECT_UNCHANGED(s, before);
    std::vector<float> out(3 * kVocab);
    EXPECT_SESSION_FAILS(
        s, geist_session_prefill_logits(s, b.data(), b.size(), 0, out.data(), out.size()),
        GEIST_E_INVALID_ARGUMENT);
    EXPECT_UNCHANGED(s, before);
  }
  EXPECT_EQ(stats_of(s).n_prefill_tokens, 5u);
  // Nothing of the rejected calls leaked into the KV cache or the sampler.
  ASSERT_EQ(geist_session_prefill_tokens(s, t.data() + 5, 3), GEIST_OK);
  EXPECT_TRUE(same_bytes(logits_of(s), scratch(t)));
}

TEST_F(CApi, PinFailureKeepsOldStateAndPin) {
  SessionPtr sp = make(32, 4);
  geist_session *s = sp.get();
  const std::vector<geist_token> sys = seq(10, 8), q = seq(5, 9);
  ASSERT_EQ(geist_session_pin_prefix(s, sys.data(), sys.size()), GEIST_OK);
  const std::vector<float> pin_logits = logits_of(s);
  ASSERT_EQ(geist_session_prefill_tokens(s, q.data(), q.size()), GEIST_OK);
  const State before(s);
  ASSERT_EQ(before.n_pinned, 10u);
  std::vector<geist_token> bad = seq(12, 10);
  bad[11] = static_cast<geist_token>(kVocab);
  EXPECT_SESSION_FAILS(s, geist_session_pin_prefix(s, bad.data(), bad.size()),
                       GEIST_E_INVALID_ARGUMENT);
  EXPECT_UNCHANGED(s, before);
  const std::vector<geist_token> too_long = seq(33, 11);
  EXPECT_SESSION_FAILS(s, geist_session_pin_prefix(s, too_long.data(), too_long.size()),
                       GEIST_E_CONTEXT_FULL);
  EXPECT_UNCHANGED(s, before);
  EXPECT_SESSION_FAILS(s, geist_session_pin_prefix(s, sys.data(), 0), GEIST_E_INVALID_ARGUMENT);
  EXPECT_UNCHANGED(s, before);
  EXPECT_EQ(stats_of(s).n_pins, 1u);
  // The old pin still works.
  ASSERT_EQ(geist_session_reset(s), GEIST_OK);
  EXPECT_EQ(geist_session_n_tokens(s), 10u);
  EXPECT_EQ(tokens_of(s), sys);
  EXPECT_TRUE(same_bytes(logits_of(s), pin_logits));
}

// ---- Pin / reset --------------------------------------------------------------------

TEST_F(CApi, PinResetIsBitIdenticalToScratch) {
  SessionPtr sp = make(64, 4);  // sliding ring of W + 4 - 1 = 11 slots
  geist_session *s = sp.get();
  const std::vector<geist_token> sys = seq(10, 12), q1 = seq(12, 13), q2 = seq(3, 14);
  ASSERT_EQ(geist_session_pin_prefix(s, sys.data(), sys.size()), GEIST_OK);
  EXPECT_EQ(geist_session_n_pinned(s), 10u);
  const std::vector<float> pin_logits = logits_of(s);
  EXPECT_TRUE(same_bytes(pin_logits, scratch(sys)));

  // A request longer than the chunk overwrites ring slots the pin still needs.
  ASSERT_EQ(geist_session_prefill_tokens(s, q1.data(), q1.size()), GEIST_OK);
  EXPECT_TRUE(same_bytes(logits_of(s), scratch(cat(sys, q1))));
  std::vector<geist_token> gen;
  for (int i = 0; i < 5; ++i) {
    geist_token tok = -1;
    ASSERT_EQ(geist_session_decode_step(s, &tok), GEIST_OK) << geist_session_error(s);
    ASSERT_GE(tok, 0);
    ASSERT_LT(tok, static_cast<geist_token>(kVocab));
    gen.push_back(tok);
  }
  EXPECT_TRUE(same_bytes(logits_of(s), scratch(cat(cat(sys, q1), gen))))
      << "decode is batch invariant";
  EXPECT_EQ(tokens_of(s), cat(cat(sys, q1), gen));

  ASSERT_EQ(geist_session_reset(s), GEIST_OK);
  EXPECT_EQ(geist_session_n_tokens(s), 10u);
  EXPECT_EQ(geist_session_n_pinned(s), 10u);
  EXPECT_EQ(tokens_of(s), sys);
  EXPECT_TRUE(same_bytes(logits_of(s), pin_logits));
  EXPECT_EQ(stats_of(s).n_reset_rows, uint64_t(kSlidingLayers) * (kWindow - 1));
  ASSERT_EQ(geist_session_prefill_tokens(s, q2.data(), q2.size()), GEIST_OK);
  EXPECT_TRUE(same_bytes(logits_of(s), scratch(cat(sys, q2)))) << "after reset + prefill";

  // Decode directly after reset: the greedy token of the pin's logits.
  ASSERT_EQ(geist_session_reset(s), GEIST_OK);
  ASSERT_EQ(geist_session_reset(s), GEIST_OK);  // twice is the same as once
  geist_token tok = -1;
  ASSERT_EQ(geist_session_decode_step(s, &tok), GEIST_OK);
  size_t argmax = 0;
  for (size_t i = 1; i < kVocab; ++i) argmax = pin_logits[i] > pin_logits[argmax] ? i : argmax;
  EXPECT_EQ(tok, static_cast<geist_token>(argmax));
  EXPECT_TRUE(same_bytes(logits_of(s), scratch(cat(sys, {tok}))));
}

TEST_F(CApi, ResetRestoresTheSampler) {
  // Non-greedy sampling: the draws after a reset repeat those after the pin, so the RNG
  // state went back to the pin's, not on from where the last request left it.
  geist_session_params p = geist_session_params_default();
  p.n_ctx = 64;
  p.n_threads = 1;
  p.sampling.temperature = 1.5f;
  p.sampling.top_k = 0;
  p.sampling.top_p = 1.0f;
  p.sampling.min_p = 0.0f;
  geist_session *raw = nullptr;
  ASSERT_EQ(geist_session_create(model_, &p, &raw), GEIST_OK) << geist_last_error();
  SessionPtr sp(raw, geist_session_free);
  geist_session *s = sp.get();
  const std::vector<geist_token> sys = seq(10, 29);
  ASSERT_EQ(geist_session_pin_prefix(s, sys.data(), sys.size()), GEIST_OK);
  auto decode = [&] {
    std::vector<geist_token> out(6);
    for (geist_token &t : out) EXPECT_EQ(geist_session_decode_step(s, &t), GEIST_OK);
    return out;
  };
  const std::vector<geist_token> first = decode();
  ASSERT_EQ(geist_session_reset(s), GEIST_OK);
  EXPECT_EQ(decode(), first);
  ASSERT_EQ(geist_session_reset(s), GEIST_OK);
  geist_token t = -1;
  ASSERT_EQ(geist_session_sample(s, &t), GEIST_OK);
  EXPECT_EQ(t, first[0]);
  // The draws are random, not the greedy path.
  SessionPtr g = make(64);
  ASSERT_EQ(geist_session_prefill_tokens(g.get(), sys.data(), sys.size()), GEIST_OK);
  std::vector<geist_token> greedy(6);
  for (geist_token &x : greedy) ASSERT_EQ(geist_session_decode_step(g.get(), &x), GEIST_OK);
  EXPECT_NE(first, greedy);
}

TEST_F(CApi, UnpinAndClear) {
  SessionPtr sp = make(64, 4);
  geist_session *s = sp.get();
  const std::vector<geist_token> sys = seq(10, 15), q = seq(3, 16);
  ASSERT_EQ(geist_session_pin_prefix(s, sys.data(), sys.size()), GEIST_OK);
  ASSERT_EQ(geist_session_prefill_tokens(s, q.data(), q.size()), GEIST_OK);
  const std::vector<float> l = logits_of(s);
  ASSERT_EQ(geist_session_unpin(s), GEIST_OK);
  EXPECT_EQ(geist_session_n_pinned(s), 0u);
  EXPECT_EQ(geist_session_n_tokens(s), 13u) << "unpin keeps the tokens";
  EXPECT_TRUE(same_bytes(logits_of(s), l));
  EXPECT_EQ(stats_of(s).checkpoint_bytes, 0u);
  ASSERT_EQ(geist_session_reset(s), GEIST_OK);  // nothing pinned: back to empty
  EXPECT_EQ(geist_session_n_tokens(s), 0u);
  EXPECT_EQ(logits_of(s), std::vector<float>());

  ASSERT_EQ(geist_session_pin_prefix(s, sys.data(), sys.size()), GEIST_OK);
  ASSERT_EQ(geist_session_clear(s), GEIST_OK);
  EXPECT_EQ(geist_session_n_pinned(s), 0u);
  EXPECT_EQ(geist_session_n_tokens(s), 0u);
  EXPECT_EQ(logits_of(s), std::vector<float>());
  ASSERT_EQ(geist_session_reset(s), GEIST_OK);
  EXPECT_EQ(geist_session_n_tokens(s), 0u) << "clear dropped the pin";
  // A second pin replaces the first.
  ASSERT_EQ(geist_session_pin_prefix(s, sys.data(), sys.size()), GEIST_OK);
  ASSERT_EQ(geist_session_pin_prefix(s, q.data(), q.size()), GEIST_OK);
  ASSERT_EQ(geist_session_prefill_tokens(s, sys.data(), 2), GEIST_OK);
  ASSERT_EQ(geist_session_reset(s), GEIST_OK);
  EXPECT_EQ(tokens_of(s), q);
  EXPECT_TRUE(same_bytes(logits_of(s), scratch(q)));
}

// ---- Model lifetime and loading -----------------------------------------------------

TEST_F(CApi, ModelFreedBeforeSessions) {
  geist_model *m = nullptr;
  ASSERT_EQ(geist_model_load(tiny_path().c_str(), nullptr, &m), GEIST_OK) << geist_last_error();
  SessionPtr a = make(64, 4, m), b = make(64, 256, m);
  ASSERT_TRUE(a && b);
  geist_model_free(m);  // the sessions keep it alive
  const std::vector<geist_token> t = seq(20, 17);
  ASSERT_EQ(geist_session_pin_prefix(a.get(), t.data(), 8), GEIST_OK);
  ASSERT_EQ(geist_session_prefill_tokens(a.get(), t.data() + 8, 12), GEIST_OK);
  ASSERT_EQ(geist_session_prefill_tokens(b.get(), t.data(), t.size()), GEIST_OK);
  const std::vector<float> ref = scratch(t);  // on the suite's own copy of the file
  EXPECT_TRUE(same_bytes(logits_of(a.get()), ref));
  EXPECT_TRUE(same_bytes(logits_of(b.get()), ref));
  geist_token ta = -1, tb = -2;
  ASSERT_EQ(geist_session_decode_step(a.get(), &ta), GEIST_OK);
  ASSERT_EQ(geist_session_decode_step(b.get(), &tb), GEIST_OK);
  EXPECT_EQ(ta, tb);
  ASSERT_EQ(geist_session_reset(a.get()), GEIST_OK);
  EXPECT_TRUE(
      same_bytes(logits_of(a.get()), scratch(std::vector<geist_token>(t.begin(), t.begin() + 8))));
  // A snapshot of a session whose model handle is gone restores into the suite's model
  // (same file, same fingerprint).
  size_t size = 0, w = 0;
  ASSERT_EQ(geist_session_snapshot_size(b.get(), &size), GEIST_OK);
  std::vector<uint8_t> img(size);
  ASSERT_EQ(geist_session_snapshot(b.get(), img.data(), img.size(), &w), GEIST_OK);
  SessionPtr c = make(64);
  ASSERT_EQ(geist_session_restore(c.get(), img.data(), w), GEIST_OK) << geist_last_error();
  EXPECT_TRUE(same_bytes(logits_of(c.get()), logits_of(b.get())));
  a.reset();  // the model goes with the last of these two
  EXPECT_TRUE(same_bytes(logits_of(b.get()), logits_of(c.get())));
  b.reset();
}

std::string write_temp(const std::string &name, const std::string &bytes) {
  const std::string path = ::testing::TempDir() + "/" + name;
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  EXPECT_TRUE(f.good()) << path;
  return path;
}

TEST(CApiLoad, Errors) {
  int dummy = 0;
  geist_model *m = reinterpret_cast<geist_model *>(&dummy);
  const std::string missing = ::testing::TempDir() + "/c_api_int_no_such_file.gguf";
  EXPECT_FAILS(geist_model_load(missing.c_str(), nullptr, &m), GEIST_E_IO);
  EXPECT_EQ(m, nullptr);
  EXPECT_NE(std::string(geist_last_error()).find(missing), std::string::npos) << geist_last_error();

  const std::string text = write_temp("c_api_int_not.gguf", std::string(4096, 'x'));
  m = reinterpret_cast<geist_model *>(&dummy);
  EXPECT_FAILS(geist_model_load(text.c_str(), nullptr, &m), GEIST_E_BAD_FORMAT);
  EXPECT_EQ(m, nullptr);

  const std::vector<uint8_t> tiny = geist::test::read_file(tiny_path());
  ASSERT_GT(tiny.size(), 4096u);
  const std::string cut =
      write_temp("c_api_int_cut.gguf", std::string(tiny.begin(), tiny.begin() + tiny.size() / 2));
  EXPECT_FAILS(geist_model_load(cut.c_str(), nullptr, &m), GEIST_E_BAD_FORMAT);
  EXPECT_EQ(m, nullptr);

  // An empty file: the mapping refuses it (GEIST_E_IO, "cannot map ...: the file is
  // empty") before the GGUF reader could call it truncated (GEIST_E_BAD_FORMAT); either
  // names the problem.
  const std::string empty = write_temp("c_api_int_empty.gguf", "");
  const std::string primed = prime_last_error();
  const geist_status est = geist_model_load(empty.c_str(), nullptr, &m);
  EXPECT_TRUE(est == GEIST_E_IO || est == GEIST_E_BAD_FORMAT) << geist_status_name(est);
  EXPECT_NE(std::string(geist_last_error()), primed);
  EXPECT_NE(std::string(geist_last_error()).find("empty"), std::string::npos) << geist_last_error();
  EXPECT_EQ(m, nullptr);

  EXPECT_FAILS(geist_model_load(::testing::TempDir().c_str(), nullptr, &m), GEIST_E_IO);
  EXPECT_EQ(m, nullptr);

  const std::string junk(4096, 'x');
  EXPECT_FAILS(geist_model_load_from_memory(junk.data(), junk.size(), nullptr, &m),
               GEIST_E_BAD_FORMAT);
  EXPECT_EQ(m, nullptr);
  EXPECT_FAILS(geist_model_load_from_memory(tiny.data(), tiny.size() / 2, nullptr, &m),
               GEIST_E_BAD_FORMAT);
  EXPECT_EQ(m, nullptr);
  std::remove(text.c_str());
  std::remove(cut.c_str());
  std::remove(empty.c_str());
}

TEST_F(CApi, LoadFromMemoryMatchesLoad) {
  const std::vector<uint8_t> file = geist::test::read_file(tiny_path());
  ASSERT_FALSE(file.empty());
  void *copy = std::malloc(file.size());
  ASSERT_NE(copy, nullptr);
  std::memcpy(copy, file.data(), file.size());
  geist_model_params mp = geist_model_params_default();
  mp.prefetch = 0;
  geist_model *m = nullptr;
  ASSERT_EQ(geist_model_load_from_memory(copy, file.size(), &mp, &m), GEIST_OK)
      << geist_last_error();
  geist_model_info a, b;
  ASSERT_EQ(geist_model_get_info(m, &a), GEIST_OK);
  ASSERT_EQ(geist_model_get_info(model_, &b), GEIST_OK);
  EXPECT_EQ(a.fingerprint, b.fingerprint);
  EXPECT_EQ(a.file_size, file.size());
  EXPECT_EQ(a.n_params, b.n_params);
  const std::vector<geist_token> t = seq(20, 18);
  {
    SessionPtr s = make(64, 7, m);
    geist_model_free(m);
    ASSERT_EQ(geist_session_prefill_tokens(s.get(), t.data(), t.size()), GEIST_OK);
    EXPECT_TRUE(same_bytes(logits_of(s.get()), scratch(t, 7)));
  }
  // A buffer whose tensor data is not aligned for its element type is refused.
  std::vector<uint8_t> shifted(file.size() + 1);
  std::memcpy(shifted.data() + 1, file.data(), file.size());
  m = reinterpret_cast<geist_model *>(copy);
  const geist_status st =
      geist_model_load_from_memory(shifted.data() + 1, file.size(), nullptr, &m);
  EXPECT_NE(st, GEIST_OK);
  EXPECT_EQ(m, nullptr);
  EXPECT_NE(std::string(geist_last_error()).find("aligned"), std::string::npos)
      << geist_status_name(st) << ": " << geist_last_error();
  std::free(copy);  // only after the model and its sessions are gone
}

// ---- Params -------------------------------------------------------------------------

TEST_F(CApi, ParamsDefaults) {
  const geist_model_params mp = geist_model_params_default();
  EXPECT_EQ(mp.prefetch, 1);
  const geist_sampling_params d = geist_sampling_params_default();
  EXPECT_EQ(d.temperature, 0.8f);
  EXPECT_EQ(d.top_k, 40);
  EXPECT_EQ(d.top_p, 0.95f);
  EXPECT_EQ(d.min_p, 0.05f);
  EXPECT_EQ(d.repeat_penalty, 1.0f);
  EXPECT_EQ(d.repeat_last_n, 64);
  EXPECT_EQ(d.seed, 0xC0FFEEu);
  const geist_session_params p = geist_session_params_default();
  EXPECT_EQ(p.n_ctx, 0);
  EXPECT_EQ(p.n_threads, 0);
  EXPECT_EQ(p.chunk, 256);
  EXPECT_EQ(std::memcmp(&p.sampling, &d, sizeof d), 0);

  geist_session *s = nullptr;
  ASSERT_EQ(geist_session_create(model_, &p, &s), GEIST_OK) << geist_last_error();
  EXPECT_EQ(geist_session_n_ctx(s), size_t(kTrainCtx)) << "n_ctx 0 resolves to the trained context";
  EXPECT_EQ(geist_session_n_vocab(s), kVocab);
  EXPECT_EQ(geist_session_n_tokens(s), 0u);
  EXPECT_EQ(geist_session_n_pinned(s), 0u);
  geist_session_free(s);
  s = nullptr;
  ASSERT_EQ(geist_session_create(model_, nullptr, &s), GEIST_OK) << "NULL params: the defaults";
  EXPECT_EQ(geist_session_n_ctx(s), size_t(kTrainCtx));
  geist_session_free(s);
  SessionPtr small = make(100);
  EXPECT_EQ(geist_session_n_ctx(small.get()), 100u);
}

TEST_F(CApi, ModelInfo) {
  geist_model_info i;
  ASSERT_EQ(geist_model_get_info(model_, &i), GEIST_OK);
  EXPECT_STREQ(i.arch, "gemma3");
  ASSERT_NE(i.name, nullptr);
  EXPECT_EQ(i.n_vocab, int64_t(kVocab));
  EXPECT_EQ(i.n_ctx_train, kTrainCtx);
  EXPECT_EQ(i.n_embd, 64);
  EXPECT_EQ(i.n_layer, 6);
  EXPECT_GT(i.n_params, 0);
  EXPECT_EQ(i.file_size, geist::test::read_file(tiny_path()).size());
  EXPECT_NE(i.fingerprint, 0u);
  EXPECT_EQ(i.bos, kBos);
  EXPECT_EQ(i.eos, kEos);
  EXPECT_EQ(i.eot, kEndOfTurn);
}

TEST_F(CApi, SessionParamsValidation) {
  struct Case {
    const char *what;
    void (*edit)(geist_session_params &);
  };
  const Case cases[] = {
      {"chunk 0", [](geist_session_params &p) { p.chunk = 0; }},
      {"chunk 65537", [](geist_session_params &p) { p.chunk = 65537; }},
      {"chunk -1", [](geist_session_params &p) { p.chunk = -1; }},
      {"n_ctx -1", [](geist_session_params &p) { p.n_ctx = -1; }},
      {"n_ctx 2^24+1", [](geist_session_params &p) { p.n_ctx = (int64_t(1) << 24) + 1; }},
      {"n_threads 1000", [](geist_session_params &p) { p.n_threads = 1000; }},
      {"n_threads 513", [](geist_session_params &p) { p.n_threads = 513; }},
      {"n_threads -1", [](geist_session_params &p) { p.n_threads = -1; }},
      {"top_p 2", [](geist_session_params &p) { p.sampling.top_p = 2; }},
      {"top_p -0.5", [](geist_session_params &p) { p.sampling.top_p = -0.5f; }},
      {"min_p 1.5", [](geist_session_params &p) { p.sampling.min_p = 1.5f; }},
      {"temperature NaN", [](geist_session_params &p) { p.sampling.temperature = std::nanf(""); }},
      {"repeat_penalty 0", [](geist_session_params &p) { p.sampling.repeat_penalty = 0; }},
      {"repeat_penalty -1", [](geist_session_params &p) { p.sampling.repeat_penalty = -1; }},
      {"repeat_last_n -2", [](geist_session_params &p) { p.sampling.repeat_last_n = -2; }},
  };
  for (const Case &c : cases) {
    SCOPED_TRACE(c.what);
    geist_session_params p = geist_session_params_default();
    p.n_threads = 1;
    c.edit(p);
    int dummy = 0;
    geist_session *s = reinterpret_cast<geist_session *>(&dummy);
    EXPECT_FAILS(geist_session_create(model_, &p, &s), GEIST_E_INVALID_ARGUMENT);
    EXPECT_EQ(s, nullptr);
    if (s != nullptr && s != reinterpret_cast<geist_session *>(&dummy)) geist_session_free(s);
  }
  // The message names the parameter, its value and the rule (a NaN is not "above 1e4").
  {
    geist_session_params p = geist_session_params_default();
    p.sampling.temperature = std::nanf("");
    geist_session *s = nullptr;
    EXPECT_EQ(geist_session_create(model_, &p, &s), GEIST_E_INVALID_ARGUMENT);
    EXPECT_NE(std::string(geist_last_error()).find("temperature is nan; it must be a finite number"),
              std::string::npos)
        << geist_last_error();
    p = geist_session_params_default();
    p.sampling.repeat_penalty = 0;
    EXPECT_EQ(geist_session_create(model_, &p, &s), GEIST_E_INVALID_ARGUMENT);
    EXPECT_NE(std::string(geist_last_error()).find("repeat_penalty is 0; it must be in (0, 1e4]"), std::string::npos)
        << geist_last_error();
  }
  // The edges of the ranges are accepted.
  for (int32_t chunk : {1, 65536}) {
    geist_session_params p = geist_session_params_default();
    p.n_threads = 1;
    p.n_ctx = 1;
    p.chunk = chunk;
    geist_session *s = nullptr;
    ASSERT_EQ(geist_session_create(model_, &p, &s), GEIST_OK)
        << chunk << ": " << geist_last_error();
    const geist_token t = 10;
    geist_token out = -1;
    EXPECT_EQ(geist_session_prefill_tokens(s, &t, 1), GEIST_OK);
    EXPECT_EQ(geist_session_decode_step(s, &out), GEIST_E_CONTEXT_FULL)
        << "n_ctx 1 holds one token";
    geist_session_free(s);
  }
}

TEST_F(CApi, SetSampling) {
  SessionPtr sp = make(64);
  geist_session *s = sp.get();
  const std::vector<geist_token> t = seq(6, 19);
  ASSERT_EQ(geist_session_prefill_tokens(s, t.data(), t.size()), GEIST_OK);
  const std::vector<float> l = logits_of(s);
  size_t argmax = 0;
  for (size_t i = 1; i < kVocab; ++i) argmax = l[i] > l[argmax] ? i : argmax;
  geist_token tok = -1;
  ASSERT_EQ(geist_session_sample(s, &tok), GEIST_OK);
  EXPECT_EQ(tok, static_cast<geist_token>(argmax)) << "temperature 0 is argmax";

  geist_sampling_params p = geist_sampling_params_default();
  p.temperature = 1.0f;
  p.top_k = 0;
  p.top_p = 1.0f;
  p.min_p = 0.0f;
  auto draw = [&](uint64_t seed) {
    p.seed = seed;
    EXPECT_EQ(geist_session_set_sampling(s, &p), GEIST_OK) << geist_session_error(s);
    std::vector<geist_token> v(8);
    for (geist_token &x : v) EXPECT_EQ(geist_session_sample(s, &x), GEIST_OK);
    return v;
  };
  const std::vector<geist_token> a = draw(7), a2 = draw(7), b = draw(8);
  EXPECT_EQ(a, a2) << "set_sampling reseeds";
  EXPECT_NE(a, b);
  EXPECT_NE(a, std::vector<geist_token>(8, static_cast<geist_token>(argmax)))
      << "temperature 1 is not greedy";

  // A rejected update keeps the params in force (greedy again here).
  geist_sampling_params g = p;
  g.temperature = 0;
  ASSERT_EQ(geist_session_set_sampling(s, &g), GEIST_OK);
  geist_sampling_params bad = p;
  bad.top_p = 2;
  EXPECT_SESSION_FAILS(s, geist_session_set_sampling(s, &bad), GEIST_E_INVALID_ARGUMENT);
  bad = p;
  bad.repeat_penalty = 0;
  EXPECT_SESSION_FAILS(s, geist_session_set_sampling(s, &bad), GEIST_E_INVALID_ARGUMENT);
  for (int i = 0; i < 4; ++i) {
    ASSERT_EQ(geist_session_sample(s, &tok), GEIST_OK);
    EXPECT_EQ(tok, static_cast<geist_token>(argmax));
  }
  EXPECT_EQ(geist_session_n_tokens(s), 6u) << "sample does not append";
  EXPECT_TRUE(same_bytes(logits_of(s), l));
}

// ---- Stats --------------------------------------------------------------------------

TEST_F(CApi, StatsCounters) {
  SessionPtr sp = make(64, 4);
  geist_session *s = sp.get();
  struct geist_session_stats st = stats_of(s);
  EXPECT_EQ(st.n_prefill_tokens, 0u);
  EXPECT_EQ(st.n_decode_tokens, 0u);
  EXPECT_EQ(st.n_pins, 0u);
  EXPECT_EQ(st.n_pinned_tokens, 0u);
  EXPECT_EQ(st.n_resets, 0u);
  EXPECT_EQ(st.n_reset_rows, 0u);
  EXPECT_EQ(st.n_snapshots, 0u);
  EXPECT_EQ(st.n_restores, 0u);
  EXPECT_EQ(st.prefill_seconds, 0.0);
  EXPECT_EQ(st.decode_seconds, 0.0);
  EXPECT_EQ(st.last_prefill_seconds, 0.0);
  EXPECT_GT(st.kv_bytes_reserved, 0u);
  EXPECT_EQ(st.checkpoint_bytes, 0u);

  const std::vector<geist_token> sys = seq(10, 20), q = seq(12, 21);
  ASSERT_EQ(geist_session_pin_prefix(s, sys.data(), sys.size()), GEIST_OK);
  st = stats_of(s);
  EXPECT_EQ(st.n_pins, 1u);
  EXPECT_EQ(st.n_pinned_tokens, 10u);
  EXPECT_EQ(st.n_prefill_tokens, 0u) << "pins are not prefill";
  EXPECT_GT(st.pin_seconds, 0.0);
  EXPECT_GT(st.checkpoint_bytes, 0u);

  ASSERT_EQ(geist_session_prefill_tokens(s, q.data(), 2), GEIST_OK);
  st = stats_of(s);
  EXPECT_EQ(st.n_prefill_tokens, 2u);
  EXPECT_GT(st.last_prefill_seconds, 0.0);
  EXPECT_EQ(st.prefill_seconds, st.last_prefill_seconds);
  geist_token tok;
  for (int i = 0; i < 2; ++i) ASSERT_EQ(geist_session_decode_step(s, &tok), GEIST_OK);
  st = stats_of(s);
  EXPECT_EQ(st.n_decode_tokens, 2u);
  EXPECT_GT(st.decode_seconds, 0.0);
  EXPECT_GT(st.last_decode_seconds, 0.0);
  EXPECT_LE(st.last_decode_seconds, st.decode_seconds);
  ASSERT_EQ(geist_session_sample(s, &tok), GEIST_OK);
  EXPECT_EQ(stats_of(s).n_decode_tokens, 2u) << "sample is not a decode step";

  ASSERT_EQ(geist_session_reset(s), GEIST_OK);  // a 4-token request: no row copied back
  st = stats_of(s);
  EXPECT_EQ(st.n_resets, 1u);
  EXPECT_EQ(st.n_reset_rows, 0u);
  ASSERT_EQ(geist_session_prefill_tokens(s, q.data(), q.size()), GEIST_OK);  // wraps the ring
  ASSERT_EQ(geist_session_reset(s), GEIST_OK);
  st = stats_of(s);
  EXPECT_EQ(st.n_resets, 2u);
  EXPECT_EQ(st.n_reset_rows, uint64_t(kSlidingLayers) * (kWindow - 1));
  EXPECT_EQ(st.n_prefill_tokens, 14u);

  const geist_token bad = -1;
  EXPECT_NE(geist_session_prefill_tokens(s, &bad, 1), GEIST_OK);
  std::vector<float> out(3 * kVocab);
  ASSERT_EQ(geist_session_prefill_logits(s, q.data(), 3, 0, out.data(), out.size()), GEIST_OK);
  st = stats_of(s);
  EXPECT_EQ(st.n_prefill_tokens, 17u) << "a failed prefill counts nothing; prefill_logits counts";
  EXPECT_EQ(st.n_pins, 1u);

  size_t size = 0, w = 0;
  ASSERT_EQ(geist_session_snapshot_size(s, &size), GEIST_OK);
  std::vector<uint8_t> img(size);
  ASSERT_EQ(geist_session_snapshot(s, img.data(), img.size(), &w), GEIST_OK);
  EXPECT_EQ(stats_of(s).n_snapshots, 1u);
  SessionPtr r = make(64);
  ASSERT_EQ(geist_session_restore(r.get(), img.data(), w), GEIST_OK);
  st = stats_of(r.get());
  EXPECT_EQ(st.n_restores, 1u);
  EXPECT_EQ(st.n_pins, 0u) << "a restore does not bring counters from the image";
  EXPECT_EQ(st.n_prefill_tokens, 0u);
  EXPECT_GT(st.checkpoint_bytes, 0u) << "the pin came with the image";
}

// The scratch a session reports is what its exec holds: set at create, the same after every
// kind of request, and larger for a larger chunk (the activation buffers hold a chunk's rows).
TEST_F(CApi, StatsScratchIsFixedAfterCreate) {
  SessionPtr sp = make(64, 4);
  geist_session *s = sp.get();
  const uint64_t at_create = stats_of(s).scratch_bytes;
  EXPECT_GT(at_create, 0u);
  const std::vector<geist_token> sys = seq(10, 20), q = seq(12, 21);
  ASSERT_EQ(geist_session_pin_prefix(s, sys.data(), sys.size()), GEIST_OK);
  geist_token tok;
  std::vector<float> out(3 * kVocab);
  for (int r = 0; r < 20; ++r) {
    ASSERT_EQ(geist_session_reset(s), GEIST_OK);
    ASSERT_EQ(geist_session_prefill_tokens(s, q.data(), 1 + r % int(q.size())), GEIST_OK);
    ASSERT_EQ(geist_session_decode_step(s, &tok), GEIST_OK);
    ASSERT_EQ(geist_session_prefill_logits(s, q.data(), 3, 0, out.data(), out.size()), GEIST_OK);
    ASSERT_EQ(stats_of(s).scratch_bytes, at_create) << "request " << r;
  }
  SessionPtr wide = make(64, 16);
  EXPECT_GT(stats_of(wide.get()).scratch_bytes, at_create) << "a chunk of 16 rows holds more than one of 4";
}

// ---- Snapshots ------------------------------------------------------------------------

TEST_F(CApi, SnapshotRestore) {
  SessionPtr ap = make(64, 4);
  geist_session *a = ap.get();
  const std::vector<geist_token> sys = seq(10, 22), q = seq(5, 23);
  ASSERT_EQ(geist_session_pin_prefix(a, sys.data(), sys.size()), GEIST_OK);
  const std::vector<float> pin_logits = logits_of(a);
  ASSERT_EQ(geist_session_prefill_tokens(a, q.data(), q.size()), GEIST_OK);
  size_t size = 0, w = 0;
  ASSERT_EQ(geist_session_snapshot_size(a, &size), GEIST_OK);
  std::vector<uint8_t> img(size);
  ASSERT_EQ(geist_session_snapshot(a, img.data(), img.size(), &w), GEIST_OK);
  ASSERT_EQ(w, size);

  SessionPtr bp = make(64, 8);  // another chunk size
  geist_session *b = bp.get();
  const std::vector<geist_token> other = seq(3, 24);
  ASSERT_EQ(geist_session_prefill_tokens(b, other.data(), other.size()), GEIST_OK);
  const State before(b);
  EXPECT_SESSION_FAILS(b, geist_session_restore(b, img.data(), 0), GEIST_E_BAD_FORMAT);
  EXPECT_SESSION_FAILS(b, geist_session_restore(b, img.data(), 7), GEIST_E_BAD_FORMAT);
  EXPECT_SESSION_FAILS(b, geist_session_restore(b, img.data(), w - 1), GEIST_E_BAD_FORMAT);
  const std::string junk(w, 'x');
  EXPECT_SESSION_FAILS(b, geist_session_restore(b, junk.data(), junk.size()), GEIST_E_BAD_FORMAT);
  std::vector<uint8_t> flipped = img;
  flipped[w / 2] ^= 0x01;
  EXPECT_SESSION_FAILS(b, geist_session_restore(b, flipped.data(), w), GEIST_E_BAD_FORMAT);
  EXPECT_UNCHANGED(b, before);
  SessionPtr tiny_ctx = make(8);
  EXPECT_SESSION_FAILS(tiny_ctx.get(), geist_session_restore(tiny_ctx.get(), img.data(), w),
                       GEIST_E_CONTEXT_FULL);
  EXPECT_EQ(geist_session_n_tokens(tiny_ctx.get()), 0u);

  ASSERT_EQ(geist_session_restore(b, img.data(), w), GEIST_OK) << geist_session_error(b);
  EXPECT_EQ(tokens_of(b), cat(sys, q));
  EXPECT_EQ(geist_session_n_pinned(b), 10u);
  EXPECT_TRUE(same_bytes(logits_of(b), logits_of(a)));
  geist_token ta = -1, tb = -2;
  ASSERT_EQ(geist_session_decode_step(a, &ta), GEIST_OK);
  ASSERT_EQ(geist_session_decode_step(b, &tb), GEIST_OK);
  EXPECT_EQ(ta, tb);
  EXPECT_TRUE(same_bytes(logits_of(b), logits_of(a)));
  ASSERT_EQ(geist_session_reset(b), GEIST_OK);
  EXPECT_TRUE(same_bytes(logits_of(b), pin_logits)) << "the pin travels in the snapshot";

  // Files: written whole, read back; a missing file is GEIST_E_IO.
  const std::string path = ::testing::TempDir() + "/c_api_int.snap";
  ASSERT_EQ(geist_session_save_file(a, path.c_str()), GEIST_OK) << geist_session_error(a);
  EXPECT_FALSE(std::ifstream(path + ".tmp").good()) << "the temporary file was left behind";
  SessionPtr cp = make(64);
  ASSERT_EQ(geist_session_load_file(cp.get(), path.c_str()), GEIST_OK)
      << geist_session_error(cp.get());
  EXPECT_TRUE(same_bytes(logits_of(cp.get()), logits_of(a)));
  EXPECT_EQ(tokens_of(cp.get()), tokens_of(a));
  const State c_state(cp.get());
  const std::string missing = path + ".missing";
  EXPECT_SESSION_FAILS(cp.get(), geist_session_load_file(cp.get(), missing.c_str()), GEIST_E_IO);
  EXPECT_SESSION_FAILS(a, geist_session_save_file(a, "/nonexistent-dir/x.snap"), GEIST_E_IO);
  EXPECT_UNCHANGED(cp.get(), c_state);
  std::remove(path.c_str());
}

TEST_F(CApi, SnapshotOfAnotherModelIsMismatch) {
  // Another model: the tiny file with one character of general.name changed, which
  // changes the metadata fingerprint and nothing else.
  std::vector<uint8_t> bytes = geist::test::read_file(tiny_path());
  const std::string name = "tiny-gemma3-random";
  auto it = std::search(bytes.begin(), bytes.end(), name.begin(), name.end());
  ASSERT_NE(it, bytes.end()) << "general.name not found in the file";
  it[name.size() - 1] = 'M';
  geist_model *other = nullptr;
  ASSERT_EQ(geist_model_load_from_memory(bytes.data(), bytes.size(), nullptr, &other), GEIST_OK)
      << geist_last_error();
  ModelPtr other_ptr(other, geist_model_free);
  geist_model_info a, b;
  ASSERT_EQ(geist_model_get_info(model_, &a), GEIST_OK);
  ASSERT_EQ(geist_model_get_info(other, &b), GEIST_OK);
  EXPECT_STREQ(b.name, "tiny-gemma3-randoM");
  ASSERT_NE(a.fingerprint, b.fingerprint);

  SessionPtr src = make(64);
  const std::vector<geist_token> t = seq(6, 27);
  ASSERT_EQ(geist_session_prefill_tokens(src.get(), t.data(), t.size()), GEIST_OK);
  size_t size = 0, w = 0;
  ASSERT_EQ(geist_session_snapshot_size(src.get(), &size), GEIST_OK);
  std::vector<uint8_t> img(size);
  ASSERT_EQ(geist_session_snapshot(src.get(), img.data(), img.size(), &w), GEIST_OK);
  SessionPtr dst = make(64, 256, other);
  const std::vector<geist_token> mine = seq(2, 28);
  ASSERT_EQ(geist_session_prefill_tokens(dst.get(), mine.data(), mine.size()), GEIST_OK);
  const State before(dst.get());
  EXPECT_SESSION_FAILS(dst.get(), geist_session_restore(dst.get(), img.data(), w),
                       GEIST_E_MISMATCH);
  EXPECT_UNCHANGED(dst.get(), before);
  // The same weights compute the same logits: only the identity differs.
  EXPECT_TRUE(same_bytes(before.logits, scratch(mine)));
}

// ---- Threads ------------------------------------------------------------------------

TEST_F(CApi, SessionsOnTwoThreadsShareTheModel) {
  const std::vector<geist_token> t1 = seq(30, 25), t2 = seq(30, 26);
  std::vector<float> l1, l2;
  std::vector<geist_token> tok1, tok2;
  auto work = [](const std::vector<geist_token> &t, std::vector<float> *l,
                 std::vector<geist_token> *toks) {
    SessionPtr s = make(64, 5);
    if (!s) return;
    std::vector<geist_token> mine(64);
    size_t n = 0;
    const char *text = "<start_of_turn>user\nhello world";
    if (geist_tokenize(model_, text, std::strlen(text), 1, 1, mine.data(), mine.size(), &n) !=
        GEIST_OK)
      return;
    toks->assign(mine.begin(), mine.begin() + n);
    if (geist_session_prefill_tokens(s.get(), t.data(), t.size()) != GEIST_OK) return;
    *l = logits_of(s.get());
  };
  std::thread a(work, std::cref(t1), &l1, &tok1), b(work, std::cref(t2), &l2, &tok2);
  a.join();
  b.join();
  EXPECT_TRUE(same_bytes(l1, scratch(t1)));
  EXPECT_TRUE(same_bytes(l2, scratch(t2)));
  EXPECT_EQ(tok1, tokenize("<start_of_turn>user\nhello world", 1, 1));
  EXPECT_EQ(tok1, tok2);
}

}  // namespace
