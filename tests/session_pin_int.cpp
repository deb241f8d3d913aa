// Pin, reset, decode and snapshot/restore on the tiny Gemma 3 (tests/data/tiny_gemma3.gguf:
// 5 sliding layers with a window of 8 and one global layer), where every prompt is far
// longer than the window and the sliding layers' ring (8 + chunk - 1 slots) wraps many
// times. The invariant under test (DESIGN.md, batch invariance): the logits after token
// i are bit-identical whatever the chunk size, the thread count, a pin + reset, or a
// snapshot + restore in between — compared with memcmp against one straight prefill.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "engine/model.h"
#include "engine/session.h"
#include "test_util.h"

namespace geist {
namespace {

constexpr int64_t kCtx = 512;

class SessionPinInt : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    Result<std::unique_ptr<Model>> m = Model::load(test::data_path("tiny_gemma3.gguf"));
    ASSERT_TRUE(m) << m.status().to_string();
    model_ = std::move(m).value().release();
    // A deterministic token sequence over the whole vocabulary except the specials.
    seq_ = new std::vector<int32_t>();
    uint64_t x = 12345;
    for (int i = 0; i < 500; ++i) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      seq_->push_back(int32_t(6 + (x >> 33) % uint64_t(model_->info().n_vocab - 6)));
    }
    // Reference: the logits after every token of seq_, one straight prefill.
    ref_ = new std::vector<float>(seq_->size() * nv());
    std::unique_ptr<Session> s = make(64, 2);
    ASSERT_TRUE(s->prefill_with_logits(seq_->data(), seq_->size(), 0, ref_->data()));
  }
  static void TearDownTestSuite() {
    delete model_;
    delete seq_;
    delete ref_;
    model_ = nullptr;
  }

  static size_t nv() { return size_t(model_->info().n_vocab); }
  static std::unique_ptr<Session> make(int chunk, int threads, SamplerParams sp = greedy(), int64_t n_ctx = kCtx) {
    SessionParams p;
    p.n_ctx = n_ctx;
    p.chunk = chunk;
    p.n_threads = threads;
    p.sampling = sp;
    Result<std::unique_ptr<Session>> s = Session::create(*model_, p);
    EXPECT_TRUE(s) << s.status().to_string();
    return std::move(s).value();
  }
  static SamplerParams greedy() {
    SamplerParams sp;
    sp.temperature = 0;
    return sp;
  }
  static SamplerParams warm(uint64_t seed) {
    SamplerParams sp;
    sp.temperature = 1.2f;
    sp.top_k = 0;
    sp.top_p = 1.0f;
    sp.min_p = 0.0f;
    sp.repeat_penalty = 1.3f;
    sp.seed = seed;
    return sp;
  }
  // Reference logits after token i of seq_.
  static const float *ref_at(size_t i) { return ref_->data() + i * nv(); }
  static bool same(const float *a, const float *b) { return a && b && std::memcmp(a, b, nv() * sizeof(float)) == 0; }
  static std::vector<float> copy(const Session &s) { return std::vector<float>(s.logits(), s.logits() + nv()); }

  static inline Model *model_ = nullptr;
  static inline std::vector<int32_t> *seq_ = nullptr;
  static inline std::vector<float> *ref_ = nullptr;
};

TEST_F(SessionPinInt, ReferenceIsNotDegenerate) {
  // Neighbouring positions give different logits, and a logit row has spread.
  EXPECT_FALSE(same(ref_at(10), ref_at(11)));
  float mn = ref_at(100)[0], mx = mn;
  for (size_t j = 0; j < nv(); ++j) mn = std::min(mn, ref_at(100)[j]), mx = std::max(mx, ref_at(100)[j]);
  EXPECT_GT(mx - mn, 1.0f);
}

TEST_F(SessionPinInt, PinResetRemainderMatchesStraightPrefill) {
  const size_t P = 100;
  for (int threads : {1, 2}) {
    for (int chunk : {1, 3, 7, 8, 64, 512}) {
      SCOPED_TRACE("chunk " + std::to_string(chunk) + ", threads " + std::to_string(threads));
      std::unique_ptr<Session> s = make(chunk, threads);
      ASSERT_TRUE(s->pin_prefix(seq_->data(), P));
      EXPECT_EQ(s->n_pinned(), P);
      EXPECT_EQ(s->n_tokens(), P);
      EXPECT_TRUE(same(s->logits(), ref_at(P - 1))) << "logits right after the pin";
      // Requests of many lengths, each after a reset; the longer ones overwrite the
      // whole ring many times over.
      for (size_t len : {size_t(1), size_t(5), size_t(9), size_t(63), size_t(64), size_t(65), size_t(200),
                         size_t(400), size_t(2)}) {
        s->reset();
        ASSERT_EQ(s->n_tokens(), P);
        ASSERT_TRUE(same(s->logits(), ref_at(P - 1))) << "after reset, before request " << len;
        ASSERT_TRUE(s->prefill(seq_->data() + P, len));
        ASSERT_TRUE(same(s->logits(), ref_at(P + len - 1))) << "request of " << len << " tokens";
      }
    }
  }
}

TEST_F(SessionPinInt, RequestsInManyCallsAndJunkBetween) {
  const size_t P = 37;
  std::unique_ptr<Session> s = make(16, 2);
  ASSERT_TRUE(s->pin_prefix(seq_->data(), P));
  // A request of unrelated tokens, long enough to wrap the ring, then reset.
  std::vector<int32_t> junk(300, 42);
  ASSERT_TRUE(s->prefill(junk.data(), junk.size()));
  s->reset();
  // The real request in uneven calls, checking the logits after each.
  size_t done = P;
  for (size_t c : {size_t(1), size_t(15), size_t(16), size_t(17), size_t(100)}) {
    ASSERT_TRUE(s->prefill(seq_->data() + done, c));
    done += c;
    ASSERT_TRUE(same(s->logits(), ref_at(done - 1))) << "after " << done << " tokens";
  }
  // prefill_with_logits after a reset: every row equals the reference.
  s->reset();
  std::vector<float> rows(120 * nv());
  ASSERT_TRUE(s->prefill_with_logits(seq_->data() + P, 120, 0, rows.data()));
  EXPECT_EQ(std::memcmp(rows.data(), ref_at(P), rows.size() * sizeof(float)), 0);
}

TEST_F(SessionPinInt, ResetCopiesBackOnlyOverwrittenRows) {
  const size_t P = 100;
  const int chunk = 32;  // ring of 8 + 31 = 39 slots; the pin needs positions 93..99
  std::unique_ptr<Session> s = make(chunk, 1);
  ASSERT_TRUE(s->pin_prefix(seq_->data(), P));
  EXPECT_EQ(s->checkpoint_bytes(), (5 * 2 * 7 * 2 * 16 + nv()) * sizeof(float));  // 5 layers, K+V, 7 rows, 2x16 floats
  // A request of up to `chunk` tokens cannot reach the checkpoint's slots.
  ASSERT_TRUE(s->prefill(seq_->data() + P, size_t(chunk)));
  s->reset();
  EXPECT_EQ(s->stats().n_reset_rows, 0u);
  // One more token overwrites position 93's slot in each of the 5 sliding layers.
  ASSERT_TRUE(s->prefill(seq_->data() + P, size_t(chunk) + 1));
  s->reset();
  EXPECT_EQ(s->stats().n_reset_rows, 5u);
  ASSERT_TRUE(s->prefill(seq_->data() + P, 200));
  s->reset();
  EXPECT_EQ(s->stats().n_reset_rows, 5u + 5u * 7u);
  ASSERT_TRUE(s->prefill(seq_->data() + P, 3));
  EXPECT_TRUE(same(s->logits(), ref_at(P + 2)));
  EXPECT_EQ(s->stats().n_resets, 3u);
  EXPECT_EQ(s->stats().n_pins, 1u);
  EXPECT_EQ(s->stats().n_pinned_tokens, P);
}

TEST_F(SessionPinInt, DecodeAfterResetRepeatsExactly) {
  const size_t P = 50;
  for (bool sampled : {false, true}) {
    SCOPED_TRACE(sampled ? "temperature 1.2, repeat penalty" : "greedy");
    std::unique_ptr<Session> s = make(7, 2, sampled ? warm(99) : greedy());
    ASSERT_TRUE(s->pin_prefix(seq_->data(), P));
    std::vector<int32_t> first;
    std::vector<std::vector<float>> first_logits;
    for (int i = 0; i < 40; ++i) {
      int32_t t = -1;
      ASSERT_TRUE(s->decode_step(&t));
      first.push_back(t);
      first_logits.push_back(copy(*s));
    }
    s->reset();
    for (int i = 0; i < 40; ++i) {
      int32_t t = -1;
      ASSERT_TRUE(s->decode_step(&t));
      ASSERT_EQ(t, first[i]) << "step " << i;
      ASSERT_TRUE(same(s->logits(), first_logits[i].data())) << "step " << i;
    }
    // The decoded tokens prefilled from scratch give the same logits (decode is batch
    // invariant too).
    std::unique_ptr<Session> f = make(64, 1);
    std::vector<int32_t> all(seq_->begin(), seq_->begin() + P);
    all.insert(all.end(), first.begin(), first.end());
    ASSERT_TRUE(f->prefill(all.data(), all.size()));
    EXPECT_TRUE(same(f->logits(), first_logits.back().data()));
  }
}

TEST_F(SessionPinInt, PinnedAndFullRequestsSampleTheSameTokens) {
  // full: clear + whole prompt each time; pin: reset + remainder. With the same seed the
  // sampled continuations agree token for token (sampler state is part of the pin).
  const size_t P = 60;
  std::unique_ptr<Session> full = make(64, 2, warm(7)), pin = make(64, 2, warm(7));
  ASSERT_TRUE(pin->pin_prefix(seq_->data(), P));
  for (size_t req = 0; req < 4; ++req) {
    const size_t rest = 20 + 30 * req;
    std::vector<int32_t> prompt(seq_->begin(), seq_->begin() + P);  // the constant prefix
    prompt.insert(prompt.end(), seq_->begin() + 200 + req * 10, seq_->begin() + 200 + req * 10 + rest);
    full->clear();
    ASSERT_TRUE(full->prefill(prompt.data(), prompt.size()));
    pin->reset();
    ASSERT_TRUE(pin->prefill(prompt.data() + P, rest));
    ASSERT_TRUE(same(full->logits(), pin->logits())) << "request " << req;
    for (int i = 0; i < 12; ++i) {
      int32_t a = -1, b = -2;
      ASSERT_TRUE(full->decode_step(&a));
      ASSERT_TRUE(pin->decode_step(&b));
      ASSERT_EQ(a, b) << "request " << req << " step " << i;
    }
  }
}

TEST_F(SessionPinInt, RestoredSnapshotContinuesBitIdentical) {
  const size_t P = 80;
  std::unique_ptr<Session> a = make(64, 2, warm(5));
  ASSERT_TRUE(a->pin_prefix(seq_->data(), P));
  ASSERT_TRUE(a->prefill(seq_->data() + P, 150));  // past the ring: the checkpoint is needed
  std::vector<uint8_t> img(a->snapshot_size());
  size_t written = 0;
  ASSERT_TRUE(a->snapshot(img.data(), img.size(), &written));
  ASSERT_EQ(written, img.size());
  for (int chunk : {1, 5, 256}) {
    for (int threads : {1, 2}) {
      SCOPED_TRACE("restore into chunk " + std::to_string(chunk) + ", threads " + std::to_string(threads));
      std::unique_ptr<Session> b = make(chunk, threads, warm(5));
      ASSERT_TRUE(b->prefill(seq_->data() + 300, 33));  // some other state to be replaced
      Status st = b->restore(img.data(), img.size());
      ASSERT_TRUE(st) << st.to_string();
      EXPECT_EQ(b->n_tokens(), P + 150);
      EXPECT_EQ(b->n_pinned(), P);
      EXPECT_TRUE(same(b->logits(), ref_at(P + 150 - 1)));
      ASSERT_TRUE(b->prefill(seq_->data() + P + 150, 70));
      EXPECT_TRUE(same(b->logits(), ref_at(P + 220 - 1))) << "continuing after restore";
      b->reset();
      EXPECT_TRUE(same(b->logits(), ref_at(P - 1))) << "reset to the restored pin";
      ASSERT_TRUE(b->prefill(seq_->data() + P, 99));
      EXPECT_TRUE(same(b->logits(), ref_at(P + 98))) << "remainder after reset to the restored pin";
    }
  }
  // Sampling continues with the restored RNG: a and a restored copy draw the same tokens.
  std::unique_ptr<Session> c = make(8, 1, warm(5));
  ASSERT_TRUE(c->restore(img.data(), img.size()));
  for (int i = 0; i < 20; ++i) {
    int32_t x = -1, y = -2;
    ASSERT_TRUE(a->decode_step(&x));
    ASSERT_TRUE(c->decode_step(&y));
    ASSERT_EQ(x, y) << "step " << i;
  }
}

TEST_F(SessionPinInt, FailedPinKeepsOldPin) {
  std::unique_ptr<Session> s = make(16, 1, greedy(), 128);
  ASSERT_TRUE(s->pin_prefix(seq_->data(), 30));
  ASSERT_TRUE(s->prefill(seq_->data() + 30, 10));
  const std::vector<float> before = copy(*s);
  std::vector<int32_t> bad(seq_->begin(), seq_->begin() + 20);
  bad[17] = int32_t(nv());
  EXPECT_EQ(s->pin_prefix(bad.data(), bad.size()).code(), GEIST_E_INVALID_ARGUMENT);
  EXPECT_EQ(s->pin_prefix(seq_->data(), 129).code(), GEIST_E_CONTEXT_FULL);
  EXPECT_EQ(s->pin_prefix(seq_->data(), 0).code(), GEIST_E_INVALID_ARGUMENT);
  EXPECT_EQ(s->pin_prefix(nullptr, 3).code(), GEIST_E_INVALID_ARGUMENT);
  EXPECT_EQ(s->n_tokens(), 40u);
  EXPECT_EQ(s->n_pinned(), 30u);
  EXPECT_TRUE(same(s->logits(), before.data()));
  s->reset();
  EXPECT_TRUE(same(s->logits(), ref_at(29)));
  // A pin of the whole context is allowed; then decode has no room.
  ASSERT_TRUE(s->pin_prefix(seq_->data(), 128));
  int32_t t = -1;
  EXPECT_EQ(s->decode_step(&t).code(), GEIST_E_CONTEXT_FULL);
  EXPECT_EQ(s->n_tokens(), 128u);
  EXPECT_TRUE(same(s->logits(), ref_at(127)));
}

TEST_F(SessionPinInt, UnpinClearAndDecodeWithoutLogits) {
  std::unique_ptr<Session> s = make(16, 1);
  int32_t t = -1;
  EXPECT_EQ(s->decode_step(&t).code(), GEIST_E_STATE);
  EXPECT_EQ(s->sample(&t).code(), GEIST_E_STATE);
  EXPECT_EQ(s->n_tokens(), 0u);
  s->reset();  // no pin: empty
  EXPECT_EQ(s->logits(), nullptr);
  ASSERT_TRUE(s->pin_prefix(seq_->data(), 20));
  ASSERT_TRUE(s->prefill(seq_->data() + 20, 5));
  s->unpin();
  EXPECT_EQ(s->n_pinned(), 0u);
  EXPECT_EQ(s->n_tokens(), 25u);  // unpin keeps the tokens
  s->reset();                     // and reset without a pin empties the session
  EXPECT_EQ(s->n_tokens(), 0u);
  EXPECT_EQ(s->logits(), nullptr);
  EXPECT_EQ(s->decode_step(&t).code(), GEIST_E_STATE);
  ASSERT_TRUE(s->prefill(seq_->data(), 20));
  EXPECT_TRUE(same(s->logits(), ref_at(19)));
}

}  // namespace
}  // namespace geist
