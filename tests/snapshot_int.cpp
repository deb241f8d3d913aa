// Session snapshots on the tiny Gemma 3 (tests/data/tiny_gemma3.gguf: 6 layers, 5 sliding
// with W = 8 and 1 global; 569-token vocabulary). Round trips are bit-exact (logits
// memcmp, tokens, pin, sampler RNG: the next sampled tokens at temperature > 0, reset()
// back to the pin) also into sessions of another chunk size and thread count; every
// refusal returns its exact status and leaves the target session byte-identical (its
// own snapshot before == after, logits memcmp). Image layout: docs/SNAPSHOT.md.
#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "engine/model.h"
#include "engine/session.h"
#include "engine/snapshot_file.h"
#include "geist/geist.h"
#include "test_util.h"

namespace geist {
namespace {

// Header offsets (docs/SNAPSHOT.md).
constexpr size_t kOffVersion = 8, kOffFlags = 12, kOffTotal = 16, kOffSum = 24, kOffFingerprint = 32,
                 kOffVocab = 40, kOffTokens = 48, kOffPinned = 56, kOffLayers = 64, kOffReserved = 68,
                 kHeader = 72, kLayerBytes = 16;
constexpr uint32_t kHasLogits = 1, kCheckpointLive = 2;
constexpr int kW = 8;  // the tiny model's sliding window

template <typename T>
T get_at(const std::vector<uint8_t> &b, size_t off) {
  T v;
  std::memcpy(&v, b.data() + off, sizeof v);
  return v;
}
template <typename T>
void put_at(std::vector<uint8_t> &b, size_t off, T v) {
  std::memcpy(b.data() + off, &v, sizeof v);
}
// Make the size field and the checksum agree with the bytes again, so a restore gets
// past them to the check under test.
void reseal(std::vector<uint8_t> &b) {
  put_at<uint64_t>(b, kOffTotal, b.size());
  put_at<uint64_t>(b, kOffSum, XXH3_64bits(b.data() + 32, b.size() - 32));
}

// Deterministic token ids in [0, 569).
std::vector<int32_t> toks(size_t n, uint32_t seed) {
  std::vector<int32_t> t(n);
  uint32_t x = seed * 2654435761u + 12345u;
  for (auto &v : t) {
    x = x * 1664525u + 1013904223u;
    v = int32_t((x >> 8) % 569u);
  }
  return t;
}

std::vector<uint8_t> snap(const Session &s) {
  std::vector<uint8_t> b(s.snapshot_size());
  size_t w = 0;
  Status st = s.snapshot(b.data(), b.size(), &w);
  EXPECT_TRUE(st) << st.to_string();
  EXPECT_EQ(w, b.size());
  return b;
}

std::vector<float> logits_of(const Session &s) {
  const float *l = s.logits();
  return l ? std::vector<float>(l, l + s.n_vocab()) : std::vector<float>();
}

bool same_floats(const std::vector<float> &a, const std::vector<float> &b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

// Same tokens, pin, logits (bitwise) and snapshot bytes.
void expect_same(const Session &a, const Session &b, const char *where) {
  SCOPED_TRACE(where);
  EXPECT_EQ(a.tokens(), b.tokens());
  EXPECT_EQ(a.n_pinned(), b.n_pinned());
  EXPECT_EQ(a.logits() == nullptr, b.logits() == nullptr);
  EXPECT_TRUE(same_floats(logits_of(a), logits_of(b))) << "logits differ";
  EXPECT_TRUE(snap(a) == snap(b)) << "snapshots differ";
}

// n decode steps on both; the sampled tokens and the logits after each must agree.
void decode_both(Session &a, Session &b, int n, const char *where) {
  SCOPED_TRACE(where);
  for (int i = 0; i < n; ++i) {
    int32_t ta = -1, tb = -2;
    ASSERT_TRUE(a.decode_step(&ta));
    ASSERT_TRUE(b.decode_step(&tb));
    ASSERT_EQ(ta, tb) << "step " << i;
    ASSERT_TRUE(same_floats(logits_of(a), logits_of(b))) << "logits differ after step " << i;
  }
}

class SnapshotInt : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    Result<std::unique_ptr<Model>> m = Model::load(test::data_path("tiny_gemma3.gguf"));
    ASSERT_TRUE(m) << m.status().to_string();
    model_ = std::move(m).value().release();
  }
  static void TearDownTestSuite() {
    delete model_;
    model_ = nullptr;
  }
  void SetUp() override { ASSERT_NE(model_, nullptr); }

  static SamplerParams sampling() {
    SamplerParams p;
    p.temperature = 0.9f;
    p.top_k = 50;
    p.top_p = 0.97f;
    p.min_p = 0.01f;
    p.repeat_penalty = 1.1f;
    p.repeat_last_n = 64;
    p.seed = 1234;
    return p;
  }
  static std::unique_ptr<Session> make(int chunk, int threads, int64_t n_ctx = 256, const Model *m = nullptr) {
    SessionParams p;
    p.n_ctx = n_ctx;
    p.n_threads = threads;
    p.chunk = chunk;
    p.sampling = sampling();
    Result<std::unique_ptr<Session>> s = Session::create(m ? *m : *model_, p);
    EXPECT_TRUE(s) << s.status().to_string();
    return s ? std::move(s).value() : nullptr;
  }
  // A session pinned at n_pin tokens, then n_more prefilled, then n_decode sampled.
  static std::unique_ptr<Session> busy(size_t n_pin, size_t n_more, int n_decode, int chunk = 4, int threads = 2,
                                       uint32_t seed = 1) {
    std::unique_ptr<Session> s = make(chunk, threads);
    const std::vector<int32_t> t = toks(n_pin + n_more, seed);
    if (n_pin) {
      EXPECT_TRUE(s->pin_prefix(t.data(), n_pin));
    }
    if (n_more) {
      EXPECT_TRUE(s->prefill(t.data() + n_pin, n_more));
    }
    for (int i = 0; i < n_decode; ++i) {
      int32_t tok;
      EXPECT_TRUE(s->decode_step(&tok));
    }
    return s;
  }
  // The restore is refused with `code` and the session is as before, byte for byte.
  static void expect_refused(Session &t, const std::vector<uint8_t> &img, geist_status code, const std::string &what) {
    SCOPED_TRACE(what);
    const std::vector<uint8_t> before = snap(t);
    const std::vector<float> logits = logits_of(t);
    const std::vector<int32_t> tokens = t.tokens();
    const size_t n_pinned = t.n_pinned();
    const uint64_t n_restores = t.stats().n_restores;
    Status st = t.restore(img.empty() ? static_cast<const void *>("") : img.data(), img.size());
    EXPECT_EQ(st.code(), code) << st.to_string();
    EXPECT_FALSE(st.message().empty());
    EXPECT_TRUE(snap(t) == before) << "session changed by a refused restore";
    EXPECT_TRUE(same_floats(logits_of(t), logits)) << "logits changed by a refused restore";
    EXPECT_EQ(t.tokens(), tokens);
    EXPECT_EQ(t.n_pinned(), n_pinned);
    EXPECT_EQ(t.stats().n_restores, n_restores);
  }
  static size_t off_tokens(const std::vector<uint8_t> &img) {
    return kHeader + kLayerBytes * get_at<uint32_t>(img, kOffLayers);
  }

  static Model *model_;
};
Model *SnapshotInt::model_ = nullptr;

TEST_F(SnapshotInt, RoundTripIsBitExact) {
  std::unique_ptr<Session> a = busy(20, 30, 3);
  const std::vector<uint8_t> img = snap(*a);
  // Every byte is written: a buffer that held other bytes (geist serve takes snapshots into
  // evicted images' buffers) gets the same image as a zeroed one.
  std::vector<uint8_t> dirty(img.size(), 0xA5);
  size_t wd = 0;
  ASSERT_TRUE(a->snapshot(dirty.data(), dirty.size(), &wd));
  EXPECT_EQ(wd, img.size());
  EXPECT_TRUE(dirty == img);
  EXPECT_EQ(get_at<uint32_t>(img, kOffFlags), kHasLogits);  // n_tokens > n_pinned: checkpoint section
  EXPECT_EQ(get_at<uint64_t>(img, kOffTokens), 53u);
  EXPECT_EQ(get_at<uint64_t>(img, kOffPinned), 20u);
  EXPECT_EQ(get_at<uint64_t>(img, kOffFingerprint), model_->fingerprint());

  std::unique_ptr<Session> b = make(4, 2);
  ASSERT_TRUE(b->prefill(toks(7, 99).data(), 7));  // some unrelated state to replace
  Status st = b->restore(img.data(), img.size());
  ASSERT_TRUE(st) << st.to_string();
  EXPECT_EQ(b->stats().n_restores, 1u);
  expect_same(*a, *b, "after restore");
  EXPECT_TRUE(snap(*b) == img);
  decode_both(*a, *b, 6, "decode after restore (temperature 0.9: RNG and history restored)");

  // reset() after the restore goes back to the pin exactly, as on the original and as on
  // a session that only pinned the same prefix.
  a->reset();
  b->reset();
  expect_same(*a, *b, "after reset");
  std::unique_ptr<Session> r = make(4, 2);
  ASSERT_TRUE(r->pin_prefix(toks(50, 1).data(), 20));
  expect_same(*a, *r, "reset vs fresh pin");
  decode_both(*a, *b, 5, "decode after reset (a, b)");
  r->reset();
  b->reset();
  decode_both(*r, *b, 5, "decode after reset (fresh pin, b)");

  // A second image of the same session restores to the same bytes (idempotent).
  const std::vector<uint8_t> img2 = snap(*b);
  ASSERT_TRUE(b->restore(img2.data(), img2.size()));
  EXPECT_TRUE(snap(*b) == img2);

  // Buffer size contract.
  size_t w = 0;
  std::vector<uint8_t> small(img2.size() - 1);
  EXPECT_EQ(b->snapshot(small.data(), small.size(), &w).code(), GEIST_E_BUFFER_TOO_SMALL);
  EXPECT_EQ(w, img2.size());
  EXPECT_EQ(b->snapshot(nullptr, 0, &w).code(), GEIST_E_BUFFER_TOO_SMALL);
  EXPECT_EQ(b->snapshot(small.data(), small.size(), nullptr).code(), GEIST_E_INVALID_ARGUMENT);
  EXPECT_EQ(b->restore(nullptr, 100).code(), GEIST_E_INVALID_ARGUMENT);
}

TEST_F(SnapshotInt, RestoreIntoOtherChunkAndThreads) {
  std::unique_ptr<Session> a = busy(13, 9, 2, /*chunk=*/4, /*threads=*/2, /*seed=*/3);
  const std::vector<uint8_t> img = snap(*a);
  const std::vector<int32_t> more = toks(25, 77);  // > W, and past every ring below
  struct Shape {
    int chunk, threads;
  };
  for (Shape sh : {Shape{1, 1}, Shape{3, 3}, Shape{7, 1}, Shape{64, 2}}) {
    const std::string where = "chunk " + std::to_string(sh.chunk) + ", threads " + std::to_string(sh.threads);
    SCOPED_TRACE(where);
    std::unique_ptr<Session> ref = busy(13, 9, 2, 4, 2, 3);
    std::unique_ptr<Session> b = make(sh.chunk, sh.threads);
    Status st = b->restore(img.data(), img.size());
    ASSERT_TRUE(st) << st.to_string();
    EXPECT_EQ(b->chunk(), sh.chunk);
    EXPECT_TRUE(snap(*b) == img) << "an image does not depend on the chunk or threads";
    ASSERT_TRUE(ref->prefill(more.data(), more.size()));
    ASSERT_TRUE(b->prefill(more.data(), more.size()));
    expect_same(*ref, *b, "after 25 more tokens");
    decode_both(*ref, *b, 4, "decode");
    ref->reset();
    b->reset();
    expect_same(*ref, *b, "after reset");
    if (sh.chunk + kW - 1 < 53 - (13 - (kW - 1))) {  // the ring wrapped past the checkpointed slots
      EXPECT_GT(b->stats().n_reset_rows, 0u) << "reset copied no checkpoint rows back: the test lost its point";
    }
    decode_both(*ref, *b, 3, "decode after reset");
  }

  // Batch invariance across the restore: a session that prefills the same tokens in one
  // call has the same logits as the restored one after its prefill.
  std::unique_ptr<Session> b = make(5, 1);
  ASSERT_TRUE(b->restore(img.data(), img.size()));
  ASSERT_TRUE(b->prefill(more.data(), more.size()));
  std::vector<int32_t> all = a->tokens();
  all.insert(all.end(), more.begin(), more.end());
  std::unique_ptr<Session> straight = make(256, 2);
  ASSERT_TRUE(straight->prefill(all.data(), all.size()));
  EXPECT_TRUE(same_floats(logits_of(*straight), logits_of(*b)));
}

TEST_F(SnapshotInt, EmptySession) {
  std::unique_ptr<Session> e = make(4, 1);
  const std::vector<uint8_t> img = snap(*e);
  // header, 6 layer records, the sampler (rng + history count); nothing else.
  EXPECT_EQ(img.size(), kHeader + 6 * kLayerBytes + 40);
  EXPECT_EQ(get_at<uint32_t>(img, kOffFlags), 0u);
  EXPECT_EQ(get_at<uint64_t>(img, kOffTokens), 0u);
  for (int l = 0; l < 6; ++l) EXPECT_EQ(get_at<uint32_t>(img, kHeader + kLayerBytes * l + 12), 0u);

  std::unique_ptr<Session> t = busy(6, 6, 1);
  Status st = t->restore(img.data(), img.size());
  ASSERT_TRUE(st) << st.to_string();
  EXPECT_EQ(t->n_tokens(), 0u);
  EXPECT_EQ(t->n_pinned(), 0u);
  EXPECT_EQ(t->logits(), nullptr);
  int32_t tok;
  EXPECT_EQ(t->decode_step(&tok).code(), GEIST_E_STATE);
  EXPECT_TRUE(snap(*t) == img);
  // It works as a fresh session afterwards.
  const std::vector<int32_t> x = toks(11, 5);
  ASSERT_TRUE(t->prefill(x.data(), x.size()));
  ASSERT_TRUE(e->prefill(x.data(), x.size()));
  expect_same(*e, *t, "prefill after restoring an empty image");
  decode_both(*e, *t, 3, "decode");
}

TEST_F(SnapshotInt, PinnedCompactForm) {
  for (size_t p : {size_t(3), size_t(kW - 1), size_t(12)}) {  // P < W - 1, = W - 1, > W
    SCOPED_TRACE("n_pinned " + std::to_string(p));
    std::unique_ptr<Session> a = busy(p, 0, 0, 4, 2, 11);
    const std::vector<uint8_t> img = snap(*a);
    EXPECT_EQ(get_at<uint32_t>(img, kOffFlags), kHasLogits | kCheckpointLive);
    EXPECT_EQ(get_at<uint64_t>(img, kOffTokens), p);
    EXPECT_EQ(get_at<uint64_t>(img, kOffPinned), p);
    // Layout: no checkpoint section; the kv section's rows are the checkpoint.
    size_t expect = kHeader + 6 * kLayerBytes + 4 * p + 4 * 569;
    const size_t hist = get_at<uint64_t>(img, off_tokens(img) + 4 * p + 4 * 569 + 32);
    EXPECT_EQ(hist, p);  // repeat_last_n 64 keeps every prompt token
    expect += 40 + 4 * hist + 40 + 4 * hist + 4 * 569;
    for (int l = 0; l < 6; ++l) {
      const uint64_t rf = get_at<uint64_t>(img, kHeader + kLayerBytes * l);
      const uint32_t win = get_at<uint32_t>(img, kHeader + kLayerBytes * l + 8);
      const uint32_t rows = get_at<uint32_t>(img, kHeader + kLayerBytes * l + 12);
      EXPECT_EQ(rf, 32u);
      EXPECT_EQ(win, l == 5 ? 0u : uint32_t(kW));
      EXPECT_EQ(rows, win ? std::min<size_t>(p, kW - 1) : p);
      expect += 2 * 4 * rf * rows;
    }
    EXPECT_EQ(img.size(), expect);

    std::unique_ptr<Session> b = make(2, 1);
    ASSERT_TRUE(b->restore(img.data(), img.size()));
    expect_same(*a, *b, "after restore");
    const std::vector<int32_t> more = toks(30, 12);
    ASSERT_TRUE(a->prefill(more.data(), more.size()));
    ASSERT_TRUE(b->prefill(more.data(), more.size()));
    expect_same(*a, *b, "after 30 more");
    a->reset();
    b->reset();
    expect_same(*a, *b, "after reset");
    EXPECT_TRUE(snap(*b) == img);
    decode_both(*a, *b, 4, "decode after reset");
  }
}

TEST_F(SnapshotInt, PinnedBeyondTheRing) {
  // chunk 4: the sliding rings hold W + 3 = 11 positions; 40 tokens after the pin
  // overwrite every checkpointed slot, so the image needs its checkpoint section.
  std::unique_ptr<Session> a = busy(10, 40, 0, 4, 2, 21);
  const std::vector<uint8_t> img = snap(*a);
  EXPECT_EQ(get_at<uint32_t>(img, kOffFlags), kHasLogits);
  std::unique_ptr<Session> b = make(16, 3);  // ring of 23: a different slot map
  ASSERT_TRUE(b->restore(img.data(), img.size()));
  expect_same(*a, *b, "after restore");
  b->reset();
  a->reset();
  std::unique_ptr<Session> r = busy(10, 0, 0, 4, 2, 21);
  expect_same(*r, *b, "reset after restore vs a fresh pin");
  expect_same(*r, *a, "reset on the original vs a fresh pin");
  EXPECT_GT(b->stats().n_reset_rows, 0u);
  decode_both(*r, *b, 5, "decode after reset");
}

// A small image with every section: pin 2, 1 more token (n_tokens > n_pinned).
class SnapshotRefusal : public SnapshotInt {
 protected:
  void SetUp() override {
    SnapshotInt::SetUp();
    src_ = busy(2, 1, 0, 4, 1, 31);
    img_ = snap(*src_);
    ASSERT_EQ(get_at<uint32_t>(img_, kOffFlags), kHasLogits);
    target_ = busy(6, 9, 2, 4, 1, 32);
  }
  std::unique_ptr<Session> src_, target_;
  std::vector<uint8_t> img_;
};

TEST_F(SnapshotRefusal, EveryTruncation) {
  for (size_t n = 0; n < img_.size(); ++n) {
    std::vector<uint8_t> cut(img_.begin(), img_.begin() + n);
    const std::vector<uint8_t> before = snap(*target_);
    Status st = target_->restore(cut.empty() ? static_cast<const void *>("") : cut.data(), n);
    ASSERT_EQ(st.code(), GEIST_E_BAD_FORMAT) << "length " << n << ": " << st.to_string();
    ASSERT_TRUE(snap(*target_) == before) << "length " << n;
  }
  // The same with the size field and checksum made to agree (so the section walk, not
  // the size field, finds the truncation), for every length that keeps the header.
  for (size_t n = kHeader; n < img_.size(); ++n) {
    std::vector<uint8_t> cut(img_.begin(), img_.begin() + n);
    reseal(cut);
    const std::vector<uint8_t> before = snap(*target_);
    Status st = target_->restore(cut.data(), n);
    ASSERT_EQ(st.code(), GEIST_E_BAD_FORMAT) << "resealed length " << n << ": " << st.to_string();
    ASSERT_TRUE(snap(*target_) == before) << "resealed length " << n;
  }
  expect_refused(*target_, std::vector<uint8_t>(img_.begin(), img_.end() - 1), GEIST_E_BAD_FORMAT, "last byte cut");
}

TEST_F(SnapshotRefusal, BitFlips) {
  const std::vector<uint8_t> before = snap(*target_);
  const std::vector<float> logits = logits_of(*target_);
  size_t n_tried = 0;
  for (size_t off = 0; off < img_.size(); ++off) {
    // Every bit of the header and the layer table; one bit (rotating) elsewhere.
    const int b0 = off < off_tokens(img_) ? 0 : int(off % 8), b1 = off < off_tokens(img_) ? 8 : b0 + 1;
    for (int bit = b0; bit < b1; ++bit) {
      std::vector<uint8_t> m = img_;
      m[off] ^= uint8_t(1u << bit);
      Status st = target_->restore(m.data(), m.size());
      // The version is read before the checksum (which covers [32, size)), so a flip
      // there reads as another version.
      const geist_status want = off >= kOffVersion && off < kOffVersion + 4 ? GEIST_E_UNSUPPORTED : GEIST_E_BAD_FORMAT;
      ASSERT_EQ(st.code(), want) << "offset " << off << " bit " << bit << ": " << st.to_string();
      ++n_tried;
    }
    if (off % 64 == 0 || off < kHeader) {
      ASSERT_TRUE(snap(*target_) == before) << "offset " << off;
    }
  }
  EXPECT_TRUE(snap(*target_) == before);
  EXPECT_TRUE(same_floats(logits_of(*target_), logits));
  EXPECT_GT(n_tried, img_.size());

  // The flags word is outside the checksum too: every flip of it must still be refused,
  // for the compact (live) form as well.
  std::unique_ptr<Session> live = busy(5, 0, 0, 4, 1, 33);
  const std::vector<uint8_t> limg = snap(*live);
  ASSERT_EQ(get_at<uint32_t>(limg, kOffFlags), kHasLogits | kCheckpointLive);
  for (const std::vector<uint8_t> *img : {static_cast<const std::vector<uint8_t> *>(&img_), &limg}) {
    for (int bit = 0; bit < 32; ++bit) {
      std::vector<uint8_t> m = *img;
      put_at<uint32_t>(m, kOffFlags, get_at<uint32_t>(m, kOffFlags) ^ (1u << bit));
      expect_refused(*target_, m, GEIST_E_BAD_FORMAT, "flags bit " + std::to_string(bit));
    }
  }
}

TEST_F(SnapshotRefusal, HeaderFieldsWithChecksumRecomputed) {
  // Sanity: resealing an unchanged image changes nothing and it restores.
  {
    std::vector<uint8_t> m = img_;
    reseal(m);
    EXPECT_TRUE(m == img_);
  }
  auto edited = [&](auto edit) {
    std::vector<uint8_t> m = img_;
    edit(m);
    reseal(m);
    return m;
  };
  const size_t tok = off_tokens(img_);
  const uint64_t n = get_at<uint64_t>(img_, kOffTokens);
  const size_t sampler = tok + 4 * n + 4 * 569;

  // Unsupported version (with or without a valid checksum).
  for (uint32_t v : {0u, 3u, 0xFFFFFFFFu}) {
    expect_refused(*target_, edited([&](auto &m) { put_at<uint32_t>(m, kOffVersion, v); }), GEIST_E_UNSUPPORTED,
                   "version " + std::to_string(v));
  }
  // Another model, another geometry.
  expect_refused(*target_, edited([&](auto &m) { m[kOffFingerprint] ^= 1; }), GEIST_E_MISMATCH, "fingerprint");
  expect_refused(*target_, edited([&](auto &m) { put_at<uint64_t>(m, kOffVocab, 570); }), GEIST_E_MISMATCH,
                 "n_vocab");
  expect_refused(*target_, edited([&](auto &m) { put_at<uint64_t>(m, kOffVocab, 0); }), GEIST_E_MISMATCH,
                 "n_vocab 0");
  expect_refused(*target_, edited([&](auto &m) { put_at<uint32_t>(m, kOffLayers, 5); }), GEIST_E_MISMATCH,
                 "n_layers 5");
  expect_refused(*target_, edited([&](auto &m) { put_at<uint32_t>(m, kOffLayers, 0xFFFFFFFFu); }),
                 GEIST_E_MISMATCH, "n_layers huge");
  for (int l : {0, 5}) {
    const size_t rec = kHeader + kLayerBytes * l;
    expect_refused(*target_, edited([&](auto &m) { put_at<uint64_t>(m, rec, 64); }), GEIST_E_MISMATCH,
                   "row_floats, layer " + std::to_string(l));
    expect_refused(*target_, edited([&](auto &m) { put_at<uint32_t>(m, rec + 8, l == 5 ? 8 : 0); }),
                   GEIST_E_MISMATCH, "window, layer " + std::to_string(l));
    expect_refused(*target_, edited([&](auto &m) { put_at<uint32_t>(m, rec + 8, 4096); }), GEIST_E_MISMATCH,
                   "window 4096, layer " + std::to_string(l));
    expect_refused(*target_, edited([&](auto &m) { put_at<uint32_t>(m, rec + 12, get_at<uint32_t>(m, rec + 12) + 1); }),
                   GEIST_E_BAD_FORMAT, "rows + 1, layer " + std::to_string(l));
    expect_refused(*target_, edited([&](auto &m) { put_at<uint32_t>(m, rec + 12, 0); }), GEIST_E_BAD_FORMAT,
                   "rows 0, layer " + std::to_string(l));
  }
  // Inconsistent counts and flags.
  expect_refused(*target_, edited([&](auto &m) { put_at<uint64_t>(m, kOffPinned, n + 1); }), GEIST_E_BAD_FORMAT,
                 "n_pinned > n_tokens");
  expect_refused(*target_, edited([&](auto &m) { put_at<uint64_t>(m, kOffPinned, 0); }), GEIST_E_BAD_FORMAT,
                 "n_pinned 0 with a pin section");
  expect_refused(*target_, edited([&](auto &m) { put_at<uint64_t>(m, kOffTokens, n + 1); }), GEIST_E_BAD_FORMAT,
                 "n_tokens + 1");
  expect_refused(*target_, edited([&](auto &m) { put_at<uint64_t>(m, kOffTokens, n - 1); }), GEIST_E_BAD_FORMAT,
                 "n_tokens - 1");
  // Version 2's KV types (bytes 68, 69) and reserved word (70).
  expect_refused(*target_, edited([&](auto &m) { put_at<uint16_t>(m, kOffReserved + 2, 1); }), GEIST_E_BAD_FORMAT,
                 "reserved");
  for (size_t at : {kOffReserved, kOffReserved + 1}) {
    expect_refused(*target_, edited([&](auto &m) { m[at] = 4; }), GEIST_E_BAD_FORMAT, "KV type code 4");
    expect_refused(*target_, edited([&](auto &m) { m[at] = 1; }), GEIST_E_MISMATCH, "f16 rows into an f32 session");
    expect_refused(*target_, edited([&](auto &m) {
                     m[at] = 1;
                     put_at<uint32_t>(m, kOffVersion, 1);
                   }),
                   GEIST_E_BAD_FORMAT, "version 1 with a KV type");
  }
  for (uint32_t f : {kHasLogits | 4u, kHasLogits | 0x80000000u, kHasLogits | kCheckpointLive, 0u}) {
    expect_refused(*target_, edited([&](auto &m) { put_at<uint32_t>(m, kOffFlags, f); }), GEIST_E_BAD_FORMAT,
                   "flags " + std::to_string(f));
  }
  // Token ids outside the vocabulary.
  for (int32_t id : {569, -1, INT32_MAX, INT32_MIN}) {
    expect_refused(*target_, edited([&](auto &m) { put_at<int32_t>(m, tok + 4 * (n - 1), id); }),
                   GEIST_E_BAD_FORMAT, "token id " + std::to_string(id));
  }
  // Section lengths that do not add up.
  expect_refused(*target_, edited([&](auto &m) { m.insert(m.end(), {0, 0, 0, 0}); }), GEIST_E_BAD_FORMAT,
                 "trailing bytes");
  expect_refused(*target_, edited([&](auto &m) { m.push_back(0); }), GEIST_E_BAD_FORMAT, "one trailing byte");
  expect_refused(*target_, edited([&](auto &m) { m.resize(m.size() - 4); }), GEIST_E_BAD_FORMAT, "last row cut");
  expect_refused(*target_, edited([&](auto &m) { put_at<uint64_t>(m, sampler + 32, get_at<uint64_t>(m, sampler + 32) + 1); }),
                 GEIST_E_BAD_FORMAT, "history count + 1");
  expect_refused(*target_, edited([&](auto &m) { put_at<uint64_t>(m, sampler + 32, ~uint64_t(0)); }),
                 GEIST_E_BAD_FORMAT, "history count 2^64-1");
  expect_refused(*target_, edited([&](auto &m) { put_at<uint64_t>(m, sampler + 32, uint64_t(1) << 62); }),
                 GEIST_E_BAD_FORMAT, "history count 2^62 (x4 wraps)");
  // A count that passes every size test is a context problem, reported as such.
  expect_refused(*target_, edited([&](auto &m) { put_at<uint64_t>(m, kOffTokens, uint64_t(1) << 40); }),
                 GEIST_E_CONTEXT_FULL, "n_tokens 2^40");
  // Not an image at all; wrong size field without resealing.
  expect_refused(*target_, std::vector<uint8_t>(img_.size(), 0), GEIST_E_BAD_FORMAT, "zeros");
  {
    std::vector<uint8_t> m = img_;
    put_at<uint64_t>(m, kOffTotal, m.size() + 1);
    expect_refused(*target_, m, GEIST_E_BAD_FORMAT, "size field + 1");
  }
  // An unchanged image still restores after all that.
  ASSERT_TRUE(target_->restore(img_.data(), img_.size()));
  expect_same(*src_, *target_, "the valid image restores");
}

// n_tokens == n_pinned without the live flag, carrying a checkpoint section of its own:
// the writer never makes this (it uses the compact form), and its checkpoint may differ
// from the kv rows of the same positions, which no session can hold.
// Version 1 images (before KV types; f32 rows, the types' bytes 0) still restore into an
// f32 session: the same state as the version 2 image they were made from.
TEST_F(SnapshotRefusal, Version1ImagesStillRestore) {
  std::vector<uint8_t> v1 = img_;
  put_at<uint32_t>(v1, kOffVersion, 1);
  reseal(v1);
  ASSERT_TRUE(target_->restore(v1.data(), v1.size()).is_ok());
  EXPECT_TRUE(snap(*target_) == img_);
}

TEST_F(SnapshotRefusal, PinAtEndWithoutLiveFlag) {
  std::unique_ptr<Session> live = busy(12, 0, 0, 4, 1, 34);
  std::vector<uint8_t> m = snap(*live);
  ASSERT_EQ(get_at<uint32_t>(m, kOffFlags), kHasLogits | kCheckpointLive);
  put_at<uint32_t>(m, kOffFlags, kHasLogits);
  // Append a checkpoint section: 5 sliding layers x (K, V) x 7 rows x 32 floats.
  m.resize(m.size() + 5 * 2 * (kW - 1) * 32 * 4, 0);
  reseal(m);
  expect_refused(*target_, m, GEIST_E_BAD_FORMAT, "pin at n_tokens, no live flag");
}

TEST_F(SnapshotInt, ContextTooSmall) {
  std::unique_ptr<Session> a = busy(10, 40, 0);
  const std::vector<uint8_t> img = snap(*a);
  std::unique_ptr<Session> t = make(4, 1, /*n_ctx=*/49);
  ASSERT_TRUE(t->prefill(toks(9, 3).data(), 9));
  expect_refused(*t, img, GEIST_E_CONTEXT_FULL, "n_ctx 49 < 50 tokens");
  std::unique_ptr<Session> fits = make(4, 1, /*n_ctx=*/50);
  ASSERT_TRUE(fits->restore(img.data(), img.size()));
  expect_same(*a, *fits, "n_ctx 50 == 50 tokens");
  int32_t tok;
  EXPECT_EQ(fits->decode_step(&tok).code(), GEIST_E_CONTEXT_FULL);
  fits->reset();
  EXPECT_EQ(fits->n_tokens(), 10u);
  EXPECT_TRUE(fits->decode_step(&tok));
}

// The tiny model with one metadata byte changed (same weights and geometry, another
// fingerprint), loaded from memory that *keep owns.
void load_renamed_model(std::unique_ptr<void, decltype(&std::free)> *keep, std::unique_ptr<Model> *out) {
  std::vector<uint8_t> bytes = test::read_file(test::data_path("tiny_gemma3.gguf"));
  const std::string name = "tiny-gemma3-random";
  auto it = std::search(bytes.begin(), bytes.end(), name.begin(), name.end());
  ASSERT_NE(it, bytes.end());
  it[name.size() - 1] = 'D';
  const size_t n = bytes.size();
  keep->reset(std::aligned_alloc(4096, (n + 4095) / 4096 * 4096));
  ASSERT_NE(keep->get(), nullptr);
  std::memcpy(keep->get(), bytes.data(), n);
  Result<std::unique_ptr<Model>> m = Model::load_from_memory(keep->get(), n);
  ASSERT_TRUE(m) << m.status().to_string();
  *out = std::move(m).value();
}

TEST_F(SnapshotInt, ImageOfAnotherModel) {
  // Same weights and geometry, one metadata byte changed: a different fingerprint.
  std::unique_ptr<void, decltype(&std::free)> keep(nullptr, &std::free);
  std::unique_ptr<Model> m2;
  ASSERT_NO_FATAL_FAILURE(load_renamed_model(&keep, &m2));
  ASSERT_NE(m2->fingerprint(), model_->fingerprint());

  std::unique_ptr<Session> a = busy(4, 5, 1);
  std::unique_ptr<Session> b = make(4, 1, 256, m2.get());
  const std::vector<int32_t> x = toks(5, 8);
  ASSERT_TRUE(b->prefill(x.data(), x.size()));
  const std::vector<uint8_t> ia = snap(*a), ib = snap(*b);
  expect_refused(*b, ia, GEIST_E_MISMATCH, "model 1 image into a model 2 session");
  expect_refused(*a, ib, GEIST_E_MISMATCH, "model 2 image into a model 1 session");
  // Same weights: the logits agree, only the identity differs.
  std::unique_ptr<Session> c = make(4, 1);
  ASSERT_TRUE(c->prefill(x.data(), x.size()));
  EXPECT_TRUE(same_floats(logits_of(*b), logits_of(*c)));
  b.reset();  // before the model and its memory go
}

// ---- saved states (Session::save_state / load_state) ----------------------------------------

std::vector<uint8_t> state_snap(const SessionState &st) {
  std::vector<uint8_t> b(st.snapshot_size());
  size_t w = 0;
  Status s = st.snapshot(b.data(), b.size(), &w);
  EXPECT_TRUE(s) << s.to_string();
  EXPECT_EQ(w, b.size());
  return b;
}

// load_state is refused with `code` and the session is as before, byte for byte.
void expect_load_refused(Session &t, const SessionState &st, geist_status code, const std::string &what) {
  SCOPED_TRACE(what);
  const std::vector<uint8_t> before = snap(t);
  const std::vector<float> logits = logits_of(t);
  const uint64_t n_restores = t.stats().n_restores;
  Status s = t.load_state(st);
  EXPECT_EQ(s.code(), code) << s.to_string();
  EXPECT_FALSE(s.message().empty());
  EXPECT_TRUE(snap(t) == before) << "session changed by a refused load_state";
  EXPECT_TRUE(same_floats(logits_of(t), logits));
  EXPECT_EQ(t.stats().n_restores, n_restores);
}

TEST_F(SnapshotInt, SavedStatesAreSnapshotsWithoutTheBytes) {
  struct Case {
    const char *name;
    size_t n_pin, n_more;
    int n_decode;
  };
  // A checkpoint section (pin 20, 33 after it), the compact form (pin at the end), no pin,
  // the pin's checkpoint beyond the ring (40 after a pin of 10), and an empty session.
  for (const Case &c : {Case{"pin 20 + 30 + 3 decoded", 20, 30, 3}, Case{"pinned at the end", 12, 0, 0},
                        Case{"no pin", 0, 15, 2}, Case{"pin 10 + 40", 10, 40, 0}, Case{"empty", 0, 0, 0}}) {
    SCOPED_TRACE(c.name);
    std::unique_ptr<Session> a = busy(c.n_pin, c.n_more, c.n_decode, 4, 2, 41);
    SessionState st;
    EXPECT_TRUE(st.empty());
    const size_t want = a->state_bytes();
    Status s = a->save_state(&st);
    ASSERT_TRUE(s) << s.to_string();
    EXPECT_FALSE(st.empty());
    EXPECT_GE(st.bytes(), want) << "state_bytes() is what a save needs";
    EXPECT_LE(st.bytes(), want + want / 8) << "a fresh state holds at most 1/8 more";
    EXPECT_EQ(st.tokens(), a->tokens());
    // Its snapshot is the session's, byte for byte (the same image the file path writes).
    EXPECT_TRUE(state_snap(st) == snap(*a));

    for (int chunk : {1, 7, 64}) {
      SCOPED_TRACE("chunk " + std::to_string(chunk));
      std::unique_ptr<Session> ref = busy(c.n_pin, c.n_more, c.n_decode, 4, 2, 41);
      std::unique_ptr<Session> b = make(chunk, 1);
      ASSERT_TRUE(b->prefill(toks(9, 5).data(), 9));  // something to replace
      s = b->load_state(st);
      ASSERT_TRUE(s) << s.to_string();
      EXPECT_EQ(b->stats().n_restores, 1u);
      expect_same(*ref, *b, "after load_state");
      const std::vector<int32_t> more = toks(25, 77);
      ASSERT_TRUE(ref->prefill(more.data(), more.size()));
      ASSERT_TRUE(b->prefill(more.data(), more.size()));
      expect_same(*ref, *b, "after 25 more");
      decode_both(*ref, *b, 3, "decode after load_state");
      ref->reset();
      b->reset();
      expect_same(*ref, *b, "after reset");
    }
  }
}

TEST_F(SnapshotInt, SavedStatesAreReusedAndOutliveTheirSession) {
  SessionState st;
  {
    std::unique_ptr<Session> big = busy(10, 40, 0, 4, 2, 51);
    ASSERT_TRUE(big->save_state(&st));
  }  // the session is gone; its state is not
  const size_t held = st.bytes();
  std::unique_ptr<Session> ref = busy(10, 40, 0, 4, 2, 51);
  std::unique_ptr<Session> b = make(4, 2);
  ASSERT_TRUE(b->load_state(st));
  expect_same(*ref, *b, "a state of a destroyed session");

  // A smaller save reuses the memory (no allocation, nothing released) and replaces
  // every part: its snapshot is the smaller session's.
  std::unique_ptr<Session> small = busy(3, 4, 1, 4, 2, 52);
  ASSERT_TRUE(small->save_state(&st));
  EXPECT_EQ(st.bytes(), held);
  EXPECT_TRUE(state_snap(st) == snap(*small));
  ASSERT_TRUE(b->load_state(st));
  expect_same(*small, *b, "after a smaller save into the same state");
  decode_both(*small, *b, 3, "decode");
  // A larger one grows it.
  std::unique_ptr<Session> larger = busy(0, 120, 0, 16, 2, 53);
  ASSERT_TRUE(larger->save_state(&st));
  EXPECT_GT(st.bytes(), held);
  EXPECT_TRUE(state_snap(st) == snap(*larger));
}

TEST_F(SnapshotInt, SavedStateRefusals) {
  std::unique_ptr<Session> t = busy(6, 9, 2, 4, 1, 61);
  SessionState empty;
  expect_load_refused(*t, empty, GEIST_E_STATE, "an empty state");
  size_t w = 0;
  EXPECT_EQ(empty.snapshot(nullptr, 0, &w).code(), GEIST_E_STATE);
  EXPECT_EQ(t->save_state(nullptr).code(), GEIST_E_INVALID_ARGUMENT);

  SessionState st;
  std::unique_ptr<Session> a = busy(10, 40, 0, 4, 2, 62);
  ASSERT_TRUE(a->save_state(&st));
  std::unique_ptr<Session> tiny = make(4, 1, /*n_ctx=*/49);
  ASSERT_TRUE(tiny->prefill(toks(9, 3).data(), 9));
  expect_load_refused(*tiny, st, GEIST_E_CONTEXT_FULL, "n_ctx 49 < 50 tokens");

  // KV types differ.
  SessionParams p;
  p.n_ctx = 256;
  p.chunk = 4;
  p.type_k = KvType::F16;
  Result<std::unique_ptr<Session>> f16 = Session::create(*model_, p);
  ASSERT_TRUE(f16) << f16.status().to_string();
  expect_load_refused(*f16.value(), st, GEIST_E_MISMATCH, "f32 rows into an f16 K cache");

  // Buffer contract of the state's snapshot.
  std::vector<uint8_t> small(st.snapshot_size() - 1);
  EXPECT_EQ(st.snapshot(small.data(), small.size(), &w).code(), GEIST_E_BUFFER_TOO_SMALL);
  EXPECT_EQ(w, small.size() + 1);
  EXPECT_EQ(st.snapshot(small.data(), small.size(), nullptr).code(), GEIST_E_INVALID_ARGUMENT);
}

TEST_F(SnapshotInt, SavedStateOfAnotherModel) {
  std::unique_ptr<void, decltype(&std::free)> keep(nullptr, &std::free);
  std::unique_ptr<Model> m2;
  ASSERT_NO_FATAL_FAILURE(load_renamed_model(&keep, &m2));
  std::unique_ptr<Session> a = busy(4, 5, 1);
  std::unique_ptr<Session> b = make(4, 1, 256, m2.get());
  ASSERT_TRUE(b->prefill(toks(5, 8).data(), 5));
  SessionState sa, sb;
  ASSERT_TRUE(a->save_state(&sa));
  ASSERT_TRUE(b->save_state(&sb));
  expect_load_refused(*b, sa, GEIST_E_MISMATCH, "model 1 state into a model 2 session");
  expect_load_refused(*a, sb, GEIST_E_MISMATCH, "model 2 state into a model 1 session");
  b.reset();
}

std::string temp_dir() {
  const char *t = std::getenv("TMPDIR");
  std::string tmpl = std::string(t && *t ? t : "/tmp") + "/geist_snapshot_int.XXXXXX";
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  const char *d = mkdtemp(buf.data());
  EXPECT_NE(d, nullptr);
  return d ? d : "";
}
bool exists(const std::string &p) {
  struct stat st;
  return stat(p.c_str(), &st) == 0;
}
// Names in dir that look like a snapshot write's temporary file ("*.tmp.*").
std::vector<std::string> temp_files(const std::string &dir) {
  std::vector<std::string> r;
  if (DIR *d = opendir(dir.c_str())) {
    while (const dirent *e = readdir(d)) {
      if (std::strstr(e->d_name, ".tmp.")) r.push_back(e->d_name);
    }
    closedir(d);
  }
  std::sort(r.begin(), r.end());
  return r;
}
void write_file(const std::string &p, const std::string &bytes) {
  FILE *f = std::fopen(p.c_str(), "wb");
  ASSERT_NE(f, nullptr) << p;
  ASSERT_EQ(std::fwrite(bytes.data(), 1, bytes.size(), f), bytes.size());
  ASSERT_EQ(std::fclose(f), 0);
}
std::string read_all(const std::string &p) {
  const std::vector<uint8_t> b = test::read_file(p);
  return std::string(b.begin(), b.end());
}
void remove_tree(const std::string &dir) {
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}

TEST_F(SnapshotInt, Files) {
  const std::string dir = temp_dir();
  ASSERT_FALSE(dir.empty());
  std::unique_ptr<Session> a = busy(10, 40, 2);
  const std::string path = dir + "/s.geistsnap";
  Status st = a->save_file(path);
  ASSERT_TRUE(st) << st.to_string();
  EXPECT_FALSE(exists(path + ".tmp"));
  EXPECT_TRUE(test::read_file(path) == snap(*a));
  std::unique_ptr<Session> b = make(9, 1);
  st = b->load_file(path);
  ASSERT_TRUE(st) << st.to_string();
  expect_same(*a, *b, "after load_file");
  decode_both(*a, *b, 3, "decode after load_file");
  // Overwrite in place.
  ASSERT_TRUE(b->save_file(path));
  EXPECT_TRUE(test::read_file(path) == snap(*b));

  std::unique_ptr<Session> t = busy(3, 3, 0);
  auto refused_load = [&](const std::string &p, geist_status code, const char *what) {
    SCOPED_TRACE(what);
    const std::vector<uint8_t> before = snap(*t);
    Status s = t->load_file(p);
    EXPECT_EQ(s.code(), code) << s.to_string();
    EXPECT_NE(s.message().find(p), std::string::npos) << "the message names the path: " << s.message();
    EXPECT_TRUE(snap(*t) == before);
  };
  refused_load(dir + "/missing.geistsnap", GEIST_E_IO, "missing file");
  refused_load(dir, GEIST_E_IO, "a directory");
  {  // A truncated file is a format error, with the path in the message.
    std::vector<uint8_t> img = snap(*a);
    img.resize(img.size() / 2);
    FILE *f = std::fopen((dir + "/half.geistsnap").c_str(), "wb");
    ASSERT_NE(f, nullptr);
    ASSERT_EQ(std::fwrite(img.data(), 1, img.size(), f), img.size());
    std::fclose(f);
    refused_load(dir + "/half.geistsnap", GEIST_E_BAD_FORMAT, "half a file");
    FILE *e = std::fopen((dir + "/empty.geistsnap").c_str(), "wb");
    ASSERT_NE(e, nullptr);
    std::fclose(e);
    refused_load(dir + "/empty.geistsnap", GEIST_E_BAD_FORMAT, "empty file");
  }

  // Unwritable destinations (we may run as root, so not by permission bits): under a
  // missing directory, under a regular file, and onto a directory. None leaves a file
  // behind.
  const std::string under_missing = dir + "/no/such/dir/s.geistsnap";
  EXPECT_EQ(a->save_file(under_missing).code(), GEIST_E_IO);
  EXPECT_FALSE(exists(under_missing));
  const std::string under_file = path + "/s.geistsnap";
  EXPECT_EQ(a->save_file(under_file).code(), GEIST_E_IO);
  const std::string onto_dir = dir + "/adir";
  ASSERT_EQ(mkdir(onto_dir.c_str(), 0700), 0);
  st = a->save_file(onto_dir);
  EXPECT_EQ(st.code(), GEIST_E_IO) << st.to_string();
  {
    // A write error half way (EFBIG from a file-size limit, as a full disk would give):
    // GEIST_E_IO, the old snapshot under PATH intact, no temporary file left.
    const std::vector<uint8_t> old = test::read_file(path);
    std::unique_ptr<Session> big = busy(40, 40, 2);
    struct rlimit saved {};
    ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &saved), 0);
    void (*prev)(int) = signal(SIGXFSZ, SIG_IGN);
    struct rlimit lim = saved;
    lim.rlim_cur = 4096;
    ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &lim), 0);
    st = big->save_file(path);
    setrlimit(RLIMIT_FSIZE, &saved);
    signal(SIGXFSZ, prev);
    EXPECT_EQ(st.code(), GEIST_E_IO) << st.to_string();
    EXPECT_TRUE(test::read_file(path) == old) << "a failed write changed the file under PATH";
  }
  EXPECT_EQ(temp_files(dir), std::vector<std::string>{}) << "a partial file was left behind";

  for (const char *f : {"/s.geistsnap", "/half.geistsnap", "/empty.geistsnap"}) {
    std::remove((dir + f).c_str());
  }
  rmdir(onto_dir.c_str());
  rmdir(dir.c_str());
}

// geist replaces a path only if it is absent, empty, or a geist snapshot; everything else
// (a user's file, a symlink, a directory, a FIFO, a socket, a device) is refused before
// anything is written, and left exactly as it was.
TEST_F(SnapshotInt, SaveFileReplacesOnlySnapshots) {
  const std::string dir = temp_dir();
  ASSERT_FALSE(dir.empty());
  std::unique_ptr<Session> a = busy(6, 10, 1);
  const std::vector<uint8_t> img = snap(*a);
  auto refused = [&](const std::string &p, const char *needle, const char *what) {
    SCOPED_TRACE(what);
    Status st = check_snapshot_target(p);
    EXPECT_EQ(st.code(), GEIST_E_IO) << st.to_string();
    EXPECT_NE(st.message().find(needle), std::string::npos) << st.message();
    EXPECT_NE(st.message().find(p), std::string::npos) << "the message names the path: " << st.message();
    st = a->save_file(p);
    EXPECT_EQ(st.code(), GEIST_E_IO) << st.to_string();
    EXPECT_EQ(geist_snapshot_file_check(p.c_str()), GEIST_E_IO);
  };
  // A user's file, a file that only starts like one, a symlink to a snapshot.
  const std::string user = dir + "/notes.txt";
  write_file(user, "my notes\n");
  refused(user, "not a geist snapshot", "a user's text file");
  EXPECT_EQ(read_all(user), "my notes\n");
  const std::string gguf = dir + "/model.gguf";
  write_file(gguf, std::string("GGUF\3\0\0\0 and more", 17));
  refused(gguf, "not a geist snapshot", "a GGUF file");
  EXPECT_EQ(read_all(gguf), std::string("GGUF\3\0\0\0 and more", 17));
  const std::string short_file = dir + "/short";
  write_file(short_file, "GEIST");
  refused(short_file, "not a geist snapshot", "5 bytes of the magic");
  const std::string target = dir + "/real.geistsnap", link = dir + "/link.geistsnap";
  ASSERT_TRUE(a->save_file(target));
  ASSERT_EQ(symlink(target.c_str(), link.c_str()), 0);
  refused(link, "symbolic link", "a symlink to a snapshot");
  struct stat ls {};
  ASSERT_EQ(lstat(link.c_str(), &ls), 0);
  EXPECT_TRUE(S_ISLNK(ls.st_mode)) << "the link was replaced";
  const std::string dangling = dir + "/dangling";
  ASSERT_EQ(symlink((dir + "/nowhere").c_str(), dangling.c_str()), 0);
  refused(dangling, "symbolic link", "a dangling symlink");
  EXPECT_FALSE(exists(dir + "/nowhere"));
  // Not regular files. A FIFO must not block the check (no reader, no writer).
  const std::string fifo = dir + "/fifo";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  refused(fifo, "FIFO", "a FIFO");
  const std::string sub = dir + "/sub";
  ASSERT_EQ(mkdir(sub.c_str(), 0700), 0);
  refused(sub, "directory", "a directory");
  const std::string sock = dir + "/sock";
  {
    const int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    ASSERT_GE(fd, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    ASSERT_LT(sock.size(), sizeof addr.sun_path);
    std::memcpy(addr.sun_path, sock.c_str(), sock.size() + 1);
    ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr *>(&addr), sizeof addr), 0);
    close(fd);
  }
  refused(sock, "socket", "a socket");
  // A character device: /dev/null's twin where we may make one (root), else /dev/null
  // itself, which the check refuses before anything could be written.
  const std::string dev = dir + "/null";
  const bool have_dev = mknod(dev.c_str(), S_IFCHR | 0666, makedev(1, 3)) == 0;
  refused(have_dev ? dev : "/dev/null", "character device", "a character device");
  struct stat ds {};
  ASSERT_EQ(stat("/dev/null", &ds), 0);
  EXPECT_TRUE(S_ISCHR(ds.st_mode));

  // What may be replaced: nothing there, an empty file, a snapshot, a corrupt snapshot.
  const std::string fresh = dir + "/fresh.geistsnap";
  EXPECT_EQ(geist_snapshot_file_check(fresh.c_str()), GEIST_OK);
  EXPECT_FALSE(exists(fresh)) << "the check created the file";
  ASSERT_TRUE(a->save_file(fresh));
  EXPECT_TRUE(test::read_file(fresh) == img);
  const std::string empty = dir + "/empty";
  write_file(empty, "");
  ASSERT_TRUE(a->save_file(empty));
  EXPECT_TRUE(test::read_file(empty) == img);
  std::vector<uint8_t> cut(img.begin(), img.begin() + 100);
  const std::string corrupt = dir + "/cut.geistsnap";
  write_file(corrupt, std::string(cut.begin(), cut.end()));
  ASSERT_TRUE(a->save_file(corrupt));
  EXPECT_TRUE(test::read_file(corrupt) == img);
  EXPECT_EQ(temp_files(dir), std::vector<std::string>{});
  remove_tree(dir);
}

// A writer killed mid-save leaves at most a temporary file that no process holds; the
// next save to the same path removes it, and never a temporary file a live writer holds
// or a file that is not geist's.
TEST_F(SnapshotInt, SaveFileRemovesStaleTemporaries) {
  const std::string dir = temp_dir();
  ASSERT_FALSE(dir.empty());
  std::unique_ptr<Session> a = busy(6, 10, 1);
  const std::vector<uint8_t> img = snap(*a);
  const std::string path = dir + "/s.geistsnap";
  const std::string img_s(img.begin(), img.end());
  write_file(path + ".tmp.999999999", img_s.substr(0, 1000));      // an older geist's name
  write_file(path + ".tmp.999999998.3", img_s.substr(0, 77));      // this geist's name
  write_file(path + ".tmp.12", "a user's file with that name");    // not geist's: kept
  write_file(path + ".tmp.x", std::string(kSnapshotMagic, 8));     // not the name pattern: kept
  write_file(dir + "/other.tmp.5", std::string(kSnapshotMagic, 8));  // another path's: kept
  const std::string live = path + ".tmp.7.7";                        // a live writer holds it
  write_file(live, img_s.substr(0, 500));
  const int held = open(live.c_str(), O_RDONLY);
  ASSERT_GE(held, 0);
  ASSERT_EQ(flock(held, LOCK_EX), 0);
  ASSERT_TRUE(a->save_file(path));
  EXPECT_EQ(temp_files(dir), (std::vector<std::string>{"other.tmp.5", "s.geistsnap.tmp.12", "s.geistsnap.tmp.7.7",
                                                       "s.geistsnap.tmp.x"}));
  close(held);
  ASSERT_TRUE(a->save_file(path));  // now nobody holds it
  EXPECT_EQ(temp_files(dir),
            (std::vector<std::string>{"other.tmp.5", "s.geistsnap.tmp.12", "s.geistsnap.tmp.x"}));
  EXPECT_TRUE(test::read_file(path) == img);
  remove_tree(dir);
}

// kill -9 at random moments of a loop of saves: PATH always holds a whole snapshot, and
// after the next save no temporary file is left.
TEST_F(SnapshotInt, SaveFileKilledMidWrite) {
  const std::string dir = temp_dir();
  ASSERT_FALSE(dir.empty());
  std::unique_ptr<Session> a = busy(20, 150, 2);
  const std::vector<uint8_t> img = snap(*a);
  const std::string path = dir + "/s.geistsnap";
  ASSERT_TRUE(a->save_file(path));
  for (int round = 0; round < 12; ++round) {
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {  // the child only saves: no thread pool work after fork
      for (;;) {
        if (!a->save_file(path)) _exit(3);
      }
    }
    usleep(2000 + 1500 * round);
    kill(pid, SIGKILL);
    int status = 0;
    waitpid(pid, &status, 0);
    ASSERT_TRUE(WIFSIGNALED(status)) << "the saving child failed: status " << status;
    EXPECT_TRUE(test::read_file(path) == img) << "round " << round << ": PATH is not the whole snapshot";
  }
  ASSERT_TRUE(a->save_file(path));
  EXPECT_EQ(temp_files(dir), std::vector<std::string>{});
  remove_tree(dir);
}

// load_file refuses a FIFO at once (no writer: it would block forever) and reads only the
// header of a large file that is not a snapshot (no allocation of its size).
TEST_F(SnapshotInt, LoadFileLooksAtTheHeaderFirst) {
  const std::string dir = temp_dir();
  ASSERT_FALSE(dir.empty());
  std::unique_ptr<Session> t = busy(3, 3, 0);
  const std::vector<uint8_t> before = snap(*t);
  const std::string fifo = dir + "/fifo";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  Status st = t->load_file(fifo);
  EXPECT_EQ(st.code(), GEIST_E_IO) << st.to_string();
  EXPECT_NE(st.message().find("FIFO"), std::string::npos) << st.message();

  const std::string big = dir + "/big.bin";
  {
    const int fd = open(big.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(ftruncate(fd, off_t(2) << 30), 0);  // 2 GiB, sparse
    ASSERT_EQ(pwrite(fd, "not a snapshot", 14, 0), 14);
    close(fd);
  }
  struct rusage r0 {}, r1 {};
  getrusage(RUSAGE_SELF, &r0);
  st = t->load_file(big);
  getrusage(RUSAGE_SELF, &r1);
  EXPECT_EQ(st.code(), GEIST_E_BAD_FORMAT) << st.to_string();
  EXPECT_NE(st.message().find("not a geist session snapshot"), std::string::npos) << st.message();
  EXPECT_LT(r1.ru_maxrss - r0.ru_maxrss, 256 * 1024) << "peak RSS grew by " << (r1.ru_maxrss - r0.ru_maxrss)
                                                     << " KiB: the file was read";
  // A snapshot header whose size is not the file's: refused before the rest is read.
  std::vector<uint8_t> img = snap(*t);
  img.resize(img.size() + 1);
  const std::string longer = dir + "/longer.geistsnap";
  write_file(longer, std::string(img.begin(), img.end()));
  st = t->load_file(longer);
  EXPECT_EQ(st.code(), GEIST_E_BAD_FORMAT) << st.to_string();
  EXPECT_NE(st.message().find("header says"), std::string::npos) << st.message();
  EXPECT_TRUE(snap(*t) == before);
  remove_tree(dir);
}

// The C ABI maps the same statuses and records the message on the session.
TEST_F(SnapshotInt, CApi) {
  geist_model *m = nullptr;
  ASSERT_EQ(geist_model_load(test::data_path("tiny_gemma3.gguf").c_str(), nullptr, &m), GEIST_OK);
  geist_session_params p = geist_session_params_default();
  p.n_ctx = 64;
  p.n_threads = 1;
  p.chunk = 4;
  geist_session *s = nullptr, *t = nullptr;
  ASSERT_EQ(geist_session_create(m, &p, &s), GEIST_OK);
  ASSERT_EQ(geist_session_create(m, &p, &t), GEIST_OK);
  const std::vector<int32_t> x = toks(20, 4);
  ASSERT_EQ(geist_session_pin_prefix(s, x.data(), 9), GEIST_OK);
  ASSERT_EQ(geist_session_prefill_tokens(s, x.data() + 9, 11), GEIST_OK);
  size_t size = 0, w = 0;
  ASSERT_EQ(geist_session_snapshot_size(s, &size), GEIST_OK);
  std::vector<uint8_t> img(size);
  ASSERT_EQ(geist_session_snapshot(s, img.data(), img.size(), &w), GEIST_OK);
  ASSERT_EQ(w, size);

  ASSERT_EQ(geist_session_prefill_tokens(t, x.data(), 3), GEIST_OK);
  auto t_image = [&] {
    size_t n = 0, wr = 0;
    EXPECT_EQ(geist_session_snapshot_size(t, &n), GEIST_OK);
    std::vector<uint8_t> b(n);
    EXPECT_EQ(geist_session_snapshot(t, b.data(), b.size(), &wr), GEIST_OK);
    return b;
  };
  const std::vector<uint8_t> before = t_image();
  std::vector<uint8_t> bad = img;
  bad[img.size() / 2] ^= 0x10;
  EXPECT_EQ(geist_session_restore(t, bad.data(), bad.size()), GEIST_E_BAD_FORMAT);
  EXPECT_NE(std::string(geist_session_error(t)).find("checksum"), std::string::npos) << geist_session_error(t);
  EXPECT_EQ(geist_session_restore(t, nullptr, 10), GEIST_E_INVALID_ARGUMENT);
  EXPECT_EQ(geist_session_restore(nullptr, img.data(), img.size()), GEIST_E_INVALID_ARGUMENT);
  EXPECT_TRUE(t_image() == before);
  EXPECT_EQ(geist_session_restore(t, img.data(), img.size()), GEIST_OK);
  EXPECT_EQ(geist_session_n_tokens(t), 20u);
  EXPECT_EQ(geist_session_n_pinned(t), 9u);
  EXPECT_TRUE(t_image() == img);
  geist_session_free(s);
  geist_session_free(t);
  geist_model_free(m);
}

}  // namespace
}  // namespace geist
