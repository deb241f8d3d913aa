// Session on the default model: batch invariance (bit-identical logits, memcmp) across
// chunk sizes, thread counts, uneven prefill calls, prefill_with_logits rows against
// prefix prefills, clear() and refill, a prompt longer than the 512-token sliding window
// (with and without the sliding layers' KV ring wrapping); and the input errors, each
// leaving the session unchanged. Runtime on 2 busy cores: about 2 minutes, most of it the
// three 700-token sliding-window runs and the chunk-1 run.
#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "engine/model.h"
#include "engine/session.h"
#include "test_util.h"

namespace geist {
namespace {

class SessionE2e : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string path = test::default_model_path();
    if (path.empty()) return;
    Result<std::unique_ptr<Model>> m = Model::load(path);
    ASSERT_TRUE(m) << m.status().to_string();
    model_ = std::move(m).value().release();
    const std::vector<uint8_t> bytes = test::read_file(test::data_path("text/kjv_genesis.txt"));
    const std::string text(bytes.begin(), bytes.end());
    tokens_ = new std::vector<int32_t>();
    ref_ = new std::vector<float>();
    Status s = model_->tokenizer().encode(text, true, false, tokens_);
    ASSERT_TRUE(s) << s.to_string();
    ASSERT_GE(tokens_->size(), 700u);
  }
  static void TearDownTestSuite() {
    delete model_;
    model_ = nullptr;
    delete tokens_;
    tokens_ = nullptr;
    delete ref_;
    ref_ = nullptr;
  }
  void SetUp() override {
    if (!model_) GEIST_SKIP("default model not found; run scripts/fetch_model.py or set GEIST_MODEL");
  }

  static std::unique_ptr<Session> make(int64_t n_ctx, int n_threads, int chunk) {
    SessionParams p;
    p.n_ctx = n_ctx;
    p.n_threads = n_threads;
    p.chunk = chunk;
    Result<std::unique_ptr<Session>> s = Session::create(*model_, p);
    EXPECT_TRUE(s) << s.status().to_string();
    return s ? std::move(s).value() : nullptr;
  }
  static std::vector<float> copy_logits(const Session &s) {
    const float *l = s.logits();
    EXPECT_NE(l, nullptr);
    return l ? std::vector<float>(l, l + s.n_vocab()) : std::vector<float>();
  }
  // Logits after the first n tokens, fed through prefill calls of the given sizes (one
  // call of n if empty).
  static std::vector<float> logits_after(size_t n, int64_t n_ctx, int n_threads, int chunk,
                                         std::vector<size_t> calls = {}) {
    std::unique_ptr<Session> s = make(n_ctx, n_threads, chunk);
    if (!s) return {};
    if (calls.empty()) calls = {n};
    size_t done = 0;
    for (size_t c : calls) {
      Status st = s->prefill(tokens_->data() + done, c);
      EXPECT_TRUE(st) << st.to_string();
      done += c;
      EXPECT_EQ(s->n_tokens(), done);
    }
    EXPECT_EQ(done, n);
    return copy_logits(*s);
  }
  // Bit-identical, with the first differing index on failure.
  static void expect_bit_identical(const std::vector<float> &a, const std::vector<float> &b, const std::string &what) {
    ASSERT_EQ(a.size(), b.size()) << what;
    ASSERT_FALSE(a.empty()) << what;
    if (std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0) return;
    size_t i = 0, n_diff = 0;
    for (size_t j = 0; j < a.size(); ++j)
      if (std::memcmp(&a[j], &b[j], sizeof(float)) != 0 && n_diff++ == 0) i = j;
    ADD_FAILURE() << what << ": " << n_diff << " of " << a.size() << " logits differ; first at " << i << ": "
                  << a[i] << " vs " << b[i];
  }

  // Logits after the first kN tokens, one call, chunk 90, 2 threads: computed once.
  static const std::vector<float> &ref() {
    if (ref_->empty()) *ref_ = logits_after(kN, 256, 2, 90);
    return *ref_;
  }

  static constexpr size_t kN = 90;
  static inline std::vector<float> *ref_ = nullptr;
  static inline Model *model_ = nullptr;
  static inline std::vector<int32_t> *tokens_ = nullptr;
};

TEST_F(SessionE2e, ChunkSizesAndThreadsBitIdentical) {
  const std::vector<float> &ref = SessionE2e::ref();
  // A sanity check that these are logits and not a zeroed buffer.
  ASSERT_EQ(ref.size(), size_t(model_->info().n_vocab));
  float mn = ref[0], mx = ref[0];
  for (float v : ref) mn = std::min(mn, v), mx = std::max(mx, v);
  EXPECT_GT(mx - mn, 1.0f);
  for (int chunk : {1, 7, 64}) expect_bit_identical(ref, logits_after(kN, 256, 2, chunk), "chunk " + std::to_string(chunk));
  expect_bit_identical(ref, logits_after(kN, 256, 1, 90), "1 thread vs 2, chunk 90");
  expect_bit_identical(ref, logits_after(kN, 256, 1, 7), "1 thread chunk 7 vs 2 threads chunk 90");
}

TEST_F(SessionE2e, UnevenPrefillCallsBitIdentical) {
  const std::vector<float> &ref = SessionE2e::ref();
  expect_bit_identical(ref, logits_after(kN, 256, 2, 64, {13, 1, 50, 26}), "calls 13+1+50+26, chunk 64");
  expect_bit_identical(ref, logits_after(kN, 256, 2, 7, {1, 1, 30, 58}), "calls 1+1+30+58, chunk 7");
}

TEST_F(SessionE2e, PrefillWithLogitsRowsMatchPrefixes) {
  const size_t first = 40;
  const size_t nv = size_t(model_->info().n_vocab);
  std::unique_ptr<Session> s = make(256, 2, 7);  // chunk 7: rows start mid-chunk (40 = 5*7 + 5)
  ASSERT_TRUE(s);
  std::vector<float> rows((kN - first) * nv);  // [kN - first][n_vocab]
  Status st = s->prefill_with_logits(tokens_->data(), kN, first, rows.data());
  ASSERT_TRUE(st) << st.to_string();
  EXPECT_EQ(s->n_tokens(), kN);
  const std::vector<float> last(rows.end() - nv, rows.end());
  expect_bit_identical(last, copy_logits(*s), "logits() after prefill_with_logits vs its last row");
  expect_bit_identical(last, ref(), "last row vs a plain prefill");

  // One session fed the same tokens in prefix steps; logits() after each prefix ends at
  // position p must equal row p - first.
  std::unique_ptr<Session> p = make(256, 2, 64);
  ASSERT_TRUE(p);
  size_t done = 0;
  for (size_t pos : {size_t(40), size_t(41), size_t(63), size_t(64), size_t(75)}) {
    const size_t end = pos + 1;
    ASSERT_TRUE(p->prefill(tokens_->data() + done, end - done));
    done = end;
    const std::vector<float> row(rows.begin() + (pos - first) * nv, rows.begin() + (pos - first + 1) * nv);
    expect_bit_identical(row, copy_logits(*p), "row for position " + std::to_string(pos));
  }
  // Neighbouring rows differ (the rows are not one row repeated).
  EXPECT_NE(std::memcmp(rows.data(), rows.data() + nv, nv * sizeof(float)), 0);

  // first >= n is rejected before anything is computed.
  std::unique_ptr<Session> e = make(256, 2, 7);
  ASSERT_TRUE(e);
  st = e->prefill_with_logits(tokens_->data(), 5, 5, rows.data());
  EXPECT_EQ(st.code(), GEIST_E_INVALID_ARGUMENT) << st.to_string();
  EXPECT_EQ(e->n_tokens(), 0u);
  EXPECT_EQ(e->logits(), nullptr);
}

TEST_F(SessionE2e, ClearThenRefillIdentical) {
  std::unique_ptr<Session> s = make(256, 2, 64);
  ASSERT_TRUE(s);
  ASSERT_TRUE(s->prefill(tokens_->data(), kN));
  const std::vector<float> a = copy_logits(*s);
  s->clear();
  EXPECT_EQ(s->n_tokens(), 0u);
  EXPECT_EQ(s->logits(), nullptr);
  // Different tokens after the clear first, so a stale cache would show.
  ASSERT_TRUE(s->prefill(tokens_->data() + 200, 30));
  s->clear();
  ASSERT_TRUE(s->prefill(tokens_->data(), kN));
  EXPECT_EQ(s->n_tokens(), kN);
  expect_bit_identical(a, copy_logits(*s), "after clear() and refill");
  expect_bit_identical(ref(), a, "chunk 64 vs the reference");
}

TEST_F(SessionE2e, InvalidInputLeavesSessionUnchanged) {
  const std::vector<float> ref10 = logits_after(10, 64, 2, 64);
  std::unique_ptr<Session> s = make(64, 2, 64);
  ASSERT_TRUE(s);
  EXPECT_EQ(s->prefill(tokens_->data(), 0).code(), GEIST_E_INVALID_ARGUMENT);  // on an empty session
  EXPECT_EQ(s->n_tokens(), 0u);
  EXPECT_EQ(s->logits(), nullptr);
  ASSERT_TRUE(s->prefill(tokens_->data(), 5));
  const std::vector<float> after5 = copy_logits(*s);

  auto expect_unchanged = [&](const Status &st, geist_status code, const std::string &what) {
    EXPECT_EQ(st.code(), code) << what << ": " << st.to_string();
    EXPECT_FALSE(st.message().empty()) << what;
    EXPECT_EQ(s->n_tokens(), 5u) << what;
    EXPECT_EQ(std::vector<int32_t>(s->tokens()), std::vector<int32_t>(tokens_->begin(), tokens_->begin() + 5)) << what;
    expect_bit_identical(after5, copy_logits(*s), what);
  };
  expect_unchanged(s->prefill(tokens_->data(), 0), GEIST_E_INVALID_ARGUMENT, "0 tokens");
  expect_unchanged(s->prefill(nullptr, 3), GEIST_E_INVALID_ARGUMENT, "null tokens");
  const int32_t nv = int32_t(model_->info().n_vocab);
  for (int32_t bad : {300000, -1, nv, INT32_MIN}) {
    // The bad id last, after valid ones: nothing of the call may be appended.
    const std::vector<int32_t> t = {(*tokens_)[5], (*tokens_)[6], bad};
    expect_unchanged(s->prefill(t.data(), t.size()), GEIST_E_INVALID_ARGUMENT, "id " + std::to_string(bad));
    std::vector<float> out(3 * size_t(nv));
    expect_unchanged(s->prefill_with_logits(t.data(), t.size(), 0, out.data()), GEIST_E_INVALID_ARGUMENT,
                     "prefill_with_logits id " + std::to_string(bad));
  }
  expect_unchanged(s->prefill(tokens_->data() + 5, 60), GEIST_E_CONTEXT_FULL, "5 + 60 > 64");
  {
    // Chunk 2: the bad id sits in the second forward chunk, so the whole call must be
    // rejected before the first chunk is computed and appended.
    std::unique_ptr<Session> c2 = make(64, 2, 2);
    ASSERT_TRUE(c2);
    const std::vector<int32_t> t = {(*tokens_)[0], (*tokens_)[1], (*tokens_)[2], 300000};
    EXPECT_EQ(c2->prefill(t.data(), t.size()).code(), GEIST_E_INVALID_ARGUMENT);
    EXPECT_EQ(c2->n_tokens(), 0u);
    EXPECT_EQ(c2->logits(), nullptr);
    std::vector<float> out(static_cast<size_t>(nv));
    EXPECT_EQ(c2->prefill_with_logits(t.data(), t.size(), 3, out.data()).code(), GEIST_E_INVALID_ARGUMENT);
    EXPECT_EQ(c2->n_tokens(), 0u);
    EXPECT_EQ(c2->logits(), nullptr);
  }
  // The failed calls left no trace in the KV cache either: continuing matches a clean run.
  ASSERT_TRUE(s->prefill(tokens_->data() + 5, 5));
  expect_bit_identical(ref10, copy_logits(*s), "5 + 5 tokens after failed calls vs 10 at once");
}

TEST_F(SessionE2e, ContextFull) {
  std::unique_ptr<Session> s = make(16, 2, 8);
  ASSERT_TRUE(s);
  EXPECT_EQ(s->n_ctx(), 16);
  Status st = s->prefill(tokens_->data(), 20);
  EXPECT_EQ(st.code(), GEIST_E_CONTEXT_FULL) << st.to_string();
  EXPECT_EQ(s->n_tokens(), 0u);
  EXPECT_EQ(s->logits(), nullptr);
  ASSERT_TRUE(s->prefill(tokens_->data(), 10));
  EXPECT_EQ(s->prefill(tokens_->data() + 10, 7).code(), GEIST_E_CONTEXT_FULL);
  EXPECT_EQ(s->n_tokens(), 10u);
  ASSERT_TRUE(s->prefill(tokens_->data() + 10, 6));  // exactly full is fine
  EXPECT_EQ(s->n_tokens(), 16u);
  EXPECT_EQ(s->prefill(tokens_->data() + 16, 1).code(), GEIST_E_CONTEXT_FULL);
  EXPECT_EQ(s->n_tokens(), 16u);
}

TEST_F(SessionE2e, CreateRejectsBadParams) {
  auto code = [](int64_t n_ctx, int n_threads, int chunk) {
    SessionParams p;
    p.n_ctx = n_ctx;
    p.n_threads = n_threads;
    p.chunk = chunk;
    Result<std::unique_ptr<Session>> s = Session::create(*model_, p);
    return s ? GEIST_OK : s.status().code();
  };
  EXPECT_EQ(code(64, 1, 0), GEIST_E_INVALID_ARGUMENT);
  EXPECT_EQ(code(64, 1, -3), GEIST_E_INVALID_ARGUMENT);
  EXPECT_EQ(code(64, 1, 65537), GEIST_E_INVALID_ARGUMENT);
  EXPECT_EQ(code(-1, 1, 64), GEIST_E_INVALID_ARGUMENT);
  EXPECT_EQ(code((int64_t(1) << 24) + 1, 1, 64), GEIST_E_INVALID_ARGUMENT);
  EXPECT_EQ(code(64, 1, 64), GEIST_OK);
  // n_ctx 0 is the model's trained context; a chunk above n_ctx is clamped to it.
  std::unique_ptr<Session> d = make(0, 1, 64);
  ASSERT_TRUE(d);
  EXPECT_EQ(d->n_ctx(), model_->info().n_ctx_train);
  std::unique_ptr<Session> c = make(16, 1, 64);
  ASSERT_TRUE(c);
  EXPECT_EQ(c->chunk(), 16);
  EXPECT_EQ(c->n_threads(), 1);
}

TEST_F(SessionE2e, BeyondSlidingWindowBitIdentical) {
  // 700 tokens > the 512-token window of the sliding layers. Chunk 256 holds a ring of
  // 512 + 255 = 767 positions (no wrap at 700); chunk 64 a ring of 575, which wraps.
  const size_t n = 700;
  const std::vector<float> a = logits_after(n, 1100, 2, 256);  // forward chunks 256+256+188
  const std::vector<float> b = logits_after(n, 1100, 2, 256, std::vector<size_t>(7, 100));
  expect_bit_identical(a, b, "700 tokens: one call (chunks of 256) vs 7 calls of 100");
  const std::vector<float> c = logits_after(n, 1100, 2, 64, {100, 100, 100, 100, 100, 100, 100});
  expect_bit_identical(a, c, "700 tokens: chunks of 256 vs chunks of 64 (ring wraps)");
}

TEST_F(SessionE2e, PinResetAndRestorePastTheWindowBitIdentical) {
  // Pin 300 tokens, run a 400-token request (the sliding layers' ring of 512 + 63 slots
  // wraps, overwriting rows the pin needs), reset, run it again; then snapshot, restore
  // into a session with another chunk size and thread count, reset and run it a third
  // time. Every time the logits after token 700 equal a straight 700-token prefill.
  const size_t P = 300, n = 700;
  const std::vector<float> straight = logits_after(n, 1100, 2, 256);
  std::unique_ptr<Session> s = make(1100, 2, 64);
  ASSERT_TRUE(s);
  ASSERT_TRUE(s->pin_prefix(tokens_->data(), P));
  for (int round = 0; round < 2; ++round) {
    s->reset();
    ASSERT_TRUE(s->prefill(tokens_->data() + P, n - P));
    expect_bit_identical(straight, copy_logits(*s), "pinned request, round " + std::to_string(round));
  }
  EXPECT_GT(s->stats().n_reset_rows, 0u);  // the second reset had rows to copy back
  std::vector<uint8_t> img(s->snapshot_size());
  size_t written = 0;
  ASSERT_TRUE(s->snapshot(img.data(), img.size(), &written));
  std::unique_ptr<Session> r = make(1100, 1, 256);
  ASSERT_TRUE(r);
  Status st = r->restore(img.data(), written);
  ASSERT_TRUE(st) << st.to_string();
  expect_bit_identical(straight, copy_logits(*r), "restored");
  r->reset();
  EXPECT_EQ(r->n_tokens(), P);
  ASSERT_TRUE(r->prefill(tokens_->data() + P, n - P));
  expect_bit_identical(straight, copy_logits(*r), "restored, reset, request again");
}

}  // namespace
}  // namespace geist
