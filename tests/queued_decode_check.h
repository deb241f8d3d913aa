// Checks of queued decode (Session::decode_step on an exec that queues steps: CUDA by
// default, the CPU with GEIST_CPU_QUEUE=1, which emulates it) shared by the CPU test
// (decode_batch_int.cpp, so that CI runs the session's queued paths under the sanitizers)
// and the CUDA one (cuda_model_int.cpp): the tokens, the logits read between steps and a
// snapshot are bit-identical to waited steps, and a failure found at a wait takes the
// session back to its pin. Greedy and sampled sessions (a sampled step draws its token on
// the device, base/draw.h).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/model.h"
#include "engine/session.h"

namespace geist::test {

// Sets an environment variable for a scope; the old value (or none) comes back after it.
class EnvGuard {
 public:
  EnvGuard(const char *name, const char *value) : name_(name) {
    if (const char *old = std::getenv(name)) old_ = old, had_ = true;
    setenv(name, value, 1);
  }
  ~EnvGuard() {
    if (had_) {
      setenv(name_, old_.c_str(), 1);
    } else {
      unsetenv(name_);
    }
  }
  EnvGuard(const EnvGuard &) = delete;
  EnvGuard &operator=(const EnvGuard &) = delete;

 private:
  const char *name_;
  std::string old_;
  bool had_ = false;
};

inline SamplerParams greedy_sampling() {
  SamplerParams p;
  p.temperature = 0;
  return p;
}

// A sampler whose draws a step computes on the device: top-k 20 (below every test model's
// vocabulary), no penalty.
inline SamplerParams sampled_sampling() {
  SamplerParams p;
  p.temperature = 0.9f;
  p.top_k = 20;
  p.seed = 5;
  return p;
}

// A session of 16 rows per step and 1024 positions (greedy unless sp says otherwise) made
// with `knob` set to `value` (the exec reads it when it is made).
inline std::unique_ptr<Session> knob_session(const Model &m, const char *knob, const char *value,
                                             const SamplerParams &sp = greedy_sampling()) {
  EnvGuard g(knob, value);
  SessionParams p;
  p.n_ctx = 1024;
  p.chunk = 16;
  p.sampling = sp;
  Result<std::unique_ptr<Session>> s = Session::create(m, p);
  EXPECT_TRUE(s) << s.status().to_string();
  return s ? std::move(s).value() : nullptr;
}

// What a session's decode gives through every kind of call that can come between
// queued steps: tokens, logits rows read in between, a snapshot image.
struct DecodeTrace {
  std::vector<int32_t> tokens;
  std::vector<std::vector<float>> logits;
  std::vector<uint8_t> image;
};

// ids: at least 27 tokens (a pin of 24, a prefill of 3). base: the session's sampling.
inline DecodeTrace trace_decode(Session &s, const std::vector<int32_t> &ids, const SamplerParams &base) {
  DecodeTrace t;
  const size_t nv = size_t(s.n_vocab());
  auto decode = [&](int n) {
    for (int i = 0; i < n; ++i) {
      int32_t tok = -1;
      const Status st = s.decode_step(&tok);
      EXPECT_TRUE(st.is_ok()) << st.to_string();
      t.tokens.push_back(tok);
    }
  };
  auto read_logits = [&] {
    const float *l = s.logits();
    EXPECT_NE(l, nullptr);
    t.logits.emplace_back(l, l + (l ? nv : 0));
  };
  EXPECT_TRUE(s.pin_prefix(ids.data(), 24).is_ok());
  decode(12);
  read_logits();  // waits for the queued step; decoding goes on queued after it
  decode(12);
  size_t written = 0;
  t.image.resize(s.snapshot_size());
  EXPECT_TRUE(s.snapshot(t.image.data(), t.image.size(), &written).is_ok());
  decode(4);
  Session *one[] = {&s};
  int32_t tok = -1;
  EXPECT_TRUE(Session::decode_batch(one, 1, &tok).is_ok());  // a step of the batch path
  t.tokens.push_back(tok);
  decode(3);
  EXPECT_TRUE(s.prefill(ids.data() + 24, 3).is_ok());
  decode(5);
  SamplerParams hot;  // a sampler that reads the logits (a penalty): steps are waited for
  hot.temperature = 0.8f;
  hot.repeat_penalty = 1.3f;
  hot.seed = 7;
  EXPECT_TRUE(s.set_sampling(hot).is_ok());
  decode(3);
  SamplerParams other = base;  // the other kind of step draw, queued too
  other.temperature = base.temperature > 0 ? 0.0f : 1.1f;
  EXPECT_TRUE(s.set_sampling(other).is_ok());
  decode(4);
  EXPECT_TRUE(s.set_sampling(base).is_ok());
  decode(6);
  read_logits();
  s.reset();
  decode(10);  // from the pin again
  EXPECT_TRUE(s.wait().is_ok());
  read_logits();
  return t;
}

// Queued (knob = on) against waited (knob = off) decode of one model: bit-identical through
// reads, a snapshot, a batch step, a prefill, sampler changes and a reset.
inline void expect_queued_equals_waited(const Model &m, const std::string &name, const std::vector<int32_t> &ids,
                                        const char *knob, const char *on, const char *off,
                                        const SamplerParams &base = greedy_sampling()) {
  std::unique_ptr<Session> waited = knob_session(m, knob, off, base);
  std::unique_ptr<Session> queued = knob_session(m, knob, on, base);
  ASSERT_TRUE(waited && queued);
  EXPECT_FALSE(waited->queues_steps()) << knob << "=" << off;
  ASSERT_TRUE(queued->queues_steps()) << knob << "=" << on << " did not queue";
  const DecodeTrace a = trace_decode(*waited, ids, base), b = trace_decode(*queued, ids, base);
  EXPECT_EQ(a.tokens, b.tokens) << name;
  ASSERT_EQ(a.logits.size(), b.logits.size());
  for (size_t i = 0; i < a.logits.size(); ++i) {
    EXPECT_TRUE(a.logits[i].size() == b.logits[i].size() &&
                std::memcmp(a.logits[i].data(), b.logits[i].data(), a.logits[i].size() * sizeof(float)) == 0)
        << name << " read " << i;
  }
  EXPECT_TRUE(a.image == b.image) << name << " snapshot";
  // The decode after reset repeats the first tokens after the pin.
  ASSERT_GE(a.tokens.size(), 10u);
  EXPECT_TRUE(std::equal(a.tokens.end() - 10, a.tokens.end(), a.tokens.begin())) << name;
}

// A failure found while waiting for a queued step, or raised while a fed step is recorded:
// each (knob, value) of `faults` is set while a queued session (queue = on) is made; the call
// that meets the fault returns it (its message containing `device` and "injected fault"), the
// session is back at its pin, and decoding from there equals a waited session (queue = off).
// The pin is 24 of ids on a model whose sliding window is at most 8 (the committed
// tiny_gemma4_a models) in 16-row sessions (rings of 23 slots): a fault after 30 steps comes
// after the pinned window rows were overwritten, so going back restores them. Then a fault
// found by logits() (wait_fault_knob = 2): null, and the session is at its pin at once.
inline void expect_queued_faults_recover(const Model &m, const std::vector<int32_t> &ids, const char *queue_knob,
                                         const char *on, const char *off,
                                         const std::vector<std::pair<const char *, const char *>> &faults,
                                         const char *wait_fault_knob, const char *device,
                                         const SamplerParams &sp = greedy_sampling()) {
  std::unique_ptr<Session> clean = knob_session(m, queue_knob, off, sp);
  ASSERT_TRUE(clean && clean->pin_prefix(ids.data(), ids.size()).is_ok());
  std::vector<int32_t> ref(60);
  for (int32_t &t : ref) ASSERT_TRUE(clean->decode_step(&t).is_ok());
  for (const auto &[knob, at] : faults) {
    std::unique_ptr<Session> s;
    {
      EnvGuard g(knob, at);
      s = knob_session(m, queue_knob, on, sp);
    }
    ASSERT_TRUE(s && s->queues_steps());
    if (!s->pin_prefix(ids.data(), ids.size()).is_ok()) {  // an op fault came in the pin
      ASSERT_TRUE(s->pin_prefix(ids.data(), ids.size()).is_ok());
    }
    Status st;
    size_t good = 0;
    for (size_t i = 0; i < ref.size() && st.is_ok(); ++i) {
      int32_t t = -1;
      st = s->decode_step(&t);
      if (st.is_ok()) {
        EXPECT_EQ(t, ref[good]) << "step " << i << ", " << knob << "=" << at;
        ++good;
      }
    }
    ASSERT_FALSE(st.is_ok()) << knob << "=" << at << " never fired";
    EXPECT_EQ(s->n_tokens(), ids.size()) << "back at the pin";
    EXPECT_NE(st.message().find(device), std::string::npos) << st.message();
    EXPECT_NE(st.message().find("injected fault"), std::string::npos) << st.message();
    std::printf("%s=%s after %zu tokens: %s\n", knob, at, good, st.message().c_str());
    for (size_t i = 0; i < ref.size(); ++i) {
      int32_t t = -1;
      ASSERT_TRUE(s->decode_step(&t).is_ok());
      EXPECT_EQ(t, ref[i]) << "after " << knob << "=" << at;
    }
  }
  std::unique_ptr<Session> s;
  {
    EnvGuard g(wait_fault_knob, "2");
    s = knob_session(m, queue_knob, on, sp);
  }
  ASSERT_TRUE(s && s->pin_prefix(ids.data(), ids.size()).is_ok());
  for (int i = 0; i < 2; ++i) {
    int32_t t = -1;
    ASSERT_TRUE(s->decode_step(&t).is_ok());  // the first queues, the second waits (wait 1)
    EXPECT_EQ(t, ref[size_t(i)]);
  }
  EXPECT_EQ(s->logits(), nullptr) << "wait 2 fails inside logits()";
  EXPECT_EQ(s->n_tokens(), ids.size()) << "back at the pin";
  int32_t t = -1;
  ASSERT_TRUE(s->decode_step(&t).is_ok());
  EXPECT_EQ(t, ref[0]) << "decoding goes on from the pin";
  EXPECT_EQ(s->n_tokens(), ids.size() + 1);
}

}  // namespace geist::test
