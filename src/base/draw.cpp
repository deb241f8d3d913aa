#include "base/draw.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "base/cpu_clones.h"

namespace geist {
namespace {
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

int32_t draw_sampled(const float *x, int64_t n, size_t k, float temperature, float top_p, float min_p, double u01,
                     std::vector<std::pair<float, int32_t>> &cand, std::vector<double> &pr) {
  // The top k in one pass over the row, in the order a sort by (logit desc, id asc) gives
  // (NaNs never taken): the same candidates as sorting all n pairs, without writing them.
  cand.resize(k);
  const size_t m = top_k_sorted(x, n, k, cand.data());
  if (m == 0) return 0;
  // Probabilities at temperature 1 drive top-p and min-p (as llama.cpp's chain does).
  const float mx = cand[0].first;
  pr.resize(m);
  for (size_t i = 0; i < m; ++i) pr[i] = draw::weight(cand[i].first, mx);
  const auto w = [&](int i) { return draw::weight_t(cand[size_t(i)].first, mx, temperature); };
  return cand[size_t(draw::pick(pr.data(), w, static_cast<int>(m), top_p, min_p, u01))].second;
}

}  // namespace geist
