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

// The greedy token of a logits row as a scan that moves to i whenever x[i] > x[best]
// writes it (the sampler's rule, written out here), over the row with the repetition
// penalty applied to the ids in `penalised` (none: the row as it is).
inline int32_t scan_argmax(const float *x, int64_t n, const std::vector<int32_t> &penalised = {},
                           float penalty = 1.0f) {
  std::vector<float> v(x, x + n);
  std::vector<bool> done(size_t(n), false);
  for (int32_t t : penalised) {
    if (t < 0 || t >= n || done[size_t(t)]) continue;
    done[size_t(t)] = true;
    v[size_t(t)] = v[size_t(t)] > 0 ? v[size_t(t)] / penalty : v[size_t(t)] * penalty;
  }
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i) {
    if (v[size_t(i)] > v[size_t(best)]) best = i;
  }
  return int32_t(best);
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
    std::vector<int32_t> argmax;  // what each greedy session's draw must be
    for (int i : active) {
      batch.push_back(together[size_t(i)].get());
      argmax.push_back(i % 2 == 0 ? scan_argmax(batch.back()->logits(), int64_t(nv)) : -1);
    }
    std::vector<int32_t> got(batch.size());
    const Status st = Session::decode_batch(batch.data(), batch.size(), got.data());
    ASSERT_TRUE(st.is_ok()) << what << ": " << st.to_string();
    for (size_t k = 0; k < active.size(); ++k) {
      Session &a = *alone[size_t(active[k])];
      int32_t want = -1;
      ASSERT_TRUE(a.decode_step(&want).is_ok());
      EXPECT_EQ(got[k], want) << what << " session " << active[k] << " step " << step;
      if (argmax[k] >= 0) {
        EXPECT_EQ(got[k], argmax[k]) << what << " session " << active[k] << " step " << step;
      }
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
  // Each logits row's drawn token (Exec::draw), alone and in the joint step; sequence 1's
  // is not asked for in the joint step and must stay as it was. Sequences 0 and 1 draw the
  // greedy token, 2 and 3 sampled ones (different params and uniforms per row).
  auto spec_of = [](int i) {
    DrawSpec d;
    if (i == 2) d = {0.9f, 40, 0.95f, 0.05f, 0.37};
    if (i == 3) d = {1.3f, 7, 1.0f, 0.0f, 0.81};
    return d;
  };
  std::vector<StepDraw> solo_draw(kSeqs), joint_draw(kSeqs);
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
      StepDraw *const g = &solo_draw[size_t(i)];
      *g = StepDraw{spec_of(i), -1};
      ASSERT_TRUE(arch.forward(t, n, *solo[size_t(i)], **ex, n - 1, want.data() + size_t(i) * nv, &g).is_ok());
      toks.insert(toks.end(), t, t + n);
      seqs.push_back({joint[size_t(i)].get(), n});
    }
    // Each sequence's row to its own buffer (here in reverse order in one array).
    std::vector<float *> dst(kSeqs);
    for (int i = 0; i < kSeqs; ++i) dst[size_t(i)] = got.data() + size_t(kSeqs - 1 - i) * nv;
    std::vector<StepDraw *> gp(kSeqs);
    for (int i = 0; i < kSeqs; ++i) {
      joint_draw[size_t(i)] = StepDraw{spec_of(i), -7};
      gp[size_t(i)] = i == 1 ? nullptr : &joint_draw[size_t(i)];
    }
    models::ArchModel::LogitRows out;
    out.seq_out = dst.data();
    out.draws = gp.data();
    const Status st = arch.forward(toks.data(), seqs.data(), kSeqs, **ex, out);
    ASSERT_TRUE(st.is_ok()) << st.to_string();
    for (int i = 0; i < kSeqs; ++i) {
      EXPECT_EQ(joint[size_t(i)]->n_past, solo[size_t(i)]->n_past);
      EXPECT_EQ(0, std::memcmp(want.data() + size_t(i) * nv, dst[size_t(i)], nv * sizeof(float)))
          << what << " phase " << phase << " sequence " << i;
      const DrawSpec d = spec_of(i);
      std::vector<std::pair<float, int32_t>> cand;
      std::vector<double> pr;
      const int32_t ref = d.temperature <= 0.0f
                              ? scan_argmax(want.data() + size_t(i) * nv, int64_t(nv))
                              : draw_sampled(want.data() + size_t(i) * nv, int64_t(nv), size_t(d.top_k), d.temperature,
                                             d.top_p, d.min_p, d.u, cand, pr);
      EXPECT_EQ(solo_draw[size_t(i)].token, ref) << what << " phase " << phase << " sequence " << i << " alone";
      EXPECT_EQ(joint_draw[size_t(i)].token, i == 1 ? -7 : ref) << what << " phase " << phase << " sequence " << i;
    }
  }
}

// A session's draws whatever the sampling and the state its logits came from: every token
// is the one sampling the logits it had before the step gives (greedy: the scan's argmax of
// the row, penalised where a penalty applies; sampled: a host Sampler with the same params
// and seed on that row, which the step's own draw must match), through greedy and sampled
// steps, a switch of the params mid-way, a pin and reset, a snapshot restore, and
// decode_batch.
inline void expect_draws_follow_the_logits(const Model &m, const std::string &what, int threads) {
  const int64_t nv = m.info().n_vocab;
  std::unique_ptr<Session> s = batch_session(m, 16, threads, 0), other = batch_session(m, 16, threads, 2);
  ASSERT_TRUE(s && other);
  const std::vector<int32_t> ids = batch_ids(m, 40, 9);
  ASSERT_TRUE(s->pin_prefix(ids.data(), 20).is_ok());
  ASSERT_TRUE(s->prefill(ids.data() + 20, 7).is_ok());
  ASSERT_TRUE(other->prefill(ids.data(), 11).is_ok());
  SamplerParams greedy = s->sampling(), penalised = greedy, sampled = greedy, sampled2 = greedy;
  penalised.repeat_penalty = 1.5f;
  penalised.repeat_last_n = -1;  // every token so far
  sampled.temperature = 0.9f;
  sampled.top_k = 40;
  sampled2.temperature = 1.7f;  // hot: the draws reach past the first candidates
  sampled2.top_k = 200;
  sampled2.top_p = 0.99f;
  sampled2.min_p = 0.0f;
  sampled2.seed = 99;
  Sampler ref(sampled);  // the session's sampler while it samples (set_sampling reseeds both)
  std::vector<uint8_t> image;
  for (int step = 0; step < 27; ++step) {
    if (step == 4) {
      ASSERT_TRUE(s->set_sampling(sampled).is_ok());
      ref = Sampler(sampled);
    }
    if (step == 21) {
      ASSERT_TRUE(s->set_sampling(sampled2).is_ok());
      ref = Sampler(sampled2);
    }
    if (step == 7) {
      ASSERT_TRUE(s->set_sampling(penalised).is_ok());
    }
    if (step == 11) {
      ASSERT_TRUE(s->set_sampling(greedy).is_ok());
    }
    if (step == 14) s->reset();  // the pin's logits
    if (step == 16) {
      image.resize(s->snapshot_size());
      size_t n = 0;
      ASSERT_TRUE(s->snapshot(image.data(), image.size(), &n).is_ok());
      image.resize(n);
    }
    if (step == 19) {
      ASSERT_TRUE(s->restore(image.data(), image.size()).is_ok());
    }
    const SamplerParams &p = s->sampling();
    const std::vector<int32_t> hist = p.repeat_penalty != 1.0f ? s->tokens() : std::vector<int32_t>{};
    const int32_t want = p.temperature <= 0          ? scan_argmax(s->logits(), nv, hist, p.repeat_penalty)
                         : p.repeat_penalty == 1.0f ? ref.sample(s->logits(), nv)
                                                    : -1;
    int32_t got = -1;
    if (step % 3 == 2) {  // through decode_batch with another greedy session
      Session *b[] = {other.get(), s.get()};
      int32_t out[2] = {-1, -1};
      const int32_t want_other = scan_argmax(other->logits(), nv);
      ASSERT_TRUE(Session::decode_batch(b, 2, out).is_ok()) << what;
      EXPECT_EQ(out[0], want_other) << what << " step " << step << " (the other session)";
      got = out[1];
    } else {
      ASSERT_TRUE(s->decode_step(&got).is_ok()) << what;
    }
    if (want >= 0) {
      EXPECT_EQ(got, want) << what << " step " << step;
    } else {
      EXPECT_TRUE(got >= 0 && got < nv) << what << " step " << step;
    }
  }
  // Sampled one-row steps (a device backend captures them), then a greedy batch step of
  // more rows than any before on s's exec (its token buffers grow; no sampled row in it),
  // then sampled one-row steps again: the draws still follow the logits (a replayed step
  // must not write where the old buffers were).
  auto sampled_steps = [&](const char *when) {
    ASSERT_TRUE(s->set_sampling(sampled).is_ok());
    ref = Sampler(sampled);
    for (int step = 0; step < 3; ++step) {
      const int32_t want = ref.sample(s->logits(), nv);
      int32_t got = -1;
      ASSERT_TRUE(s->decode_step(&got).is_ok()) << what;
      EXPECT_EQ(got, want) << what << " sampled step " << step << " " << when << " the wide batch";
    }
  };
  sampled_steps("before");
  ASSERT_TRUE(s->set_sampling(greedy).is_ok());
  std::vector<std::unique_ptr<Session>> more;
  std::vector<Session *> wide = {s.get()};
  for (int i = 0; i < 5; ++i) {
    more.push_back(batch_session(m, 16, threads, 2 * i));  // greedy
    ASSERT_TRUE(more.back() && more.back()->prefill(ids.data() + i, 5).is_ok());
    wide.push_back(more.back().get());
  }
  std::vector<int32_t> outs(wide.size(), -1);
  const int32_t want_s = scan_argmax(s->logits(), nv);
  ASSERT_TRUE(Session::decode_batch(wide.data(), wide.size(), outs.data()).is_ok()) << what;
  EXPECT_EQ(outs[0], want_s) << what << " the wide greedy batch";
  sampled_steps("after");
}

// A batched step's logits rows stay with each session (on a device, in its own exec: the
// lead's next step, or the lead's end, must not take them): after decode_batch the lead
// decodes alone, is freed, and the others' logits, a snapshot of one and their next batched
// step still equal those of twins decoding alone.
inline void expect_batch_rows_outlive_the_lead(const Model &m, const std::string &what, int threads) {
  const size_t nv = size_t(m.info().n_vocab);
  constexpr int kN = 3;
  std::vector<std::unique_ptr<Session>> t, a;  // together, alone
  for (int i = 0; i < kN; ++i) {
    for (auto *set : {&t, &a}) {
      set->push_back(batch_session(m, 16, threads, 2 * i));  // greedy: rows the step may keep
      ASSERT_TRUE(set->back());
      const std::vector<int32_t> ids = batch_ids(m, 9 + size_t(i), 50 + uint64_t(i));
      ASSERT_TRUE(set->back()->prefill(ids.data(), ids.size()).is_ok());
    }
  }
  auto same_logits = [&](int i, const char *when) {
    const float *x = t[size_t(i)]->logits(), *y = a[size_t(i)]->logits();
    ASSERT_TRUE(x != nullptr && y != nullptr) << what << " session " << i << " " << when;
    EXPECT_EQ(0, std::memcmp(x, y, nv * sizeof(float))) << what << " session " << i << " " << when << ": logits differ";
  };
  auto batch = [&](std::vector<int> who, const char *when) {
    std::vector<Session *> b;
    for (int i : who) b.push_back(t[size_t(i)].get());
    std::vector<int32_t> got(b.size(), -1);
    ASSERT_TRUE(Session::decode_batch(b.data(), b.size(), got.data()).is_ok()) << what << " " << when;
    for (size_t k = 0; k < who.size(); ++k) {
      int32_t want = -1;
      ASSERT_TRUE(a[size_t(who[k])]->decode_step(&want).is_ok());
      EXPECT_EQ(got[k], want) << what << " session " << who[k] << " " << when;
    }
  };
  auto alone = [&](int i) {
    int32_t x = -1, y = -1;
    ASSERT_TRUE(t[size_t(i)]->decode_step(&x).is_ok());
    ASSERT_TRUE(a[size_t(i)]->decode_step(&y).is_ok());
    EXPECT_EQ(x, y) << what << " session " << i << " alone";
  };
  batch({0, 1, 2}, "the first batch");
  alone(0);  // the lead's exec runs a step of its own
  same_logits(1, "after the lead's own step");
  t[0].reset();  // and goes
  same_logits(2, "after the lead was freed");
  batch({2, 1}, "the second batch");
  alone(2);
  std::vector<uint8_t> image(t[1]->snapshot_size());
  size_t n = 0;
  ASSERT_TRUE(t[1]->snapshot(image.data(), image.size(), &n).is_ok()) << what;
  std::unique_ptr<Session> r = batch_session(m, 16, threads, 2);
  ASSERT_TRUE(r && r->restore(image.data(), n).is_ok()) << what;
  const float *x = r->logits(), *y = a[1]->logits();
  ASSERT_TRUE(x != nullptr && y != nullptr);
  EXPECT_EQ(0, std::memcmp(x, y, nv * sizeof(float))) << what << ": the restored snapshot's logits differ";
  same_logits(1, "after a snapshot");
  batch({1, 2}, "the third batch");
  same_logits(1, "after the third batch");
  same_logits(2, "after the third batch");
}

}  // namespace geist::test
