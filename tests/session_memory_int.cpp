// Memory per request (issue 12, finding 11): one session serving many requests must not
// hold more memory at the end than after its warm-up, in every mode of the pinned-prefix
// workload (geist bench pinned), driven through the public C ABI:
//   full      clear, prefill prefix + request, decode
//   pin       pin once; per request reset + prefill of the request + decode
//   snapshot  pin + snapshot once; per request restore + prefill of the request + decode
// on the tiny Gemma 3 and a tiny Gemma 4 (sliding windows of 8, so every request wraps
// the ring and resets / restores copy checkpoint rows back).
//
// The measure is the heap in use (exact, not noisy): glibc's mallinfo2() (uordblks +
// hblkhd: chunks in the arenas plus mmapped chunks), or the sanitizer allocator's count
// under ASan/TSan (their malloc bypasses glibc's). Requests vary in length with a period
// of 8, so every capacity reaches its steady size during the warm-up; after it, the
// lowest heap of the last window of requests must not exceed the highest of the first
// window by more than the slack.
// - 1 thread: everything runs on the caller, so the heap is a deterministic function of
//   the requests: 1 KiB of slack (windows 440 requests apart: any leaked allocation, or
//   a vector that gains 4 bytes per request, fails).
// - 2 threads: the pool's worker grows its thread-local kernel scratch (ops.cpp; bounded
//   by the chunk size: 2 threads hold ~13 KiB more heap than 1 on these models) the first
//   time it happens to claim a task of a given kernel and size, which depends on
//   scheduling: 16 KiB of slack (a leak of ~40 bytes per request fails).
// 600 requests each; an injected leak of one small vector per prefill fails every case.
// Anonymous RSS (/proc/self/status RssAnon) is checked too, with a slack of 256 KiB,
// outside sanitizers (their quarantine and shadow memory move it): that catches memory
// that bypasses malloc (mmap). File-backed RSS is not checked: it is pages of the mapped
// model (embedding rows of tokens seen for the first time), bounded by the file.
#include <gtest/gtest.h>
#include <malloc.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <ostream>
#include <string>
#include <vector>

#include "geist/geist.h"
#include "test_util.h"

#if defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) || __has_feature(memory_sanitizer)
#define GEIST_TEST_SANITIZER_HEAP 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define GEIST_TEST_SANITIZER_HEAP 1
#endif
#ifdef GEIST_TEST_SANITIZER_HEAP
// From <sanitizer/allocator_interface.h>, which GCC does not install (clang does); the
// ASan and TSan runtimes of both export it.
extern "C" size_t __sanitizer_get_current_allocated_bytes(void);
#endif

namespace {

constexpr int kWarmup = 40;              // requests before the first window
constexpr int kWindow = 60;              // requests in each window
constexpr int kPrefix = 40;              // pinned tokens (window 8: a checkpoint of 7 rows)
constexpr int kRestLens[8] = {48, 17, 33, 25, 41, 20, 36, 29};  // request tokens, period 8
constexpr int kGen = 8;                  // decoded tokens per request

// Heap bytes in use by the process; -1 if this build cannot tell.
int64_t heap_in_use() {
#ifdef GEIST_TEST_SANITIZER_HEAP
  return int64_t(__sanitizer_get_current_allocated_bytes());
#elif defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 33))
  const struct mallinfo2 mi = mallinfo2();
  return int64_t(mi.uordblks + mi.hblkhd);
#else
  return -1;
#endif
}

// RssAnon of /proc/self/status in KiB, -1 if unknown. Reads into a fixed buffer (no
// allocation that would stay behind).
int64_t rss_anon_kb() {
  FILE *f = std::fopen("/proc/self/status", "r");
  if (!f) return -1;
  char line[256];
  int64_t kb = -1;
  while (std::fgets(line, sizeof line, f)) {
    if (std::strncmp(line, "RssAnon:", 8) == 0) {
      kb = std::strtoll(line + 8, nullptr, 10);
      break;
    }
  }
  std::fclose(f);
  return kb;
}

enum class Mode { kFull, kPin, kSnapshot };

struct Case {
  const char *model;  // under tests/data
  Mode mode;
  int threads;
  int requests;
  int64_t slack;  // heap bytes
};

const char *mode_name(Mode m) { return m == Mode::kFull ? "full" : m == Mode::kPin ? "pin" : "snapshot"; }

// How gtest prints a Case (ctest's listing and failure messages): without it gtest dumps the
// struct's raw bytes, pointer and padding included, so the listing changed from build to build.
void PrintTo(const Case &c, std::ostream *os) {
  *os << c.model << ' ' << mode_name(c.mode) << ' ' << c.threads << "t " << c.requests << " requests";
}

std::string case_name(const ::testing::TestParamInfo<Case> &info) {
  std::string m = info.param.model;
  m = m.substr(m.find_last_of('/') + 1);
  m = m.substr(0, m.find('.'));
  return m + "_" + mode_name(info.param.mode) + "_" + std::to_string(info.param.threads) + "t";
}

class SessionMemoryInt : public ::testing::TestWithParam<Case> {};

TEST_P(SessionMemoryInt, HeapDoesNotGrowPerRequest) {
  if (heap_in_use() < 0) GEIST_SKIP("no heap-in-use counter on this platform (needs glibc >= 2.33 or a sanitizer)");
  const Case c = GetParam();
  geist_model *m = nullptr;
  ASSERT_EQ(geist_model_load(geist::test::data_path(c.model).c_str(), nullptr, &m), GEIST_OK) << geist_last_error();
  geist_model_info info;
  ASSERT_EQ(geist_model_get_info(m, &info), GEIST_OK);
  geist_session_params sp = geist_session_params_default();
  sp.n_ctx = 256;
  sp.chunk = 16;
  sp.n_threads = c.threads;
  sp.sampling.temperature = 0.9f;  // the whole sampler: top-k/p, min-p, penalties, RNG
  sp.sampling.repeat_penalty = 1.1f;
  sp.sampling.repeat_last_n = 64;
  geist_session *s = nullptr;
  ASSERT_EQ(geist_session_create(m, &sp, &s), GEIST_OK) << geist_last_error();

  // Every buffer the loop uses is sized here, so the test itself allocates nothing per
  // request.
  uint64_t x = 0x9E3779B97F4A7C15ull;
  auto next_id = [&] {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    return geist_token(6 + (x >> 33) % uint64_t(info.n_vocab - 6));  // no specials
  };
  const int max_rest = *std::max_element(std::begin(kRestLens), std::end(kRestLens));
  std::vector<geist_token> prefix(kPrefix), whole(kPrefix + max_rest);
  for (geist_token &t : prefix) t = next_id();
  std::copy(prefix.begin(), prefix.end(), whole.begin());
  std::vector<uint8_t> image;
  if (c.mode != Mode::kFull) {
    ASSERT_EQ(geist_session_pin_prefix(s, prefix.data(), prefix.size()), GEIST_OK);
  }
  if (c.mode == Mode::kSnapshot) {
    size_t size = 0, written = 0;
    ASSERT_EQ(geist_session_snapshot_size(s, &size), GEIST_OK);
    image.resize(size);
    ASSERT_EQ(geist_session_snapshot(s, image.data(), image.size(), &written), GEIST_OK);
  }
  const int n_req = c.requests;
  std::vector<int64_t> heap(n_req), rss(n_req);
  geist_sampling_params sampling = sp.sampling;

  for (int r = 0; r < n_req; ++r) {
    const int n_rest = kRestLens[r % 8];
    for (int i = 0; i < n_rest; ++i) whole[kPrefix + i] = next_id();
    geist_status st = GEIST_OK;
    switch (c.mode) {
      case Mode::kFull:
        st = geist_session_clear(s);
        break;
      case Mode::kPin:
        st = geist_session_reset(s);
        break;
      case Mode::kSnapshot:
        st = geist_session_restore(s, image.data(), image.size());
        break;
    }
    sampling.seed = uint64_t(r);  // a per-request seed, as geist.h suggests after a reset
    if (st == GEIST_OK) st = geist_session_set_sampling(s, &sampling);
    if (st == GEIST_OK) {
      st = c.mode == Mode::kFull ? geist_session_prefill_tokens(s, whole.data(), size_t(kPrefix + n_rest))
                                 : geist_session_prefill_tokens(s, whole.data() + kPrefix, size_t(n_rest));
    }
    for (int g = 0; st == GEIST_OK && g < kGen; ++g) {
      geist_token t;
      st = geist_session_decode_step(s, &t);
    }
    ASSERT_EQ(st, GEIST_OK) << "request " << r << ": " << geist_session_error(s);
    ASSERT_EQ(geist_session_n_tokens(s), size_t(kPrefix + n_rest + kGen));
    heap[r] = heap_in_use();
    rss[r] = rss_anon_kb();
  }
  geist_session_free(s);
  geist_model_free(m);

  // Highest of the window after the warm-up against the lowest of the last window: a
  // steady state gives <= 0 whatever the jitter; a per-request leak gives about
  // (n_req - kWarmup - kWindow) times its size.
  const auto early = heap.begin() + kWarmup, late = heap.end() - kWindow;
  const int64_t early_max = *std::max_element(early, early + kWindow);
  const int64_t late_min = *std::min_element(late, heap.end());
  const double per_request = double(heap.back() - heap[kWarmup]) / double(n_req - 1 - kWarmup);
  std::printf("%s: heap in use after request 1 %lld, %d %lld, %d %lld bytes (%+.1f bytes/request after the "
              "warm-up); RssAnon %lld -> %lld -> %lld KiB\n",
              case_name({c, 0}).c_str(), (long long)heap[0], kWarmup + 1, (long long)heap[kWarmup], n_req,
              (long long)heap.back(), per_request, (long long)rss[0], (long long)rss[kWarmup],
              (long long)rss.back());
  EXPECT_LE(late_min - early_max, c.slack)
      << "the heap grows per request: highest of requests " << kWarmup + 1 << ".." << kWarmup + kWindow << " is "
      << early_max << " bytes, lowest of requests " << n_req - kWindow + 1 << ".." << n_req << " is "
      << late_min << " (" << per_request << " bytes/request)";
#ifndef GEIST_TEST_SANITIZER_HEAP
  constexpr int64_t kRssSlackKb = 256;  // anonymous RSS, KiB
  if (rss[kWarmup] >= 0) {
    EXPECT_LE(rss.back() - rss[kWarmup], kRssSlackKb)
        << "anonymous RSS grows per request: " << rss[kWarmup] << " KiB after request " << kWarmup + 1 << ", "
        << rss.back() << " KiB after request " << n_req;
  }
#endif
}

// A restore overwrites the session's own buffers in place when they are large enough
// (snapshot.cpp): images of every shape (pin shorter than the window, pin beyond it, pin
// at the end, no pin, empty) restored one after another into one session leave it
// exactly as a fresh session restored from the same image: the same image back, and
// the same logits after reset + prefill + decode.
TEST(SessionMemoryRestore, InPlaceRestoreOfEveryShapeIsExact) {
  geist_model *m = nullptr;
  ASSERT_EQ(geist_model_load(geist::test::data_path("tiny_gemma3.gguf").c_str(), nullptr, &m), GEIST_OK)
      << geist_last_error();
  geist_model_info info;
  ASSERT_EQ(geist_model_get_info(m, &info), GEIST_OK);
  geist_session_params sp = geist_session_params_default();
  sp.n_ctx = 256;
  sp.chunk = 16;
  sp.n_threads = 1;
  sp.sampling.temperature = 0.9f;
  sp.sampling.repeat_penalty = 1.1f;
  sp.sampling.repeat_last_n = 64;
  uint64_t x = 42;
  auto ids = [&](size_t n) {
    std::vector<geist_token> v(n);
    for (geist_token &t : v) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      t = geist_token(6 + (x >> 33) % uint64_t(info.n_vocab - 6));
    }
    return v;
  };
  auto image_of = [&](geist_session *s) {
    size_t size = 0, written = 0;
    EXPECT_EQ(geist_session_snapshot_size(s, &size), GEIST_OK);
    std::vector<uint8_t> img(size);
    EXPECT_EQ(geist_session_snapshot(s, img.data(), img.size(), &written), GEIST_OK);
    return img;
  };
  // {pinned tokens, tokens after the pin}
  const std::vector<std::pair<size_t, size_t>> shapes = {{3, 20}, {40, 30}, {40, 0}, {0, 50}, {100, 5}, {0, 0}, {12, 90}};
  std::vector<std::vector<uint8_t>> images;
  for (const auto &[pinned, after] : shapes) {
    geist_session *s = nullptr;
    ASSERT_EQ(geist_session_create(m, &sp, &s), GEIST_OK);
    if (pinned > 0) {
      const std::vector<geist_token> p = ids(pinned);
      ASSERT_EQ(geist_session_pin_prefix(s, p.data(), p.size()), GEIST_OK);
    }
    if (after > 0) {
      const std::vector<geist_token> r = ids(after);
      ASSERT_EQ(geist_session_prefill_tokens(s, r.data(), r.size()), GEIST_OK);
    }
    images.push_back(image_of(s));
    geist_session_free(s);
  }
  // Logits after reset + 5 tokens + 3 decode steps, or after the 3 decode steps alone
  // when the session is empty after the reset (no pin).
  const std::vector<geist_token> more = ids(5);
  auto continue_from = [&](geist_session *s) {
    EXPECT_EQ(geist_session_reset(s), GEIST_OK);
    EXPECT_EQ(geist_session_prefill_tokens(s, more.data(), more.size()), GEIST_OK);
    for (int g = 0; g < 3; ++g) {
      geist_token t;
      EXPECT_EQ(geist_session_decode_step(s, &t), GEIST_OK);
    }
    size_t nv = 0;
    const float *l = geist_session_logits(s, &nv);
    return l ? std::vector<float>(l, l + nv) : std::vector<float>();
  };
  geist_session *t = nullptr;
  ASSERT_EQ(geist_session_create(m, &sp, &t), GEIST_OK);
  const int order[] = {1, 0, 4, 2, 3, 1, 5, 0, 6, 4, 6, 2, 1, 1};
  for (int k : order) {
    SCOPED_TRACE("image " + std::to_string(k) + " (pinned " + std::to_string(shapes[k].first) + ", after " +
                 std::to_string(shapes[k].second) + ")");
    const std::vector<uint8_t> &img = images[k];
    ASSERT_EQ(geist_session_restore(t, img.data(), img.size()), GEIST_OK) << geist_session_error(t);
    EXPECT_TRUE(image_of(t) == img) << "the restored session does not give its image back";
    geist_session *fresh = nullptr;
    ASSERT_EQ(geist_session_create(m, &sp, &fresh), GEIST_OK);
    ASSERT_EQ(geist_session_restore(fresh, img.data(), img.size()), GEIST_OK);
    const std::vector<float> a = continue_from(t), b = continue_from(fresh);
    ASSERT_EQ(a.size(), b.size());
    EXPECT_TRUE(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0)
        << "logits after reset + prefill + decode differ from a fresh session's";
    geist_session_free(fresh);
  }
  geist_session_free(t);
  geist_model_free(m);
}

std::vector<Case> cases() {
  std::vector<Case> v;
  for (const char *model : {"tiny_gemma3.gguf", "gemma4/tiny_gemma4_a_q8_0.gguf"})
    for (Mode mode : {Mode::kFull, Mode::kPin, Mode::kSnapshot}) {
      v.push_back({model, mode, 1, 600, 1024});
      v.push_back({model, mode, 2, 600, 16384});
    }
  return v;
}

INSTANTIATE_TEST_SUITE_P(Modes, SessionMemoryInt, ::testing::ValuesIn(cases()), case_name);

}  // namespace
