#include "base/argmax.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "base/cpu_clones.h"
#include "base/thread_pool.h"

namespace geist {
namespace {
// What a scan from index 0 that moves to i whenever x[i] > x[best] returns: the first index
// of the largest value, NaNs never chosen (and a NaN at 0 never left, nothing compares
// greater than it). In two passes over vectors of 16 floats (GCC/Clang vector extensions,
// lowered to the clone's ISA): the largest value per lane (v > m ? v : m, a max
// instruction, the same per-lane rule as the scan), then the first block of 16 holding a
// value equal to it. The first index equal to the maximum is the scan's: the scan stops
// at the first element that nothing later exceeds, and an earlier equal element would
// have stopped it there.
typedef float F16x __attribute__((vector_size(64)));
typedef int32_t I16x __attribute__((vector_size(64)));

GEIST_CPU_CLONES
int64_t argmax_first(const float *x, int64_t n) {
  if (std::isnan(x[0])) return 0;
  F16x m;
  for (int l = 0; l < 16; ++l) m[l] = x[0];
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    F16x v;
    std::memcpy(&v, x + i, sizeof v);
    m = v > m ? v : m;
  }
  float best = x[0];
  for (int l = 0; l < 16; ++l) best = m[l] > best ? m[l] : best;
  for (int64_t j = i; j < n; ++j) best = x[j] > best ? x[j] : best;
  F16x bv;
  for (int l = 0; l < 16; ++l) bv[l] = best;
  int64_t b = 0;
  for (; b + 16 <= n; b += 16) {
    F16x v;
    std::memcpy(&v, x + b, sizeof v);
    const I16x eq = v == bv;
    int32_t hit = 0;
    for (int l = 0; l < 16; ++l) hit |= eq[l];
    if (hit) break;
  }
  for (; b < n; ++b) {
    if (x[b] == best) return b;
  }
  return 0;  // not reached: best is one of the values
}
}  // namespace

int64_t greedy_argmax(const float *x, int64_t n, ThreadPool *pool, int64_t segment) {
  constexpr int64_t kMaxParts = 64;
  if (x == nullptr || n <= 0) return -1;
  if (pool == nullptr || pool->n_threads() <= 1 || segment <= 0 || n <= segment || std::isnan(x[0])) {
    return argmax_first(x, n);
  }
  segment = std::max(segment, (n + kMaxParts - 1) / kMaxParts);
  const int n_parts = static_cast<int>((n + segment - 1) / segment);
  struct Part {
    float max;      // the segment's largest non-NaN value
    int64_t first;  // its first index; -1: the segment is all NaN
  };
  std::array<Part, kMaxParts> parts;
  pool->run(n_parts, [&](int s, int) {
    const int64_t a = int64_t(s) * segment, b = std::min(n, a + segment);
    int64_t a0 = a;
    while (a0 < b && std::isnan(x[a0])) ++a0;
    if (a0 == b) {
      parts[size_t(s)] = {0.0f, -1};
      return;
    }
    // From a non-NaN start the scan's index is the first one of the largest non-NaN value.
    const int64_t i = a0 + argmax_first(x + a0, b - a0);
    parts[size_t(s)] = {x[i], i};
  });
  // x[0] is not NaN, so part 0 has a value. The largest of the parts' values, by the scan's
  // rule; the first part holding a value equal to it holds the row's first such index (an
  // earlier part holding one would have it as its largest).
  float best = parts[0].max;
  for (int s = 1; s < n_parts; ++s) {
    if (parts[size_t(s)].first >= 0 && parts[size_t(s)].max > best) best = parts[size_t(s)].max;
  }
  for (int s = 0; s < n_parts; ++s) {
    if (parts[size_t(s)].first >= 0 && parts[size_t(s)].max == best) return parts[size_t(s)].first;
  }
  return 0;  // not reached: best is one of the parts' values
}

int64_t greedy_segment() {
  static const int64_t segment = [] {
    const char *e = std::getenv("GEIST_GREEDY_SEGMENT");
    return e != nullptr && *e != '\0' ? std::max<int64_t>(0, std::strtoll(e, nullptr, 10)) : int64_t(32768);
  }();
  return segment;
}

}  // namespace geist
