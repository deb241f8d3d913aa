// The greedy token of a logits row: what a scan from index 0 that moves to i whenever
// x[i] > x[best] returns. The sampler's greedy draw (engine/sampler.h) and the CPU exec's
// greedy op (backends/backend.h: Exec::greedy) both read rows with it, and the CUDA kernel
// of that op reproduces its rule.
#pragma once

#include <cstdint>

namespace geist {

class ThreadPool;

// The greedy token of x[0, n): the first index of the largest value, NaNs never chosen, a NaN
// at index 0 kept (a scan from 0 moving to i whenever x[i] > x[best]). With a pool of several
// threads and n above `segment`, the row is read in up to 64 contiguous segments, one task
// each: a segment's largest non-NaN value and its first index, then the first segment whose
// value equals the largest of all. The same index as the scan for any segment size; -1 for
// an empty row or a null x.
int64_t greedy_argmax(const float *x, int64_t n, ThreadPool *pool = nullptr, int64_t segment = 32768);

// GEIST_GREEDY_SEGMENT: elements per task of a pool's greedy read (default 32768; 0 reads
// the row on the calling thread alone). A measurement knob: the token is the same.
int64_t greedy_segment();

}  // namespace geist
