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
  SamplerParams p_;
  uint64_t s_[4];
  std::deque<int32_t> history_;
  std::vector<std::pair<float, int32_t>> cand_;
  std::vector<float> pen_;  // the penalised logits
};

// The k best (logit, id) of x[0..n) in the order of a sort by logit descending, then id
// ascending (what sorting all n pairs and keeping the first k gives), written to out[0..k);
// NaNs are never taken. Returns how many were written: k, or fewer if x has fewer non-NaN
// values. One pass over x; the sampler's top-k.
size_t top_k_sorted(const float *x, int64_t n, size_t k, std::pair<float, int32_t> *out);

}  // namespace geist
