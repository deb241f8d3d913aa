// Many sessions over one Model, on several threads at once (run under TSan in CI).
// Each of 4 threads drives its own two sessions (each with a 2-thread pool) through pin,
// reset, prefill, sampled decode and snapshot/restore; every token and every logits row
// it sees must equal what the same script produced when run alone on one thread.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "engine/model.h"
#include "engine/session.h"
#include "test_util.h"

namespace geist {
namespace {

struct Trace {
  std::vector<int32_t> tokens;
  std::vector<float> logits;  // concatenated rows
  std::string error;
};

std::unique_ptr<Session> make(const Model &m, int chunk, uint64_t seed) {
  SessionParams p;
  p.n_ctx = 512;
  p.chunk = chunk;
  p.n_threads = 2;
  p.sampling.temperature = 0.9f;
  p.sampling.seed = seed;
  Result<std::unique_ptr<Session>> s = Session::create(m, p);
  return s ? std::move(s).value() : nullptr;
}

// The script of worker w; deterministic given w.
Trace run_script(const Model &m, int w) {
  Trace tr;
  auto fail = [&](const std::string &what, const Status &st) { tr.error = what + ": " + st.to_string(); };
  auto keep = [&](const Session &s) { tr.logits.insert(tr.logits.end(), s.logits(), s.logits() + s.n_vocab()); };
  std::unique_ptr<Session> a = make(m, 5 + 11 * w, 1000 + w), b = make(m, 64, 2000 + w);
  if (!a || !b) {
    tr.error = "create failed";
    return tr;
  }
  std::vector<int32_t> seq;
  uint64_t x = 777 + w;
  for (int i = 0; i < 200; ++i) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    seq.push_back(int32_t(6 + (x >> 33) % uint64_t(m.info().n_vocab - 6)));
  }
  const size_t P = 40 + 10 * w;
  if (Status st = a->pin_prefix(seq.data(), P); !st) return fail("pin", st), tr;
  keep(*a);
  for (int req = 0; req < 4; ++req) {
    a->reset();
    const size_t rest = 10 + 17 * req;
    if (Status st = a->prefill(seq.data() + P, rest); !st) return fail("prefill", st), tr;
    keep(*a);
    for (int i = 0; i < 6; ++i) {
      int32_t t = -1;
      if (Status st = a->decode_step(&t); !st) return fail("decode", st), tr;
      tr.tokens.push_back(t);
    }
    keep(*a);
  }
  std::vector<uint8_t> img(a->snapshot_size());
  size_t written = 0;
  if (Status st = a->snapshot(img.data(), img.size(), &written); !st) return fail("snapshot", st), tr;
  if (Status st = b->restore(img.data(), img.size()); !st) return fail("restore", st), tr;
  for (int i = 0; i < 6; ++i) {
    int32_t t = -1;
    if (Status st = b->decode_step(&t); !st) return fail("decode after restore", st), tr;
    tr.tokens.push_back(t);
  }
  keep(*b);
  b->reset();
  keep(*b);
  return tr;
}

TEST(ConcurrencyInt, FourThreadsMatchSingleThreadedRuns) {
  Result<std::unique_ptr<Model>> mr = Model::load(test::data_path("tiny_gemma3.gguf"));
  ASSERT_TRUE(mr) << mr.status().to_string();
  const Model &m = **mr;
  constexpr int kWorkers = 4;
  std::vector<Trace> alone(kWorkers), together(kWorkers);
  for (int w = 0; w < kWorkers; ++w) {
    alone[w] = run_script(m, w);
    ASSERT_EQ(alone[w].error, "") << "worker " << w;
    ASSERT_EQ(alone[w].tokens.size(), 30u);
  }
  // Different workers see different things (the comparison below is not vacuous).
  EXPECT_NE(alone[0].tokens, alone[1].tokens);
  for (int round = 0; round < 2; ++round) {
    std::vector<std::thread> threads;
    for (int w = 0; w < kWorkers; ++w) threads.emplace_back([&, w] { together[w] = run_script(m, w); });
    for (auto &t : threads) t.join();
    for (int w = 0; w < kWorkers; ++w) {
      SCOPED_TRACE("round " + std::to_string(round) + ", worker " + std::to_string(w));
      ASSERT_EQ(together[w].error, "");
      EXPECT_EQ(together[w].tokens, alone[w].tokens);
      ASSERT_EQ(together[w].logits.size(), alone[w].logits.size());
      EXPECT_EQ(std::memcmp(together[w].logits.data(), alone[w].logits.data(), alone[w].logits.size() * sizeof(float)),
                0);
    }
  }
}

}  // namespace
}  // namespace geist
