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

typedef float F16x __attribute__((vector_size(64)));
typedef int32_t I16x __attribute__((vector_size(64)));

// The first index j in [i, n) with x[j] > t (n if none), 16 floats at a time: top_k_sorted
// below compares most of a vocabulary against the worst candidate kept and finds no hit.
GEIST_CPU_CLONES
int64_t first_above(const float *x, int64_t i, int64_t n, float t) {
  for (; i < n && (i & 15) != 0; ++i) {
    if (x[i] > t) return i;
  }
  F16x tv;
  for (int l = 0; l < 16; ++l) tv[l] = t;
  for (; i + 16 <= n; i += 16) {
    F16x v;
    std::memcpy(&v, x + i, sizeof v);
    const I16x gt = v > tv;
    int32_t hit = 0;
    for (int l = 0; l < 16; ++l) hit |= gt[l];
    if (hit) break;
  }
  for (; i < n; ++i) {
    if (x[i] > t) return i;
  }
  return n;
}
}  // namespace

size_t top_k_sorted(const float *x, int64_t n, size_t k, std::pair<float, int32_t> *out) {
  // A heap of the best k seen so far whose top is the worst of them. Ids come in ascending
  // order, so a later element displaces the worst only with a strictly larger value (on a
  // tie the earlier id ranks first): the threshold test is one comparison.
  auto better = [](const std::pair<float, int32_t> &a, const std::pair<float, int32_t> &b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  };
  if (k == 0) return 0;
  size_t m = 0;
  int64_t i = 0;
  for (; i < n && m < k; ++i) {
    if (std::isnan(x[i])) continue;
    out[m++] = {x[i], static_cast<int32_t>(i)};
    std::push_heap(out, out + m, better);
  }
  if (m == k) {
    for (i = first_above(x, i, n, out[0].first); i < n; i = first_above(x, i + 1, n, out[0].first)) {
      std::pop_heap(out, out + k, better);
      out[k - 1] = {x[i], static_cast<int32_t>(i)};
      std::push_heap(out, out + k, better);
    }
  }
  std::sort(out, out + m, better);
  return m;
}

Sampler::Sampler(const SamplerParams &p) : p_(p) { reset(); }

void Sampler::reset() {
  uint64_t x = p_.seed;
  for (auto &s : s_) s = splitmix64(x);
  history_.clear();
}

double Sampler::next_uniform() {
  const uint64_t result = rotl(s_[1] * 5, 7) * 9;
  const uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = rotl(s_[3], 45);
  return static_cast<double>(result >> 11) * 0x1.0p-53;
}

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
  auto by_logit = [](const auto &a, const auto &b) { return a.first > b.first || (a.first == b.first && a.second < b.second); };
  int32_t chosen;
  size_t n = 0;
  if (p_.temperature > 0.0f && p_.top_k > 0 && p_.top_k < n_vocab) {
    // The top k in one pass over the row, in the order a sort by (logit desc, id asc)
    // gives: the same candidates as sorting all n_vocab pairs, without writing them.
    cand_.resize(static_cast<size_t>(p_.top_k));
    n = top_k_sorted(lg, n_vocab, cand_.size(), cand_.data());
  }
  if (n == 0) {
    cand_.resize(static_cast<size_t>(n_vocab));
    for (int64_t i = 0; i < n_vocab; ++i) cand_[i] = {lg[i], static_cast<int32_t>(i)};
  }
  if (p_.temperature <= 0.0f) {
    chosen = std::min_element(cand_.begin(), cand_.end(), by_logit)->second;
  } else {
    if (n == 0) {
      n = cand_.size();
      if (p_.top_k > 0 && static_cast<size_t>(p_.top_k) < n) n = static_cast<size_t>(p_.top_k);
      std::partial_sort(cand_.begin(), cand_.begin() + n, cand_.end(), by_logit);
    }
    cand_.resize(n);
    // Probabilities at temperature 1 drive top-p and min-p (as llama.cpp's chain does).
    const float mx = cand_[0].first;
    std::vector<double> pr(n);
    double sum = 0;
    for (size_t i = 0; i < n; ++i) sum += pr[i] = std::exp(double(cand_[i].first) - mx);
    size_t keep = n;
    if (p_.top_p < 1.0f) {
      double cum = 0;
      for (size_t i = 0; i < n; ++i) {
        cum += pr[i] / sum;
        if (cum >= p_.top_p) { keep = i + 1; break; }
      }
    }
    if (p_.min_p > 0.0f) {
      size_t k = 1;
      while (k < keep && pr[k] >= p_.min_p * pr[0]) ++k;
      keep = k;
    }
    cand_.resize(keep);
    std::vector<double> w(keep);
    double wsum = 0;
    for (size_t i = 0; i < keep; ++i) wsum += w[i] = std::exp((double(cand_[i].first) - mx) / p_.temperature);
    double u = next_uniform() * wsum;
    chosen = cand_[keep - 1].second;
    for (size_t i = 0; i < keep; ++i) {
      if (u < w[i]) { chosen = cand_[i].second; break; }
      u -= w[i];
    }
  }
  accept(chosen);
  return chosen;
}

}  // namespace geist
