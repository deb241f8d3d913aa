// Typed KV rings (append, copy and host transfer by position) and attention.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <type_traits>
#include <cmath>

#include "backends/cuda/common.cuh"

namespace geist::cuda {
namespace {

constexpr unsigned kFull = 0xFFFFFFFFu;

// f16 to f32 by the hardware conversion: the same value as quant::fp16_to_fp32 for every
// non-NaN input (subnormals included; a NaN stays a NaN), without its loop over subnormals,
// which keeps the attention kernels' unrolled loads in registers.
__device__ __forceinline__ float kv_f16(uint16_t h) { return __half2float(__ushort_as_half(h)); }

// Element e of a KV row of type T (kv_type.h).
template <KvType T>
__device__ __forceinline__ float kv_elem(const uint8_t *row, int64_t e) {
  if constexpr (T == KvType::F32) {
    return reinterpret_cast<const float *>(row)[e];
  } else if constexpr (T == KvType::F16) {
    return kv_f16(reinterpret_cast<const uint16_t *>(row)[e]);
  } else if constexpr (T == KvType::BF16) {
    return dev::bf16_to_fp32(reinterpret_cast<const uint16_t *>(row)[e]);
  } else {
    const uint8_t *b = row + (e / 32) * 34;
    return __fmul_rn(kv_f16(uint16_t(dev::ld_u16(b))), float(int8_t(b[2 + e % 32])));
  }
}

// ---- append ---------------------------------------------------------------------------------

// grid (n_rows, row_elems / 256 rounded up), 256 threads: one element per thread; for Q8_0
// a warp is one 32-element block (row_elems % 32 == 0, so warps never straddle a row end).
// rings: the table's K (v_rings false) or V rings.
// With k_src and v_src both set, blockIdx.z = 0 stores K rows and 1 V rows (one launch for
// both); with one of them null, the other's rings only.
template <KvType T>
__global__ void kv_append_kernel(SeqRings t, int64_t row_elems, size_t row_bytes, const float *__restrict__ k_src,
                                 const float *__restrict__ v_src) {
  dev::pdl_start();
  const int r = blockIdx.x;
  const int64_t e = int64_t(blockIdx.y) * blockDim.x + threadIdx.x;
  if (e >= row_elems) return;
  const bool v_rings = v_src != nullptr && (k_src == nullptr || blockIdx.z == 1);
  const float *__restrict__ src = v_rings ? v_src : k_src;
  dev::kv_store<T>(dev::ring_row(t, r, v_rings, row_bytes), e, src[size_t(r) * row_elems + e]);
}

// ---- attention ------------------------------------------------------------------------------

constexpr int kThreads = 128;           // 4 warps, 8 half-warps
constexpr int kTile = 2048;             // keys whose scores are held in shared memory at once
constexpr int kMaxHeadDim = 512;
constexpr int kDimsPerThread = kMaxHeadDim / kThreads;

struct AttnCore {
  const float *q;
  const uint8_t *k, *v;
  float *out;
  const int64_t *pos0;
  int64_t capacity;
  size_t k_row_bytes, v_row_bytes;
  int n_head, group, head_dim, window;
  float scale;
  int row_base;  // query r is at position *pos0 + r - row_base
  // quant_block 32 / 256: the merge also quantizes each output row for the matmul after it
  // (AttnArgs::quant_block) into oq [rows][n_head head_dim], od [rows][n_head head_dim / block].
  int quant_block;
  int8_t *oq;
  float *od;
  // The split kernel asks L2 for its chunks' K and V slices before griddepcontrol.wait
  // (decode: run_attention sets it; GEIST_CUDA_ATTN_PREFETCH=0 never).
  bool kv_prefetch;
  // chunk_values takes a chunk's last keys (fewer than a group) as one predicated group
  // instead of one or two per round trip (GEIST_CUDA_ATTN_VTAIL=0: the round trips). The same
  // adds in the same order. E4B tg128 at depth 1024 +3 % (H100, 2026-12-07).
  bool v_tail_group;
};
struct AttnParams {
  AttnCore c;
  SeqRings seqs;  // n > 0: each row's k, v, pos0, capacity come from its sequence here
};

// The parameters as query row r sees them.
__device__ __forceinline__ AttnCore for_row(const AttnParams &a, int r) {
  AttnCore b = a.c;
  if (a.seqs.n > 0) {
    const int i = dev::seq_of_row(a.seqs, r);
    b.k = static_cast<const uint8_t *>(dev::pick(a.seqs.k, i));
    b.v = static_cast<const uint8_t *>(dev::pick(a.seqs.v, i));
    b.pos0 = dev::pick(a.seqs.pos0, i);
    b.capacity = dev::pick(a.seqs.capacity, i);
    b.row_base = dev::pick(a.seqs.row0, i);
  }
  return b;
}

// Scores of keys [t0, t0 + len) (offsets from j0) into sc[0, len): one half-warp per key, as
// the CPU's dot_f32 (lane l sums elements l, l + 16, ... in order, then the tree) times scale.
template <KvType KT>
__device__ void tile_scores(const AttnCore &a, const float *qs, int64_t j0, int64_t t0, int len, int g, float *sc) {
  const int hw = threadIdx.x / 16, l = threadIdx.x % 16;
  const int64_t e0 = int64_t(g) * a.head_dim;
  for (int kk0 = 0; kk0 < len; kk0 += kThreads / 16) {  // every half-warp of the warp loops alike
    const int kk = kk0 + hw;
    float acc = 0.0f;
    if (kk < len) {
      const int64_t slot = (j0 + t0 + kk) % a.capacity;
      const uint8_t *row = a.k + size_t(slot) * a.k_row_bytes;
      for (int i = l; i < a.head_dim; i += 16) acc = __fadd_rn(acc, __fmul_rn(qs[i], kv_elem<KT>(row, e0 + i)));
    }
#pragma unroll
    for (int o = 8; o >= 1; o /= 2) acc = __fadd_rn(acc, __shfl_down_sync(kFull, acc, o, 16));
    if (l == 0 && kk < len) sc[kk] = __fmul_rn(acc, a.scale);
  }
}

__device__ __forceinline__ float exp_f(float x) { return float(exp(double(x))); }

// grid (n_head, n_rows), kThreads threads: the exact softmax of the CPU generic path in
// three passes over the keys (max; exp and sum; weighted sum of V), the scores held in
// shared memory when the keys fit one tile and recomputed per pass otherwise.
template <KvType KT, KvType VT>
__global__ void __launch_bounds__(kThreads) attention_kernel(AttnParams a0) {
  dev::pdl_start();
  const AttnCore a = for_row(a0, int(blockIdx.y));
  __shared__ float qs[kMaxHeadDim];
  __shared__ float sc[kTile];
  __shared__ float red_f[kThreads / 32];
  __shared__ double red_d[kThreads / 32];
  const int h = blockIdx.x, r = blockIdx.y;
  const int g = h / a.group;
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int64_t p = *a.pos0 + (r - a.row_base);
  const int64_t j0 = a.window > 0 ? (p - a.window + 1 > 0 ? p - a.window + 1 : int64_t(0)) : 0;
  const int64_t n_keys = p - j0 + 1;
  const int n_tiles = int((n_keys + kTile - 1) / kTile);
  const float *q = a.q + (size_t(r) * a.n_head + h) * a.head_dim;
  for (int i = tid; i < a.head_dim; i += kThreads) qs[i] = q[i];
  __syncthreads();

  // Pass 1: the maximum score (NaN ignored, as std::max(mx, s) does from -inf).
  float mx = -INFINITY;
  for (int t = 0; t < n_tiles; ++t) {
    const int len = int(n_keys - int64_t(t) * kTile < kTile ? n_keys - int64_t(t) * kTile : int64_t(kTile));
    tile_scores<KT>(a, qs, j0, int64_t(t) * kTile, len, g, sc);
    __syncthreads();
    for (int j = tid; j < len; j += kThreads) mx = fmaxf(mx, sc[j]);
    __syncthreads();
  }
  for (int o = 16; o >= 1; o /= 2) mx = fmaxf(mx, __shfl_xor_sync(kFull, mx, o));
  if (lane == 0) red_f[warp] = mx;
  __syncthreads();
  mx = red_f[0];
  for (int w = 1; w < kThreads / 32; ++w) mx = fmaxf(mx, red_f[w]);

  // Pass 2: e_j = exp(s_j - mx) (kept in sc), their sum in double in a fixed order: each
  // thread its keys j = tid (mod kThreads) in order, then a fixed tree.
  double sum = 0.0;
  for (int t = 0; t < n_tiles; ++t) {
    const int len = int(n_keys - int64_t(t) * kTile < kTile ? n_keys - int64_t(t) * kTile : int64_t(kTile));
    if (n_tiles > 1) {
      __syncthreads();
      tile_scores<KT>(a, qs, j0, int64_t(t) * kTile, len, g, sc);
      __syncthreads();
    }
    for (int j = tid; j < len; j += kThreads) {
      const float e = exp_f(__fsub_rn(sc[j], mx));
      sc[j] = e;
      sum = __dadd_rn(sum, double(e));
    }
  }
  for (int o = 16; o >= 1; o /= 2) sum = __dadd_rn(sum, __shfl_xor_sync(kFull, sum, o));
  if (lane == 0) red_d[warp] = sum;
  __syncthreads();
  sum = red_d[0];
  for (int w = 1; w < kThreads / 32; ++w) sum = __dadd_rn(sum, red_d[w]);
  const float inv = float(__ddiv_rn(1.0, sum));

  // Pass 3: o[d] = sum_j (e_j * inv) * v_j[d], in key order, thread tid owning d = tid + 128 i.
  float o[kDimsPerThread];
#pragma unroll
  for (int i = 0; i < kDimsPerThread; ++i) o[i] = 0.0f;
  const int64_t e0 = int64_t(g) * a.head_dim;
  for (int t = 0; t < n_tiles; ++t) {
    const int len = int(n_keys - int64_t(t) * kTile < kTile ? n_keys - int64_t(t) * kTile : int64_t(kTile));
    __syncthreads();
    if (n_tiles > 1) {
      tile_scores<KT>(a, qs, j0, int64_t(t) * kTile, len, g, sc);
      __syncthreads();
      for (int j = tid; j < len; j += kThreads) sc[j] = __fmul_rn(exp_f(__fsub_rn(sc[j], mx)), inv);
    } else {
      for (int j = tid; j < len; j += kThreads) sc[j] = __fmul_rn(sc[j], inv);
    }
    __syncthreads();
    for (int j = 0; j < len; ++j) {
      const int64_t slot = (j0 + int64_t(t) * kTile + j) % a.capacity;
      const uint8_t *row = a.v + size_t(slot) * a.v_row_bytes;
      const float w = sc[j];
#pragma unroll
      for (int i = 0; i < kDimsPerThread; ++i) {
        const int d = tid + kThreads * i;
        if (d < a.head_dim) o[i] = __fadd_rn(o[i], __fmul_rn(w, kv_elem<VT>(row, e0 + d)));
      }
    }
  }
  float *out = a.out + (size_t(r) * a.n_head + h) * a.head_dim;
#pragma unroll
  for (int i = 0; i < kDimsPerThread; ++i) {
    const int d = tid + kThreads * i;
    if (d < a.head_dim) out[d] = o[i];
  }
}

// ---- split attention (the fast path) -----------------------------------------------------------
// Keys are cut into chunks of kChunk absolute positions ([64 c, 64 c + 64)); split s of
// kSplits takes chunks c = s (mod kSplits), each block one (split, head, query): scores,
// then an online softmax over its chunks in order (max, rescale, exp, sum, weighted V in key
// order). A merge kernel then combines the kSplits partials in split order. Everything a
// query's output depends on (its position, its window, the chunk grid, the split count) is
// fixed by the query alone, so the output is the same whatever the batch (batch invariant);
// it is not the CPU's three-pass softmax bit for bit (see the test's tolerance).

constexpr int kChunk = 64;
constexpr int kSplits = 8;
constexpr int kRowGroup = 64;  // queries per launch pair (bounds the partials' scratch)

// out = (sum_s f_s o_s) * (1 / sum_s f_s l_s), f_s = exp(m_s - M), splits in order, for
// query row row0 + rr and head h, by the block's threads. The partials are read past L1
// (__ldcg): in the split kernel's own merge they were written by other blocks.
// Head h of output row `row` (its values in o_sh) quantized as matmul_n quantizes that row
// (dev::quant_q8_0_block / quant_q8_k_block, one warp per block of the head).
__device__ __forceinline__ void quantize_head(const AttnCore &a, int row, int h, const float *o_sh) {
  const int64_t K = int64_t(a.n_head) * a.head_dim, e0 = int64_t(h) * a.head_dim;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  int8_t *q = a.oq + size_t(row) * K + e0;
  if (a.quant_block == 32) {
    float *d = a.od + size_t(row) * (K / 32) + e0 / 32;
    for (int b = warp; b < a.head_dim / 32; b += kThreads / 32) {
      dev::quant_q8_0_block(o_sh[b * 32 + lane], lane, q + b * 32, d + b);
    }
  } else {
    float *d = a.od + size_t(row) * (K / 256) + e0 / 256;
    for (int b = warp; b < a.head_dim / 256; b += kThreads / 32) {
      float v[8];
#pragma unroll
      for (int t = 0; t < 8; ++t) v[t] = o_sh[b * 256 + lane + 32 * t];
      dev::quant_q8_k_block(v, lane, q + b * 256, d + b);
    }
  }
}

__device__ __forceinline__ void merge_splits(const AttnCore &a, int row0, int rr, int h, const float *part) {
  __shared__ float o_sh[kMaxHeadDim];
  const float *pp = part + (size_t(rr) * a.n_head + h) * kSplits * size_t(a.head_dim + 2);
  const size_t st = size_t(a.head_dim + 2);
  float M = -INFINITY;
  for (int s = 0; s < kSplits; ++s) M = fmaxf(M, __ldcg(pp + s * st));
  float f[kSplits];
  float L = 0.0f;
#pragma unroll
  for (int s = 0; s < kSplits; ++s) {
    const float ms = __ldcg(pp + s * st);
    f[s] = ms == -INFINITY ? 0.0f : exp_f(__fsub_rn(ms, M));
    L = __fadd_rn(L, __fmul_rn(f[s], __ldcg(pp + s * st + 1)));
  }
  const float inv = __fdiv_rn(1.0f, L);
  float *out = a.out + (size_t(row0 + rr) * a.n_head + h) * a.head_dim;
  for (int d = threadIdx.x; d < a.head_dim; d += kThreads) {
    float acc = 0.0f;
#pragma unroll
    for (int s = 0; s < kSplits; ++s) {
      if (f[s] != 0.0f) acc = __fadd_rn(acc, __fmul_rn(f[s], __ldcg(pp + s * st + 2 + d)));
    }
    const float v = __fmul_rn(acc, inv);
    out[d] = v;
    o_sh[d] = v;
  }
  if (a.quant_block == 0) return;
  __syncthreads();
  quantize_head(a, row0 + rr, h, o_sh);
}

__global__ void __launch_bounds__(kThreads) attention_merge_kernel(AttnCore a, int row0, const float *__restrict__ part) {
  dev::pdl_start();
  merge_splits(a, row0, int(blockIdx.y), int(blockIdx.x), part);
}

// The split kernel's own merge (cnt != nullptr: one zeroed counter per (query row of the
// group, head)): each block, its partial written, counts itself in; the last of a query's
// kSplits blocks merges them (merge_splits, splits in order: the merge kernel's bits) and
// zeroes the counter for the next call. One launch per attention instead of two.
__device__ __forceinline__ void merge_if_last(const AttnCore &a, int row0, int rr, int h, const float *part,
                                              unsigned *cnt) {
  __shared__ unsigned last;
  __threadfence();  // this block's partial, visible device-wide before it is counted
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(cnt + size_t(rr) * a.n_head + h, 1u) == unsigned(kSplits - 1);
  __syncthreads();
  if (!last) return;
  __threadfence();
  merge_splits(a, row0, rr, h, part);
  if (threadIdx.x == 0) cnt[size_t(rr) * a.n_head + h] = 0;
}


// Ring slot of position ka + off, given s0 = ka % capacity (no 64-bit division per key).
__device__ __forceinline__ int64_t slot_after(int64_t s0, int off, int64_t capacity) {
  int64_t s = s0 + off;
  while (s >= capacity) s -= capacity;
  return s;
}

// The scores of the chunk's keys [ka, ka + len) into sc, as tile_scores computes them (one
// half-warp per key, lane l summing elements l, l + 16, ... in order, then the tree), for a
// head dim HD known at compile time: the q elements of a lane are held in registers and the
// loads of kU keys per half-warp are issued before any of them is used.
template <KvType KT, int HD>
__device__ __forceinline__ void chunk_scores(const AttnCore &a, const float (&qr)[HD / 16], int64_t s0, int len,
                                             int64_t e0, float *sc) {
  // Keys per half-warp in flight: 64 (32 for Q8_0, whose elements cost more registers)
  // loaded values per lane, at most 8 keys.
  constexpr int kPer = HD / 16, kBudget = KT == KvType::Q8_0 ? 32 : 64,
                kU = kPer >= kBudget ? 1 : (kBudget / kPer > 8 ? 8 : kBudget / kPer);
  const int hw = threadIdx.x / 16, l = threadIdx.x % 16;
  for (int kk0 = 0; kk0 < len; kk0 += (kThreads / 16) * kU) {  // uniform over the block
    float kv[kU][kPer];
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int kk = kk0 + (kThreads / 16) * u + hw;
      const uint8_t *row = a.k + size_t(slot_after(s0, kk < len ? kk : 0, a.capacity)) * a.k_row_bytes;
#pragma unroll
      for (int i = 0; i < kPer; ++i) kv[u][i] = kk < len ? kv_elem<KT>(row, e0 + l + 16 * i) : 0.0f;
    }
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int kk = kk0 + (kThreads / 16) * u + hw;
      float acc = 0.0f;
      if (kk < len) {
#pragma unroll
        for (int i = 0; i < kPer; ++i) acc = __fadd_rn(acc, __fmul_rn(qr[i], kv[u][i]));
      }
#pragma unroll
      for (int o = 8; o >= 1; o /= 2) acc = __fadd_rn(acc, __shfl_down_sync(kFull, acc, o, 16));
      if (l == 0 && kk < len) sc[kk] = __fmul_rn(acc, a.scale);
    }
  }
}

// o[i] += w_j * v_j[tid + kThreads i] for the chunk's keys in order, kVU keys' loads issued
// before their products are added (HD known at compile time).
template <KvType VT, int HD>
__device__ __forceinline__ void chunk_values(const AttnCore &a, int64_t s0, int len, int64_t e0, const float *sc,
                                             float (&o)[(HD + kThreads - 1) / kThreads]) {
  constexpr int kDpt = (HD + kThreads - 1) / kThreads, kVU = VT == KvType::Q8_0 || kDpt > 2 ? 8 : 16;
  const int tid = threadIdx.x;
  int j = 0;
  for (; j + kVU <= len; j += kVU) {
    float vv[kVU][kDpt];
#pragma unroll
    for (int u = 0; u < kVU; ++u) {
      const uint8_t *row = a.v + size_t(slot_after(s0, j + u, a.capacity)) * a.v_row_bytes;
#pragma unroll
      for (int i = 0; i < kDpt; ++i) {
        const int d = tid + kThreads * i;
        vv[u][i] = d < HD ? kv_elem<VT>(row, e0 + d) : 0.0f;
      }
    }
#pragma unroll
    for (int u = 0; u < kVU; ++u) {
      const float w = sc[j + u];
#pragma unroll
      for (int i = 0; i < kDpt; ++i) {
        if (tid + kThreads * i < HD) o[i] = __fadd_rn(o[i], __fmul_rn(w, vv[u][i]));
      }
    }
  }
  if (a.v_tail_group && j < len) {
    // The last len - j < kVU keys as one group: every load issued before the first add (the
    // loop below waits a round trip per one or two keys), the adds in key order as there.
    float vv[kVU][kDpt];
#pragma unroll
    for (int u = 0; u < kVU; ++u) {
      const bool in = j + u < len;
      const uint8_t *row = a.v + size_t(slot_after(s0, in ? j + u : j, a.capacity)) * a.v_row_bytes;
#pragma unroll
      for (int i = 0; i < kDpt; ++i) {
        const int d = tid + kThreads * i;
        vv[u][i] = in && d < HD ? kv_elem<VT>(row, e0 + d) : 0.0f;
      }
    }
#pragma unroll
    for (int u = 0; u < kVU; ++u) {
      if (j + u < len) {
        const float w = sc[j + u];
#pragma unroll
        for (int i = 0; i < kDpt; ++i) {
          if (tid + kThreads * i < HD) o[i] = __fadd_rn(o[i], __fmul_rn(w, vv[u][i]));
        }
      }
    }
    return;
  }
  for (; j < len; ++j) {
    const uint8_t *row = a.v + size_t(slot_after(s0, j, a.capacity)) * a.v_row_bytes;
    const float w = sc[j];
#pragma unroll
    for (int i = 0; i < kDpt; ++i) {
      const int d = tid + kThreads * i;
      if (d < HD) o[i] = __fadd_rn(o[i], __fmul_rn(w, kv_elem<VT>(row, e0 + d)));
    }
  }
}

// The first chunk >= c_lo that split s takes (c % kSplits == s).
__device__ __forceinline__ int64_t first_chunk_of_split(int64_t c_lo, int s) {
  return c_lo + ((s - c_lo % kSplits) % kSplits + kSplits) % kSplits;
}
constexpr int kPrefetchChunks = 2;

// Bytes of a row's first e elements (e a multiple of 32 for Q8_0).
template <KvType T>
__device__ __forceinline__ size_t kv_bytes(int64_t e) {
  if constexpr (T == KvType::F32) return size_t(e) * 4;
  if constexpr (T == KvType::Q8_0) return size_t(e / 32) * 34;
  return size_t(e) * 2;
}

// The split block's chunks (keys [j0, p], chunks c = s mod kSplits) asked of L2: the head
// slice [e0, e0 + head_dim) of each key's K and V row, line by line over the block's threads.
// Called before griddepcontrol.wait, so the requests overlap the kernel before. Safe there: a
// prefetch changes no value; pos0 was uploaded at the start of the step, several kernels
// back; and the one row the kernel before writes (this step's key) is asked of L2, the level
// every SM's writes reach, so its new bytes are what the loads after the wait see.
template <KvType KT, KvType VT>
__device__ __forceinline__ void prefetch_chunks(const AttnCore &a, int r, int s, int g, int head_dim) {
  const int64_t p = *a.pos0 + (r - a.row_base);
  if (p < 0) return;
  const int64_t j0 = a.window > 0 ? (p - a.window + 1 > 0 ? p - a.window + 1 : int64_t(0)) : 0;
  const int64_t c_lo = j0 / kChunk, c_hi = p / kChunk;
  const int64_t e0 = int64_t(g) * head_dim;
  const size_t k_off = kv_bytes<KT>(e0), k_len = kv_bytes<KT>(e0 + head_dim) - k_off;
  const size_t v_off = kv_bytes<VT>(e0), v_len = kv_bytes<VT>(e0 + head_dim) - v_off;
  // At most kPrefetchChunks of them: at long contexts the rest would evict from L2 what the
  // kernels before and this one still read (and the first chunks' loads hide the later ones').
  int64_t c = first_chunk_of_split(c_lo, s);
  for (int k = 0; c <= c_hi && k < kPrefetchChunks; c += kSplits, ++k) {
    const int64_t ka = c * kChunk > j0 ? c * kChunk : j0;
    const int64_t kb = c * kChunk + kChunk - 1 < p ? c * kChunk + kChunk - 1 : p;
    for (int64_t j = ka + threadIdx.x; j <= kb; j += kThreads) {  // a thread's keys, whole slices
      const int64_t slot = j % a.capacity;
      dev::prefetch_lines(a.k + size_t(slot) * a.k_row_bytes + k_off, k_len, 0, 1, 1);
      dev::prefetch_lines(a.v + size_t(slot) * a.v_row_bytes + v_off, v_len, 0, 1, 1);
    }
  }
}

// HD > 0: the head dim, fixed at compile time (64, 128, 256, 512 with K and V of one type);
// 0: any head dim. Both give the same bits.
template <KvType KT, KvType VT, int HD>
__global__ void __launch_bounds__(kThreads) attention_split_kernel(AttnParams a0, int row0, float *__restrict__ part,
                                                                  unsigned *cnt) {
  const AttnCore a = for_row(a0, row0 + int(blockIdx.z));
  if (a.kv_prefetch && int(blockIdx.y) % a.group == 0) {  // one query head per KV head asks
    prefetch_chunks<KT, VT>(a, row0 + int(blockIdx.z), int(blockIdx.x), int(blockIdx.y) / a.group,
                            HD > 0 ? HD : a.head_dim);
  }
  dev::pdl_start();
  constexpr int kDpt = HD > 0 ? (HD + kThreads - 1) / kThreads : kDimsPerThread;
  const int head_dim = HD > 0 ? HD : a.head_dim;
  __shared__ float qs[kMaxHeadDim];
  __shared__ float sc[kChunk];
  __shared__ float red_f[kThreads / 32];
  const int s = blockIdx.x, h = blockIdx.y, rr = blockIdx.z, r = row0 + rr;
  const int g = h / a.group;
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int64_t p = *a.pos0 + (r - a.row_base);
  const int64_t j0 = a.window > 0 ? (p - a.window + 1 > 0 ? p - a.window + 1 : int64_t(0)) : 0;
  const int64_t c_lo = j0 / kChunk, c_hi = p / kChunk;
  const float *q = a.q + (size_t(r) * a.n_head + h) * head_dim;
  for (int i = tid; i < head_dim; i += kThreads) qs[i] = q[i];
  float m = -INFINITY, l = 0.0f;
  float o[kDpt];
#pragma unroll
  for (int i = 0; i < kDpt; ++i) o[i] = 0.0f;
  const int64_t e0 = int64_t(g) * head_dim;
  int64_t c = first_chunk_of_split(c_lo, s);
  __syncthreads();
  float qr[HD > 0 ? HD / 16 : 1];
  if constexpr (HD > 0) {
#pragma unroll
    for (int i = 0; i < HD / 16; ++i) qr[i] = qs[tid % 16 + 16 * i];
  }
  for (; c <= c_hi; c += kSplits) {
    const int64_t ka = c * kChunk > j0 ? c * kChunk : j0;
    const int64_t kb = c * kChunk + kChunk - 1 < p ? c * kChunk + kChunk - 1 : p;
    const int len = int(kb - ka + 1);
    const int64_t s0 = ka % a.capacity;
    if constexpr (HD > 0) {
      chunk_scores<KT, HD>(a, qr, s0, len, e0, sc);
    } else {
      tile_scores<KT>(a, qs, ka, 0, len, g, sc);
    }
    __syncthreads();
    // The chunk's maximum (NaN ignored), then the running one.
    float mc = -INFINITY;
    for (int j = tid; j < len; j += kThreads) mc = fmaxf(mc, sc[j]);
    for (int off = 16; off >= 1; off /= 2) mc = fmaxf(mc, __shfl_xor_sync(kFull, mc, off));
    if (lane == 0) red_f[warp] = mc;
    __syncthreads();
    mc = red_f[0];
    for (int w = 1; w < kThreads / 32; ++w) mc = fmaxf(mc, red_f[w]);
    const float mn = fmaxf(m, mc);
    const float alpha = m == -INFINITY ? 0.0f : exp_f(__fsub_rn(m, mn));
    __syncthreads();  // everyone has read red_f
    // e_j = exp(s_j - mn), their sum in a fixed order (thread-strided, then the tree).
    float ls = 0.0f;
    for (int j = tid; j < len; j += kThreads) {
      const float e = mn == -INFINITY ? 0.0f : exp_f(__fsub_rn(sc[j], mn));
      sc[j] = e;
      ls = __fadd_rn(ls, e);
    }
    for (int off = 16; off >= 1; off /= 2) ls = __fadd_rn(ls, __shfl_xor_sync(kFull, ls, off));
    if (lane == 0) red_f[warp] = ls;
    __syncthreads();
    ls = red_f[0];
    for (int w = 1; w < kThreads / 32; ++w) ls = __fadd_rn(ls, red_f[w]);
    l = __fadd_rn(__fmul_rn(l, alpha), ls);
    // o = o * alpha + sum_j e_j v_j, keys in order.
#pragma unroll
    for (int i = 0; i < kDpt; ++i) o[i] = __fmul_rn(o[i], alpha);
    if constexpr (HD > 0) {
      chunk_values<VT, HD>(a, s0, len, e0, sc, o);
    } else {
#pragma unroll 4
      for (int j = 0; j < len; ++j) {
        const uint8_t *row = a.v + size_t(slot_after(s0, j, a.capacity)) * a.v_row_bytes;
        const float w = sc[j];
#pragma unroll
        for (int i = 0; i < kDpt; ++i) {
          const int d = tid + kThreads * i;
          if (d < head_dim) o[i] = __fadd_rn(o[i], __fmul_rn(w, kv_elem<VT>(row, e0 + d)));
        }
      }
    }
    m = mn;
    __syncthreads();  // sc and red_f are reused by the next chunk
  }
  float *pp = part + ((size_t(rr) * a.n_head + h) * kSplits + s) * size_t(head_dim + 2);
  if (tid == 0) {
    pp[0] = m;
    pp[1] = l;
  }
#pragma unroll
  for (int i = 0; i < kDpt; ++i) {
    const int d = tid + kThreads * i;
    if (d < head_dim) pp[2 + d] = o[i];
  }
  if (cnt != nullptr) merge_if_last(a, row0, rr, h, part, cnt);
}

// ---- split attention, many queries per block (prefill) -------------------------------------------
// attention_split_kernel's arithmetic for kMqHeads query heads at once: the `group` heads of
// one KV head for 16 / group consecutive rows of one sequence. A block (split, KV head, row
// tile) stages each chunk's K rows, then its V rows, in shared memory as floats (kv_elem's
// values) once for all its query heads, instead of once per (query, head). Every query head
// keeps the single-query kernel's operations in the same order:
// - its score of key j: 16 chains (lane l: q[l + 16 i] k[l + 16 i], i in order), the tree
//   by shuffles down 8, 4, 2, 1 within a half-warp, times the scale;
// - per chunk it visits: the max, alpha, e_j = exp(s_j - m) at index j - ka, their sum as
//   two 32-lane xor trees (indices 0..31, then 32..63) added in that order (the single-query
//   kernel's warps 2 and 3 add zeros, which change nothing), l = l alpha + sum;
// - o = o alpha, then o += e_j v_j for the chunk's keys in order.
// A chunk outside a query's range is skipped, as the single-query kernel never visits it.
// So a row's partials, and after the merge its output, are bit for bit those of the
// single-query kernel (CudaOps.AttentionMultiQuerySameBits).

constexpr int kMqHeads = 16;   // query heads per block
constexpr int kMqMinRows = 4;  // fewer rows keep the single-query kernel (decode)
constexpr int kMqThreads = 256;  // a half-warp per query head in the score pass

template <int HD>
constexpr int mq_keys() {  // keys staged at once: 64 KB of floats
  return HD <= 256 ? 64 : 16384 / HD;
}
template <int HD>
constexpr size_t mq_smem_bytes() {
  return sizeof(float) * (size_t(kMqHeads) * HD + size_t(mq_keys<HD>()) * HD + size_t(kMqHeads) * kChunk + 4 * kMqHeads);
}

// Rows s0, s0 + 1, ... (ring slots) x elements [e0, e0 + HD) of a ring into dst[nt][HD] as
// floats (kv_elem's values), 4 elements per load where the type allows.
template <KvType T, int HD>
__device__ __forceinline__ void mq_stage(const uint8_t *ring, size_t row_bytes, int64_t s0, int64_t capacity, int nt,
                                         int64_t e0, float *dst) {
  constexpr int kQ = HD / 4;  // groups of 4 elements per row
  for (int i = threadIdx.x; i < nt * kQ; i += kMqThreads) {
    const int kk = i / kQ, d = 4 * (i % kQ);
    const uint8_t *row = ring + size_t(slot_after(s0, kk, capacity)) * row_bytes;
    float4 v;
    if constexpr (T == KvType::F32) {
      v = *reinterpret_cast<const float4 *>(row + 4 * (e0 + d));
    } else if constexpr (T == KvType::F16 || T == KvType::BF16) {
      const uint2 h = *reinterpret_cast<const uint2 *>(row + 2 * (e0 + d));
      if constexpr (T == KvType::F16) {
        v = make_float4(kv_f16(h.x & 0xFFFFu), kv_f16(h.x >> 16), kv_f16(h.y & 0xFFFFu), kv_f16(h.y >> 16));
      } else {
        v = make_float4(dev::bf16_to_fp32(h.x & 0xFFFFu), dev::bf16_to_fp32(h.x >> 16), dev::bf16_to_fp32(h.y & 0xFFFFu),
                        dev::bf16_to_fp32(h.y >> 16));
      }
    } else {
      v = make_float4(kv_elem<T>(row, e0 + d), kv_elem<T>(row, e0 + d + 1), kv_elem<T>(row, e0 + d + 2),
                      kv_elem<T>(row, e0 + d + 3));
    }
    *reinterpret_cast<float4 *>(dst + kk * HD + d) = v;
  }
}

// One query head's softmax step over a chunk's scores scq[0, lq) (lq <= 64), by one warp:
// the chunk's max, alpha = exp(m - m_new), e_j = exp(s_j - m_new) written over the scores,
// their sum as two 32-lane xor trees (indices 0..31, then 32..63) added in that order (the
// single-query kernel's warps 2 and 3 add zeros, which change nothing), l = l alpha + sum;
// lane 0 updates *m, *l and leaves alpha in *a.
__device__ __forceinline__ void mq_chunk_softmax(float *scq, int lq, float *m_q, float *l_q, float *a_q, int lane) {
  float mc = -INFINITY;  // NaN scores are ignored, as fmaxf from -inf does in the single-query kernel
  if (lane < lq) mc = fmaxf(mc, scq[lane]);
  if (lane + 32 < lq) mc = fmaxf(mc, scq[lane + 32]);
  for (int off = 16; off >= 1; off /= 2) mc = fmaxf(mc, __shfl_xor_sync(kFull, mc, off));
  const float m = *m_q;
  const float mn = fmaxf(m, mc);
  const float alpha = m == -INFINITY ? 0.0f : exp_f(__fsub_rn(m, mn));
  float e_lo = 0.0f, e_hi = 0.0f;
  if (lane < lq) e_lo = mn == -INFINITY ? 0.0f : exp_f(__fsub_rn(scq[lane], mn));
  if (lane + 32 < lq) e_hi = mn == -INFINITY ? 0.0f : exp_f(__fsub_rn(scq[lane + 32], mn));
  __syncwarp();
  if (lane < lq) scq[lane] = e_lo;
  if (lane + 32 < lq) scq[lane + 32] = e_hi;
  float t_lo = e_lo, t_hi = e_hi;
  for (int off = 16; off >= 1; off /= 2) {
    t_lo = __fadd_rn(t_lo, __shfl_xor_sync(kFull, t_lo, off));
    t_hi = __fadd_rn(t_hi, __shfl_xor_sync(kFull, t_hi, off));
  }
  if (lane == 0) {
    float sum = t_lo;
    sum = __fadd_rn(sum, t_hi);
    sum = __fadd_rn(sum, 0.0f);  // the single-query kernel's warps 2 and 3 (no keys)
    sum = __fadd_rn(sum, 0.0f);
    *l_q = __fadd_rn(__fmul_rn(*l_q, alpha), sum);
    *m_q = mn;
    *a_q = alpha;
  }
}

template <KvType KT, KvType VT, int HD>
__global__ void __launch_bounds__(kMqThreads) attention_mq_kernel(AttnParams a0, int row0, int n_rows,
                                                                  float *__restrict__ part) {
  dev::pdl_start();
  constexpr int kKs = mq_keys<HD>(), kPer = HD / 16;
  extern __shared__ float mq_smem[];
  float *qs = mq_smem;                          // [kMqHeads][HD]
  float *kvs = qs + kMqHeads * HD;              // [kKs][HD]
  float *sc = kvs + kKs * HD;                   // [kMqHeads][kChunk]: scores, then e_j
  float *ms = sc + kMqHeads * kChunk;           // running max per query head
  float *ls = ms + kMqHeads;                    // running sum
  float *al = ls + kMqHeads;                    // this chunk's alpha
  int *act = reinterpret_cast<int *>(al + kMqHeads);  // 1: the query head visits this chunk
  const AttnCore a = a0.c;
  const int s = blockIdx.x, g = blockIdx.y, group = a.group, rows_per = kMqHeads / group;
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, hw = tid / 16, l = tid % 16;
  const int rt0 = int(blockIdx.z) * rows_per;  // first row of the tile, relative to row0
  const int64_t e0 = int64_t(g) * HD;
  const int64_t p_first = *a.pos0 + (row0 + rt0 - a.row_base);
  // Query head qh: row rt0 + qh / group, head g * group + qh % group.
  auto qh_row = [&](int qh) { return rt0 + qh / group; };
  auto qh_live = [&](int qh) { return qh_row(qh) < n_rows; };
  auto qh_pos = [&](int qh) { return p_first + qh / group; };
  auto qh_j0 = [&](int qh) {
    const int64_t p = qh_pos(qh);
    return a.window > 0 ? (p - a.window + 1 > 0 ? p - a.window + 1 : int64_t(0)) : int64_t(0);
  };
  for (int i = tid; i < kMqHeads * HD; i += kMqThreads) {
    const int qh = i / HD, d = i % HD;
    qs[i] = qh_live(qh) ? a.q[(size_t(row0 + qh_row(qh)) * a.n_head + g * group + qh % group) * HD + d] : 0.0f;
  }
  if (tid < kMqHeads) {
    ms[tid] = -INFINITY;
    ls[tid] = 0.0f;
  }
  // The rows of the tile that exist: chunks from the first one's lowest to the last one's highest.
  int last = kMqHeads - 1;
  while (last > 0 && !qh_live(last)) --last;
  const int64_t c_lo = qh_j0(0) / kChunk, c_hi = qh_pos(last) / kChunk;
  float o[kPer];  // thread (qh = tid / 16, l): dims l + 16 i of its query head
#pragma unroll
  for (int i = 0; i < kPer; ++i) o[i] = 0.0f;
  __syncthreads();
  float qr[kPer];  // the score pass: half-warp hw is query head hw
#pragma unroll
  for (int i = 0; i < kPer; ++i) qr[i] = qs[hw * HD + l + 16 * i];
  const int oq = tid / 16;  // the output pass's query head (the same as hw)
  int64_t c = first_chunk_of_split(c_lo, s);
  for (; c <= c_hi; c += kSplits) {
    // This query head's keys in the chunk: [ka, kb], or none.
    const int64_t p = qh_pos(hw), j0 = qh_j0(hw);
    const bool on = qh_live(hw) && c >= j0 / kChunk && c <= p / kChunk;
    const int64_t ka = c * kChunk > j0 ? c * kChunk : j0;
    const int64_t kb = c * kChunk + kChunk - 1 < p ? c * kChunk + kChunk - 1 : p;
    const int len = on ? int(kb - ka + 1) : 0;
    if (l == 0) act[hw] = on ? 1 : 0;
    // Keys the block stages: the chunk's positions from the lowest ka to the highest kb.
    const int64_t sa = c * kChunk > qh_j0(0) ? c * kChunk : qh_j0(0);
    const int64_t sb = c * kChunk + kChunk - 1 < qh_pos(last) ? c * kChunk + kChunk - 1 : qh_pos(last);
    for (int64_t t0 = sa; t0 <= sb; t0 += kKs) {
      const int nt = sb - t0 + 1 < kKs ? int(sb - t0 + 1) : kKs;
      __syncthreads();  // the buffer is free
      mq_stage<KT, HD>(a.k, a.k_row_bytes, t0 % a.capacity, a.capacity, nt, e0, kvs);
      __syncthreads();
      if (len > 0) {
        // kKu keys at a time: independent chains in flight, each key's operations unchanged.
        constexpr int kKu = HD <= 256 ? 4 : 2;
        const unsigned mask = 0xFFFFu << (16 * (hw % 2));
        const int64_t u0 = t0 > ka ? t0 : ka, u1 = t0 + nt - 1 < kb ? t0 + nt - 1 : kb;
        for (int64_t j = u0; j <= u1; j += kKu) {
          float acc[kKu];
#pragma unroll
          for (int u = 0; u < kKu; ++u) acc[u] = 0.0f;
#pragma unroll
          for (int i = 0; i < kPer; ++i) {
#pragma unroll
            for (int u = 0; u < kKu; ++u) {
              if (j + u <= u1) acc[u] = __fadd_rn(acc[u], __fmul_rn(qr[i], kvs[(j + u - t0) * HD + l + 16 * i]));
            }
          }
#pragma unroll
          for (int off = 8; off >= 1; off /= 2) {
#pragma unroll
            for (int u = 0; u < kKu; ++u) acc[u] = __fadd_rn(acc[u], __shfl_down_sync(mask, acc[u], off, 16));
          }
          if (l == 0) {
#pragma unroll
            for (int u = 0; u < kKu; ++u) {
              if (j + u <= u1) sc[hw * kChunk + (j + u - ka)] = __fmul_rn(acc[u], a.scale);
            }
          }
        }
      }
    }
    __syncthreads();
    // Softmax of the chunk, a warp per query head.
    for (int qh = warp; qh < kMqHeads; qh += kMqThreads / 32) {
      if (!act[qh]) continue;
      const int64_t pq = qh_pos(qh), jq = qh_j0(qh);
      const int64_t kaq = c * kChunk > jq ? c * kChunk : jq;
      const int64_t kbq = c * kChunk + kChunk - 1 < pq ? c * kChunk + kChunk - 1 : pq;
      const int lq = int(kbq - kaq + 1);
      mq_chunk_softmax(sc + qh * kChunk, lq, ms + qh, ls + qh, al + qh, lane);
    }
    __syncthreads();
    // o = o alpha + sum_j e_j v_j, keys in order, V staged like K.
    const bool oon = act[oq] != 0;
    int64_t kaq = 0, kbq = -1;
    if (oon) {
      const int64_t pq = qh_pos(oq), jq = qh_j0(oq);
      kaq = c * kChunk > jq ? c * kChunk : jq;
      kbq = c * kChunk + kChunk - 1 < pq ? c * kChunk + kChunk - 1 : pq;
      const float alpha = al[oq];
#pragma unroll
      for (int i = 0; i < kPer; ++i) o[i] = __fmul_rn(o[i], alpha);
    }
    for (int64_t t0 = sa; t0 <= sb; t0 += kKs) {
      const int nt = sb - t0 + 1 < kKs ? int(sb - t0 + 1) : kKs;
      __syncthreads();
      mq_stage<VT, HD>(a.v, a.v_row_bytes, t0 % a.capacity, a.capacity, nt, e0, kvs);
      __syncthreads();
      if (oon) {
        const int64_t u0 = t0 > kaq ? t0 : kaq, u1 = t0 + nt - 1 < kbq ? t0 + nt - 1 : kbq;
        const float *scq = sc + oq * kChunk;
        for (int64_t j = u0; j <= u1; ++j) {
          const float w = scq[j - kaq];
          const float *vr = kvs + (j - t0) * HD;
#pragma unroll
          for (int i = 0; i < kPer; ++i) o[i] = __fadd_rn(o[i], __fmul_rn(w, vr[l + 16 * i]));
        }
      }
    }
    __syncthreads();  // sc, act and al are reused by the next chunk
  }
  // Partials, as the single-query kernel writes them.
  if (qh_live(oq)) {
    const int rr = rt0 + oq / group, h = g * group + oq % group;
    float *pp = part + ((size_t(rr) * a.n_head + h) * kSplits + s) * size_t(HD + 2);
    if (l == 0) {
      pp[0] = ms[oq];
      pp[1] = ls[oq];
    }
#pragma unroll
    for (int i = 0; i < kPer; ++i) pp[2 + l + 16 * i] = o[i];
  }
}

// ---- many queries per block, register-blocked (prefill) ---------------------------------------
// attention_mq_kernel's block (split, KV head, tile of 16 query heads) and arithmetic, with the
// work laid out so that a value read from shared memory serves several query heads:
// - scores: half-warp hw holds the queries of QG query heads in registers (dims l + 16 i) and
//   makes the 16 chains of QG x KU scores at once, each key's row read once for its QG heads
//   (the two half-warps of a warp take the same keys, so the read is a broadcast); the tree
//   by shuffles down 8, 4, 2, 1 and the scale as before;
// - softmax: unchanged (a warp per query head);
// - o += e_j v_j: thread (column col of 4 dims, head group og) holds QO heads x 4 dims, one
//   16-byte read of a V row per key for its QO heads.
// K and V come in tiles of kKs keys through two shared-memory buffers in turn: the next tile
// (the chunk's next K tile, its first V tile, the next chunk's first K tile) is copied with
// cp.async while the current one is used (f32 rings; the other types are converted by the
// threads, without the overlap). Every score, exponential, sum and output element is the same
// operation on the same values in the same order as in attention_mq_kernel, so the partials
// are bit for bit the same (CudaOps.AttentionMultiQuerySameBits compares them with the
// single-query kernel). Head dim 512 keeps attention_mq_kernel: at 32 registers of queries a
// half-warp holds one head, and 16-key tiles (two buffers in 64 KiB) measured slower there.
// H200 (CudaOps.DISABLED_PerfAttention, 512 rows, 8 / 2 heads, f32, ms): head dim 256 from
// position 0 0.209 -> 0.184, after 4096 cached 2.174 -> 2.185; head dim 512 0.406 -> 0.370
// and 4.120 -> 4.810 (the 16-key tiles). E4B pp512 9394 / 9654 -> 9862 / 9900 t/s, 270M
// 48328 / 50597 -> 59174 / 59611 (every head dim through this kernel).

template <int HD>
constexpr int mqr_keys() {  // keys per tile: 32 KiB of floats, at most a chunk
  return 8192 / HD < kChunk ? 8192 / HD : kChunk;
}
template <int HD>
constexpr int mqr_qg() {  // query heads per half-warp in the score pass (at most 32 registers of queries)
  return HD <= 128 ? 4 : 2;
}
template <int HD>
constexpr size_t mqr_smem_bytes() {
  return sizeof(float) * (size_t(2) * mqr_keys<HD>() * HD + size_t(kMqHeads) * kChunk + 3 * kMqHeads);
}

// Keys [t0, t0 + nt) of a ring's rows (elements [e0, e0 + HD)) into dst[nt][HD] as floats:
// f32 by cp.async, the other types through registers; one cp.async group either way.
template <KvType T, int HD>
__device__ __forceinline__ void mqr_stage(const uint8_t *ring, size_t row_bytes, int64_t t0, int64_t capacity, int nt,
                                          int64_t e0, float *dst) {
  constexpr int kQ = HD / 4;
  if constexpr (T == KvType::F32) {
    for (int i = threadIdx.x; i < nt * kQ; i += kMqThreads) {
      const int kk = i / kQ, d = 4 * (i % kQ);
      const uint8_t *row = ring + size_t((t0 + kk) % capacity) * row_bytes;
      dev::cp_async16(dst + kk * HD + d, row + 4 * (e0 + d));
    }
  } else {
    mq_stage<T, HD>(ring, row_bytes, t0 % capacity, capacity, nt, e0, dst);
  }
  dev::cp_async_commit();  // a group for every tile (an empty one here), which the waits count
}

template <KvType KT, KvType VT, int HD>
__global__ void __launch_bounds__(kMqThreads, 2) attention_mqr_kernel(AttnParams a0, int row0, int n_rows,
                                                                        float *__restrict__ part) {
  dev::pdl_start();
  constexpr int kKs = mqr_keys<HD>(), kPer = HD / 16;
  constexpr int QG = mqr_qg<HD>(), NQG = kMqHeads / QG, NKP = 16 / NQG, KU = 8 / QG;
  constexpr int kCols = HD / 4, QO = HD / 64;  // the output pass: kCols x (16 / QO) threads
  static_assert(HD <= 256, "head dim 512 keeps attention_mq_kernel");
  static_assert(kCols * (kMqHeads / QO) == kMqThreads, "one thread per 4 dims x QO heads");
  extern __shared__ __align__(16) float mqr_smem[];
  float *buf = mqr_smem;                   // [2][kKs][HD]
  float *sc = buf + 2 * kKs * HD;          // [kMqHeads][kChunk]: scores, then e_j
  float *ms = sc + kMqHeads * kChunk;      // running max per query head
  float *ls = ms + kMqHeads;               // running sum
  float *al = ls + kMqHeads;               // this chunk's alpha
  const AttnCore a = a0.c;
  const int s = blockIdx.x, g = blockIdx.y, group = a.group, rows_per = kMqHeads / group;
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, hw = tid / 16, l = tid % 16;
  const int rt0 = int(blockIdx.z) * rows_per;
  const int64_t e0 = int64_t(g) * HD;
  const int64_t p_first = *a.pos0 + (row0 + rt0 - a.row_base);
  auto qh_live = [&](int qh) { return rt0 + qh / group < n_rows; };
  auto qh_pos = [&](int qh) { return p_first + qh / group; };
  auto qh_j0 = [&](int qh) {
    const int64_t p = qh_pos(qh);
    return a.window > 0 ? (p - a.window + 1 > 0 ? p - a.window + 1 : int64_t(0)) : int64_t(0);
  };
  // Query head qh's keys in chunk c: c kChunk + [*ka, *ka + len), len 0 where it does not
  // visit c.
  auto qrange = [&](int qh, int64_t c, int *ka) {
    const int64_t p = qh_pos(qh), j0 = qh_j0(qh);
    const int64_t k0 = c * kChunk > j0 ? c * kChunk : j0;
    const int64_t kb = c * kChunk + kChunk - 1 < p ? c * kChunk + kChunk - 1 : p;
    *ka = int(k0 - c * kChunk);
    return qh_live(qh) && c >= j0 / kChunk && c <= p / kChunk ? int(kb - k0 + 1) : 0;
  };
  if (tid < kMqHeads) {
    ms[tid] = -INFINITY;
    ls[tid] = 0.0f;
  }
  int last = kMqHeads - 1;
  while (last > 0 && !qh_live(last)) --last;
  const int64_t c_lo = qh_j0(0) / kChunk, c_hi = qh_pos(last) / kChunk;
  // The block's keys in chunk c: [sa(c), sb(c)].
  auto sa = [&](int64_t c) { return c * kChunk > qh_j0(0) ? c * kChunk : qh_j0(0); };
  auto sb = [&](int64_t c) { return c * kChunk + kChunk - 1 < qh_pos(last) ? c * kChunk + kChunk - 1 : qh_pos(last); };

  // The score pass's query heads: qg * QG + u, u < QG; its keys: kph * KU + NKP * KU * m + u.
  const int qg = hw % NQG, kph = hw / NQG;
  float qr[QG][kPer];
#pragma unroll
  for (int u = 0; u < QG; ++u) {
    const int qh = qg * QG + u;
    const float *qp = a.q + (size_t(row0 + rt0 + qh / group) * a.n_head + g * group + qh % group) * HD;
#pragma unroll
    for (int i = 0; i < kPer; ++i) qr[u][i] = qh_live(qh) ? qp[l + 16 * i] : 0.0f;
  }
  // The output pass's query heads og * QO + u and dims 4 col .. 4 col + 3.
  const int col = tid % kCols, og = tid / kCols;
  float o[QO][4];
#pragma unroll
  for (int u = 0; u < QO; ++u)
#pragma unroll
    for (int e = 0; e < 4; ++e) o[u][e] = 0.0f;
  int ska[QG], slen[QG], oka[QO], olen[QO];  // this chunk's keys per query head (qrange)

  // Tiles in order: per chunk of this split, its K tiles then its V tiles.
  struct Tile {
    int64_t c, t0;
    bool v;
  };
  auto advance = [&](Tile t) {
    t.t0 += kKs;
    if (t.t0 > sb(t.c)) {
      if (!t.v) {
        t.v = true;
      } else {
        t.v = false;
        t.c += kSplits;
      }
      t.t0 = sa(t.c);
    }
    return t;
  };
  auto issue = [&](const Tile &t, float *dst) {
    const int nt = sb(t.c) - t.t0 + 1 < kKs ? int(sb(t.c) - t.t0 + 1) : kKs;
    if (t.v) {
      mqr_stage<VT, HD>(a.v, a.v_row_bytes, t.t0, a.capacity, nt, e0, dst);
    } else {
      mqr_stage<KT, HD>(a.k, a.k_row_bytes, t.t0, a.capacity, nt, e0, dst);
    }
  };
  const int64_t c_first = first_chunk_of_split(c_lo, s);
  Tile cur{c_first, sa(c_first), false};
  Tile nxt = advance(cur);
  if (cur.c <= c_hi) issue(cur, buf);
  if (nxt.c <= c_hi) issue(nxt, buf + kKs * HD);
  int bi = 0;
  while (cur.c <= c_hi) {
    if (nxt.c <= c_hi) {
      dev::cp_async_wait<1>();
    } else {
      dev::cp_async_wait<0>();
    }
    __syncthreads();  // the tile is in (and, for a chunk's first tile, ms / ls / al settled)
    const float *kv = buf + bi * kKs * HD;
    const int64_t c = cur.c;
    const int nt = sb(c) - cur.t0 + 1 < kKs ? int(sb(c) - cur.t0 + 1) : kKs;
    const int tb = int(cur.t0 - c * kChunk);  // the tile's first key, from the chunk's start
    if (!cur.v) {
      if (cur.t0 == sa(c)) {
#pragma unroll
        for (int u = 0; u < QG; ++u) slen[u] = qrange(qg * QG + u, c, &ska[u]);
      }
      for (int kb = kph * KU; kb < nt; kb += NKP * KU) {  // the same trip count for the whole block
        float acc[QG][KU];
        const float *kr[KU];
#pragma unroll
        for (int v = 0; v < KU; ++v) {
          acc[0][v] = 0.0f;
          kr[v] = kv + (kb + v < nt ? kb + v : nt - 1) * HD + l;
        }
#pragma unroll
        for (int u = 1; u < QG; ++u)
#pragma unroll
          for (int v = 0; v < KU; ++v) acc[u][v] = 0.0f;
#pragma unroll
        for (int i = 0; i < kPer; ++i) {
#pragma unroll
          for (int v = 0; v < KU; ++v) {
            const float kx = kr[v][16 * i];
#pragma unroll
            for (int u = 0; u < QG; ++u) acc[u][v] = __fadd_rn(acc[u][v], __fmul_rn(qr[u][i], kx));
          }
        }
#pragma unroll
        for (int off = 8; off >= 1; off /= 2)
#pragma unroll
          for (int u = 0; u < QG; ++u)
#pragma unroll
            for (int v = 0; v < KU; ++v) acc[u][v] = __fadd_rn(acc[u][v], __shfl_down_sync(kFull, acc[u][v], off, 16));
        if (l == 0) {
#pragma unroll
          for (int u = 0; u < QG; ++u)
#pragma unroll
            for (int v = 0; v < KU; ++v) {
              const int r = tb + kb + v - ska[u];
              if (kb + v < nt && r >= 0 && r < slen[u]) sc[(qg * QG + u) * kChunk + r] = __fmul_rn(acc[u][v], a.scale);
            }
        }
      }
      if (cur.t0 + kKs > sb(c)) {
        __syncthreads();  // every score of the chunk is in
        // Softmax of the chunk, a warp per query head, as attention_mq_kernel's.
        for (int qh = warp; qh < kMqHeads; qh += kMqThreads / 32) {
          int kaq;
          const int lq = qrange(qh, c, &kaq);
          if (lq == 0) continue;
          mq_chunk_softmax(sc + qh * kChunk, lq, ms + qh, ls + qh, al + qh, lane);
        }
      }
    } else {
      if (cur.t0 == sa(c)) {  // the chunk's first V tile: o = o alpha for the heads that visit it
#pragma unroll
        for (int u = 0; u < QO; ++u) {
          olen[u] = qrange(og * QO + u, c, &oka[u]);
          if (olen[u] > 0) {
            const float alpha = al[og * QO + u];
#pragma unroll
            for (int e = 0; e < 4; ++e) o[u][e] = __fmul_rn(o[u][e], alpha);
          }
        }
      }
      auto add = [&](int u, float w, const float4 &vv) {
        o[u][0] = __fadd_rn(o[u][0], __fmul_rn(w, vv.x));
        o[u][1] = __fadd_rn(o[u][1], __fmul_rn(w, vv.y));
        o[u][2] = __fadd_rn(o[u][2], __fmul_rn(w, vv.z));
        o[u][3] = __fadd_rn(o[u][3], __fmul_rn(w, vv.w));
      };
      bool all_in = true;  // every head of the thread takes every key of the tile
#pragma unroll
      for (int u = 0; u < QO; ++u) all_in = all_in && oka[u] <= tb && tb + nt <= oka[u] + olen[u];
      if (all_in) {
        for (int kk = 0; kk < nt; ++kk) {
          const float4 vv = *reinterpret_cast<const float4 *>(kv + kk * HD + 4 * col);
#pragma unroll
          for (int u = 0; u < QO; ++u) add(u, sc[(og * QO + u) * kChunk + tb + kk - oka[u]], vv);
        }
      } else {
        for (int kk = 0; kk < nt; ++kk) {
          const float4 vv = *reinterpret_cast<const float4 *>(kv + kk * HD + 4 * col);
#pragma unroll
          for (int u = 0; u < QO; ++u) {
            const int r = tb + kk - oka[u];
            if (r >= 0 && r < olen[u]) add(u, sc[(og * QO + u) * kChunk + r], vv);
          }
        }
      }
    }
    __syncthreads();  // the buffer is free (and the chunk's scores, for a V tile, used)
    const Tile n2 = advance(nxt);
    if (n2.c <= c_hi) issue(n2, buf + bi * kKs * HD);
    cur = nxt;
    nxt = n2;
    bi ^= 1;
  }
  __syncthreads();  // ms and ls (set above where no tile ran)
  // Partials, as the single-query kernel writes them.
#pragma unroll
  for (int u = 0; u < QO; ++u) {
    const int qh = og * QO + u;
    if (!qh_live(qh)) continue;
    const int rr = rt0 + qh / group, h = g * group + qh % group;
    float *pp = part + ((size_t(rr) * a.n_head + h) * kSplits + s) * size_t(HD + 2);
    if (col == 0) {
      pp[0] = ms[qh];
      pp[1] = ls[qh];
    }
#pragma unroll
    for (int e = 0; e < 4; ++e) pp[2 + 4 * col + e] = o[u][e];
  }
}

bool kv_type_ok(KvType t) { return static_cast<uint8_t>(t) <= static_cast<uint8_t>(KvType::Q8_0); }

Status check_ring(KvType t, const void *ring, int64_t capacity, int64_t row_elems, const char *op) {
  if (!kv_type_ok(t)) return bad_arg(std::string(op) + ": unknown KV type");
  if (ring == nullptr || capacity <= 0 || row_elems <= 0 || (t == KvType::Q8_0 && row_elems % 32 != 0)) {
    return bad_arg(std::string(op) + ": bad ring (null, capacity <= 0, row_elems <= 0, or q8_0 rows not a multiple "
                                     "of 32)");
  }
  return Status::ok();
}

// Calls copy(ring_byte_offset, dense_byte_offset, bytes) for each run of consecutive slots
// that positions [from, to) occupy in a ring of `capacity` rows.
template <class F>
Status for_each_run(int64_t capacity, size_t row_bytes, int64_t from, int64_t to, F &&copy) {
  for (int64_t p = from; p < to;) {
    const int64_t slot = p % capacity;
    const int64_t n = std::min(to - p, capacity - slot);
    GEIST_RETURN_IF_ERROR(copy(size_t(slot) * row_bytes, size_t(p - from) * row_bytes, size_t(n) * row_bytes));
    p += n;
  }
  return Status::ok();
}

}  // namespace

Status kv_append(KvType t, void *ring, int64_t capacity, int64_t row_elems, const int64_t *pos0, int n_rows,
                 const float *src, CudaStream s) {
  GEIST_RETURN_IF_ERROR(check_ring(t, ring, capacity, row_elems, "cuda::kv_append"));
  if (n_rows < 0 || n_rows > capacity || pos0 == nullptr || (n_rows > 0 && src == nullptr)) {
    return bad_arg("cuda::kv_append: bad n_rows (must be <= capacity) or null pos0/src");
  }
  if (n_rows == 0) return Status::ok();
  SeqRings one;
  one.n = 1;
  one.row0[1] = n_rows;
  one.pos0[0] = pos0;
  one.k[0] = ring;
  one.capacity[0] = capacity;
  return kv_append_seqs(t, one, false, row_elems, src, s);
}

Status check_seq_rings(KvType t, const SeqRings &sq, int64_t row_elems, bool k, bool v, const char *op) {
  if (sq.n < 1 || sq.n > kMaxStepSeqs || sq.row0[0] != 0) return bad_arg(std::string(op) + ": bad sequence table");
  for (int i = 0; i < sq.n; ++i) {
    const int n = sq.row0[i + 1] - sq.row0[i];
    if (k) GEIST_RETURN_IF_ERROR(check_ring(t, sq.k[i], sq.capacity[i], row_elems, op));
    if (v) GEIST_RETURN_IF_ERROR(check_ring(t, sq.v[i], sq.capacity[i], row_elems, op));
    if (n < 1 || n > sq.capacity[i] || sq.pos0[i] == nullptr) {
      return bad_arg(std::string(op) + ": bad n_rows (must be <= capacity) or null pos0/src");
    }
  }
  return Status::ok();
}

namespace {
Status kv_append_launch(KvType t, const SeqRings &sq, int64_t row_elems, const float *k_src, const float *v_src,
                        CudaStream s) {
  if (k_src == nullptr && v_src == nullptr) {
    return bad_arg("cuda::kv_append: bad n_rows (must be <= capacity) or null pos0/src");
  }
  GEIST_RETURN_IF_ERROR(check_seq_rings(t, sq, row_elems, k_src != nullptr, v_src != nullptr, "cuda::kv_append"));
  const int n_rows = sq.row0[sq.n];
  const dim3 grid(unsigned(n_rows), unsigned((row_elems + 255) / 256), k_src != nullptr && v_src != nullptr ? 2u : 1u);
  const size_t rb = kv_row_bytes(t, row_elems);
  dispatch_kv(t, [&](auto tag) {
    constexpr KvType T = decltype(tag)::value;
    launch(kv_append_kernel<T>, grid, 256, s, sq, row_elems, rb, k_src, v_src);
  });
  return launch_status("cuda::kv_append");
}
}  // namespace

Status kv_append_seqs(KvType t, const SeqRings &sq, bool v_rings, int64_t row_elems, const float *src, CudaStream s) {
  if (src == nullptr) return bad_arg("cuda::kv_append: bad n_rows (must be <= capacity) or null pos0/src");
  return kv_append_launch(t, sq, row_elems, v_rings ? nullptr : src, v_rings ? src : nullptr, s);
}

Status kv_append_kv_seqs(KvType t, const SeqRings &sq, int64_t row_elems, const float *k_src, const float *v_src,
                         CudaStream s) {
  if (k_src == nullptr || v_src == nullptr) return bad_arg("cuda::kv_append_kv: null k or v rows");
  return kv_append_launch(t, sq, row_elems, k_src, v_src, s);
}

Status kv_copy_positions(KvType t, const void *src_ring, int64_t src_capacity, void *dst_ring, int64_t dst_capacity,
                         int64_t row_elems, int64_t from, int64_t to, CudaStream s) {
  GEIST_RETURN_IF_ERROR(check_ring(t, src_ring, src_capacity, row_elems, "cuda::kv_copy_positions"));
  GEIST_RETURN_IF_ERROR(check_ring(t, dst_ring, dst_capacity, row_elems, "cuda::kv_copy_positions"));
  if (from < 0 || to < from || to - from > src_capacity || to - from > dst_capacity) {
    return bad_arg("cuda::kv_copy_positions: bad position range");
  }
  const size_t rb = kv_row_bytes(t, row_elems);
  // Runs of the source ring, each split again where the destination ring wraps.
  return for_each_run(src_capacity, rb, from, to, [&](size_t src_off, size_t dense_off, size_t bytes) -> Status {
    const int64_t p0 = from + int64_t(dense_off / rb), p1 = p0 + int64_t(bytes / rb);
    return for_each_run(dst_capacity, rb, p0, p1, [&](size_t dst_off, size_t sub_off, size_t sub_bytes) {
      return cuda_status(cudaMemcpyAsync(static_cast<uint8_t *>(dst_ring) + dst_off,
                                         static_cast<const uint8_t *>(src_ring) + src_off + sub_off, sub_bytes,
                                         cudaMemcpyDeviceToDevice, s),
                         "cuda::kv_copy_positions");
    });
  });
}

Status kv_read_positions(KvType t, const void *ring, int64_t capacity, int64_t row_elems, int64_t from, int64_t to,
                         void *dst, CudaStream s) {
  GEIST_RETURN_IF_ERROR(check_ring(t, ring, capacity, row_elems, "cuda::kv_read_positions"));
  if (from < 0 || to < from || to - from > capacity || (to > from && dst == nullptr)) {
    return bad_arg("cuda::kv_read_positions: bad position range or null buffer");
  }
  return for_each_run(capacity, kv_row_bytes(t, row_elems), from, to, [&](size_t ring_off, size_t off, size_t bytes) {
    return cuda_status(cudaMemcpyAsync(static_cast<uint8_t *>(dst) + off,
                                       static_cast<const uint8_t *>(ring) + ring_off, bytes, cudaMemcpyDefault, s),
                       "cuda::kv_read_positions");
  });
}

Status kv_write_positions(KvType t, void *ring, int64_t capacity, int64_t row_elems, int64_t from, int64_t to,
                          const void *src, CudaStream s) {
  GEIST_RETURN_IF_ERROR(check_ring(t, ring, capacity, row_elems, "cuda::kv_write_positions"));
  if (from < 0 || to < from || to - from > capacity || (to > from && src == nullptr)) {
    return bad_arg("cuda::kv_write_positions: bad position range or null buffer");
  }
  return for_each_run(capacity, kv_row_bytes(t, row_elems), from, to, [&](size_t ring_off, size_t off, size_t bytes) {
    return cuda_status(cudaMemcpyAsync(static_cast<uint8_t *>(ring) + ring_off,
                                       static_cast<const uint8_t *>(src) + off, bytes, cudaMemcpyDefault, s),
                       "cuda::kv_write_positions");
  });
}

namespace {
// Queries per launch of the many-queries kernel: GEIST_CUDA_ATTN_ROWS (a multiple of 64 in
// [64, 4096], default 512). Each launch covers only the chunks its queries reach, so 64 at a
// time left most of the GPU idle in a prefill from position 0 (E4B pp512: 8 launch pairs of
// 32 to 256 live blocks). 256 -> 512 (2026-12-06, H100, E4B pp512 10516 / 10492 -> 10739 /
// 10804 t/s; ncu: the 256-row launches took 61 and 117 us at head dim 256, the first one
// leaving SMs idle); the scratch is 67 MB for E4B's 512-row chunks at head dim 512. The rows
// a launch takes change no query's bits.
int mq_row_group_max() {
  static const int v = [] {
    const int n = env_int("GEIST_CUDA_ATTN_ROWS", 512) / kRowGroup * kRowGroup;
    return n < kRowGroup ? kRowGroup : n > 4096 ? 4096 : n;
  }();
  return v;
}
int rows_per_launch(int n_rows) {
  if (n_rows <= kRowGroup) return kRowGroup;
  const int r = (n_rows + kRowGroup - 1) / kRowGroup * kRowGroup;
  return r < mq_row_group_max() ? r : mq_row_group_max();
}
size_t partial_bytes_per_row(int n_head, int head_dim) {
  return size_t(n_head) * kSplits * size_t(head_dim + 2) * sizeof(float);
}
}  // namespace

bool attention_mq_in_steps() {
  static const bool v = env_int("GEIST_CUDA_ATTN_MQ_STEPS", 1) != 0;
  return v;
}

// The fewest rows of a one-sequence step that go to the many-queries kernel
// (GEIST_CUDA_ATTN_MQ_STEPS_ROWS, default 65). H200, E4B: a 512-row chunk gained (attention
// 477 -> 292 us per layer), but `bench pinned`'s 64-row chunks from positions 0-240 lost
// (the 240-token prefill 70.9 -> 74.8 ms): there the one-query kernel's grid (8 splits x
// heads x rows) fills the card and the many-queries kernel's (8 splits x KV heads x row
// groups) does not. Rows in between were not measured.
static int attention_mq_steps_min_rows() {
  static const int v = env_int("GEIST_CUDA_ATTN_MQ_STEPS_ROWS", 65);
  return v;
}

size_t attention_scratch_bytes(int n_head, int head_dim, int n_rows) {
  return size_t(rows_per_launch(n_rows)) * partial_bytes_per_row(n_head, head_dim);
}

size_t attention_counter_bytes(int n_head) { return size_t(kRowGroup) * size_t(n_head) * sizeof(unsigned); }

namespace {

Status check_attn(const AttnArgs &a) {
  if (!kv_type_ok(a.k_type) || !kv_type_ok(a.v_type)) return bad_arg("cuda::attention: unknown KV type");
  if (a.n_rows < 0 || a.n_head <= 0 || a.n_head_kv <= 0 || a.n_head % a.n_head_kv != 0 || a.head_dim <= 0 ||
      a.head_dim > kMaxHeadDim || a.window < 0 || a.n_head > 65535 || a.n_rows > 65535 ||
      ((a.k_type == KvType::Q8_0 || a.v_type == KvType::Q8_0) && (int64_t(a.n_head_kv) * a.head_dim) % 32 != 0)) {
    return bad_arg("cuda::attention: bad shape (n_head % n_head_kv, head_dim up to 512, capacity, q8_0 rows a "
                   "multiple of 32)");
  }
  if (a.quant_block != 0 &&
      ((a.quant_block != 32 && a.quant_block != 256) || a.head_dim % a.quant_block != 0 || a.quant_scratch == nullptr)) {
    return bad_arg("cuda::attention: quant_block must be 32 or 256 and divide head_dim, with a scratch");
  }
  return Status::ok();
}

// The many-queries kernel's shared memory (84 KiB at head dim 256, 100 KiB at 512) is above
// the default 48 KB: it is allowed once per instantiation and device. false where the
// device cannot give a block that much (its opt-in limit: 99 KiB on sm_86/89, so head dim
// 512 there; 163 KiB on sm_80, 227 KiB on sm_90): the caller then runs the one-query kernel.
template <KvType KT, KvType VT, int HD>
bool mq_allow_smem() {
  static std::atomic<uint64_t> done{0};
  return allow_dynamic_smem(attention_mq_kernel<KT, VT, HD>, mq_smem_bytes<HD>(), done);
}
template <KvType KT, KvType VT, int HD>
bool mqr_allow_smem() {
  static std::atomic<uint64_t> done{0};
  return allow_dynamic_smem(attention_mqr_kernel<KT, VT, HD>, mqr_smem_bytes<HD>(), done);
}
// GEIST_CUDA_ATTN_MQR=0: the many-queries kernel without the register blocking and the
// copy pipeline (attention_mq_kernel; a knob to compare, the same bits).
bool mqr_on() {
  static const bool v = env_int("GEIST_CUDA_ATTN_MQR", 1) != 0;
  return v;
}

// The split kernel asks L2 for its keys ahead (AttnCore::kv_prefetch) in calls of one row, or
// of one row per sequence (batched decode). The rows of one sequence share their keys, so in
// a longer call every block would ask for the same lines again: E4B's 64-row prefill chunks
// of `bench pinned` ran 4-5 % slower with every launch prefetching.
Status run_attention(const AttnArgs &a, const AttnParams &p_in, CudaStream s) {
  static const bool kv_prefetch = env_int("GEIST_CUDA_ATTN_PREFETCH", 1) != 0;
  AttnParams p = p_in;
  p.c.kv_prefetch = kv_prefetch && (a.n_rows == 1 || p.seqs.n == a.n_rows);
  if (a.scratch == nullptr || reference_kernels()) {
    const dim3 grid(unsigned(a.n_head), unsigned(a.n_rows));
    dispatch_kv(a.k_type, [&](auto tag_k) {
      dispatch_kv(a.v_type, [&](auto tag_v) {
        constexpr KvType KT = decltype(tag_k)::value, VT = decltype(tag_v)::value;
        launch(attention_kernel<KT, VT>, grid, kThreads, s, p);
      });
    });
    GEIST_RETURN_IF_ERROR(launch_status("cuda::attention"));
    // This kernel does not merge: the rows are quantized by the matmul's own quantizer.
    if (a.quant_block != 0) {
      return quantize_rows(a.out, int64_t(a.n_head) * a.head_dim, a.n_rows, a.quant_block, a.quant_scratch, s);
    }
    return Status::ok();
  }
  auto *part = static_cast<float *>(a.scratch);
  unsigned *const cnt = a.merge_counters;
  const int group = a.n_head / a.n_head_kv;
  // GEIST_CUDA_ATTN_MQ=0: never the many-queries kernel (a knob to compare; the same bits).
  static const bool mq_on = env_int("GEIST_CUDA_ATTN_MQ", 1) != 0;
  const bool mq = mq_on && !a.single_query && !a.any_head_dim && p.seqs.n == 0 && a.n_rows >= kMqMinRows &&
                  kMqHeads % group == 0 && (a.head_dim == 64 || a.head_dim == 128 || a.head_dim == 256 || a.head_dim == 512);
  // The many-queries kernel takes as many queries per launch as the scratch holds (at most
  // rows_per_launch); the others 64.
  int per_launch = kRowGroup;
  if (mq) {
    const size_t have = a.scratch_bytes != 0 ? a.scratch_bytes : attention_scratch_bytes(a.n_head, a.head_dim);
    const int fit = int(have / partial_bytes_per_row(a.n_head, a.head_dim)) / kRowGroup * kRowGroup;
    const int want = rows_per_launch(a.n_rows);
    per_launch = fit < want ? fit : want;
    if (per_launch < kRowGroup) per_launch = kRowGroup;
  }
  for (int row0 = 0; row0 < a.n_rows; row0 += per_launch) {
    const int nr = a.n_rows - row0 < per_launch ? a.n_rows - row0 : per_launch;
    const dim3 grid(unsigned(kSplits), unsigned(a.n_head), unsigned(nr));
    if (mq) {
      const int rows_per = kMqHeads / group;
      const dim3 gq(unsigned(kSplits), unsigned(a.n_head_kv), unsigned((nr + rows_per - 1) / rows_per));
      bool launched = false;
      dispatch_kv(a.k_type, [&](auto tag_k) {
        dispatch_kv(a.v_type, [&](auto tag_v) {
          constexpr KvType KT = decltype(tag_k)::value, VT = decltype(tag_v)::value;
          dispatch_among<int, 64, 128, 256, 512>(a.head_dim, [&](auto tag_hd) {
            constexpr int HD = decltype(tag_hd)::value;
            if constexpr (HD <= 256) {
              if (mqr_on() && mqr_allow_smem<KT, VT, HD>()) {
                launch_smem(attention_mqr_kernel<KT, VT, HD>, gq, kMqThreads, mqr_smem_bytes<HD>(), s, p, row0, nr,
                            part);
                launched = true;
                return;
              }
            }
            if (!mq_allow_smem<KT, VT, HD>()) return;
            launch_smem(attention_mq_kernel<KT, VT, HD>, gq, kMqThreads, mq_smem_bytes<HD>(), s, p, row0, nr, part);
            launched = true;
          });
        });
      });
      if (launched) {
        launch(attention_merge_kernel, dim3(unsigned(a.n_head), unsigned(nr)), kThreads, s, p.c, row0, part);
        continue;
      }
    }
    dispatch_kv(a.k_type, [&](auto tag_k) {
      dispatch_kv(a.v_type, [&](auto tag_v) {
        constexpr KvType KT = decltype(tag_k)::value, VT = decltype(tag_v)::value;
        bool fixed = false;
        // (Q8_0 with head dim 512 would spill registers: it keeps the any-head-dim kernel.)
        if constexpr (KT == VT) {
          if (!a.any_head_dim && !(KT == KvType::Q8_0 && a.head_dim == 512)) {
            fixed = dispatch_among<int, 64, 128, 256, 512>(a.head_dim, [&](auto tag_hd) {
              launch(attention_split_kernel<KT, VT, decltype(tag_hd)::value>, grid, kThreads, s, p, row0, part, cnt);
            });
          }
        }
        if (!fixed) launch(attention_split_kernel<KT, VT, 0>, grid, kThreads, s, p, row0, part, cnt);
      });
    });
    if (cnt == nullptr) launch(attention_merge_kernel, dim3(unsigned(a.n_head), unsigned(nr)), kThreads, s, p.c, row0, part);
  }
  return launch_status("cuda::attention");
}

AttnParams params_of(const AttnArgs &a) {
  AttnParams p{};
  p.c.q = a.q;
  p.c.k = static_cast<const uint8_t *>(a.k);
  p.c.v = static_cast<const uint8_t *>(a.v);
  p.c.out = a.out;
  p.c.pos0 = a.pos0;
  p.c.capacity = a.capacity;
  const int64_t row_elems = int64_t(a.n_head_kv) * a.head_dim;
  p.c.k_row_bytes = kv_row_bytes(a.k_type, row_elems);
  p.c.v_row_bytes = kv_row_bytes(a.v_type, row_elems);
  p.c.n_head = a.n_head;
  p.c.group = a.n_head / a.n_head_kv;
  p.c.head_dim = a.head_dim;
  p.c.window = a.window;
  p.c.scale = a.scale;
  p.c.row_base = 0;
  p.c.quant_block = a.quant_block;
  p.c.oq = a.quant_block != 0 ? act_quants(a.quant_scratch) : nullptr;
  p.c.od = a.quant_block != 0 ? act_scales(a.quant_scratch, a.n_rows, int64_t(a.n_head) * a.head_dim) : nullptr;
  p.c.kv_prefetch = false;  // run_attention decides
  static const bool v_tail_group = env_int("GEIST_CUDA_ATTN_VTAIL", 1) != 0;
  p.c.v_tail_group = v_tail_group;
  p.seqs.n = 0;
  return p;
}

}  // namespace

Status attention(const AttnArgs &a, CudaStream s) {
  GEIST_RETURN_IF_ERROR(check_attn(a));
  if (a.capacity <= 0) return bad_arg("cuda::attention: bad shape (capacity <= 0)");
  if (a.n_rows == 0) return Status::ok();
  if (!a.q || !a.k || !a.v || !a.out || !a.pos0) return bad_arg("cuda::attention: null pointer");
  return run_attention(a, params_of(a), s);
}

Status attention_seqs(const AttnArgs &a, const SeqRings &sq, CudaStream s) {
  GEIST_RETURN_IF_ERROR(check_attn(a));
  if (sq.n < 1 || sq.n > kMaxStepSeqs || sq.row0[0] != 0 || sq.row0[sq.n] != a.n_rows) {
    return bad_arg("cuda::attention: bad sequence table");
  }
  for (int i = 0; i < sq.n; ++i) {
    if (sq.row0[i + 1] <= sq.row0[i] || !sq.k[i] || !sq.v[i] || !sq.pos0[i] || sq.capacity[i] <= 0) {
      return bad_arg("cuda::attention: bad sequence table entry");
    }
  }
  if (!a.q || !a.out) return bad_arg("cuda::attention: null pointer");
  AttnParams p = params_of(a);
  if (sq.n == 1 && attention_mq_in_steps() && a.n_rows >= attention_mq_steps_min_rows()) {
    // One sequence (a prefill chunk, one session's decode): its rings as the plain call's, so
    // that the many-queries kernel, which takes no sequence table, runs a prefill (every model
    // step passes its table, so no prefill has ever reached that kernel). Every kernel reads
    // the same rings and positions either way: the same bits.
    p.c.k = static_cast<const uint8_t *>(sq.k[0]);
    p.c.v = static_cast<const uint8_t *>(sq.v[0]);
    p.c.pos0 = sq.pos0[0];
    p.c.capacity = sq.capacity[0];
    return run_attention(a, p, s);
  }
  p.seqs = sq;
  return run_attention(a, p, s);
}

}  // namespace geist::cuda
