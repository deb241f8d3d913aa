// Checks of the multi-session step (Session::decode_batch, ArchModel::forward over several
// sequences) shared by the CPU test (decode_batch_int.cpp) and the CUDA one
// (cuda_model_int.cpp): whatever else shares a step, a session's tokens and logits are
// bit-identical to running it alone.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "engine/model.h"
#include "engine/session.h"

namespace geist::test {

inline std::vector<int32_t> batch_ids(const Model &m, size_t n, uint64_t seed) {
  std::vector<int32_t> v(n);
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  const uint64_t span = uint64_t(std::min<int64_t>(m.info().n_vocab, 100000) - 6);
  for (auto &t : v) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    t = int32_t(6 + (x >> 33) % span);
  }
  return v;
}

inline std::unique_ptr<Session> batch_session(const Model &m, int chunk, int threads, int i) {
  SessionParams p;
  p.n_ctx = 512;
  p.chunk = chunk;
  p.n_threads = threads;
  if (i % 2 == 0) {
    p.sampling.temperature = 0;  // greedy
  } else {  // sampled, each with its own seed and a repetition penalty (history per session)
    p.sampling.temperature = 1.1f;
    p.sampling.top_k = 0;
    p.sampling.top_p = 1.0f;
    p.sampling.min_p = 0.0f;
    p.sampling.repeat_penalty = 1.2f;
    p.sampling.seed = 100 + uint64_t(i);
  }
  Result<std::unique_ptr<Session>> s = Session::create(m, p);
  EXPECT_TRUE(s) << s.status().to_string();
  return s ? std::move(s).value() : nullptr;
}

// Six sessions with prompts of different lengths (one pinned and reset, one of a single
// token) decode 12 tokens alone and, in a second identical set, together through
// decode_batch; the set shrinks after step 5 and a session joins late. Tokens and logits
// must be equal bit for bit at every step.
inline void expect_decode_batch_equals_alone(const Model &m, const std::string &what, int threads) {
  const size_t nv = size_t(m.info().n_vocab);
  const size_t lens[] = {1, 5, 37, 90, 200, 13};
  constexpr int kN = 6, kSteps = 12;
  std::vector<std::unique_ptr<Session>> alone, together;
  for (int i = 0; i < kN; ++i) {
    for (auto *set : {&alone, &together}) {
      std::unique_ptr<Session> s = batch_session(m, 16, threads, i);
      ASSERT_TRUE(s);
      const std::vector<int32_t> ids = batch_ids(m, lens[i] + 20, uint64_t(i));
      if (i == 2) {  // a pinned prefix, a junk request, reset, then the prompt's rest
        ASSERT_TRUE(s->pin_prefix(ids.data(), 30).is_ok());
        ASSERT_TRUE(s->prefill(ids.data() + lens[i], 20).is_ok());
        s->reset();
        ASSERT_TRUE(s->prefill(ids.data() + 30, lens[i] - 30).is_ok());
      } else {
        ASSERT_TRUE(s->prefill(ids.data(), lens[i]).is_ok());
      }
      set->push_back(std::move(s));
    }
  }
  for (int step = 0; step < kSteps; ++step) {
    std::vector<int> active;
    for (int i = 0; i < kN; ++i) {
      if ((i == 4 && step > 5) || (i == 5 && step < 3)) continue;  // 4 leaves, 5 joins late
      active.push_back(i);
    }
    std::vector<Session *> batch;
    for (int i : active) batch.push_back(together[size_t(i)].get());
    std::vector<int32_t> got(batch.size());
    const Status st = Session::decode_batch(batch.data(), batch.size(), got.data());
    ASSERT_TRUE(st.is_ok()) << what << ": " << st.to_string();
    for (size_t k = 0; k < active.size(); ++k) {
      Session &a = *alone[size_t(active[k])];
      int32_t want = -1;
      ASSERT_TRUE(a.decode_step(&want).is_ok());
      EXPECT_EQ(got[k], want) << what << " session " << active[k] << " step " << step;
      const Session &b = *together[size_t(active[k])];
      EXPECT_EQ(0, std::memcmp(a.logits(), b.logits(), nv * sizeof(float)))
          << what << " session " << active[k] << " step " << step << ": logits differ";
      EXPECT_EQ(a.n_tokens(), b.n_tokens());
    }
  }
}

// ArchModel::forward over sequences of several rows (a prefill chunk beside decodes, as a
// server's continuous batching makes them): the last row of each sequence has the logits
// it has when its chunk runs alone, and a following one-row step over all of them too.
inline void expect_mixed_step_equals_alone(const Model &m, const std::string &what) {
  const models::ArchModel &arch = m.arch();
  Backend &be = arch.backend();
  const size_t nv = size_t(m.info().n_vocab);
  const int rows[] = {3, 1, 7, 2};
  constexpr int kSeqs = 4;
  auto kv = [&] {
    Result<std::unique_ptr<KvStore>> r = be.create_kv(arch.kv_layout(), 128, 16, KvType::F32, KvType::F32);
    EXPECT_TRUE(r) << r.status().to_string();
    return r ? std::move(r).value() : nullptr;
  };
  Result<std::unique_ptr<Exec>> ex = be.create_exec(2, 16);
  ASSERT_TRUE(ex) << ex.status().to_string();
  arch.reserve(**ex);
  std::vector<std::unique_ptr<KvStore>> solo, joint;
  std::vector<std::vector<int32_t>> ids;
  std::vector<float> want(kSeqs * nv), got(kSeqs * nv);
  for (int i = 0; i < kSeqs; ++i) {
    solo.push_back(kv());
    joint.push_back(kv());
    ASSERT_TRUE(solo.back() && joint.back());
    ids.push_back(batch_ids(m, size_t(rows[i]) + 1, 50 + uint64_t(i)));
    // A few tokens of history first, different per sequence.
    const std::vector<int32_t> pre = batch_ids(m, size_t(2 + 3 * i), 70 + uint64_t(i));
    ASSERT_TRUE(arch.forward(pre.data(), int(pre.size()), *solo.back(), **ex, int(pre.size()), nullptr).is_ok());
    ASSERT_TRUE(arch.forward(pre.data(), int(pre.size()), *joint.back(), **ex, int(pre.size()), nullptr).is_ok());
  }
  for (int phase = 0; phase < 2; ++phase) {
    std::vector<int32_t> toks;
    std::vector<StepSeq> seqs;
    for (int i = 0; i < kSeqs; ++i) {
      const int n = phase == 0 ? rows[i] : 1;
      const int32_t *t = phase == 0 ? ids[size_t(i)].data() : ids[size_t(i)].data() + rows[i];
      ASSERT_TRUE(arch.forward(t, n, *solo[size_t(i)], **ex, n - 1, want.data() + size_t(i) * nv).is_ok());
      toks.insert(toks.end(), t, t + n);
      seqs.push_back({joint[size_t(i)].get(), n});
    }
    // Each sequence's row to its own buffer (here in reverse order in one array).
    std::vector<float *> dst(kSeqs);
    for (int i = 0; i < kSeqs; ++i) dst[size_t(i)] = got.data() + size_t(kSeqs - 1 - i) * nv;
    models::ArchModel::LogitRows out;
    out.seq_out = dst.data();
    const Status st = arch.forward(toks.data(), seqs.data(), kSeqs, **ex, out);
    ASSERT_TRUE(st.is_ok()) << st.to_string();
    for (int i = 0; i < kSeqs; ++i) {
      EXPECT_EQ(joint[size_t(i)]->n_past, solo[size_t(i)]->n_past);
      EXPECT_EQ(0, std::memcmp(want.data() + size_t(i) * nv, dst[size_t(i)], nv * sizeof(float)))
          << what << " phase " << phase << " sequence " << i;
    }
  }
}

}  // namespace geist::test
