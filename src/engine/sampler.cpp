#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <unordered_set>

#include "base/cpu_clones.h"
#include "base/status.h"

namespace geist {
namespace {
uint64_t splitmix64(uint64_t &x) {
  uint64_t z = (x += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

// xoshiro256**: the next word of s, as a double in [0, 1) (53 bits).
double xoshiro_uniform(uint64_t *s) {
  const uint64_t result = rotl(s[1] * 5, 7) * 9;
  const uint64_t t = s[1] << 17;
  s[2] ^= s[0];
  s[3] ^= s[1];
  s[1] ^= s[2];
  s[0] ^= s[3];
  s[2] ^= t;
  s[3] = rotl(s[3], 45);
  return static_cast<double>(result >> 11) * 0x1.0p-53;
}

}  // namespace

Sampler::Sampler(const SamplerParams &p) : p_(p) { reset(); }

double Sampler::peek_uniform(int skip) const {
  uint64_t s[4] = {s_[0], s_[1], s_[2], s_[3]};
  for (int i = 0; i < skip; ++i) (void)xoshiro_uniform(s);
  return xoshiro_uniform(s);
}

bool Sampler::step_spec(int pending, int64_t n_vocab, DrawSpec *spec) const {
  *spec = DrawSpec{};
  if (p_.temperature <= 0.0f) return true;  // greedy: the argmax (temperature 0)
  if (p_.repeat_penalty != 1.0f || p_.top_k < 1 || p_.top_k > DrawSpec::kMaxStepTopK || p_.top_k >= n_vocab) {
    return false;
  }
  spec->temperature = p_.temperature;
  spec->top_k = p_.top_k;
  spec->top_p = p_.top_p;
  spec->min_p = p_.min_p;
  spec->u = peek_uniform(pending);
  return true;
}

bool Sampler::takes_step_draw(const DrawSpec &s) const {
  if (s.temperature <= 0.0f) return draws_argmax();
  return p_.temperature == s.temperature && p_.top_k == s.top_k && p_.top_p == s.top_p && p_.min_p == s.min_p &&
         p_.repeat_penalty == 1.0f && peek_uniform(0) == s.u;
}

void Sampler::take_step_draw(const DrawSpec &s, int32_t token) {
  if (s.temperature > 0.0f) (void)next_uniform();  // the word sample() would have used
  accept(token);
}

void Sampler::reset() {
  uint64_t x = p_.seed;
  for (auto &s : s_) s = splitmix64(x);
  history_.clear();
}

double Sampler::next_uniform() { return xoshiro_uniform(s_); }

void Sampler::set_params(const SamplerParams &p) {
  p_ = p;
  uint64_t x = p_.seed;
  for (auto &s : s_) s = splitmix64(x);
  if (p_.repeat_last_n == 0) history_.clear();
  while (p_.repeat_last_n > 0 && static_cast<int>(history_.size()) > p_.repeat_last_n) history_.pop_front();
}

Sampler::State Sampler::state() const {
  State st;
  for (int i = 0; i < 4; ++i) st.rng[i] = s_[i];
  st.history.assign(history_.begin(), history_.end());
  return st;
}

void Sampler::set_state(const State &st) {
  // The history is built aside and swapped in: if its allocation throws, the sampler is
  // unchanged (Session::restore relies on it).
  std::deque<int32_t> h;
  if (p_.repeat_last_n != 0) {
    size_t from = 0;
    if (p_.repeat_last_n > 0 && st.history.size() > static_cast<size_t>(p_.repeat_last_n)) {
      from = st.history.size() - static_cast<size_t>(p_.repeat_last_n);
    }
    h.assign(st.history.begin() + static_cast<std::ptrdiff_t>(from), st.history.end());
  }
  history_.swap(h);
  for (int i = 0; i < 4; ++i) s_[i] = st.rng[i];
}

std::string Sampler::check(const SamplerParams &p) {
  auto bad = [](const char *name, double v, const char *rule) {
    char b[160];
    std::snprintf(b, sizeof b, "%s is %g; it must be %s", name, v, rule);
    return std::string(b);
  };
  if (!std::isfinite(p.temperature) || p.temperature > 1e4f) {
    return bad("temperature", p.temperature, "a finite number <= 1e4 (<= 0: greedy)");
  }
  if (!(p.top_p >= 0.0f && p.top_p <= 1.0f)) return bad("top_p", p.top_p, "in [0, 1]");
  if (!(p.min_p >= 0.0f && p.min_p <= 1.0f)) return bad("min_p", p.min_p, "in [0, 1]");
  if (!(p.repeat_penalty > 0.0f && p.repeat_penalty <= 1e4f)) {
    return bad("repeat_penalty", p.repeat_penalty, "in (0, 1e4]");
  }
  if (p.repeat_last_n < -1) return bad("repeat_last_n", p.repeat_last_n, ">= -1 (-1: all)");
  return std::string();
}

void Sampler::accept(int32_t token) {
  if (p_.repeat_last_n == 0) return;
  history_.push_back(token);
  while (p_.repeat_last_n > 0 && static_cast<int>(history_.size()) > p_.repeat_last_n) history_.pop_front();
}

int32_t Sampler::sample(const float *logits, int64_t n_vocab, ThreadPool *pool) {
  GEIST_CHECK(logits != nullptr && n_vocab > 0, "sample() needs a non-empty logits row");
  if (draws_argmax()) {
    // Greedy without penalties: the argmax read in place, what the candidate list below
    // picks (the first index of the largest logit; a NaN never replaces the running best),
    // without writing 262144 (logit, id) pairs per token first.
    const auto chosen = static_cast<int32_t>(greedy_argmax(logits, n_vocab, pool, greedy_segment()));
    accept(chosen);
    return chosen;
  }
  // The penalised logits, if a penalty applies (a copy: logits are not modified).
  const float *lg = logits;
  if (p_.repeat_penalty != 1.0f && !history_.empty()) {
    pen_.assign(logits, logits + n_vocab);
    std::unordered_set<int32_t> seen(history_.begin(), history_.end());
    for (int32_t t : seen) {
      if (t < 0 || t >= n_vocab) continue;
      float &l = pen_[t];
      l = l > 0 ? l / p_.repeat_penalty : l * p_.repeat_penalty;
    }
    lg = pen_.data();
  }
  int32_t chosen;
  if (p_.temperature <= 0.0f) {
    // The greedy draw of a penalised row: the first index of the largest value.
    auto by_logit = [](const auto &a, const auto &b) { return a.first > b.first || (a.first == b.first && a.second < b.second); };
    cand_.resize(static_cast<size_t>(n_vocab));
    for (int64_t i = 0; i < n_vocab; ++i) cand_[i] = {lg[i], static_cast<int32_t>(i)};
    chosen = std::min_element(cand_.begin(), cand_.end(), by_logit)->second;
  } else {
    const size_t k = p_.top_k > 0 && p_.top_k < n_vocab ? static_cast<size_t>(p_.top_k) : static_cast<size_t>(n_vocab);
    chosen = draw_sampled(lg, n_vocab, k, p_.temperature, p_.top_p, p_.min_p, next_uniform(), cand_, pr_);
  }
  accept(chosen);
  return chosen;
}

}  // namespace geist
