// The sampled draw's select path (draw.cu, DrawAlgo::kSelect) as block-level functions: the
// keys, the block-wide radix select of the best of them, a tile's level and the pick. The
// kernels in draw.cu are launch wrappers around them. Apart from draw.cu so that a host test
// (tests/draw_select_int.cpp) runs this very code with the block emulated by threads:
// compiled by nvcc it is device code; compiled as C++ it needs the test's stand-ins for the
// CUDA intrinsics it calls (threadIdx, __syncthreads, the warp votes and shuffles,
// atomicAdd, __popc, __float_as_uint), declared before it is included.
#pragma once

#include <cstdint>

#include "base/draw.h"

#if defined(__CUDACC__)
#define GEIST_SEL_DEV __device__ __forceinline__
#else
#define GEIST_SEL_DEV inline
#endif

namespace geist::cuda::sel {

constexpr int kTile = 4096;  // keys a block holds
constexpr int kThreads = 1024;
constexpr int kPer = kTile / kThreads;  // keys a thread holds
constexpr unsigned kAll = 0xffffffffu;
constexpr int kMaxK = DrawSpec::kMaxStepTopK;  // the most candidates a row keeps

// The key of x[i]: larger is better, in the host sort's order (value descending, then id
// ascending; -0 equal to +0); 0 (below every real key, whose low word ~i is at least 2^31)
// for a NaN and for padding.
GEIST_SEL_DEV uint64_t key_of(float v, uint32_t i) {
  if (v != v) return 0;
  uint32_t b = __float_as_uint(v == 0.0f ? 0.0f : v);
  b = (b & 0x80000000u) != 0 ? ~b : (b | 0x80000000u);
  return (uint64_t(b) << 32) | uint64_t(~i);
}
GEIST_SEL_DEV uint32_t id_of(uint64_t k) { return ~uint32_t(k); }

struct SelectSmem {
  unsigned hist[2][256];  // one pass's counts of the next byte, and the next pass's
  unsigned nz;            // the block's nonzero keys
  unsigned n_sel;         // keys gathered so far
  uint64_t prefix;        // the bytes of the wanted-th best key found so far (the rest 0)
  unsigned need;          // how many of the keys that share them are still to take
  int done;               // every key that shares them is taken
};

GEIST_SEL_DEV unsigned lanes_below() { return (1u << (threadIdx.x & 31)) - 1; }

// h[digit] += 1 for each lane where `active`, one atomic per distinct digit of the warp
// (the top bytes of a row's keys are mostly the same few). Every lane of the warp calls it;
// the inactive lanes vote with a value no digit has.
GEIST_SEL_DEV void hist_add(unsigned *h, unsigned digit, bool active) {
  const unsigned peers = __match_any_sync(kAll, active ? digit : 0x100u);
  if (active && (peers & lanes_below()) == 0) atomicAdd(&h[digit], unsigned(__popc(peers)));
}

// The block's best `want` (>= 1) keys among the kTile keys its threads hold in v (0: no
// key; every other key unique), in no particular order, to sel[0, n); returns n = the
// smaller of want and the number of nonzero keys. Every thread of the block calls it, once.
GEIST_SEL_DEV int select_top(const uint64_t (&v)[kPer], int want, uint64_t *sel, SelectSmem &sm) {
  const int lane = int(threadIdx.x & 31), warp = int(threadIdx.x >> 5);
  for (int i = int(threadIdx.x); i < 2 * 256; i += kThreads) sm.hist[i / 256][i % 256] = 0;
  if (threadIdx.x == 0) {
    sm.nz = 0;
    sm.n_sel = 0;
  }
  __syncthreads();
  // The nonzero keys, and every key's top byte.
  unsigned c = 0;
  for (int j = 0; j < kPer; ++j) {
    c += v[j] != 0 ? 1u : 0u;
    hist_add(sm.hist[0], unsigned(v[j] >> 56), true);
  }
  c = __reduce_add_sync(kAll, c);
  if (lane == 0 && c != 0) atomicAdd(&sm.nz, c);
  __syncthreads();
  uint64_t thr = 1;  // the least key taken: with no more nonzero keys than wanted, all of them
  if (sm.nz > unsigned(want)) {
    // Then the want-th best key is nonzero, so exactly `want` keys are at or above it (the
    // zeros are below every real key). Byte by byte from the top: the bin of the next byte
    // that holds it among the keys sharing the bytes so far (scanned from the largest bin by
    // warp 0), until every key in that bin is wanted (or the last byte: one key).
    unsigned need = unsigned(want);
    uint64_t prefix = 0;
    int cur = 0;
    for (int shift = 56;; shift -= 8) {
      if (warp == 0) {
        unsigned h[8], own = 0;
        for (int b = 0; b < 8; ++b) {
          h[b] = sm.hist[cur][8 * lane + b];
          own += h[b];
        }
        unsigned upto = own;  // the keys in this lane's bins and those of the lanes above it
        for (int off = 1; off < 32; off <<= 1) {
          const unsigned y = __shfl_down_sync(kAll, upto, off);
          if (lane + off < 32) upto += y;
        }
        unsigned above = upto - own;
        for (int b = 7; b >= 0; --b) {  // exactly one bin of the warp holds the need-th key
          if (above < need && need <= above + h[b]) {
            sm.prefix = prefix | (uint64_t(8 * lane + b) << shift);
            sm.need = need - above;
            sm.done = h[b] == need - above || shift == 0;
          }
          above += h[b];
        }
        for (int b = lane; b < 256; b += 32) sm.hist[cur ^ 1][b] = 0;  // the next pass's
      }
      __syncthreads();
      prefix = sm.prefix;
      need = sm.need;
      if (sm.done) break;  // the same for every thread
      const uint64_t high = ~uint64_t(0) << shift;
      for (int j = 0; j < kPer; ++j) {
        hist_add(sm.hist[cur ^ 1], unsigned(v[j] >> (shift - 8)) & 0xFFu, (v[j] & high) == prefix);
      }
      cur ^= 1;
      __syncthreads();
    }
    thr = prefix;  // the bytes below the last one found are 0: every key sharing it is >= thr
  }
  for (int j = 0; j < kPer; ++j) {
    const bool take = v[j] >= thr;
    const unsigned m = __ballot_sync(kAll, take);
    unsigned base = 0;
    if (lane == 0 && m != 0) base = atomicAdd(&sm.n_sel, unsigned(__popc(m)));
    base = __shfl_sync(kAll, base, 0);
    if (take) sel[base + unsigned(__popc(m & lanes_below()))] = v[j];
  }
  __syncthreads();
  return int(sm.n_sel);
}

// How many keys a block keeps for a row drawn by d: its top_k, within [1, k] (k: the keys a
// tile has room for, at least every row's top_k).
GEIST_SEL_DEV int wanted(const DrawSpec &d, int k) { return d.top_k < 1 ? 1 : (d.top_k > k ? k : d.top_k); }

struct TileSmem {
  SelectSmem sm;
  uint64_t sel[kMaxK];
};

// Writes the n kept keys of sel and then zeros to o[0, k).
GEIST_SEL_DEV void write_kept(const uint64_t *sel, int n, int k, uint64_t *o) {
  for (int t = int(threadIdx.x); t < k; t += kThreads) o[t] = t < n ? sel[t] : 0;
}

// The first level, one block of a tile: the best `want` keys of elements [tile * kTile, ...)
// of a row of `width` logits, to o[0, k) (then zeros). Thread t holds elements t, t + 1024, ...
GEIST_SEL_DEV void tile_best(const float *row, int64_t width, int tile, int want, int k, uint64_t *o, TileSmem &s) {
  const int64_t base = int64_t(tile) * kTile + threadIdx.x;
  uint64_t v[kPer];
  for (int j = 0; j < kPer; ++j) {
    const int64_t i = base + int64_t(j) * kThreads;
    v[j] = i < width ? key_of(row[i], uint32_t(i)) : 0;
  }
  write_kept(s.sel, select_top(v, want, s.sel, s.sm), k, o);
}

// Keys [tile * kTile, ...) of a row's m keys r, kPer a thread.
GEIST_SEL_DEV void load_keys(const uint64_t *r, int m, int tile, uint64_t (&v)[kPer]) {
  const int base = tile * kTile + int(threadIdx.x);
  for (int j = 0; j < kPer; ++j) v[j] = base + j * kThreads < m ? r[base + j * kThreads] : 0;
}

// A later level: the best `want` of keys [tile * kTile, ...) of a row's m keys r, to o[0, k).
GEIST_SEL_DEV void keys_best(const uint64_t *r, int m, int tile, int want, int k, uint64_t *o, TileSmem &s) {
  uint64_t v[kPer];
  load_keys(r, m, tile, v);
  write_kept(s.sel, select_top(v, want, s.sel, s.sm), k, o);
}

struct PickSmem {
  SelectSmem sm;
  uint64_t sel[kMaxK], sorted[kMaxK];
  float cv[kMaxK];
  int ci[kMaxK];
  double pr[kMaxK], w[kMaxK];
};

// The last level: the row's candidates, the best wanted(d, k) of its m <= kTile keys r, sorted
// (each one's place is the number of candidates above it), then base/draw.h's pick with d's
// parameters, as the host draws: *out = the token (0 where the row has no number).
GEIST_SEL_DEV void pick(const float *row, const uint64_t *r, int m, const DrawSpec &d, int k, int32_t *out,
                        PickSmem &s) {
  uint64_t v[kPer];
  load_keys(r, m, 0, v);
  const int n = select_top(v, wanted(d, k), s.sel, s.sm);
  if (n == 0) {
    if (threadIdx.x == 0) *out = 0;
    return;
  }
  for (int t = int(threadIdx.x); t < n; t += kThreads) {
    const uint64_t key = s.sel[t];
    int place = 0;
    for (int j = 0; j < n; ++j) place += s.sel[j] > key ? 1 : 0;
    s.sorted[place] = key;
  }
  __syncthreads();
  for (int t = int(threadIdx.x); t < n; t += kThreads) {
    s.ci[t] = int(id_of(s.sorted[t]));
    s.cv[t] = row[s.ci[t]];
  }
  __syncthreads();
  const float mx = s.cv[0];
  for (int t = int(threadIdx.x); t < n; t += kThreads) {
    s.pr[t] = draw::weight(s.cv[t], mx);
    s.w[t] = draw::weight_t(s.cv[t], mx, d.temperature);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    const double *w = s.w;
    *out = s.ci[draw::pick(s.pr, [w](int i) { return w[i]; }, n, d.top_p, d.min_p, d.u)];
  }
}

}  // namespace geist::cuda::sel
