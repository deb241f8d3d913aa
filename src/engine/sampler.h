// Token sampling from logits: repetition penalty, top-k, top-p, min-p, temperature, in
// llama.cpp's default order (penalties, top-k, top-p, min-p, temperature, draw).
// temperature <= 0 means greedy (argmax; ties -> lowest id). Deterministic for a seed:
// the RNG is our own (xoshiro256**), not the platform's distributions.
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <utility>
#include <vector>

#include "base/argmax.h"
#include "base/draw.h"

namespace geist {

struct SamplerParams {
  float temperature = 0.8f;
  int top_k = 40;         // <= 0: off
  float top_p = 0.95f;    // >= 1: off
  float min_p = 0.05f;    // <= 0: off
  float repeat_penalty = 1.0f;  // 1: off; must be > 0
  int repeat_last_n = 64;       // 0: off, < 0: the whole history
  uint64_t seed = 0xC0FFEE;
};

class ThreadPool;

class Sampler {
 public:
  explicit Sampler(const SamplerParams &p);
  // Pick a token from logits[n_vocab]; does not modify logits. Records the token in the
  // penalty history.
  // With a pool of several threads, a greedy draw without penalties reads the row in
  // segments over it (greedy_argmax): the same token.
  int32_t sample(const float *logits, int64_t n_vocab, ThreadPool *pool = nullptr);
  void accept(int32_t token);  // add a prompt token to the penalty history
  // Whether the next draw is the plain argmax of the logits (greedy, and no penalty
  // applies): a greedy token computed elsewhere (Exec::greedy) may then be taken with
  // accept() instead of sample(): the same token, the same state after.
  bool draws_argmax() const { return p_.temperature <= 0.0f && (p_.repeat_penalty == 1.0f || history_.empty()); }
  // Draws a step computes (Exec::draw: on a GPU, on the device, so the row need not reach
  // the host). step_spec: whether the draw after `pending` further draws can be computed
  // from the logits row alone, and how (*spec); a sampled one needs no penalty to apply and
  // 1 <= top_k <= DrawSpec::kMaxStepTopK, top_k < n_vocab. A greedy spec is filled whenever
  // the sampler is greedy (takes_step_draw decides at the draw, as draws_argmax does).
  bool step_spec(int pending, int64_t n_vocab, DrawSpec *spec) const;
  // Whether the next draw is what a step computed with spec: then take_step_draw(spec,
  // token) draws it (the same RNG words and history as sample() on that row).
  bool takes_step_draw(const DrawSpec &spec) const;
  void take_step_draw(const DrawSpec &spec, int32_t token);
  void reset();                // clear history, reseed
  const SamplerParams &params() const { return p_; }
  // Replace the params; reseeds the RNG from p.seed and keeps the history (trimmed to
  // the new repeat_last_n).
  void set_params(const SamplerParams &p);

  // What sampling depends on besides the params: the RNG words and the penalty history
  // (oldest first). Snapshots and pins carry it.
  struct State {
    uint64_t rng[4] = {0, 0, 0, 0};
    std::vector<int32_t> history;
  };
  State state() const;
  void set_state(const State &st);
  // Range check of params: "" if valid, else what is wrong.
  static std::string check(const SamplerParams &p);

 private:
  double next_uniform();  // [0, 1)
  double peek_uniform(int skip) const;  // what next_uniform() gives after `skip` more calls
  SamplerParams p_;
  uint64_t s_[4];
  std::deque<int32_t> history_;
  std::vector<std::pair<float, int32_t>> cand_;
  std::vector<double> pr_;
  std::vector<float> pen_;  // the penalised logits
};

}  // namespace geist
