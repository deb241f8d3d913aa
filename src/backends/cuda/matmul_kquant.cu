// Fast Q8-mode matmul for the K-quants (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K): a matrix-vector
// kernel for a few activation rows (decode), an int8 tensor-core kernel for up to 32 rows per
// launch whose weights are the MMA's A operand, and a 64 x 64 tile tensor-core kernel (prefill).
//
// Both give the bits of quant/dot.cpp's dot_unpacked, as the reference kernel of matmul.cu
// does: per super-block b of 256 elements the integer sums
//   isum_b = sum_i a_i q_i,   msum_b = sum_i m_i q_i      (a = scale * quant, m = min)
// are exact whatever order the products are added in, and the f32 part
//   v_b = (d_w * d_x) * isum_b - (dmin_w * d_x) * msum_b,   sum = ((v_0 + v_1) + v_2) + ...
// is evaluated operation for operation, in block order, for every output. An output thus
// depends on its weight row and activation row only: the row count, the kernel chosen for
// it and the other rows never change its bits (batch invariance).
//
// The integer sums are split by sub-block (32 elements for Q4_K/Q5_K, 16 for the others,
// whose scale and min are constant over it): isum_b = sum_j sc_j * dot_j, msum_b =
// sum_j mn_j * sum_j(q). The quants of a sub-block are small signed bytes, so dot_j is a
// run of dp4a (matrix-vector) or one int8 MMA (m16n8k32 or m16n8k16) per tile.
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdlib>

#include "backends/cuda/common.cuh"
#include "backends/cuda/matmul_kquant.cuh"

namespace geist::cuda {
namespace {

using quant::GgmlType;
constexpr unsigned kFull = 0xFFFFFFFFu;

// ---- per-type layout ------------------------------------------------------------------------
// A super-block is cut into 8 pieces of 32 elements, each a few runs ("segments") of
// consecutive elements that one lane unpacks from a few contiguous bytes.

template <GgmlType T>
struct KQ;
template <>
struct KQ<GgmlType::Q2_K> {
  static constexpr int kBytes = 84, kSub = 16, kDOff = 80, kDminOff = 82, kSegs = 4;
};
template <>
struct KQ<GgmlType::Q3_K> {
  static constexpr int kBytes = 110, kSub = 16, kDOff = 108, kDminOff = -1, kSegs = 4;
};
template <>
struct KQ<GgmlType::Q4_K> {
  static constexpr int kBytes = 144, kSub = 32, kDOff = 0, kDminOff = 2, kSegs = 2;
};
template <>
struct KQ<GgmlType::Q5_K> {
  static constexpr int kBytes = 176, kSub = 32, kDOff = 0, kDminOff = 2, kSegs = 2;
};
template <>
struct KQ<GgmlType::Q6_K> {
  static constexpr int kBytes = 210, kSub = 16, kDOff = 208, kDminOff = -1, kSegs = 4;
};

// 8 bytes from a 2-byte aligned address (blocks of 84, 110 and 210 bytes are only that).
__device__ __forceinline__ uint2 ld8_a2(const uint8_t *p) {
  const auto *h = reinterpret_cast<const uint16_t *>(p);
  return make_uint2(uint32_t(h[0]) | (uint32_t(h[1]) << 16), uint32_t(h[2]) | (uint32_t(h[3]) << 16));
}

// First element (within the super-block) of segment i of piece t; every segment has
// 32 / kSegs elements and lies inside one sub-block.
template <GgmlType T>
__device__ __forceinline__ int seg_start(int t, int i) {
  if constexpr (KQ<T>::kSegs == 2) {
    return 32 * (2 * (t / 2) + i) + 16 * (t % 2);
  } else {
    return 128 * (t / 4) + 32 * i + 8 * (t % 4);
  }
}

// The 32 quants of piece t as signed bytes, segment after segment (q[0..7]).
template <GgmlType T>
__device__ __forceinline__ void unpack_piece(const uint8_t *b, int t, uint32_t q[8]) {
  if constexpr (T == GgmlType::Q4_K || T == GgmlType::Q5_K) {
    const uint4 v = *reinterpret_cast<const uint4 *>(b + (T == GgmlType::Q4_K ? 16 : 48) + 16 * t);
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      q[i] = w[i] & 0x0F0F0F0Fu;
      q[4 + i] = (w[i] >> 4) & 0x0F0F0F0Fu;
    }
    if constexpr (T == GgmlType::Q5_K) {
      const uint4 hv = *reinterpret_cast<const uint4 *>(b + 16 + 16 * (t % 2));
      const uint32_t h[4] = {hv.x, hv.y, hv.z, hv.w};
      const int s0 = 2 * (t / 2);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        q[i] |= ((h[i] >> s0) & 0x01010101u) << 4;
        q[4 + i] |= ((h[i] >> (s0 + 1)) & 0x01010101u) << 4;
      }
    }
  } else if constexpr (T == GgmlType::Q6_K) {
    const int h = t / 4, lq = 8 * (t % 4);
    const uint2 a = ld8_a2(b + 64 * h + lq), c = ld8_a2(b + 64 * h + 32 + lq), hq = ld8_a2(b + 128 + 32 * h + lq);
    const uint32_t lo[8] = {a.x & 0x0F0F0F0Fu,        a.y & 0x0F0F0F0Fu,        c.x & 0x0F0F0F0Fu,
                            c.y & 0x0F0F0F0Fu,        (a.x >> 4) & 0x0F0F0F0Fu, (a.y >> 4) & 0x0F0F0F0Fu,
                            (c.x >> 4) & 0x0F0F0F0Fu, (c.y >> 4) & 0x0F0F0F0Fu};
#pragma unroll
    for (int s = 0; s < 4; ++s) {
      q[2 * s] = __vsub4(lo[2 * s] | (((hq.x >> (2 * s)) & 0x03030303u) << 4), 0x20202020u);
      q[2 * s + 1] = __vsub4(lo[2 * s + 1] | (((hq.y >> (2 * s)) & 0x03030303u) << 4), 0x20202020u);
    }
  } else if constexpr (T == GgmlType::Q3_K) {
    const int h = t / 4, lq = 8 * (t % 4);
    const uint2 qs = ld8_a2(b + 32 + 32 * h + lq), hm = ld8_a2(b + lq);
#pragma unroll
    for (int s = 0; s < 4; ++s) {
      const int hs = 4 * h + s;  // hmask bit of element group i / 32
      q[2 * s] = __vsub4(((qs.x >> (2 * s)) & 0x03030303u) | (((hm.x >> hs) & 0x01010101u) << 2), 0x04040404u);
      q[2 * s + 1] = __vsub4(((qs.y >> (2 * s)) & 0x03030303u) | (((hm.y >> hs) & 0x01010101u) << 2), 0x04040404u);
    }
  } else if constexpr (T == GgmlType::Q2_K) {
    const int h = t / 4, lq = 8 * (t % 4);
    const uint2 qs = ld8_a2(b + 16 + 32 * h + lq);
#pragma unroll
    for (int s = 0; s < 4; ++s) {
      q[2 * s] = (qs.x >> (2 * s)) & 0x03030303u;
      q[2 * s + 1] = (qs.y >> (2 * s)) & 0x03030303u;
    }
  }
}

// Integer scale and min of sub-block j (kSub elements), as quant::unpack_row applies them.
template <GgmlType T>
__device__ __forceinline__ void sub_scale(const uint8_t *b, int j, int *sc, int *mn) {
  if constexpr (T == GgmlType::Q4_K || T == GgmlType::Q5_K) {
    dev::scale_min_k4(b + 4, j, sc, mn);
  } else if constexpr (T == GgmlType::Q6_K) {
    *sc = int(int8_t(b[192 + j]));
    *mn = 0;
  } else if constexpr (T == GgmlType::Q3_K) {
    const uint8_t *sp = b + 96;
    *sc = (((sp[j % 8] >> (4 * (j / 8))) & 0x0F) | (((sp[8 + j % 4] >> (2 * (j / 4))) & 0x03) << 4)) - 32;
    *mn = 0;
  } else if constexpr (T == GgmlType::Q2_K) {
    *sc = b[j] & 0x0F;
    *mn = b[j] >> 4;
  }
}

// dot_unpacked's f32 step for one block.
template <GgmlType T>
__device__ __forceinline__ float block_term(float dw, float dmin, float dx, int isum, int msum) {
  float v = __fmul_rn(__fmul_rn(dw, dx), float(isum));
  if constexpr (KQ<T>::kDminOff >= 0) v = __fsub_rn(v, __fmul_rn(__fmul_rn(dmin, dx), float(msum)));
  return v;
}

// ---- matrix-vector: 1..R activation rows ------------------------------------------------------
// One warp per output; 8 lanes per super-block (one piece each), 4 super-blocks per step.
// The 4 terms of a step are added in block order by every lane (broadcast shuffles).

constexpr int kMvWarps = 8;

// Up to 4 matrices of one type and one K that share the activations (q/k, gate/up): one
// launch, each warp finding its matrix from the running output counts.
constexpr int kMaxSet = 4;
struct MvSet {
  const uint8_t *w[kMaxSet];
  size_t row_bytes[kMaxSet];
  float *y[kMaxSet];
  int64_t n_out[kMaxSet];
  int64_t first[kMaxSet + 1];  // warps before matrix m (warp = output); first[n] = the total
  int n;
  int prefetch;  // cuda::prefetch_mode()
};

// P warps per output (P > 1, for matrices with few outputs, where one warp per output
// leaves the SMs short of loads in flight): warp p of an output takes the steps s = p
// (mod P) and leaves each block's f32 term in shared memory; then one thread per (output,
// row) adds the terms in block order. The same terms added in the same order as P = 1.
constexpr int kMvSplitMaxBlocks = 128;  // super-blocks per row (K <= 32768) for P > 1

// The kernel's body for block bx (matvec_kernel: blockIdx.x; matvec2_kernel: its blocks of
// one of two sets).
template <GgmlType T, int R, int P>
__device__ __forceinline__ void matvec_body(const MvSet &set, int64_t K, const int8_t *__restrict__ xq,
                                            const float *__restrict__ xd, int n_rows, int64_t bx) {
  using L = KQ<T>;
  static_assert(P == 1 || R <= 2, "the split kernel keeps 2 rows of terms");
  constexpr int kSegBytes = 32 / L::kSegs, kOuts = kMvWarps / P;
  __shared__ float terms[P > 1 ? kOuts * R * kMvSplitMaxBlocks : 1];
  const int lane = threadIdx.x % 32, g = lane / 8, t = lane % 8;
  const int warp = threadIdx.x / 32, part = warp % P;
  const int64_t gw = bx * kOuts + warp / P;  // the output, over the set
  const bool active = gw < set.first[set.n];
  int m = 0;
  while (m + 1 < set.n && gw >= set.first[m + 1]) ++m;
  const int64_t n = gw - set.first[m], n_out = set.n_out[m];
  float *__restrict__ y = set.y[m];
  const uint8_t *wrow = set.w[m] + size_t(active ? n : 0) * set.row_bytes[m];
  const int64_t nb = K / 256;
  if (active) dev::prefetch_lines(wrow, set.row_bytes[m], 32 * part + lane, 32 * P, set.prefetch);
  dev::pdl_start();
  if (P == 1 && !active) return;  // whole warps (P > 1: every warp reaches the barrier)
  float sum[R];
#pragma unroll
  for (int r = 0; r < R; ++r) sum[r] = 0.0f;
  for (int64_t b0 = 4 * part; active && b0 < nb; b0 += 4 * P) {
    const int64_t b = b0 + g;
    const bool live = b < nb;
    int isum[R], msum[R];
#pragma unroll
    for (int r = 0; r < R; ++r) isum[r] = msum[r] = 0;
    float dw = 0.0f, dmin = 0.0f;
    if (live) {
      const uint8_t *blk = wrow + b * L::kBytes;
      uint32_t q[8];
      unpack_piece<T>(blk, t, q);
      dw = dev::fp16_to_fp32(*reinterpret_cast<const uint16_t *>(blk + L::kDOff));
      if constexpr (L::kDminOff >= 0) dmin = dev::fp16_to_fp32(*reinterpret_cast<const uint16_t *>(blk + L::kDminOff));
#pragma unroll
      for (int i = 0; i < L::kSegs; ++i) {
        const int e0 = seg_start<T>(t, i);
        int sc, mn;
        sub_scale<T>(blk, e0 / L::kSub, &sc, &mn);
#pragma unroll
        for (int r = 0; r < R; ++r) {
          if (r >= n_rows) break;
          const int8_t *xs = xq + size_t(r) * K + b * 256 + e0;
          int d = 0, sx = 0;
          if constexpr (kSegBytes == 16) {
            const int4 xv = *reinterpret_cast<const int4 *>(xs);
            d = __dp4a(int(q[4 * i]), xv.x, d);
            d = __dp4a(int(q[4 * i + 1]), xv.y, d);
            d = __dp4a(int(q[4 * i + 2]), xv.z, d);
            d = __dp4a(int(q[4 * i + 3]), xv.w, d);
            if constexpr (L::kDminOff >= 0) {
              sx = __dp4a(0x01010101, xv.x, __dp4a(0x01010101, xv.y, __dp4a(0x01010101, xv.z, __dp4a(0x01010101, xv.w, 0))));
            }
          } else {
            const int2 xv = *reinterpret_cast<const int2 *>(xs);
            d = __dp4a(int(q[2 * i]), xv.x, d);
            d = __dp4a(int(q[2 * i + 1]), xv.y, d);
            if constexpr (L::kDminOff >= 0) sx = __dp4a(0x01010101, xv.x, __dp4a(0x01010101, xv.y, 0));
          }
          isum[r] += sc * d;
          if constexpr (L::kDminOff >= 0) msum[r] += mn * sx;
        }
      }
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {
#pragma unroll
      for (int o = 4; o >= 1; o /= 2) {
        isum[r] += __shfl_xor_sync(kFull, isum[r], o);
        if constexpr (L::kDminOff >= 0) msum[r] += __shfl_xor_sync(kFull, msum[r], o);
      }
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {
      float v = 0.0f;
      if (live && r < n_rows) v = block_term<T>(dw, dmin, xd[size_t(r) * nb + b], isum[r], msum[r]);
      if constexpr (P == 1) {
#pragma unroll
        for (int gg = 0; gg < 4; ++gg) {
          const float vg = __shfl_sync(kFull, v, 8 * gg);
          if (b0 + gg < nb) sum[r] = __fadd_rn(sum[r], vg);
        }
      } else {
        if (t == 0 && live) terms[((warp / P) * R + r) * kMvSplitMaxBlocks + b] = v;
      }
    }
  }
  if constexpr (P == 1) {
    if (lane == 0) {
#pragma unroll
      for (int r = 0; r < R; ++r) {
        if (r < n_rows) y[size_t(r) * n_out + n] = sum[r];
      }
    }
  } else {
    __syncthreads();
    // Thread (o, r) of the block: output o's row r, its terms in block order.
    const int o = threadIdx.x / R, r = threadIdx.x % R;
    const int64_t go = bx * kOuts + o;
    if (o < kOuts && r < n_rows && go < set.first[set.n]) {
      int mo = 0;
      while (mo + 1 < set.n && go >= set.first[mo + 1]) ++mo;
      float acc = 0.0f;
      for (int64_t b = 0; b < nb; ++b) acc = __fadd_rn(acc, terms[(o * R + r) * kMvSplitMaxBlocks + b]);
      set.y[mo][size_t(r) * set.n_out[mo] + (go - set.first[mo])] = acc;
    }
  }
}

template <GgmlType T, int R, int P>
__global__ void __launch_bounds__(kMvWarps * 32)
    matvec_kernel(MvSet set, int64_t K, const int8_t *__restrict__ xq, const float *__restrict__ xd, int n_rows) {
  matvec_body<T, R, P>(set, K, xq, xd, n_rows, int64_t(blockIdx.x));
}

// One row of two sets of different types in one launch (Q4_K_M's q and k, Q4_K, beside its
// v, Q6_K): blocks [0, blocks1) run s1 as matvec_kernel<T1, 1, P> would, the others s2 with
// T2. Each output gets the bits of its own type's kernel; one launch instead of two, whose
// second would wait for the first although it does not depend on it.
template <GgmlType T1, GgmlType T2, int P>
__global__ void __launch_bounds__(kMvWarps * 32)
    matvec2_kernel(MvSet s1, MvSet s2, int64_t blocks1, int64_t K, const int8_t *__restrict__ xq,
                   const float *__restrict__ xd) {
  if (int64_t(blockIdx.x) < blocks1) {
    matvec_body<T1, 1, P>(s1, K, xq, xd, 1, int64_t(blockIdx.x));
  } else {
    matvec_body<T2, 1, P>(s2, K, xq, xd, 1, int64_t(blockIdx.x) - blocks1);
  }
}

// ---- matrix-matrix on int8 tensor cores ---------------------------------------------------------
// A thread block computes a 64 (activation rows) x 64 (outputs) tile, super-block by
// super-block: the activations' quants and the weights' unpacked quants go to shared
// memory, each of the 4 warps multiplies a 32 x 32 quarter with int8 MMAs per sub-block
// and folds sc_j * dot_j into its integer sums, then applies the f32 step of the block.
// Rows or outputs past the ends are zeros and are not stored.

constexpr int kTile = 64;
constexpr int kStride = 256 + 16;  // bytes per row of a quant tile: conflict-free fragment loads

__device__ __forceinline__ void mma_k32(const uint32_t a[4], const uint32_t b[2], int c[4]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%10,%11,%12,%13};\n"
      : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "r"(0), "r"(0), "r"(0), "r"(0));
#else
  __trap();
#endif
}

__device__ __forceinline__ void mma_k16(const uint32_t a[2], uint32_t b, int c[4]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%7,%8,%9,%10};\n"
      : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(b), "r"(0), "r"(0), "r"(0), "r"(0));
#else
  __trap();
#endif
}

template <GgmlType T>
__global__ void __launch_bounds__(128)
    matmul_mma_kernel(const uint8_t *__restrict__ w, size_t row_bytes, int64_t K, int64_t n_out,
                      const int8_t *__restrict__ xq, const float *__restrict__ xd, float *__restrict__ y, int n_rows,
                      int pf) {
  {
    const int64_t n0 = int64_t(blockIdx.x) * kTile, rows = n_out - n0 < kTile ? n_out - n0 : kTile;
    dev::prefetch_lines(w + size_t(n0) * row_bytes, size_t(rows) * row_bytes, threadIdx.x, 128, pf);
  }
  dev::pdl_start();
  using L = KQ<T>;
  constexpr int kNSub = 256 / L::kSub;
  constexpr bool kMin = L::kDminOff >= 0;
  __shared__ __align__(16) int8_t xs[kTile * kStride];
  __shared__ __align__(16) int8_t ws[kTile * kStride];
  // The scales and mins per (sub-block j, output) and the activation sums per (j, row), j
  // major: a warp's reads of its outputs' two scales are one conflict-free 8-byte load
  // (output-major, the four lanes' tq hit one bank; E4B pp512 6034 -> 6450 t/s on the
  // H200). xbs's row stride spreads its writes (row slow, j fast) over the banks.
  constexpr int kXbStride = kTile + 32 / kNSub;
  __shared__ __align__(8) int wsc[kNSub * kTile];
  __shared__ __align__(8) int wmn[kMin ? kNSub * kTile : 1];
  __shared__ int xbs[kMin ? kNSub * kXbStride : 1];
  auto si = [](int c, int j) { return j * kTile + c; };
  auto xi = [](int r, int j) { return j * kXbStride + r; };
  __shared__ float wd[kTile], wdm[kTile], xdd[kTile];

  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int wm = warp / 2, wn = warp % 2;  // the warp's quarter: rows wm * 32, outputs wn * 32
  const int g = lane / 4, tq = lane % 4;
  const int r0 = blockIdx.y * kTile;
  const int64_t n0 = int64_t(blockIdx.x) * kTile;
  const int64_t nb = K / 256;

  float acc[2][4][4];
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;

  for (int64_t b = 0; b < nb; ++b) {
    // Activations: 64 rows x 256 quants, 16 bytes per thread per step.
    for (int u = tid; u < kTile * 16; u += 128) {
      const int r = u / 16, c = u % 16;
      int4 v = make_int4(0, 0, 0, 0);
      if (r0 + r < n_rows) v = *reinterpret_cast<const int4 *>(xq + size_t(r0 + r) * K + b * 256 + 16 * c);
      *reinterpret_cast<int4 *>(xs + r * kStride + 16 * c) = v;
    }
    if (tid < kTile) xdd[tid] = r0 + tid < n_rows ? xd[size_t(r0 + tid) * nb + b] : 0.0f;
    // Weights: 64 outputs x 8 pieces.
    for (int u = tid; u < kTile * 8; u += 128) {
      const int nn = u / 8, t = u % 8;
      uint32_t q[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      if (n0 + nn < n_out) unpack_piece<T>(w + size_t(n0 + nn) * row_bytes + b * L::kBytes, t, q);
#pragma unroll
      for (int i = 0; i < L::kSegs; ++i) {
        uint32_t *dst = reinterpret_cast<uint32_t *>(ws + nn * kStride + seg_start<T>(t, i));
#pragma unroll
        for (int k = 0; k < 8 / L::kSegs; ++k) dst[k] = q[i * (8 / L::kSegs) + k];
      }
    }
    if (tid < kTile) {
      const int nn = tid;
      float d = 0.0f, dm = 0.0f;
      if (n0 + nn < n_out) {
        const uint8_t *blk = w + size_t(n0 + nn) * row_bytes + b * L::kBytes;
        d = dev::fp16_to_fp32(*reinterpret_cast<const uint16_t *>(blk + L::kDOff));
        if constexpr (kMin) dm = dev::fp16_to_fp32(*reinterpret_cast<const uint16_t *>(blk + L::kDminOff));
#pragma unroll
        for (int j = 0; j < kNSub; ++j) {
          int sc, mn;
          sub_scale<T>(blk, j, &sc, &mn);
          wsc[si(nn, j)] = sc;
          if constexpr (kMin) wmn[si(nn, j)] = mn;
        }
      } else {
#pragma unroll
        for (int j = 0; j < kNSub; ++j) {
          wsc[si(nn, j)] = 0;
          if constexpr (kMin) wmn[si(nn, j)] = 0;
        }
      }
      wd[nn] = d;
      wdm[nn] = dm;
    }
    __syncthreads();
    if constexpr (kMin) {
      // Sums of the activation quants per sub-block (for the mins).
      for (int u = tid; u < kTile * kNSub; u += 128) {
        const int r = u / kNSub, j = u % kNSub;
        const int *p = reinterpret_cast<const int *>(xs + r * kStride + j * L::kSub);
        int s = 0;
#pragma unroll
        for (int k = 0; k < L::kSub / 4; ++k) s = __dp4a(0x01010101, p[k], s);
        xbs[xi(r, j)] = s;
      }
    }

    int isum[2][4][4];
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) isum[i][j][e] = 0;
#pragma unroll 2
    for (int j = 0; j < kNSub; ++j) {
      const int k0 = j * L::kSub;
      uint32_t a[2][4];
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) {
        const int8_t *ar = xs + (wm * 32 + mt * 16 + g) * kStride + k0 + 4 * tq;
        a[mt][0] = *reinterpret_cast<const uint32_t *>(ar);
        a[mt][1] = *reinterpret_cast<const uint32_t *>(ar + 8 * kStride);
        if constexpr (L::kSub == 32) {
          a[mt][2] = *reinterpret_cast<const uint32_t *>(ar + 16);
          a[mt][3] = *reinterpret_cast<const uint32_t *>(ar + 8 * kStride + 16);
        }
      }
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) {
        const int col = wn * 32 + nt * 8 + g;
        const int8_t *br = ws + col * kStride + k0 + 4 * tq;
        uint32_t bf[2];
        bf[0] = *reinterpret_cast<const uint32_t *>(br);
        if constexpr (L::kSub == 32) bf[1] = *reinterpret_cast<const uint32_t *>(br + 16);
        // The scales of the two outputs this thread holds in the tile (columns 2 tq, 2 tq + 1).
        const int c0 = wn * 32 + nt * 8 + 2 * tq;
        const int2 sv = *reinterpret_cast<const int2 *>(&wsc[si(c0, j)]);  // c0 even
        const int s0 = sv.x, s1 = sv.y;
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) {
          int c[4];
          if constexpr (L::kSub == 32) {
            mma_k32(a[mt], bf, c);
          } else {
            mma_k16(a[mt], bf[0], c);
          }
          isum[mt][nt][0] += s0 * c[0];
          isum[mt][nt][1] += s1 * c[1];
          isum[mt][nt][2] += s0 * c[2];
          isum[mt][nt][3] += s1 * c[3];
        }
      }
    }
    if constexpr (kMin) __syncthreads();  // xbs is complete
    // The block's f32 step for each held output (msum from the sub-block sums and mins).
#pragma unroll
    for (int mt = 0; mt < 2; ++mt) {
      int xb[2][kMin ? kNSub : 1];
      const int ra = wm * 32 + mt * 16 + g;
      if constexpr (kMin) {
#pragma unroll
        for (int j = 0; j < kNSub; ++j) {
          xb[0][j] = xbs[xi(ra, j)];
          xb[1][j] = xbs[xi(ra + 8, j)];
        }
      }
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) {
        const int ca = wn * 32 + nt * 8 + 2 * tq;
        int ms[4] = {0, 0, 0, 0};
        if constexpr (kMin) {
#pragma unroll
          for (int j = 0; j < kNSub; ++j) {
            const int2 mv = *reinterpret_cast<const int2 *>(&wmn[si(ca, j)]);  // ca even
            const int m0 = mv.x, m1 = mv.y;
            ms[0] += m0 * xb[0][j];
            ms[1] += m1 * xb[0][j];
            ms[2] += m0 * xb[1][j];
            ms[3] += m1 * xb[1][j];
          }
        }
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int r = ra + (e >= 2 ? 8 : 0), c = ca + (e & 1);
          acc[mt][nt][e] = __fadd_rn(acc[mt][nt][e], block_term<T>(wd[c], wdm[c], xdd[r], isum[mt][nt][e], ms[e]));
        }
      }
    }
    __syncthreads();
  }
#pragma unroll
  for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
    for (int nt = 0; nt < 4; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = r0 + wm * 32 + mt * 16 + g + (e >= 2 ? 8 : 0);
        const int64_t c = n0 + wn * 32 + nt * 8 + 2 * tq + (e & 1);
        if (r < n_rows && c < n_out) y[size_t(r) * n_out + c] = acc[mt][nt][e];
      }
    }
  }
}

// ---- 32-element block types (Q4_0, Q5_0, Q8_0) on int8 tensor cores ----------------------------
// matmul_mma_kernel's tile and fragments, 8 blocks of 32 elements staged at a time; every
// block is its own f32 step: v = (d_w * d_x) * isum, sum += v, in block order, as
// dot_q8_0_blocks (and matmul_q8_kernel) do. A block past K is skipped, not added.

// Elements e0..e0+7 (e0 a multiple of 8) of a 32-element block as signed bytes.
template <GgmlType T>
__device__ __forceinline__ void unpack8_q32(const uint8_t *b, int e0, uint32_t q[2]) {
  if constexpr (T == GgmlType::Q8_0) {
    const uint2 v = ld8_a2(b + 2 + e0);
    q[0] = v.x;
    q[1] = v.y;
  } else if constexpr (T == GgmlType::Q4_0) {
    const uint2 v = ld8_a2(b + 2 + (e0 % 16));
    const int sh = e0 < 16 ? 0 : 4;
    q[0] = __vsub4((v.x >> sh) & 0x0F0F0F0Fu, 0x08080808u);
    q[1] = __vsub4((v.y >> sh) & 0x0F0F0F0Fu, 0x08080808u);
  } else {
    static_assert(T == GgmlType::Q5_0, "Q4_0, Q5_0 or Q8_0");
    const uint32_t qh = (uint32_t(*reinterpret_cast<const uint16_t *>(b + 2)) |
                         (uint32_t(*reinterpret_cast<const uint16_t *>(b + 4)) << 16)) >> e0;
    const uint2 v = ld8_a2(b + 6 + (e0 % 16));
    const int sh = e0 < 16 ? 0 : 4;
    uint32_t h0 = 0, h1 = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      h0 |= ((qh >> i) & 1u) << (8 * i + 4);
      h1 |= ((qh >> (4 + i)) & 1u) << (8 * i + 4);
    }
    q[0] = __vsub4(((v.x >> sh) & 0x0F0F0F0Fu) | h0, 0x10101010u);
    q[1] = __vsub4(((v.y >> sh) & 0x0F0F0F0Fu) | h1, 0x10101010u);
  }
}

template <GgmlType T>
__global__ void __launch_bounds__(128)
    matmul_q32_mma_kernel(const uint8_t *__restrict__ w, size_t row_bytes, int64_t K, int64_t n_out,
                          const int8_t *__restrict__ xq, const float *__restrict__ xd, float *__restrict__ y,
                          int n_rows, int pf) {
  using BI = dev::BlockInfo<T>;
  {
    const int64_t n0 = int64_t(blockIdx.x) * kTile, rows = n_out - n0 < kTile ? n_out - n0 : kTile;
    dev::prefetch_lines(w + size_t(n0) * row_bytes, size_t(rows) * row_bytes, threadIdx.x, 128, pf);
  }
  __shared__ __align__(16) int8_t xs[kTile * kStride];
  __shared__ __align__(16) int8_t ws[kTile * kStride];
  __shared__ float wd[kTile][9], xdd[kTile][9];  // 9: the two halves of a warp hit other banks

  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int wm = warp / 2, wn = warp % 2;
  const int g = lane / 4, tq = lane % 4;
  const int r0 = blockIdx.y * kTile;
  const int64_t n0 = int64_t(blockIdx.x) * kTile;
  const int64_t nb = K / 32;
  dev::pdl_start();

  float acc[2][4][4];
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;

  for (int64_t s0 = 0; s0 < nb; s0 += 8) {
    const int nblk = nb - s0 < 8 ? int(nb - s0) : 8;
    for (int u = tid; u < kTile * 16; u += 128) {
      const int r = u / 16, c = u % 16;
      int4 v = make_int4(0, 0, 0, 0);
      if (r0 + r < n_rows && c < 2 * nblk) v = *reinterpret_cast<const int4 *>(xq + size_t(r0 + r) * K + s0 * 32 + 16 * c);
      *reinterpret_cast<int4 *>(xs + r * kStride + 16 * c) = v;
    }
    for (int u = tid; u < kTile * 8; u += 128) {
      const int r = u / 8, j = u % 8;
      xdd[r][j] = (r0 + r < n_rows && j < nblk) ? xd[size_t(r0 + r) * nb + s0 + j] : 0.0f;
      const int64_t n = n0 + r;
      wd[r][j] = (n < n_out && j < nblk)
                     ? dev::fp16_to_fp32(*reinterpret_cast<const uint16_t *>(w + size_t(n) * row_bytes + (s0 + j) * BI::kBytes))
                     : 0.0f;
    }
    // Weights: 64 outputs x 8 blocks x 4 pieces of 8 elements.
#pragma unroll 4
    for (int u = tid; u < kTile * 32; u += 128) {
      const int nn = u / 32, j = (u / 4) % 8, p = u % 4;
      uint32_t q[2] = {0, 0};
      if (n0 + nn < n_out && j < nblk) unpack8_q32<T>(w + size_t(n0 + nn) * row_bytes + (s0 + j) * BI::kBytes, 8 * p, q);
      *reinterpret_cast<uint2 *>(ws + nn * kStride + 32 * j + 8 * p) = make_uint2(q[0], q[1]);
    }
    __syncthreads();
    for (int j = 0; j < nblk; ++j) {
      const int k0 = 32 * j;
      uint32_t a[2][4];
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) {
        const int8_t *ar = xs + (wm * 32 + mt * 16 + g) * kStride + k0 + 4 * tq;
        a[mt][0] = *reinterpret_cast<const uint32_t *>(ar);
        a[mt][1] = *reinterpret_cast<const uint32_t *>(ar + 8 * kStride);
        a[mt][2] = *reinterpret_cast<const uint32_t *>(ar + 16);
        a[mt][3] = *reinterpret_cast<const uint32_t *>(ar + 8 * kStride + 16);
      }
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) {
        const int8_t *br = ws + (wn * 32 + nt * 8 + g) * kStride + k0 + 4 * tq;
        const uint32_t bf[2] = {*reinterpret_cast<const uint32_t *>(br), *reinterpret_cast<const uint32_t *>(br + 16)};
        const int ca = wn * 32 + nt * 8 + 2 * tq;
        const float d0 = wd[ca][j], d1 = wd[ca + 1][j];
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) {
          int c[4];
          mma_k32(a[mt], bf, c);
          const int ra = wm * 32 + mt * 16 + g;
          const float x0 = xdd[ra][j], x1 = xdd[ra + 8][j];
          acc[mt][nt][0] = __fadd_rn(acc[mt][nt][0], __fmul_rn(__fmul_rn(d0, x0), float(c[0])));
          acc[mt][nt][1] = __fadd_rn(acc[mt][nt][1], __fmul_rn(__fmul_rn(d1, x0), float(c[1])));
          acc[mt][nt][2] = __fadd_rn(acc[mt][nt][2], __fmul_rn(__fmul_rn(d0, x1), float(c[2])));
          acc[mt][nt][3] = __fadd_rn(acc[mt][nt][3], __fmul_rn(__fmul_rn(d1, x1), float(c[3])));
        }
      }
    }
    __syncthreads();
  }
#pragma unroll
  for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
    for (int nt = 0; nt < 4; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = r0 + wm * 32 + mt * 16 + g + (e >= 2 ? 8 : 0);
        const int64_t c = n0 + wn * 32 + nt * 8 + 2 * tq + (e & 1);
        if (r < n_rows && c < n_out) y[size_t(r) * n_out + c] = acc[mt][nt][e];
      }
    }
  }
}

// ---- few rows on int8 tensor cores ("skinny": up to 32 rows per launch) ---------------------
// The weights are the MMA's A operand (16 outputs per warp) and the activations its B operand
// (8 rows per tile), so a chunk of 9..32 rows costs a few MMAs more than one row instead of
// a whole 64-row tile. Each lane loads its fragments straight from global memory: within a
// sub-block, MMA k index 4 tq + i (and 16 + 4 tq + i) holds element 8 tq + i (8 tq + 4 + i)
// for 32-element sub-blocks and 4 tq + i for 16-element ones, on both operands alike, so the
// integer dot of the sub-block is unchanged. The warps of a block share 16 outputs and split
// the super-blocks; after each round the block adds the round's f32 block terms to its sums
// in block order, as dot_unpacked does.

constexpr int kSkWarps = 8;

// The lane's quants of output row `blk` for every sub-block: 32-element sub-blocks j in
// q[2 j], q[2 j + 1]; 16-element ones in q[j]. Two steps: frag_raw loads the lane's bytes
// (KQ<T>::kRaw words), frag_unpack turns them into the signed bytes, so a kernel can hold
// the raw words of its next block while it computes the current one.
template <GgmlType T>
constexpr int kRaw = T == GgmlType::Q4_K ? 8 : T == GgmlType::Q5_K ? 10 : T == GgmlType::Q6_K ? 12
                   : T == GgmlType::Q3_K ? 6 : 4;

// A4: b is 4-byte aligned (Q6_K's 210-byte and Q3_K's 110-byte blocks are every other one),
// so the 4-byte pieces are single loads.
template <GgmlType T, bool A4 = false>
__device__ __forceinline__ void frag_raw(const uint8_t *b, int tq, uint32_t r[kRaw<T>]) {
  auto ld4 = [](const uint8_t *p) {  // 4 bytes from a 2-byte aligned address
    if constexpr (A4) {
      return *reinterpret_cast<const uint32_t *>(p);
    } else {
      const auto *h = reinterpret_cast<const uint16_t *>(p);
      return uint32_t(h[0]) | (uint32_t(h[1]) << 16);
    }
  };
  if constexpr (T == GgmlType::Q4_K || T == GgmlType::Q5_K) {
    const uint8_t *qs = b + (T == GgmlType::Q4_K ? 16 : 48);
#pragma unroll
    for (int p = 0; p < 4; ++p) {
      const uint2 v = *reinterpret_cast<const uint2 *>(qs + 32 * p + 8 * tq);
      r[2 * p] = v.x;
      r[2 * p + 1] = v.y;
    }
    if constexpr (T == GgmlType::Q5_K) {
      const uint2 hv = *reinterpret_cast<const uint2 *>(b + 16 + 8 * tq);
      r[8] = hv.x;
      r[9] = hv.y;
    }
  } else if constexpr (T == GgmlType::Q6_K) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
      for (int u = 0; u < 4; ++u) r[4 * h + u] = ld4(b + 64 * h + 16 * u + 4 * tq);
#pragma unroll
      for (int u = 0; u < 2; ++u) r[8 + 2 * h + u] = ld4(b + 128 + 32 * h + 16 * u + 4 * tq);
    }
  } else if constexpr (T == GgmlType::Q3_K) {
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      r[u] = ld4(b + 16 * u + 4 * tq);
#pragma unroll
      for (int h = 0; h < 2; ++h) r[2 + 2 * h + u] = ld4(b + 32 + 32 * h + 16 * u + 4 * tq);
    }
  } else if constexpr (T == GgmlType::Q2_K) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
      for (int u = 0; u < 2; ++u) r[2 * h + u] = ld4(b + 16 + 32 * h + 16 * u + 4 * tq);
    }
  }
}

template <GgmlType T>
__device__ __forceinline__ void frag_unpack(const uint32_t r[kRaw<T>], uint32_t q[16]) {
  if constexpr (T == GgmlType::Q4_K || T == GgmlType::Q5_K) {
#pragma unroll
    for (int p = 0; p < 4; ++p) {
      const uint32_t x = r[2 * p], y = r[2 * p + 1];
      uint32_t lo0 = x & 0x0F0F0F0Fu, lo1 = y & 0x0F0F0F0Fu;
      uint32_t hi0 = (x >> 4) & 0x0F0F0F0Fu, hi1 = (y >> 4) & 0x0F0F0F0Fu;
      if constexpr (T == GgmlType::Q5_K) {
        lo0 |= ((r[8] >> (2 * p)) & 0x01010101u) << 4;
        lo1 |= ((r[9] >> (2 * p)) & 0x01010101u) << 4;
        hi0 |= ((r[8] >> (2 * p + 1)) & 0x01010101u) << 4;
        hi1 |= ((r[9] >> (2 * p + 1)) & 0x01010101u) << 4;
      }
      q[4 * p] = lo0;
      q[4 * p + 1] = lo1;
      q[4 * p + 2] = hi0;
      q[4 * p + 3] = hi1;
    }
  } else if constexpr (T == GgmlType::Q6_K) {
    // Element l of half h: ql[64 h + l % 64] nibble l / 64, qh[32 h + l % 32] bits 2 (l / 32).
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
      for (int u = 0; u < 4; ++u) {  // l0 % 64 = 16 u: sub-blocks 8 h + u (low nibble), 8 h + 4 + u (high)
        const uint32_t l = r[4 * h + u];
        const uint32_t hb = r[8 + 2 * h + u % 2];
        const int s_lo = 2 * (u / 2), s_hi = 2 * (2 + u / 2);
        q[8 * h + u] = __vsub4((l & 0x0F0F0F0Fu) | (((hb >> s_lo) & 0x03030303u) << 4), 0x20202020u);
        q[8 * h + 4 + u] = __vsub4(((l >> 4) & 0x0F0F0F0Fu) | (((hb >> s_hi) & 0x03030303u) << 4), 0x20202020u);
      }
    }
  } else if constexpr (T == GgmlType::Q3_K) {
    // Element l of half h: qs[32 + 32 h + l % 32] bits 2 (l / 32), hmask[l % 32] bit 4 h + l / 32.
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      const uint32_t hm = r[u];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint32_t v = r[2 + 2 * h + u];
#pragma unroll
        for (int s = 0; s < 4; ++s) {  // sub-block 8 h + 2 s + u
          q[8 * h + 2 * s + u] =
              __vsub4(((v >> (2 * s)) & 0x03030303u) | (((hm >> (4 * h + s)) & 0x01010101u) << 2), 0x04040404u);
        }
      }
    }
  } else if constexpr (T == GgmlType::Q2_K) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
      for (int u = 0; u < 2; ++u) {
        const uint32_t v = r[2 * h + u];
#pragma unroll
        for (int s = 0; s < 4; ++s) q[8 * h + 2 * s + u] = (v >> (2 * s)) & 0x03030303u;
      }
    }
  }
}

template <GgmlType T>
__device__ __forceinline__ void frag_quants(const uint8_t *b, int tq, uint32_t q[16]) {
  uint32_t r[kRaw<T>];
  frag_raw<T>(b, tq, r);
  frag_unpack<T>(r, q);
}

// The scale bytes of a super-block in registers (up to 16), and sub_scale from them.
template <GgmlType T, bool A4 = false>
__device__ __forceinline__ void load_scales(const uint8_t *b, uint32_t sw[4]) {
  auto ld4 = [](const uint8_t *p) {
    if constexpr (A4) {
      return *reinterpret_cast<const uint32_t *>(p);
    } else {
      const auto *h = reinterpret_cast<const uint16_t *>(p);
      return uint32_t(h[0]) | (uint32_t(h[1]) << 16);
    }
  };
  if constexpr (T == GgmlType::Q4_K || T == GgmlType::Q5_K) {
    const uint32_t *p = reinterpret_cast<const uint32_t *>(b + 4);  // 16-byte aligned blocks
    sw[0] = p[0];
    sw[1] = p[1];
    sw[2] = p[2];
    sw[3] = 0;
  } else {
    const uint8_t *p = b + (T == GgmlType::Q6_K ? 192 : T == GgmlType::Q3_K ? 96 : 0);
    sw[0] = ld4(p);
    sw[1] = ld4(p + 4);
    sw[2] = ld4(p + 8);
    sw[3] = T == GgmlType::Q3_K ? 0 : ld4(p + 12);
  }
}

template <GgmlType T>
__device__ __forceinline__ void reg_scale(const uint32_t sw[4], int j, int *sc, int *mn) {
  auto by = [&](int i) { return int((sw[i / 4] >> (8 * (i % 4))) & 0xFFu); };
  if constexpr (T == GgmlType::Q4_K || T == GgmlType::Q5_K) {
    if (j < 4) {
      *sc = by(j) & 0x3F;
      *mn = by(j + 4) & 0x3F;
    } else {
      *sc = (by(j + 4) & 0x0F) | ((by(j - 4) >> 6) << 4);
      *mn = (by(j + 4) >> 4) | ((by(j) >> 6) << 4);
    }
  } else if constexpr (T == GgmlType::Q6_K) {
    *sc = int(int8_t(by(j)));
    *mn = 0;
  } else if constexpr (T == GgmlType::Q3_K) {
    *sc = (((by(j % 8) >> (4 * (j / 8))) & 0x0F) | (((by(8 + j % 4) >> (2 * (j / 4))) & 0x03) << 4)) - 32;
    *mn = 0;
  } else if constexpr (T == GgmlType::Q2_K) {
    *sc = by(j) & 0x0F;
    *mn = by(j) >> 4;
  }
}

// Q4_K / Q5_K: the 6-bit scales and mins of the 8 sub-blocks (load_scales' words sw) as
// bytes of 4 words: ps[0] sc 0-3, ps[1] mn 0-3, ps[2] sc 4-7, ps[3] mn 4-7, unpacked as
// scale_min_k4 does, 4 at a time.
__device__ __forceinline__ void scales_mins_k4(const uint32_t sw[4], uint32_t ps[4]) {
  ps[0] = sw[0] & 0x3F3F3F3Fu;
  ps[1] = sw[1] & 0x3F3F3F3Fu;
  ps[2] = (sw[2] & 0x0F0F0F0Fu) | ((sw[0] >> 2) & 0x30303030u);
  ps[3] = ((sw[2] >> 4) & 0x0F0F0F0Fu) | ((sw[1] >> 2) & 0x30303030u);
}

// One sub-block of one 8-row B tile, for the kernels with the weights as the A operand:
// the MMA of the quants (a) against the activations (bf), its sums times the sub-block's
// scales sc0 (output g) and sc1 (output g + 8) into isum, and for the types with mins the
// MMA of mn_j in every byte (am) against the same bf into msum.
template <GgmlType T>
__device__ __forceinline__ void sub_block_mma(const uint32_t a[4], const uint32_t am[4], const uint32_t bf[2], int sc0,
                                              int sc1, int isum[4], int msum[4]) {
  int c[4];
  if constexpr (KQ<T>::kSub == 32) {
    mma_k32(a, bf, c);
  } else {
    mma_k16(a, bf[0], c);
  }
  isum[0] += sc0 * c[0];
  isum[1] += sc0 * c[1];
  isum[2] += sc1 * c[2];
  isum[3] += sc1 * c[3];
  if constexpr (KQ<T>::kDminOff >= 0) {
    if constexpr (KQ<T>::kSub == 32) {
      mma_k32(am, bf, c);
    } else {
      mma_k16(am, bf[0], c);
    }
#pragma unroll
    for (int e = 0; e < 4; ++e) msum[e] += c[e];
  }
}

// What a lane holds of one super-block of its two outputs (g and g + 8).
struct SkBlock {
  uint32_t qa[16], qb[16], sa[4], sb[4];
  float dw[2], dm[2];
};

template <GgmlType T>
__device__ __forceinline__ void sk_load(const uint8_t *blk0, const uint8_t *blk1, bool ok0, bool ok1, int tq,
                                        SkBlock &k) {
  using L = KQ<T>;
#pragma unroll
  for (int i = 0; i < 16; ++i) k.qa[i] = k.qb[i] = 0;
#pragma unroll
  for (int i = 0; i < 4; ++i) k.sa[i] = k.sb[i] = 0;
  k.dw[0] = k.dw[1] = k.dm[0] = k.dm[1] = 0.0f;
  if (ok0) {
    frag_quants<T>(blk0, tq, k.qa);
    load_scales<T>(blk0, k.sa);
    k.dw[0] = dev::fp16_to_fp32(*reinterpret_cast<const uint16_t *>(blk0 + L::kDOff));
    if constexpr (L::kDminOff >= 0) k.dm[0] = dev::fp16_to_fp32(*reinterpret_cast<const uint16_t *>(blk0 + L::kDminOff));
  }
  if (ok1) {
    frag_quants<T>(blk1, tq, k.qb);
    load_scales<T>(blk1, k.sb);
    k.dw[1] = dev::fp16_to_fp32(*reinterpret_cast<const uint16_t *>(blk1 + L::kDOff));
    if constexpr (L::kDminOff >= 0) k.dm[1] = dev::fp16_to_fp32(*reinterpret_cast<const uint16_t *>(blk1 + L::kDminOff));
  }
}

// The f32 block terms of super-block b for the lane's 4 NR (output, row) pairs, into v.
template <GgmlType T, int NR>
__device__ __forceinline__ void sk_terms(const SkBlock &k, int64_t b, int64_t K, const int8_t *__restrict__ xq,
                                         const float *__restrict__ xd, int n_rows, int g, int tq, float *v) {
  using L = KQ<T>;
  constexpr int kNSub = 256 / L::kSub;
  constexpr bool kMin = L::kDminOff >= 0;
  const int64_t nb = K / 256;
  int isum[NR][4], msum[NR][4];
#pragma unroll
  for (int t = 0; t < NR; ++t)
#pragma unroll
    for (int e = 0; e < 4; ++e) isum[t][e] = msum[t][e] = 0;
#pragma unroll
  for (int j = 0; j < kNSub; ++j) {
    int sc0, mn0, sc1, mn1;
    reg_scale<T>(k.sa, j, &sc0, &mn0);
    reg_scale<T>(k.sb, j, &sc1, &mn1);
    uint32_t a[4], am[4];
    if constexpr (L::kSub == 32) {
      a[0] = k.qa[2 * j];
      a[1] = k.qb[2 * j];
      a[2] = k.qa[2 * j + 1];
      a[3] = k.qb[2 * j + 1];
    } else {
      a[0] = k.qa[j];
      a[1] = k.qb[j];
    }
    if constexpr (kMin) {
      am[0] = am[2] = uint32_t(mn0) * 0x01010101u;
      am[1] = am[3] = uint32_t(mn1) * 0x01010101u;
    }
#pragma unroll
    for (int t = 0; t < NR; ++t) {
      const int r = 8 * t + g;
      uint32_t bf[2] = {0, 0};
      if (r < n_rows) {
        const int8_t *xs = xq + size_t(r) * K + b * 256 + j * L::kSub;
        if constexpr (L::kSub == 32) {
          const int2 xv = *reinterpret_cast<const int2 *>(xs + 8 * tq);
          bf[0] = uint32_t(xv.x);
          bf[1] = uint32_t(xv.y);
        } else {
          bf[0] = *reinterpret_cast<const uint32_t *>(xs + 4 * tq);
        }
      }
      sub_block_mma<T>(a, am, bf, sc0, sc1, isum[t], msum[t]);
    }
  }
#pragma unroll
  for (int t = 0; t < NR; ++t) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int r = 8 * t + 2 * tq + (e & 1);
      const float dx = r < n_rows ? xd[size_t(r) * nb + b] : 0.0f;
      v[4 * t + e] = block_term<T>(k.dw[e / 2], k.dm[e / 2], dx, isum[t][e], msum[t][e]);
    }
  }
}

// A block: 16 outputs, kSkWarps warps; a round covers kSkRound super-blocks, warp w taking
// r0 + w + kSkWarps i (i < kSkPer), all of whose loads are issued before any is used.
constexpr int kSkPer = 2, kSkRound = kSkWarps * kSkPer;

template <GgmlType T, int NR>
__global__ void __launch_bounds__(kSkWarps * 32)
    matmul_skinny_kernel(const uint8_t *__restrict__ w, size_t row_bytes, int64_t K, int64_t n_out,
                         const int8_t *__restrict__ xq, const float *__restrict__ xd, float *__restrict__ y,
                         int n_rows, int pf) {
  {
    const int64_t n0 = int64_t(blockIdx.x) * 16, rows = n_out - n0 < 16 ? n_out - n0 : 16;
    dev::prefetch_lines(w + size_t(n0) * row_bytes, size_t(rows) * row_bytes, threadIdx.x, kSkWarps * 32, pf);
  }
  dev::pdl_start();
  using L = KQ<T>;
  constexpr int kE = 4 * NR;  // f32 terms per lane: NR tiles x 4 accumulators
  __shared__ float vs[kSkRound][32 * kE];
  __shared__ float acc[32 * kE];

  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int g = lane / 4, tq = lane % 4;
  const int64_t n0 = int64_t(blockIdx.x) * 16;
  const int64_t nb = K / 256;
  const bool ok0 = n0 + g < n_out, ok1 = n0 + g + 8 < n_out;
  const uint8_t *w0 = w + size_t(ok0 ? n0 + g : 0) * row_bytes;
  const uint8_t *w1 = w + size_t(ok1 ? n0 + g + 8 : 0) * row_bytes;
  for (int f = threadIdx.x; f < 32 * kE; f += kSkWarps * 32) acc[f] = 0.0f;

  for (int64_t r0 = 0; r0 < nb; r0 += kSkRound) {
    SkBlock k[kSkPer];
#pragma unroll
    for (int i = 0; i < kSkPer; ++i) {
      const int64_t b = r0 + warp + kSkWarps * i;
      if (b < nb) sk_load<T>(w0 + b * L::kBytes, w1 + b * L::kBytes, ok0, ok1, tq, k[i]);
    }
#pragma unroll
    for (int i = 0; i < kSkPer; ++i) {
      const int64_t b = r0 + warp + kSkWarps * i;
      if (b < nb) {
        float v[kE];
        sk_terms<T, NR>(k[i], b, K, xq, xd, n_rows, g, tq, v);
#pragma unroll
        for (int e = 0; e < kE; ++e) vs[warp + kSkWarps * i][lane * kE + e] = v[e];
      }
    }
    __syncthreads();
    // The round's terms, added in block order.
    const int nw = nb - r0 < kSkRound ? int(nb - r0) : kSkRound;
    for (int f = threadIdx.x; f < 32 * kE; f += kSkWarps * 32) {
      float s = acc[f];
      for (int u = 0; u < nw; ++u) s = __fadd_rn(s, vs[u][f]);
      acc[f] = s;
    }
    __syncthreads();
  }
  for (int f = threadIdx.x; f < 32 * kE; f += kSkWarps * 32) {
    const int ln = f / kE, e4 = f % kE, t = e4 / 4, e = e4 % 4;
    const int r = 8 * t + 2 * (ln % 4) + (e & 1);
    const int64_t o = n0 + ln / 4 + 8 * (e / 2);
    if (r < n_rows && o < n_out) y[size_t(r) * n_out + o] = acc[f];
  }
}

// ---- 1..8 rows on int8 tensor cores, every weight byte read once ("mvmma") -----------------
// The decode kernel. The matrix-vector kernel above spends ~290 instructions per 576 bytes of
// Q4_K (unpacking, the 8-lane reductions of each block, the ordered broadcasts) and so issues
// at 76 % of the SM's slots while reading at 30 % of the bandwidth. Here the tensor cores do
// the reductions: a warp holds 16 outputs as the MMA's A operand (frag_quants' layout: lane
// (g, tq) holds outputs g and g + 8) and up to 8 activation rows as its B operand (row n in
// column n; with fewer rows the last row fills the other columns, whose results are
// dropped). Per super-block, as sk_terms: one MMA per sub-block for sum_j(q x), one with
// mn_j in every byte for mn_j * sum_j(x), the integer steps sc_j * dot_j, then
// dot_unpacked's f32 step. The lane's C fragment is (output g, rows 2 tq and 2 tq + 1) and
// (output g + 8, the same rows), so every (output, row) pair is held by exactly one lane.
// P warps share 16 outputs, warp p taking the super-blocks b = p (mod P) and loading the
// next one before it computes the current one; P = 1 adds the terms in registers in block
// order, P > 1 leaves them in shared memory and one thread per (output, row) adds them in
// block order. The bits are those of every other kernel here: the row count, P and the
// other rows never change an output.

constexpr int kMmWarps = 8;
constexpr int64_t kMvmmaMinTiles1 = 512;  // tiles of 16 outputs for the one-row case

// One super-block of the lane's two outputs, as loaded (unpacked when it is computed).
template <GgmlType T>
struct MmBlock {
  uint32_t ra[kRaw<T>], rb[kRaw<T>], sa[4], sb[4];  // frag_raw's and load_scales' words
  uint32_t da, db;  // the f16 d (low half) and dmin (high half, where the type has one)
};

template <GgmlType T>
__device__ __forceinline__ void mm_load(const uint8_t *blk0, const uint8_t *blk1, int tq, MmBlock<T> &k) {
  using L = KQ<T>;
  // Blocks of 2-byte aligned sizes (Q3_K, Q6_K) are 4-byte aligned every other one; where
  // the row size is a multiple of 4 the branch is the same for the whole warp.
  if (L::kBytes % 4 == 0 || ((reinterpret_cast<uintptr_t>(blk0) | reinterpret_cast<uintptr_t>(blk1)) & 3) == 0) {
    frag_raw<T, true>(blk0, tq, k.ra);
    frag_raw<T, true>(blk1, tq, k.rb);
    load_scales<T, true>(blk0, k.sa);
    load_scales<T, true>(blk1, k.sb);
  } else {
    frag_raw<T>(blk0, tq, k.ra);
    frag_raw<T>(blk1, tq, k.rb);
    load_scales<T>(blk0, k.sa);
    load_scales<T>(blk1, k.sb);
  }
  if constexpr (L::kDminOff == L::kDOff + 2 && L::kDOff % 4 == 0 && L::kBytes % 4 == 0) {
    k.da = *reinterpret_cast<const uint32_t *>(blk0 + L::kDOff);
    k.db = *reinterpret_cast<const uint32_t *>(blk1 + L::kDOff);
  } else {
    k.da = *reinterpret_cast<const uint16_t *>(blk0 + L::kDOff);
    k.db = *reinterpret_cast<const uint16_t *>(blk1 + L::kDOff);
    if constexpr (L::kDminOff >= 0) {
      k.da |= uint32_t(*reinterpret_cast<const uint16_t *>(blk0 + L::kDminOff)) << 16;
      k.db |= uint32_t(*reinterpret_cast<const uint16_t *>(blk1 + L::kDminOff)) << 16;
    }
  }
}

// The f32 terms of super-block b for the lane's (output, row) pairs of NB 8-row B tiles:
// v[4 t + 0] (g, rows[t][0]), v[4 t + 1] (g, rows[t][1]), v[4 t + 2] (g + 8, rows[t][0]),
// v[4 t + 3] (g + 8, rows[t][1]); tile t's B column is xb[t], its rows' scales d0[t], d1[t].
// The A fragments are unpacked once for all NB tiles; each tile's sums are those of NB = 1.
template <GgmlType T, int NB>
__device__ __forceinline__ void mm_terms(const MmBlock<T> &k, int b, const int8_t *const *xb,
                                         const float *const *d0, const float *const *d1, int tq, float *v) {
  using L = KQ<T>;
  constexpr int kNSub = 256 / L::kSub;
  constexpr bool kMin = L::kDminOff >= 0;
  int isum[NB][4] = {}, msum[NB][4] = {};
  uint32_t qa[16], qb[16];
  frag_unpack<T>(k.ra, qa);
  frag_unpack<T>(k.rb, qb);
  uint32_t ps[2][4];
  if constexpr (T == GgmlType::Q4_K || T == GgmlType::Q5_K) {
    scales_mins_k4(k.sa, ps[0]);
    scales_mins_k4(k.sb, ps[1]);
  }
#pragma unroll
  for (int j = 0; j < kNSub; ++j) {
    int sc0, mn0, sc1, mn1;
    uint32_t am0 = 0, am1 = 0;  // mn in every byte
    if constexpr (T == GgmlType::Q4_K || T == GgmlType::Q5_K) {
      const int h = j / 4, i = j % 4;
      sc0 = int(__byte_perm(ps[0][2 * h], 0, 0x4440 | i));
      sc1 = int(__byte_perm(ps[1][2 * h], 0, 0x4440 | i));
      am0 = __byte_perm(ps[0][2 * h + 1], 0, i * 0x1111);
      am1 = __byte_perm(ps[1][2 * h + 1], 0, i * 0x1111);
      mn0 = mn1 = 0;
    } else {
      reg_scale<T>(k.sa, j, &sc0, &mn0);
      reg_scale<T>(k.sb, j, &sc1, &mn1);
      am0 = uint32_t(mn0) * 0x01010101u;
      am1 = uint32_t(mn1) * 0x01010101u;
    }
    uint32_t a[4], am[4];
    if constexpr (L::kSub == 32) {
      a[0] = qa[2 * j];
      a[1] = qb[2 * j];
      a[2] = qa[2 * j + 1];
      a[3] = qb[2 * j + 1];
    } else {
      a[0] = qa[j];
      a[1] = qb[j];
    }
    if constexpr (kMin) {
      (void)mn0;
      (void)mn1;
      am[0] = am[2] = am0;
      am[1] = am[3] = am1;
    }
#pragma unroll
    for (int t = 0; t < NB; ++t) {
      uint32_t bf[2];
      if constexpr (L::kSub == 32) {
        const int2 xv = *reinterpret_cast<const int2 *>(xb[t] + j * 32 + 8 * tq);
        bf[0] = uint32_t(xv.x);
        bf[1] = uint32_t(xv.y);
      } else {
        bf[0] = *reinterpret_cast<const uint32_t *>(xb[t] + j * 16 + 4 * tq);
      }
      sub_block_mma<T>(a, am, bf, sc0, sc1, isum[t], msum[t]);
    }
  }
  const float dw0 = dev::fp16_to_fp32(uint16_t(k.da)), dw1 = dev::fp16_to_fp32(uint16_t(k.db));
  float dm0 = 0.0f, dm1 = 0.0f;
  if constexpr (kMin) {
    dm0 = dev::fp16_to_fp32(uint16_t(k.da >> 16));
    dm1 = dev::fp16_to_fp32(uint16_t(k.db >> 16));
  }
#pragma unroll
  for (int t = 0; t < NB; ++t) {
    const float dx0 = d0[t][b], dx1 = d1[t][b];
    v[4 * t + 0] = block_term<T>(dw0, dm0, dx0, isum[t][0], msum[t][0]);
    v[4 * t + 1] = block_term<T>(dw0, dm0, dx1, isum[t][1], msum[t][1]);
    v[4 * t + 2] = block_term<T>(dw1, dm1, dx0, isum[t][2], msum[t][2]);
    v[4 * t + 3] = block_term<T>(dw1, dm1, dx1, isum[t][3], msum[t][3]);
  }
}

// set.first counts tiles of 16 outputs here. Shared memory (P > 1): kMmWarps / P tiles x 16
// outputs x n_rows x nb floats.
template <GgmlType T, int P, int NB>
__global__ void __launch_bounds__(kMmWarps * 32, NB == 1 ? 2 : 1)
    mvmma_kernel(MvSet set, int64_t K, const int8_t *__restrict__ xq, const float *__restrict__ xd, int n_rows) {
  using L = KQ<T>;
  constexpr int kTiles = kMmWarps / P;
  extern __shared__ float mm_terms_smem[];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int g = lane / 4, tq = lane % 4, part = warp % P;
  const int nb = int(K / 256);
  const int64_t n_tiles = set.first[set.n];
  const int64_t tile = int64_t(blockIdx.x) * kTiles + warp / P;
  const bool active = tile < n_tiles;
  int m = 0;
  while (m + 1 < set.n && tile >= set.first[m + 1]) ++m;
  const int64_t n0 = (active ? tile - set.first[m] : 0) * 16, n_out = set.n_out[m];
  const size_t rb = set.row_bytes[m];
  // Outputs past the end read the last row (no branch in the loads) and are not stored.
  const uint8_t *w0 = set.w[m] + size_t(n0 + g < n_out ? n0 + g : n_out - 1) * rb;
  const uint8_t *w1 = set.w[m] + size_t(n0 + g + 8 < n_out ? n0 + g + 8 : n_out - 1) * rb;
  if (active) {
    const int64_t rows = n_out - n0 < 16 ? n_out - n0 : 16;
    dev::prefetch_lines(set.w[m] + size_t(n0) * rb, size_t(rows) * rb, 32 * part + lane, 32 * P, set.prefetch);
  }
  dev::pdl_start();
  if (P == 1 && !active) return;  // whole warps (P > 1: every warp reaches the barrier)
  // B tile t: rows 8 t .. 8 t + 7, row 8 t + g in column g (rows past the end repeat the last).
  auto clamp_row = [&](int r) { return r < n_rows ? r : n_rows - 1; };
  const int8_t *xrow[NB];
  const float *d0[NB], *d1[NB];
#pragma unroll
  for (int t = 0; t < NB; ++t) {
    xrow[t] = xq + size_t(clamp_row(8 * t + g)) * K;
    d0[t] = xd + size_t(clamp_row(8 * t + 2 * tq)) * nb;
    d1[t] = xd + size_t(clamp_row(8 * t + 2 * tq + 1)) * nb;
  }
  float sum[4 * NB] = {};
  float *terms = mm_terms_smem + size_t(warp / P) * 16 * n_rows * nb;
  auto step = [&](const MmBlock<T> &k, int b) {
    float v[4 * NB];
    const int8_t *xb[NB];
#pragma unroll
    for (int t = 0; t < NB; ++t) xb[t] = xrow[t] + size_t(b) * 256;
    mm_terms<T, NB>(k, b, xb, d0, d1, tq, v);
    if constexpr (P == 1) {
#pragma unroll
      for (int e = 0; e < 4 * NB; ++e) sum[e] = __fadd_rn(sum[e], v[e]);
    } else {
#pragma unroll
      for (int e = 0; e < 4 * NB; ++e) {
        const int r = 8 * (e / 4) + 2 * tq + (e & 1), o = g + 8 * ((e % 4) / 2);
        if (r < n_rows) terms[(o * n_rows + r) * nb + b] = v[e];
      }
    }
  };
  if (active && part < nb) {
    // Two buffers in turn: block b + P loads while block b is computed. (Three, with the
    // loads two blocks ahead, spilled registers and measured slower on the H200.)
    constexpr size_t kStep = size_t(P) * L::kBytes;
    const uint8_t *p0 = w0 + size_t(part) * L::kBytes, *p1 = w1 + size_t(part) * L::kBytes;
    int b = part;
    MmBlock<T> k0, k1;
    mm_load<T>(p0, p1, tq, k0);
    auto body = [&](const MmBlock<T> &cur, MmBlock<T> &ahead) {
      if (b + P < nb) mm_load<T>(p0 + kStep, p1 + kStep, tq, ahead);
      step(cur, b);
      b += P;
      p0 += kStep;
      p1 += kStep;
      return b < nb;
    };
    while (body(k0, k1) && body(k1, k0)) {
    }
  }
  if constexpr (P == 1) {
#pragma unroll
    for (int e = 0; e < 4 * NB; ++e) {
      const int r = 8 * (e / 4) + 2 * tq + (e & 1);
      const int64_t o = n0 + g + 8 * ((e % 4) / 2);
      if (r < n_rows && o < n_out) set.y[m][size_t(r) * n_out + o] = sum[e];
    }
  } else {
    __syncthreads();
    // Thread i: tile i / (16 n_rows) of the block, output (i / n_rows) % 16, row i % n_rows.
    for (int i = threadIdx.x; i < kTiles * 16 * n_rows; i += kMmWarps * 32) {
      const int t = i / (16 * n_rows), o = (i / n_rows) % 16, r = i % n_rows;
      const int64_t tl = int64_t(blockIdx.x) * kTiles + t;
      if (tl >= n_tiles) continue;
      int mt = 0;
      while (mt + 1 < set.n && tl >= set.first[mt + 1]) ++mt;
      const int64_t oo = (tl - set.first[mt]) * 16 + o;
      if (oo >= set.n_out[mt]) continue;
      const float *tp = mm_terms_smem + ((size_t(t) * 16 + o) * n_rows + r) * nb;
      float acc = 0.0f;
      for (int b = 0; b < nb; ++b) acc = __fadd_rn(acc, tp[b]);
      set.y[mt][size_t(r) * set.n_out[mt] + oo] = acc;
    }
  }
}

// ---- prefill on int8 tensor cores with the weights as the A operand ("wtile") ---------------
// matmul_mma_kernel unpacks each super-block's weights into shared memory, loads its
// activations synchronously, and computes between two barriers; under Nsight Compute it
// issued in 27 % of the cycles. Here each warp holds 16 outputs in registers as mvmma_kernel
// does (frag_raw's words, the next super-block loading while the current one computes), so
// the weights never pass through shared memory, and the block's 8 NT activation rows stream
// into a double buffer with cp.async. Per super-block and 8-row tile a warp runs one MMA per
// sub-block for the dots and, for the types with mins, two m16n8k16 MMAs for
// msum = sum_j mn_j * xs_j: the sub-block sums xs_j of the activations, split as
// 64 * hi_j + lo_j (both fit a signed byte), are the B operand and the mins the A operand
// (k = j). The integer sums are the same as every other kernel's, the f32 step runs in block
// order: the same bits.

constexpr int kWtWarps = 4;  // 16 outputs each: 64 outputs per block

template <GgmlType T>
constexpr int kWtStride = KQ<T>::kSub == 32 ? 256 + 32 : 256 + 16;  // conflict-free LDS.64 / LDS.32 B fragments

using dev::cp_async16;
using dev::cp_async16_l2pf;
using dev::cp_async4;
using dev::cp_async_commit;
using dev::cp_async_wait_all;

// One block's 64 outputs (column block bx) x `rows` rows from row r0 (1 to 8 NT rows) of one
// matrix.
template <GgmlType T, int NT>
__device__ __forceinline__ void wtile_block(int64_t bx, const uint8_t *__restrict__ w, size_t row_bytes, int64_t K,
                                            int64_t n_out, const int8_t *__restrict__ xq, const float *__restrict__ xd,
                                            float *__restrict__ y, int r0, int rows) {
  using L = KQ<T>;
  constexpr int kNSub = 256 / L::kSub, kS = kWtStride<T>, kTok = 8 * NT, kThreads = kWtWarps * 32;
  constexpr bool kMin = L::kDminOff >= 0;
  extern __shared__ __align__(16) int8_t wt_smem[];
  int8_t *xs = wt_smem;                                               // [2][kTok][kS]
  float *xds = reinterpret_cast<float *>(wt_smem + 2 * kTok * kS);  // [2][kTok]
  uint32_t *xsh = reinterpret_cast<uint32_t *>(xds + 2 * kTok);      // [kTok][4]: hi_j, byte j
  uint32_t *xsl = xsh + 4 * kTok;                                     // [kTok][4]: lo_j

  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, g = lane / 4, tq = lane % 4;
  const int64_t n0 = bx * (16 * kWtWarps) + 16 * warp;
  const int live = (rows + 7) / 8;  // the 8-row tiles that hold rows: only theirs are staged
  const int nb = int(K / 256);
  // Outputs past the end read the last row and are not stored; rows past the end copy the
  // last row (their columns are computed and dropped).
  const uint8_t *w0 = w + size_t(n0 + g < n_out ? n0 + g : n_out - 1) * row_bytes;
  const uint8_t *w1 = w + size_t(n0 + g + 8 < n_out ? n0 + g + 8 : n_out - 1) * row_bytes;
  MmBlock<T> k0, k1;
  mm_load<T>(w0, w1, tq, k0);  // weights never depend on the kernel before: ahead of the wait
  if constexpr (kMin) {
    for (int u = tid; u < 8 * kTok; u += kThreads) (u < 4 * kTok ? xsh : xsl)[u % (4 * kTok)] = 0;
  }
  dev::pdl_start();

  // Block b's activation rows and their scales into buffer b & 1, by cp.async.
  auto issue = [&](int b) {
    int8_t *dst = xs + (b & 1) * kTok * kS;
    for (int u = tid; u < live * 8 * 16; u += kThreads) {
      const int r = u / 16, c = u % 16;
      cp_async16(dst + r * kS + 16 * c, xq + size_t(r0 + (r < rows ? r : rows - 1)) * K + size_t(b) * 256 + 16 * c);
    }
    if (tid < live * 8) cp_async4(xds + (b & 1) * kTok + tid, xd + size_t(r0 + (tid < rows ? tid : rows - 1)) * nb + b);
    cp_async_commit();
  };
  issue(0);

  float acc[NT][4];
#pragma unroll
  for (int t = 0; t < NT; ++t)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[t][e] = 0.0f;

  auto compute = [&](const MmBlock<T> &k, int b) {
    const int8_t *xb = xs + (b & 1) * kTok * kS + g * kS;  // this lane's B column (row g of each tile)
    uint32_t qa[16], qb[16];
    frag_unpack<T>(k.ra, qa);
    frag_unpack<T>(k.rb, qb);
    uint32_t ps[2][4] = {};
    if constexpr (T == GgmlType::Q4_K || T == GgmlType::Q5_K) {
      scales_mins_k4(k.sa, ps[0]);
      scales_mins_k4(k.sb, ps[1]);
    }
    // msum = 64 * (mn . hi) + (mn . lo), k = sub-block: lane tq holds the mins of sub-blocks
    // 4 tq .. 4 tq + 3 of its outputs (zeros past the last).
    uint32_t am[2] = {0u, 0u};
    if constexpr (T == GgmlType::Q2_K) {
      auto pick = [&](const uint32_t *sw) { return tq == 0 ? sw[0] : tq == 1 ? sw[1] : tq == 2 ? sw[2] : sw[3]; };
      am[0] = (pick(k.sa) >> 4) & 0x0F0F0F0Fu;
      am[1] = (pick(k.sb) >> 4) & 0x0F0F0F0Fu;
    } else if constexpr (kMin) {
      am[0] = tq == 0 ? ps[0][1] : tq == 1 ? ps[0][3] : 0u;
      am[1] = tq == 0 ? ps[1][1] : tq == 1 ? ps[1][3] : 0u;
    }
    const float dw[2] = {dev::fp16_to_fp32(uint16_t(k.da)), dev::fp16_to_fp32(uint16_t(k.db))};
    float dm[2] = {0.0f, 0.0f};
    if constexpr (kMin) {
      dm[0] = dev::fp16_to_fp32(uint16_t(k.da >> 16));
      dm[1] = dev::fp16_to_fp32(uint16_t(k.db >> 16));
    }
    // Tile by tile (the unpacked quants stay in registers, the integer sums of one tile do);
    // tiles wholly past the last row are skipped (their columns are never stored).
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      if (t > 0 && 8 * t >= rows) break;
      int isum[4] = {0, 0, 0, 0};
#pragma unroll
      for (int j = 0; j < kNSub; ++j) {
        int sc0, sc1, mn;
        if constexpr (T == GgmlType::Q4_K || T == GgmlType::Q5_K) {
          sc0 = int(__byte_perm(ps[0][2 * (j / 4)], 0, 0x4440 | (j % 4)));
          sc1 = int(__byte_perm(ps[1][2 * (j / 4)], 0, 0x4440 | (j % 4)));
        } else {
          reg_scale<T>(k.sa, j, &sc0, &mn);
          reg_scale<T>(k.sb, j, &sc1, &mn);
        }
        int c[4];
        if constexpr (L::kSub == 32) {
          const uint32_t a[4] = {qa[2 * j], qb[2 * j], qa[2 * j + 1], qb[2 * j + 1]};
          const uint2 bv = *reinterpret_cast<const uint2 *>(xb + t * 8 * kS + j * 32 + 8 * tq);
          const uint32_t bf[2] = {bv.x, bv.y};
          mma_k32(a, bf, c);
        } else {
          const uint32_t a[2] = {qa[j], qb[j]};
          mma_k16(a, *reinterpret_cast<const uint32_t *>(xb + t * 8 * kS + j * 16 + 4 * tq), c);
        }
        isum[0] += sc0 * c[0];
        isum[1] += sc0 * c[1];
        isum[2] += sc1 * c[2];
        isum[3] += sc1 * c[3];
      }
      int msum[4] = {0, 0, 0, 0};
      if constexpr (kMin) {
        int ch[4], cl[4];
        mma_k16(am, xsh[(8 * t + g) * 4 + tq], ch);
        mma_k16(am, xsl[(8 * t + g) * 4 + tq], cl);
#pragma unroll
        for (int e = 0; e < 4; ++e) msum[e] = 64 * ch[e] + cl[e];
      }
      const float2 dx = *reinterpret_cast<const float2 *>(&xds[(b & 1) * kTok + 8 * t + 2 * tq]);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        acc[t][e] = __fadd_rn(acc[t][e], block_term<T>(dw[e / 2], dm[e / 2], (e & 1) ? dx.y : dx.x, isum[e], msum[e]));
      }
    }
  };

  // Per super-block: wait for its rows and scales, start the next block's copy and the
  // warp's next weights, make the sub-block sums of the rows, then every warp computes. (The
  // scales used to be read here, a global load before the barrier on every block: E4B's
  // q at 64 rows, one block per SM, took ~2 us per super-block, H100.)
  auto body = [&](const MmBlock<T> &cur, MmBlock<T> &ahead, int b) {
    cp_async_wait_all();
    __syncthreads();  // block b's rows are in; every warp is done with block b - 1
    if (b + 1 < nb) issue(b + 1);
    if (b + 1 < nb) mm_load<T>(w0 + size_t(b + 1) * L::kBytes, w1 + size_t(b + 1) * L::kBytes, tq, ahead);
    const int8_t *xb = xs + (b & 1) * kTok * kS;
    if constexpr (kMin) {
      for (int u = tid; u < live * 8 * kNSub; u += kThreads) {
        const int r = u / kNSub, j = u % kNSub;
        const int *p = reinterpret_cast<const int *>(xb + r * kS + j * L::kSub);
        int s = 0;
#pragma unroll
        for (int i = 0; i < L::kSub / 4; ++i) s = __dp4a(p[i], 0x01010101, s);
        reinterpret_cast<int8_t *>(xsh)[r * 16 + j] = int8_t(s >> 6);  // floor(s / 64)
        reinterpret_cast<int8_t *>(xsl)[r * 16 + j] = int8_t(s & 63);
      }
    }
    __syncthreads();
    compute(cur, b);
    return b + 1 < nb;
  };
  for (int b = 0; body(k0, k1, b) && body(k1, k0, b + 1); b += 2) {
  }

#pragma unroll
  for (int t = 0; t < NT; ++t) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int r = 8 * t + 2 * tq + (e & 1);
      const int64_t o = n0 + g + 8 * (e / 2);
      if (r < rows && o < n_out) y[size_t(r0 + r) * n_out + o] = acc[t][e];
    }
  }
}

template <GgmlType T, int NT>
__global__ void __launch_bounds__(kWtWarps * 32, 2)
    matmul_wtile_kernel(const uint8_t *__restrict__ w, size_t row_bytes, int64_t K, int64_t n_out,
                        const int8_t *__restrict__ xq, const float *__restrict__ xd, float *__restrict__ y,
                        int n_rows, int rpb) {
  const int r0 = int(blockIdx.y) * rpb;
  wtile_block<T, NT>(blockIdx.x, w, row_bytes, K, n_out, xq, xd, y, r0, min(rpb, n_rows - r0));
}

// Several matrices sharing the quantized activations (q, k and v; gate and up) in one
// launch: the column blocks of matrix m are blockIdx.x in [first[m], first[m + 1]); each
// block runs wtile_block of its matrix's type (T0, or T1 where alt[m]), the same code as a
// launch of that matrix alone, so the same bits. One grid instead of one per matrix: E4B's
// k and v (512 outputs) alone gave 64-128 blocks, a fraction of a wave each.
constexpr int kWtSetMax = 4;
struct WtSet {
  int n;
  const uint8_t *w[kWtSetMax];
  size_t row_bytes[kWtSetMax];
  int64_t n_out[kWtSetMax];
  float *y[kWtSetMax];
  bool alt[kWtSetMax];
  int64_t first[kWtSetMax + 1];
};

// wtile_block for the set's column block `col` (counted over all its matrices).
template <GgmlType T0, GgmlType T1, int NT>
__device__ __forceinline__ void wtile_set_block(const WtSet &set, int64_t col, int64_t K, const int8_t *__restrict__ xq,
                                                const float *__restrict__ xd, int r0, int rows) {
  int m = 0;
  while (m + 1 < set.n && col >= set.first[m + 1]) ++m;
  const int64_t bx = col - set.first[m];
  if (T0 == T1 || !set.alt[m]) {
    wtile_block<T0, NT>(bx, set.w[m], set.row_bytes[m], K, set.n_out[m], xq, xd, set.y[m], r0, rows);
  } else {
    wtile_block<T1, NT>(bx, set.w[m], set.row_bytes[m], K, set.n_out[m], xq, xd, set.y[m], r0, rows);
  }
}

template <GgmlType T0, GgmlType T1, int NT>
__global__ void __launch_bounds__(kWtWarps * 32, 2)
    matmul_wtile_set_kernel(WtSet set, int64_t K, const int8_t *__restrict__ xq, const float *__restrict__ xd,
                            int n_rows, int rpb) {
  const int r0 = int(blockIdx.y) * rpb;
  wtile_set_block<T0, T1, NT>(set, blockIdx.x, K, xq, xd, r0, min(rpb, n_rows - r0));
}

// The same tiles with a fixed grid ("persistent"): the set's column blocks times their 8-row
// tiles, column by column, are one list that the grid's blocks split evenly; each block runs
// its share as runs of at most NT tiles of one column (a column's share split evenly), each
// run being wtile_block on those rows. A grid of blocks of 64 or 96 rows runs in whole waves:
// E4B's gate+up at 129 rows is 960 blocks for 264 slots, 3.6 waves whose last holds blocks of
// one row; split evenly, every block does the same share and the time grows with the rows.
// Every tile still runs the same code over the same K: the same bits.
template <GgmlType T0, GgmlType T1, int NT>
__global__ void __launch_bounds__(kWtWarps * 32, 2)
    matmul_wtile_persist_kernel(WtSet set, int64_t K, const int8_t *__restrict__ xq, const float *__restrict__ xd,
                                int n_rows) {
  const int64_t tpc = (n_rows + 7) / 8, total = set.first[set.n] * tpc;
  int64_t t = total * blockIdx.x / gridDim.x;
  const int64_t end = total * (blockIdx.x + 1) / gridDim.x;
  while (t < end) {
    const int64_t col = t / tpc, tile0 = t % tpc, n = min(end - t, tpc - tile0);
    const int64_t parts = (n + NT - 1) / NT;
    for (int64_t p = 0; p < parts; ++p) {
      const int r0 = int(8 * (tile0 + n * p / parts));
      const int rows = min(int(8 * (tile0 + n * (p + 1) / parts)), n_rows) - r0;
      __syncthreads();  // the block's shared memory is free again
      wtile_set_block<T0, T1, NT>(set, col, K, xq, xd, r0, rows);
    }
    t += n;
  }
}

// The types with a 12-tile (wide) instantiation: the ones Q4_K_M and Q5_K_M are made of.
constexpr bool wtile_wide_type(GgmlType t) {
  return t == GgmlType::Q4_K || t == GgmlType::Q5_K || t == GgmlType::Q6_K;
}

// Under 48 KiB for NT <= 8 (no opt-in needed): 2 x 64 x 288 + 64 x 40 = 39424 bytes.
template <GgmlType T, int NT>
size_t wtile_smem() {
  return size_t(2) * 8 * NT * kWtStride<T> + size_t(8 * NT) * (8 + 32);
}

// GEIST_CUDA_WTILE: 0 keeps matmul_mma_kernel for prefill, 4 or 8 picks the 8-row tiles per
// block of matmul_wtile_kernel (default 8), 12 the wide blocks below for every call that can
// take them. A knob to compare; the bits are the same.
int wtile_nt() {
  static const int v = [] {
    const char *e = std::getenv("GEIST_CUDA_WTILE");
    if (e == nullptr || *e == '\0') return 8;
    const int n = std::atoi(e);
    return n == 0 || n == 4 || n == 8 || n == 12 ? n : 8;
  }();
  return v;
}

// Wide blocks: up to 12 tiles (96 rows) per block, for a grid whose 64-row blocks would fill
// one wave and a bit of the next. The kernel's registers allow two blocks per SM, so E4B's
// 2560-output matrices (down, o) at 512 rows are 320 blocks of 64 rows for 264 slots: a full
// wave, then 56 blocks on 56 SMs while the others idle. As 6 blocks of 88 rows per column
// they are 240 blocks in one wave. The rows of a column are split evenly (multiples of 8):
// rows are independent and every tile runs the same code, so the bits do not change.
// GEIST_CUDA_WTILE12=0: never (a knob to compare).
bool wtile12_enabled() {
  static const bool v = env_int("GEIST_CUDA_WTILE12", 1) != 0;
  return v;
}

// Rows per block for nrb blocks over n_rows rows: the 8-row tiles split evenly.
int wtile_even_rows(int n_rows, int nrb) {
  const int tiles = (n_rows + 7) / 8;
  return 8 * ((tiles + nrb - 1) / nrb);
}

// The modelled time of a grid of cols x ceil(n_rows / rpb) blocks: waves of two blocks per SM
// (a last wave of at most one block per SM counted as 0.75 of one, GEIST_CUDA_WTILE_LONE=75:
// those blocks have an SM to themselves), each as long as a block's 8-row tiles plus 3 tiles'
// worth of fixed cost (the weights' loads and unpacking, paid per block). Fitted to what was
// measured on the H100 (`bench rows` E4B): 64-row blocks 272 us and 32-row 278 for E4B's down
// at 512 rows; blocks of 56-64 rows alone on their SMs slower than 32-row blocks two to an SM
// at 97-136 rows (so the lone factor is above 0.7); 88-row blocks alone faster than 1.2 waves
// of 32-row blocks at 256 rows (below 1).
double wtile_cost(int64_t cols, int n_rows, int rpb) {
  static const double lone = std::min(env_int("GEIST_CUDA_WTILE_LONE", 75), 100) / 100.0;
  const int64_t sms = device_sm_count(), slots = 2 * sms;
  const int64_t blocks = cols * ((n_rows + rpb - 1) / rpb);
  const int64_t full = blocks / slots, rem = blocks % slots;
  const double waves = double(full) + (rem == 0 ? 0.0 : rem <= sms ? lone : 1.0);
  return waves * (3.0 + rpb / 8.0);
}

// The wide blocks' rows per block for this grid, or 0 where the blocks of alt_rows rows it would
// otherwise take (32 or 64) are modelled within 1 % of them (GEIST_CUDA_WTILE12_GAIN=P: within
// P %), or the knobs say so. H100, E4B pp512 (one call, alternated twice): without wide
// blocks 10384 / 10689 t/s; with them on the 2560-output matrices 11171 / 11183; with the
// gate+up set too (271.8 -> 263.5 us per call) 11452 / 11449.
// set: the call is a set of matrices (matmul_wtile_set_kernel), else one matrix.
int wtile_wide_rows(int64_t cols, int n_rows, int alt_rows, bool set) {
  static const double keep = 1.0 - std::min(env_int("GEIST_CUDA_WTILE12_GAIN", 1), 100) / 100.0;
  if (wtile_nt() == 12) return wtile_even_rows(n_rows, (n_rows + 95) / 96);
  // Not below 193 rows: there the H100 sweep measured the modelled picks (gate+up and q/k/v
  // sets of 88-96-row blocks at 159-189 rows) 3-6 % slower per call, which the model does not
  // see; from 201 rows they were 3-10 % faster. GEIST_CUDA_WTILE12_MIN_ROWS /
  // GEIST_CUDA_WTILE12_SET_MIN_ROWS: the least row count for one matrix / a set (knobs to
  // compare).
  static const int min_one = env_int("GEIST_CUDA_WTILE12_MIN_ROWS", 193);
  static const int min_set = env_int("GEIST_CUDA_WTILE12_SET_MIN_ROWS", 193);
  if (wtile_nt() != 8 || !wtile12_enabled() || n_rows < (set ? min_set : min_one)) return 0;
  const int rpb = wtile_even_rows(n_rows, (n_rows + 95) / 96);
  return wtile_cost(cols, n_rows, rpb) < keep * wtile_cost(cols, n_rows, alt_rows) ? rpb : 0;
}

// Up to this many rows the 8-tile default takes blocks of 4 tiles (32 rows) instead: twice
// the blocks for the few-row calls whose 64-row tiles leave SMs idle (GEIST_CUDA_WTILE4_ROWS;
// 0: never).
int wtile4_max_rows() {
  static const int v = env_int("GEIST_CUDA_WTILE4_ROWS", 0);
  return v;
}
// So do calls whose 8-tile grid has fewer blocks than this (GEIST_CUDA_WTILE4_BLOCKS; default
// twice the SMs, two blocks per SM being what the 8-tile kernel's registers allow; 0: never):
// E4B's k and v projections (512 outputs) give 64 blocks of 64 x 64 at 512 rows, and 33-192
// rows give 40-240 blocks on the 2560-output matrices. H200 (264), `bench rows` E4B, ms per
// call, off -> on: 33 rows 15.45 -> 13.21, 64 15.89 -> 14.68, 65 19.24 -> 17.37, 96 18.97 ->
// 16.89, 129 25.12 -> 23.36, 192 23.61 -> 21.92, 256-512 unchanged (+-1 %); pp512 9765 /
// 9775 -> 9799 / 9816 t/s. 32-row blocks everywhere (GEIST_CUDA_WTILE4_ROWS=100000) lost
// from 384 rows (512: 52.2 -> 57.0 ms).
int64_t wtile4_min_blocks() {
  static const int64_t v = [] {
    const int n = env_int("GEIST_CUDA_WTILE4_BLOCKS", -1);
    return n >= 0 ? int64_t(n) : int64_t(2) * device_sm_count();
  }();
  return v;
}

// Whether a tile-kernel grid of `cols` 64-output column blocks over n_rows rows takes blocks
// of 32 rows (4 tiles) instead of 64 (8).
bool wtile_nt4(int64_t cols, int n_rows) {
  return wtile_nt() == 4 || n_rows <= wtile4_max_rows() || cols * ((n_rows + 63) / 64) < wtile4_min_blocks();
}

// GEIST_CUDA_WTILE_LONE_ROWS=1 (off by default; a knob to compare): a grid that takes 32-row
// blocks (wtile_nt4) and would put two blocks on some SMs takes instead the fewest blocks per
// column that give every block an SM of its own, of up to 64 rows each (the 8-tile kernel,
// rows split evenly in whole tiles). E4B's down and o (40 columns) at 97 rows: 3 blocks of
// 40 / 32 / 25 rows per column (120 blocks) instead of 4 of 32 / 32 / 32 / 1 (160 blocks, 28 SMs
// with two). Returns the rows per block, or 0 to keep the 32-row blocks.
// GEIST_CUDA_WTILE_LONE_SMS=N counts N SMs instead of the device's (tests: so that the small
// test matrices take these blocks too).
int wtile_lone_rows(int64_t cols, int n_rows) {
  static const bool on = env_int("GEIST_CUDA_WTILE_LONE_ROWS", 0) != 0;
  static const int test_sms = env_int("GEIST_CUDA_WTILE_LONE_SMS", 0);
  if (!on || wtile_nt() != 8) return 0;
  const int64_t sms = test_sms > 0 ? test_sms : device_sm_count();
  if (cols * ((n_rows + 31) / 32) <= sms) return 0;  // already one block per SM
  const int64_t per_col = sms / cols;
  if (per_col < 1) return 0;
  const int rpb = wtile_even_rows(n_rows, int(per_col));
  return rpb <= 64 ? rpb : 0;
}

// Rows per block of a tile grid that does not take the wide blocks: 32 (the 4-tile kernel)
// for small grids (wtile_nt4), the lone blocks' rows there where they apply, else 64; every
// count but 32 runs on the 8-tile kernel.
int wtile_grid_rows(int64_t cols, int n_rows) {
  if (!wtile_nt4(cols, n_rows)) return 64;
  const int lone = wtile_lone_rows(cols, n_rows);
  return lone > 0 ? lone : 32;
}

// GEIST_CUDA_WTILE_PERSIST: 0 (the default) launches a block per 64 or 96 rows of a column
// block; 8 or 12 runs matmul_wtile_persist_kernel instead, a grid of as many blocks as the
// SMs hold at once, each taking an even share of the tiles in runs of at most that many
// tiles (12: Q4_K, Q5_K and Q6_K, 8 for the other types).
int wtile_persist() {
  static const int v = [] {
    const int n = env_int("GEIST_CUDA_WTILE_PERSIST", 0);
    return n == 8 || n == 12 ? n : 0;
  }();
  return v;
}

// Launches the set's tiles on matmul_wtile_persist_kernel (where wtile_persist asks for it;
// false otherwise): one block per slot the SMs hold at once, at most one per tile.
template <GgmlType T0, GgmlType T1>
bool launch_wtile_persist(const WtSet &set, int64_t K, const int8_t *xq, const float *xd, int n_rows, CudaStream s) {
  const int nt = wtile_persist();
  if (nt == 0) return false;
  const int64_t tiles = set.first[set.n] * ((n_rows + 7) / 8);
  auto go = [&](auto kernel, size_t smem, int &per_sm) {
    if (per_sm == 0) {
      int b = 0;
      if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, kernel, kWtWarps * 32, smem) != cudaSuccess || b < 1) b = 1;
      per_sm = b;
    }
    static const int cap = env_int("GEIST_CUDA_WTILE_PERSIST_GRID", 0);  // a test's knob: at most this many blocks
    int64_t grid = std::min<int64_t>(tiles, int64_t(per_sm) * device_sm_count());
    if (cap > 0) grid = std::min<int64_t>(grid, cap);
    launch_smem(kernel, dim3(unsigned(grid)), dim3(kWtWarps * 32), smem, s, set, K, xq, xd, n_rows);
  };
  if constexpr (wtile_wide_type(T0) && wtile_wide_type(T1)) {
    if (nt == 12) {
      static std::atomic<uint64_t> done{0};
      static int per_sm = 0;
      const size_t smem = std::max(wtile_smem<T0, 12>(), wtile_smem<T1, 12>());
      if (allow_dynamic_smem(matmul_wtile_persist_kernel<T0, T1, 12>, smem, done)) {
        go(matmul_wtile_persist_kernel<T0, T1, 12>, smem, per_sm);
        return true;
      }
    }
  }
  static int per_sm = 0;
  go(matmul_wtile_persist_kernel<T0, T1, 8>, std::max(wtile_smem<T0, 8>(), wtile_smem<T1, 8>()), per_sm);
  return true;
}

template <GgmlType T>
void launch_wtile(const DevMatrix &wm, const int8_t *xq, const float *xd, float *y, int n_rows, CudaStream s) {
  const int64_t cols = (wm.n_out + 16 * kWtWarps - 1) / (16 * kWtWarps);
  if (wtile_persist() != 0) {
    WtSet set{};
    set.n = 1;
    set.w[0] = wm.data;
    set.row_bytes[0] = wm.row_bytes;
    set.n_out[0] = wm.n_out;
    set.y[0] = y;
    set.first[1] = cols;
    if (launch_wtile_persist<T, T>(set, wm.n_in, xq, xd, n_rows, s)) return;
  }
  auto go = [&](auto kernel, size_t smem, int rpb) {
    const dim3 grid(unsigned(cols), unsigned((n_rows + rpb - 1) / rpb));
    launch_smem(kernel, grid, dim3(kWtWarps * 32), smem, s, wm.data, wm.row_bytes, wm.n_in, wm.n_out, xq, xd, y, n_rows,
                rpb);
  };
  // The wide blocks for the types Q4_K_M and Q5_K_M are made of (their shared memory is over
  // the default 48 KiB: where the opt-in fails, 64-row blocks).
  const bool nt4 = wtile_nt4(cols, n_rows);
  if constexpr (wtile_wide_type(T)) {
    if (const int rpb = wtile_wide_rows(cols, n_rows, nt4 ? 32 : 64, false); rpb > 0) {
      static std::atomic<uint64_t> done{0};
      if (allow_dynamic_smem(matmul_wtile_kernel<T, 12>, wtile_smem<T, 12>(), done)) {
        go(matmul_wtile_kernel<T, 12>, wtile_smem<T, 12>(), rpb);
        return;
      }
    }
  }
  if (const int rpb = wtile_grid_rows(cols, n_rows); rpb == 32) {
    go(matmul_wtile_kernel<T, 4>, wtile_smem<T, 4>(), 32);
  } else {
    go(matmul_wtile_kernel<T, 8>, wtile_smem<T, 8>(), rpb);
  }
}

// ---- one activation row, the weights staged through shared memory ("mvs") -----------------
// Decode's matrix-vector product for Q4_K, Q5_K and Q6_K. The other kernels give a super-block to
// 8 lanes (or to a 16-output MMA fragment) and pay for it in shuffles, per-lane scale
// unpacking and dependent loads; ncu had them waiting on global loads with ~10 warps per SM.
// Here a block of 4 warps takes TR outputs (8, 16 or 32) and walks K in slices of SB
// super-blocks: each slice's TR row pieces are copied into shared memory with cp.async in
// coalesced 16-byte chunks (NBUF buffers, all of them requested before pdl_start, so the
// first weights stream in while the kernel before finishes), then every lane computes whole
// super-blocks of one output: output = lane % TR, and the 32 / TR lane groups of the 4 warps
// split the slice's super-blocks. A lane reads its block's scales once for 256 elements and
// needs no shuffle; the activations of a super-block are one broadcast read of shared memory
// for the lanes of a group, and their 32-element sums are made once per block of threads.
// A row piece's pitch is an odd number of 16-byte chunks, so the 8 lanes of an LDS.128 phase
// (8 outputs, one super-block) hit distinct banks. The f32 block terms go to shared memory;
// one thread per output adds them in block order. The same integer sums and the same f32
// steps in the same order as every other kernel: the same bits.

constexpr int kMvsThreads = 128;

struct MvsShape {
  int tr;    // outputs per block of threads: 8, 16 or 32 (4 by GEIST_CUDA_MVS_TR)
  int sb;    // super-blocks per slice
  int nbuf;  // slice buffers
  bool l2pf;  // the copies ask DRAM for 256 bytes into L2 at once (GEIST_CUDA_MVS_L2PF)
};

// A row piece's bytes in shared memory: Q4_K / Q5_K pieces are whole 16-byte chunks, pitch an
// odd number of them; a Q6_K piece (210-byte blocks) starts 0, 4, 8 or 12 bytes into its
// first chunk, and its lanes read up to 6 bytes past its end (mvs_block's aligned words).
template <GgmlType T>
__host__ __device__ constexpr int mvs_pitch(int sb) {
  return T == GgmlType::Q6_K ? 16 * (((12 + sb * KQ<T>::kBytes + 8 + 15) / 16) | 1) : sb * KQ<T>::kBytes + 16;
}

// Shared memory for nr activation rows: activations (nr x K bytes), their 32-element sums
// (16-element for Q6_K: nr x K / mvs_group ints), block scales (nr x nb floats, rounded up to 4), terms (nr x tr x
// (nb | 1) floats, rounded up to 4), then the slice buffers.
template <GgmlType T>
__host__ __device__ constexpr int mvs_group() {
  return T == GgmlType::Q6_K ? 16 : 32;
}

template <GgmlType T>
__host__ __device__ constexpr size_t mvs_smem(int64_t K, MvsShape sh, int nr) {
  const int64_t nb = K / 256, nbp = nb | 1;
  return size_t(nr) * (size_t(K) + size_t(K / mvs_group<T>()) * 4) + size_t((nr * nb + 3) / 4 * 4) * 4 +
         size_t((nr * sh.tr * nbp + 3) / 4 * 4) * 4 + size_t(sh.nbuf) * sh.tr * mvs_pitch<T>(sh.sb);
}

// a . b + c for unsigned bytes a and signed bytes b (dp4a.u32.s32).
__device__ __forceinline__ int dp4a_us(uint32_t a, int b, int c) {
  int d;
  asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}

// The f32 block terms of one Q4_K / Q5_K super-block for NR activation rows (wb: its bytes in
// shared memory, 16-byte aligned; x: row 0's 256 activations, row q's xstride bytes further;
// xs8: row 0's 8 sub-block sums, row q's sstride ints further; dx: row q's scale at
// dx[q * dstride]). The weights are unpacked once for all rows.
template <GgmlType T, int NR>
__device__ __forceinline__ void mvs_block(const uint8_t *wb, const int8_t *x, int xstride, const int *xs8,
                                          int sstride, const float *dx, int dstride, float out[NR]) {
  const uint4 h = *reinterpret_cast<const uint4 *>(wb);
  const float dw = dev::fp16_to_fp32(h.x & 0xFFFFu), dmin = dev::fp16_to_fp32(h.x >> 16);
  // dev::scale_min_k4 for all 8 sub-blocks at once, 4 bytes per word.
  const uint32_t sc_lo = h.y & 0x3F3F3F3Fu, mn_lo = h.z & 0x3F3F3F3Fu;
  const uint32_t sc_hi = (h.w & 0x0F0F0F0Fu) | ((h.y >> 2) & 0x30303030u);
  const uint32_t mn_hi = ((h.w >> 4) & 0x0F0F0F0Fu) | ((h.z >> 2) & 0x30303030u);
  uint32_t qh[8];
  if constexpr (T == GgmlType::Q5_K) {
    const uint4 h0 = *reinterpret_cast<const uint4 *>(wb + 16), h1 = *reinterpret_cast<const uint4 *>(wb + 32);
    qh[0] = h0.x, qh[1] = h0.y, qh[2] = h0.z, qh[3] = h0.w, qh[4] = h1.x, qh[5] = h1.y, qh[6] = h1.z, qh[7] = h1.w;
  }
  constexpr int kQs = T == GgmlType::Q4_K ? 16 : 48;
  int isum[NR];
#pragma unroll
  for (int q = 0; q < NR; ++q) isum[q] = 0;
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const uint4 qa = *reinterpret_cast<const uint4 *>(wb + kQs + 32 * k);
    const uint4 qb = *reinterpret_cast<const uint4 *>(wb + kQs + 32 * k + 16);
    const uint32_t w[8] = {qa.x, qa.y, qa.z, qa.w, qb.x, qb.y, qb.z, qb.w};
    // Q4_K's high nibbles stay in place (16 times the quant, unsigned), so its sums are 16
    // times the integer: exact, shifted back once after the last group.
    uint32_t lo[8], hi[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      lo[i] = w[i] & 0x0F0F0F0Fu;
      hi[i] = T == GgmlType::Q4_K ? (w[i] & 0xF0F0F0F0u) : ((w[i] >> 4) & 0x0F0F0F0Fu);
      if constexpr (T == GgmlType::Q5_K) {
        lo[i] |= ((qh[i] >> (2 * k)) & 0x01010101u) << 4;
        hi[i] |= ((qh[i] >> (2 * k + 1)) & 0x01010101u) << 4;
      }
    }
    const uint32_t scw = k < 2 ? sc_lo : sc_hi;
    const int s0 = int((scw >> (16 * (k % 2))) & 0xFFu), s1 = int((scw >> (16 * (k % 2) + 8)) & 0xFFu);
#pragma unroll
    for (int q = 0; q < NR; ++q) {
      const int4 *xv = reinterpret_cast<const int4 *>(x + q * xstride + 64 * k);
      const int4 x0 = xv[0], x1 = xv[1], x2 = xv[2], x3 = xv[3];
      const int xl[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
      const int xh[8] = {x2.x, x2.y, x2.z, x2.w, x3.x, x3.y, x3.z, x3.w};
      int dl = 0, dh = 0;
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        dl = __dp4a(int(lo[i]), xl[i], dl);
        dh = T == GgmlType::Q4_K ? dp4a_us(hi[i], xh[i], dh) : __dp4a(int(hi[i]), xh[i], dh);
      }
      isum[q] += T == GgmlType::Q4_K ? 16 * s0 * dl + s1 * dh : s0 * dl + s1 * dh;
    }
  }
  if constexpr (T == GgmlType::Q4_K) {
#pragma unroll
    for (int q = 0; q < NR; ++q) isum[q] >>= 4;  // |16 isum| < 2^29 (6-bit scales, 64 x 15 x 128 per group)
  }
#pragma unroll
  for (int q = 0; q < NR; ++q) {
    const int *s8 = xs8 + q * sstride;
    const int4 sa = *reinterpret_cast<const int4 *>(s8), sb = *reinterpret_cast<const int4 *>(s8 + 4);
    const int msum = int(mn_lo & 0xFFu) * sa.x + int((mn_lo >> 8) & 0xFFu) * sa.y +
                     int((mn_lo >> 16) & 0xFFu) * sa.z + int(mn_lo >> 24) * sa.w + int(mn_hi & 0xFFu) * sb.x +
                     int((mn_hi >> 8) & 0xFFu) * sb.y + int((mn_hi >> 16) & 0xFFu) * sb.z + int(mn_hi >> 24) * sb.w;
    out[q] = block_term<T>(dw, dmin, dx[q * dstride], isum[q], msum);
  }
}

// N words of a Q6_K block from p (2-byte aligned, in shared memory): aligned loads, then
// each word funnel-shifted out of two.
template <int N>
__device__ __forceinline__ void lds_words(const uint8_t *p, uint32_t out[N]) {
  // p minus its misalignment, not a rounded integer: the compiler then still sees a shared
  // memory address and loads with LDS (an address rebuilt from an integer is a generic load).
  const unsigned off = unsigned(reinterpret_cast<uintptr_t>(p) & 3);
  const uint32_t *a = reinterpret_cast<const uint32_t *>(p - off);
  const unsigned sh = off * 8;
  uint32_t w[N + 1];
#pragma unroll
  for (int k = 0; k <= N; ++k) w[k] = a[k];
#pragma unroll
  for (int k = 0; k < N; ++k) out[k] = __funnelshift_r(w[k], w[k + 1], sh);
}

// The f32 block terms of one Q6_K super-block at wb (2-byte aligned, in shared memory) for NR
// activation rows (as mvs_block), half by half: ql[64 h, 64 h + 64), qh[32 h, 32 h + 32),
// scales[8 h, 8 h + 8); element 128 h + 32 s + l takes ql's low (s = 0, 1) or high (s = 2, 3)
// nibble of byte 64 h + l + 32 (s % 2) and bits 2 s, 2 s + 1 of qh byte 32 h + l, minus 32
// (unpack_piece's quants). The products take the unsigned 6-bit quants and each 16-element
// group subtracts 32 times its activation sum (xs16: row 0's 16 sums of the block, row r's
// sstride ints further): the same integer as the signed products, with no per-byte subtract.
template <int NR>
__device__ __forceinline__ void mvs_block_q6k(const uint8_t *wb, const int8_t *x, int xstride, const int *xs16,
                                              int sstride, const float *dx, int dstride, float out[NR]) {
  int isum[NR];
#pragma unroll
  for (int r = 0; r < NR; ++r) isum[r] = 0;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    uint32_t ql[16], qh[8], sc[2];
    lds_words<16>(wb + 64 * h, ql);
    lds_words<8>(wb + 128 + 32 * h, qh);
    lds_words<2>(wb + 192 + 8 * h, sc);
    int d[NR][8];
#pragma unroll
    for (int r = 0; r < NR; ++r)
#pragma unroll
      for (int j = 0; j < 8; ++j) d[r][j] = 0;
#pragma unroll
    for (int s = 0; s < 4; ++s) {
      uint32_t q[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const uint32_t l = ql[8 * (s % 2) + i];
        const uint32_t lo = s < 2 ? (l & 0x0F0F0F0Fu) : ((l >> 4) & 0x0F0F0F0Fu);
        const uint32_t hh = s == 0 ? (qh[i] << 4) : s == 1 ? (qh[i] << 2) : s == 2 ? qh[i] : (qh[i] >> 2);
        q[i] = lo | (hh & 0x30303030u);
      }
#pragma unroll
      for (int r = 0; r < NR; ++r) {
        const int4 *xv = reinterpret_cast<const int4 *>(x + r * xstride + 128 * h + 32 * s);
        const int4 x0 = xv[0], x1 = xv[1];
        const int xw[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
#pragma unroll
        for (int i = 0; i < 8; ++i) d[r][2 * s + i / 4] = dp4a_us(q[i], xw[i], d[r][2 * s + i / 4]);
      }
    }
#pragma unroll
    for (int r = 0; r < NR; ++r) {
      const int4 *sv = reinterpret_cast<const int4 *>(xs16 + r * sstride + 8 * h);
      const int4 s0 = sv[0], s1 = sv[1];
      const int g[8] = {s0.x, s0.y, s0.z, s0.w, s1.x, s1.y, s1.z, s1.w};
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        isum[r] += int(int8_t(uint8_t(sc[j / 4] >> (8 * (j % 4))))) * (d[r][j] - 32 * g[j]);
      }
    }
  }
  uint32_t dwv[1];
  lds_words<1>(wb + 208, dwv);
  const float dw = dev::fp16_to_fp32(dwv[0] & 0xFFFFu);
#pragma unroll
  for (int r = 0; r < NR; ++r) out[r] = block_term<GgmlType::Q6_K>(dw, 0.0f, dx[r * dstride], isum[r], 0);
}

__device__ __forceinline__ void cp_async_wait_upto(int pending) {
  if (pending <= 0) {
    asm volatile("cp.async.wait_group 0;\n" ::: "memory");
  } else if (pending == 1) {
    asm volatile("cp.async.wait_group 1;\n" ::: "memory");
  } else {
    asm volatile("cp.async.wait_group 2;\n" ::: "memory");
  }
}

// set.first[m]: tiles of TR outputs before matrix m. Every row pointer is 16-byte aligned
// (the launcher checks), as are xq and the row pieces (Q4_K / Q5_K blocks are 144 / 176 bytes).
template <GgmlType T, int NR>
__global__ void __launch_bounds__(kMvsThreads)
    mvs_kernel(MvSet set, int64_t K, const int8_t *__restrict__ xq, const float *__restrict__ xd, MvsShape sh) {
  using L = KQ<T>;
  extern __shared__ __align__(16) uint8_t mvs_sm[];
  const int nb = int(K / 256), nbp = nb | 1, tr = sh.tr, sb = sh.sb, nbuf = sh.nbuf;
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int64_t tile = blockIdx.x;
  int m = 0;
  while (m + 1 < set.n && tile >= set.first[m + 1]) ++m;
  const int64_t r0 = (tile - set.first[m]) * tr;
  const int rows = int(set.n_out[m] - r0 < tr ? set.n_out[m] - r0 : tr);
  const size_t rb = set.row_bytes[m];
  const uint8_t *w0 = set.w[m] + size_t(r0) * rb;

  // Row q's activations at xs + q K, sums at xsum + q K / kGroup, scales at xdl + q nb, terms of
  // output o at terms + (q tr + o) nbp.
  int8_t *xs = reinterpret_cast<int8_t *>(mvs_sm);
  constexpr int kGroup = mvs_group<T>();
  int *xsum = reinterpret_cast<int *>(mvs_sm + NR * K);
  float *xdl = reinterpret_cast<float *>(xsum + NR * (K / kGroup));
  float *terms = xdl + (NR * nb + 3) / 4 * 4;
  uint8_t *buf = reinterpret_cast<uint8_t *>(terms + (NR * tr * nbp + 3) / 4 * 4);
  const int pitch = mvs_pitch<T>(sb), ns = (nb + sb - 1) / sb;

  // Thread tid copies row piece tid / lpr of each slice, its 16-byte chunks tid % lpr,
  // tid % lpr + lpr, ...: a group of lpr threads reads 16 lpr consecutive bytes of a row. No
  // chunk runs past the matrix: a piece's chunks end at or before its row's 16-byte aligned
  // end, and the launcher checks that the matrix ends 16-byte aligned.
  const int lpr = kMvsThreads / tr, my_r = tid / lpr, my_j = tid % lpr;
  auto stage = [&](int s, int slot) {
    if (my_r < rows) {
      const int b0 = s * sb, nbs = nb - b0 < sb ? nb - b0 : sb;
      const uint8_t *src = w0 + size_t(my_r) * rb + size_t(b0) * L::kBytes;
      const int head = T == GgmlType::Q6_K ? int(reinterpret_cast<uintptr_t>(src) & 15) : 0;
      const uint8_t *g = src - head + 16 * my_j;
      uint8_t *d = buf + size_t(slot) * tr * pitch + my_r * pitch + 16 * my_j;
      const int nch = (head + nbs * L::kBytes + 15) / 16;
      for (int c = my_j; c < nch; c += lpr, g += 16 * lpr, d += 16 * lpr) {
        if (sh.l2pf) {
          cp_async16_l2pf(d, g);
        } else {
          cp_async16(d, g);
        }
      }
    }
    cp_async_commit();
  };
  const int first = ns < nbuf ? ns : nbuf;
  for (int s = 0; s < first; ++s) stage(s, s);  // weights never depend on the kernel before
  dev::pdl_start();
  // The NR rows are consecutive in xq and xd (row strides K and nb), as here. One pass over
  // the activations: a thread's 16-byte pieces go to shared memory with their 16-element sums
  // (for Q4_K / Q5_K two neighbouring lanes add theirs into a 32-element sum; the loop's trip
  // count is the block's, so every lane takes part in the shuffle).
  const int n16 = NR * int(K / 16);
  for (int b = tid; b < NR * nb; b += kMvsThreads) xdl[b] = xd[b];
#pragma unroll 4
  for (int i0 = 0; i0 < n16; i0 += kMvsThreads) {
    const int i = i0 + tid;
    int v = 0;
    if (i < n16) {
      const int4 w = reinterpret_cast<const int4 *>(xq)[i];
      reinterpret_cast<int4 *>(xs)[i] = w;
      v = __dp4a(w.x, 0x01010101, v), v = __dp4a(w.y, 0x01010101, v), v = __dp4a(w.z, 0x01010101, v);
      v = __dp4a(w.w, 0x01010101, v);
    }
    if constexpr (kGroup == 16) {
      if (i < n16) xsum[i] = v;
    } else {
      v += __shfl_xor_sync(0xFFFFFFFFu, v, 1);  // n16 is even: a pair is in or out together
      if (i < n16 && i % 2 == 0) xsum[i / 2] = v;
    }
  }

  const int groups = 32 / tr, row = lane % tr, worker = warp * groups + lane / tr, workers = 4 * groups;
  int issued = first, slot = 0;
  for (int s = 0; s < ns; ++s) {
    cp_async_wait_upto(issued - s - 1);
    __syncthreads();  // slice s (and, the first time, the activations) visible to every thread
    if (row < rows) {
      const int b0 = s * sb, nbs = nb - b0 < sb ? nb - b0 : sb;
      const int head = T == GgmlType::Q6_K
                           ? int(reinterpret_cast<uintptr_t>(w0 + size_t(row) * rb + size_t(b0) * L::kBytes) & 15)
                           : 0;
      const uint8_t *base = buf + size_t(slot) * tr * pitch + row * pitch + head;
      for (int bi = worker; bi < nbs; bi += workers) {
        const int b = b0 + bi;
        float t[NR];
        if constexpr (T == GgmlType::Q6_K) {
          mvs_block_q6k<NR>(base + bi * L::kBytes, xs + 256 * b, int(K), xsum + 16 * b, int(K / 16), xdl + b, nb, t);
        } else {
          mvs_block<T, NR>(base + bi * L::kBytes, xs + 256 * b, int(K), xsum + 8 * b, int(K / 32), xdl + b, nb, t);
        }
#pragma unroll
        for (int q = 0; q < NR; ++q) terms[(q * tr + row) * nbp + b] = t[q];
      }
    }
    __syncthreads();  // every thread is done with buffer s % nbuf
    if (issued < ns) stage(issued++, slot);
    slot = slot + 1 == nbuf ? 0 : slot + 1;
  }
  for (int t = tid; t < NR * tr; t += kMvsThreads) {
    const int q = t / tr, o = t % tr;
    if (o < rows) {
      float acc = 0.0f;
      for (int b = 0; b < nb; ++b) acc = __fadd_rn(acc, terms[(q * tr + o) * nbp + b]);
      set.y[m][size_t(q) * set.n_out[m] + r0 + o] = acc;
    }
  }
}

// GEIST_CUDA_MVS=0 turns the kernel off (one row then takes mvmma or the dp4a matvec, as
// before); GEIST_CUDA_MVS_TR / _SB / _NBUF force its shape; GEIST_CUDA_MVS_MIN_KIB and
// GEIST_CUDA_MVS_HEAD (below) widen where it runs. Knobs to compare; the bits are the same.
bool mvs_enabled() {
  static const bool v = env_int("GEIST_CUDA_MVS", 1) != 0;
  return v;
}

// GEIST_CUDA_MVS_Q6K=0: Q6_K keeps the older kernels for one row.
bool mvs_q6k() {
  static const bool v = env_int("GEIST_CUDA_MVS_Q6K", 1) != 0;
  return v;
}

MvsShape mvs_shape(int64_t outputs, int64_t nb) {
  static const int f_tr = env_int("GEIST_CUDA_MVS_TR", 0), f_sb = env_int("GEIST_CUDA_MVS_SB", 0),
                   f_nbuf = env_int("GEIST_CUDA_MVS_NBUF", 0);
  // The most outputs per block that still give ~4 blocks per SM (H200, one row: E4B gate
  // alone 10.3 us at 32 outputs per block, 320 blocks, against 8.4 at 16; gate+up 14.2 at 32,
  // 640 blocks, against 15.5 at 16; the down projection, 2560 outputs, at 8).
  const int64_t want = int64_t(4) * device_sm_count();  // blocks
  // GEIST_CUDA_MVS_L2PF=0: plain 16-byte copies. By default each copy asks for the 256 bytes
  // around it (a thread's next chunks of the row are then L2 hits): H100, PerfDecode, E4B
  // gate+up 15.53 / 15.51 -> 14.78 / 14.80 us, the other shapes within 0.1 us.
  static const bool l2pf = env_int("GEIST_CUDA_MVS_L2PF", 1) != 0;
  MvsShape sh{8, 16, 2, l2pf};
  if (outputs / 32 >= want) {
    sh.tr = 32;
  } else if (outputs / 16 >= want) {
    sh.tr = 16;
  }
  if (f_tr == 4 || f_tr == 8 || f_tr == 16 || f_tr == 32) sh.tr = f_tr;
  // About one super-block per thread and slice; the whole row in one slice where it is at
  // most twice that.
  sh.sb = kMvsThreads / sh.tr;
  if (nb <= 2 * sh.sb) {
    sh.sb = int(nb);
    sh.nbuf = 1;
  }
  if (f_sb > 0 && f_sb <= 64) sh.sb = f_sb;
  if (f_nbuf >= 1 && f_nbuf <= 3) sh.nbuf = f_nbuf;
  return sh;
}

// Where the kernel runs by default: calls of at least GEIST_CUDA_MVS_MIN_KIB of weights
// (default 4096), the output head included (GEIST_CUDA_MVS_HEAD=0: at most 65536 outputs, the
// head left to mvmma). The head on this kernel since the copies prefetch 256 bytes (H100,
// 2026-12-06, E4B tg128 alternated in one call: 319.4 / 318.1 / 319.4 against 316.4 / 314.4 /
// 316.3 with it on mvmma; in the call before 319.9 / 316.2 against 313.8 / 316.2). Before, on the
// H200 (tg128, one call, 2026-12-05): E4B 263.5 t/s with the kernel off, 267.7 on for every
// K-quant call, 273.3 with the output head (Q6_K 2560 x 262144) left to mvmma; Gemma 3 270M
// 863.0 off, 841.0 on (its Q4_K/Q6_K matrices have 640 outputs and under 1 MiB: 80 blocks of
// 8 outputs leave SMs idle). Per call (PerfDecode, us, older kernels -> this one): E4B
// gate+up 16.6 -> 14.3, gate 9.4 -> 8.4, down Q4_K 11.3 -> 10.1, down Q6_K 16.8 -> 14.7;
// the 1-3 MB attention matrices within +-0.5 us either way (q 4.5 -> 4.6, o 3.9 -> 4.2,
// k 3.9 -> 3.8, v 4.7 -> 4.3).
bool mvs_head() {
  static const bool v = env_int("GEIST_CUDA_MVS_HEAD", 1) != 0;
  return v;
}
int64_t mvs_min_bytes() {
  static const int64_t v = int64_t(env_int("GEIST_CUDA_MVS_MIN_KIB", 4096)) * 1024;
  return v;
}

// Activation rows the kernel takes (1 to 4; each lane unpacks a super-block once for all of
// them): GEIST_CUDA_MVS_ROWS, default 1. More rows otherwise take the tensor-core kernel.
int mvs_max_rows() {
  static const int v = std::min(env_int("GEIST_CUDA_MVS_ROWS", 1), 4);
  return v;
}

// false where it does not apply (the caller then takes another kernel).
template <GgmlType T>
bool launch_mvs(const DevMatrix *ws, float *const *ys, int n_mat, const int8_t *xq, const float *xd, int n_rows,
                CudaStream s) {
  if constexpr (T != GgmlType::Q4_K && T != GgmlType::Q5_K && T != GgmlType::Q6_K) {
    return false;
  } else {
    if (!mvs_enabled() || n_rows < 1 || n_rows > mvs_max_rows() || n_mat <= 0 || n_mat > kMaxSet ||
        (reinterpret_cast<uintptr_t>(xq) & 15) != 0) {
      return false;
    }
    if (T == GgmlType::Q6_K && !mvs_q6k()) return false;
    const int64_t K = ws[0].n_in;
    int64_t outputs = 0, bytes = 0;
    for (int m = 0; m < n_mat; ++m) {
      if ((reinterpret_cast<uintptr_t>(ws[m].data) & 15) != 0 || ws[m].row_bytes % 4 != 0 ||
          (ws[m].n_out * int64_t(ws[m].row_bytes)) % 16 != 0) {
        return false;
      }
      outputs += ws[m].n_out;
      bytes += ws[m].n_out * int64_t(ws[m].row_bytes);
    }
    if ((outputs > 65536 && !mvs_head()) || bytes < mvs_min_bytes()) return false;
    const MvsShape sh = mvs_shape(outputs, K / 256);
    // Q6_K: every piece must start 4-byte aligned (0, 4, 8 or 12 bytes into its first chunk,
    // the room mvs_pitch leaves), so an even number of blocks per row and per slice.
    if (T == GgmlType::Q6_K && ((K / 256) % 2 != 0 || (sh.sb % 2 != 0 && sh.sb < K / 256))) return false;
    // Above 48 KiB the kernel is allowed the device's whole opt-in limit, once: the shapes
    // differ from call to call, and an attribute set to the first call's size would fail
    // the later, larger launches.
    const size_t smem = mvs_smem<T>(K, sh, n_rows);
    bool ok = false;
    auto go = [&](auto kernel, std::atomic<uint64_t> &done) {
      if (smem > size_t(48 * 1024) &&
          (smem > device_optin_smem() || !allow_dynamic_smem(kernel, device_optin_smem(), done))) {
        return;
      }
      MvSet set{};
      set.n = n_mat;
      for (int m = 0; m < n_mat; ++m) {
        set.w[m] = ws[m].data;
        set.row_bytes[m] = ws[m].row_bytes;
        set.y[m] = ys[m];
        set.n_out[m] = ws[m].n_out;
        set.first[m + 1] = set.first[m] + (ws[m].n_out + sh.tr - 1) / sh.tr;
      }
      launch_smem(kernel, dim3(unsigned(set.first[n_mat])), dim3(kMvsThreads), smem, s, set, K, xq, xd, sh);
      ok = true;
    };
    static std::atomic<uint64_t> done[4];
    switch (n_rows) {
      case 1: go(mvs_kernel<T, 1>, done[0]); break;
      case 2: go(mvs_kernel<T, 2>, done[1]); break;
      case 3: go(mvs_kernel<T, 3>, done[2]); break;
      default: go(mvs_kernel<T, 4>, done[3]); break;
    }
    return ok;
  }
}

template <class F>
bool dispatch_kquant(GgmlType t, F &&f) {
  using G = GgmlType;
  return dispatch_among<G, G::Q2_K, G::Q3_K, G::Q4_K, G::Q5_K, G::Q6_K>(t, std::forward<F>(f));
}

// Warps per output of the matrix-vector kernel: 1 where the outputs alone give the device
// enough warps (8192), else 2, 4 or 8 (at most one 4-block step per warp). GEIST_CUDA_MATVEC_SPLIT=0:
// always 1 (a knob to compare; the bits are the same).
int matvec_split(int64_t outputs, int64_t nb, int rows) {
  static const bool on = [] {
    const char *e = std::getenv("GEIST_CUDA_MATVEC_SPLIT");
    return !(e != nullptr && e[0] == '0');
  }();
  if (!on || rows > 2 || nb > kMvSplitMaxBlocks) return 1;
  const int64_t steps = (nb + 3) / 4;
  int p = 1;
  while (p < 8 && outputs * p < 8192 && 2 * p <= steps) p *= 2;
  return p;
}

template <GgmlType T, int R>
void launch_matvec(const MvSet &set, int64_t K, const int8_t *xq, const float *xd, int n_rows, CudaStream s) {
  const int64_t outputs = set.first[set.n];
  auto go = [&](auto kernel, int p) {
    const int outs = kMvWarps / p;
    launch(kernel, dim3(unsigned((outputs + outs - 1) / outs)), kMvWarps * 32, s, set, K, xq, xd, n_rows);
  };
  if constexpr (R <= 2) {
    switch (matvec_split(outputs, K / 256, R)) {
      case 2: return go(matvec_kernel<T, R, 2>, 2);
      case 4: return go(matvec_kernel<T, R, 4>, 4);
      case 8: return go(matvec_kernel<T, R, 8>, 8);
      default: break;
    }
  }
  go(matvec_kernel<T, R, 1>, 1);
}


// One row of a Q4_K run then a Q6_K run (q, k and v of Q4_K_M) in one launch of the dp4a
// matvec where each run alone would take it (GEIST_CUDA_MIXED_SET=0 turns it off; on by
// default since it passed its op and model tests on an H100: E4B tg128 +2-3 %).
bool mixed_set_enabled() {
  static const bool v = env_int("GEIST_CUDA_MIXED_SET", 1) != 0;
  return v;
}

MvSet one_row_set(const DevMatrix *ws, float *const *ys, int n) {
  MvSet set{};
  set.n = n;
  set.prefetch = prefetch_mode();
  set.first[0] = 0;
  for (int i = 0; i < n; ++i) {
    set.w[i] = ws[i].data;
    set.row_bytes[i] = ws[i].row_bytes;
    set.y[i] = ys[i];
    set.n_out[i] = ws[i].n_out;
    set.first[i + 1] = set.first[i] + ws[i].n_out;
  }
  return set;
}

// GEIST_CUDA_MVMMA_P=1/2/4/8: the warps per 16 outputs of mvmma_kernel, forced, and the
// kernel taken for one row whatever the matrix (knobs to compare and to test; the bits are
// the same); 0 when unset.
int mvmma_forced_split() {
  static const int v = [] {
    const char *e = std::getenv("GEIST_CUDA_MVMMA_P");
    const int p = e == nullptr ? 0 : std::atoi(e);
    return p == 1 || p == 2 || p == 4 || p == 8 ? p : 0;
  }();
  return v;
}

// Warps per 16 outputs of mvmma_kernel: the fewest (1, 2, 4, 8) that give the device 8
// warps per SM, each keeping at least 2 super-blocks, of those whose terms fit 48 KiB of
// shared memory (measured on the H200: E4B gate+up, 1280 tiles, is fastest at 1; the down
// projection, 160 tiles, at 8).
// Shared memory of mvmma_kernel with p warps per 16 outputs: its tiles' f32 terms.
size_t mvmma_terms_bytes(int p, int n_rows, int nb) { return size_t(kMmWarps / p) * 16 * n_rows * nb * sizeof(float); }

int mvmma_split(int64_t tiles, int nb, int n_rows, size_t smem_limit) {
  const int forced = mvmma_forced_split();
  auto fits = [&](int p) { return mvmma_terms_bytes(p, n_rows, nb) <= smem_limit; };
  if (forced != 0) return fits(forced) ? forced : 1;
  int best = 1;
  for (int p = 2; p <= 8 && tiles * best < int64_t(8) * device_sm_count() && 2 * p <= nb; p *= 2) {
    if (fits(p)) best = p;
  }
  return best;
}

// The device's opt-in shared memory per block (at least the default 48 KiB), which the
// 17-32-row launches may take.

template <GgmlType T>
void launch_mvmma(const MvSet &set, int64_t K, const int8_t *xq, const float *xd, int n_rows, CudaStream s) {
  const int64_t tiles = set.first[set.n];
  const int nb = int(K / 256);
  if (tiles <= 0 || n_rows <= 0 || n_rows > 32) return;  // callers never pass these (matmul, matmul_n)
  auto go = [&](auto kernel, int p) {
    const int per = kMmWarps / p;
    const size_t smem = p > 1 ? mvmma_terms_bytes(p, n_rows, nb) : 0;
    launch_smem(kernel, dim3(unsigned((tiles + per - 1) / per)), dim3(kMmWarps * 32), smem, s, set, K, xq, xd,
                n_rows);
  };
  // Up to 16 rows the terms of P > 1 warps stay within 48 KiB (as measured); from 17 rows
  // (three and four B tiles) the down projection's 40 super-blocks need up to 80 KiB for
  // P = 8, so those take the device's opt-in limit (without it they fell back to P = 1: one
  // warp per 16 outputs walking all of K, E4B 20 rows 11.2 -> 11.9 ms per call).
  const size_t limit = n_rows > 16 ? device_optin_smem() : size_t(48 * 1024);
  auto pick = [&](auto nb_tag) {
    constexpr int NB = decltype(nb_tag)::value;
    // P warps per 16 outputs if its terms fit the default 48 KiB or the kernel may take more.
    auto with = [&](auto p_tag) {
      constexpr int P = decltype(p_tag)::value;
      static std::atomic<uint64_t> done{0};
      if (mvmma_terms_bytes(P, n_rows, nb) > size_t(48 * 1024) &&
          !allow_dynamic_smem(mvmma_kernel<T, P, NB>, device_optin_smem(), done)) {
        return false;
      }
      go(mvmma_kernel<T, P, NB>, P);
      return true;
    };
    switch (mvmma_split(tiles, nb, n_rows, limit)) {
      case 2: if (with(std::integral_constant<int, 2>{})) return; break;
      case 4: if (with(std::integral_constant<int, 4>{})) return; break;
      case 8: if (with(std::integral_constant<int, 8>{})) return; break;
      default: break;
    }
    go(mvmma_kernel<T, 1, NB>, 1);
  };
  if (n_rows <= 8) {
    pick(std::integral_constant<int, 1>{});
  } else if (n_rows <= 16) {
    pick(std::integral_constant<int, 2>{});
  } else if (n_rows <= 24) {
    pick(std::integral_constant<int, 3>{});
  } else {
    pick(std::integral_constant<int, 4>{});
  }
}

}  // namespace

bool kquant_fast_path(quant::GgmlType t) {
  return t == GgmlType::Q2_K || t == GgmlType::Q3_K || t == GgmlType::Q4_K || t == GgmlType::Q5_K ||
         t == GgmlType::Q6_K;
}

int kquant_mma_min_rows() {
  static const int v = [] {
    int dev = 0, major = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) {
      return 1 << 30;
    }
    return major >= 8 ? 9 : 1 << 30;  // int8 MMA of these shapes needs sm_80
  }();
  return v;
}

size_t device_optin_smem() {
  static const size_t v = [] {
    int dev = 0, optin = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess) {
      return size_t(48 * 1024);
    }
    return std::max(size_t(optin), size_t(48 * 1024));
  }();
  return v;
}

int device_sm_count() {
  static const int v = [] {
    int dev = 0, n = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) {
      return 1;
    }
    return n > 0 ? n : 1;
  }();
  return v;
}


int kquant_matvec_max_rows() {
  static const int v = env_int("GEIST_CUDA_MATVEC_ROWS", 2);
  return v;
}

// Up to 32 rows (the default): NB = ceil(rows / 8) B tiles per warp. Measured on the H200
// (E4B, ms per prefill call, few-rows kernel -> this one): 9 / 12 / 16 rows 7.63 / 7.89 /
// 8.08 -> 6.87 / 7.27 / 7.86; with 17-32 rows too (8cf76e3's opt-in shared memory for the
// P > 1 terms) 17 / 20 / 24 / 25 / 31 / 32 rows 10.94 / 11.01 / 11.39 / 11.81 / 12.12 /
// 12.37 -> 8.26 / 8.70 / 9.28 / 9.83 / 10.51 / 11.09, every count of 16-32 within 5 % of the
// line; 32 sessions' batched decode 1807 -> 1990 tokens/s. GEIST_CUDA_MVMMA_ROWS=16 is the
// previous default, 0 turns it off.
int kquant_mvmma_max_rows() {
  static const int v = std::min(env_int("GEIST_CUDA_MVMMA_ROWS", 32), 32);
  return v;
}

// 32: from 33 rows matmul_wtile_kernel is faster on the H200 (E4B, ms per 64-row prefill
// call: 24.9 with the few-rows kernel up to 64 rows, 20.8 with it up to 32; at 17-32 rows
// the few-rows kernel wins, 14.7-16.1 against 18.2-19.4).
int kquant_skinny_max_rows() {
  static const int v = env_int("GEIST_CUDA_SKINNY_ROWS", wtile_nt() != 0 ? 32 : 64);
  return v;
}

namespace {
// GEIST_CUDA_TAIL_ROWS=T (default 0: off; at most 63): a call of more than 64 rows whose
// last 64-row tile would hold 1..T rows runs those rows as a call of their own (the
// matrix-vector / few-rows kernels), so that they do not pay a whole tile's weight loads.
// Rows are independent and every kernel gives the same bits, so the split does not change
// them. `bench rows` E4B (H100, one call), ms per call, off -> 16: 65 16.64 -> 14.14, 72
// 16.23 -> 15.46, 129 20.60 -> 18.29, 136 20.35 -> 19.96, 193 28.28 -> 22.11, 200 27.26 ->
// 24.59, 257 32.42 -> 29.63; but a tail of 16 rows costs more alone (80 15.60 -> 16.45, 144
// 20.18 -> 20.97; 32: 160 19.95 -> 23.60), hence 8.
// Not where the wide blocks may take the call (more than 192 rows, wtile_wide_rows): they split
// a call's rows evenly, so a tail costs a few rows in each block instead of a weight pass. H100
// (`bench rows` E4B, ms per call, tail split -> not, two rounds): 200 rows 24.58 / 24.30 ->
// 22.40 / 21.70, 258 31.48 / 30.60 -> 26.40 / 26.29, 264 32.12 / 31.19 -> 26.66 / 26.32, 322
// 35.03 / 34.03 -> 34.66 / 33.60, 386 39.43 / 38.17 -> 37.00 / 35.94, 450 44.05 / 42.88 ->
// 41.83 / 40.75.
// Off by default since the 32-row blocks for small grids (wtile4_min_blocks) took the 65-192-row
// calls: there the split became the slower way. H100 (2026-12-06, d679d3f, `bench rows` E4B
// 1..512, ms per call, split of up to 8 rows -> none): 65 14.38 -> 13.18, 68 15.68 -> 13.14, 72
// 16.05 -> 13.26 (73 13.73 / 13.44), 129 18.97 -> 18.63, 132 19.77 -> 18.70, 136 20.18 -> 18.76
// (137 18.36 / 18.55); row counts flagged at 5 % (align 16) 40 -> 30.
// Only for matrices that have the wide blocks (Q4_K, Q5_K, Q6_K: every one of the call's n_mat).
int kquant_tail_rows(int n_rows, const DevMatrix *ws, int n_mat) {
  static const int v = std::min(env_int("GEIST_CUDA_TAIL_ROWS", 0), 63);
  if (v <= 0 || n_rows <= 64 || wtile_persist() != 0) return 0;
  const bool wide_rows = wtile_nt() == 12 || (wtile_nt() == 8 && wtile12_enabled() && n_rows > 192);
  if (wide_rows && std::all_of(ws, ws + n_mat, [](const DevMatrix &w) { return wtile_wide_type(w.type); })) {
    return 0;
  }
  const int t = n_rows % 64;
  return t <= v ? t : 0;
}
// ys[m] advanced by `rows` rows of matrix m's outputs, for up to kMaxTailSet matrices.
constexpr int kMaxTailSet = 8;
std::array<float *, kMaxTailSet> rows_after(const DevMatrix *ws, float *const *ys, int n_mat, int rows) {
  std::array<float *, kMaxTailSet> out{};
  for (int m = 0; m < n_mat && m < kMaxTailSet; ++m) out[size_t(m)] = ys[m] + size_t(rows) * size_t(ws[m].n_out);
  return out;
}

// Whether n_rows rows of wm take the few-rows MMA kernel (matmul_skinny_kernel).
bool kquant_skinny(const DevMatrix &wm, int n_rows) {
  if (n_rows <= kquant_matvec_max_rows()) return false;
  if (n_rows <= kquant_skinny_max_rows()) return true;
  const int64_t tiles = (wm.n_out + kTile - 1) / kTile * ((n_rows + kTile - 1) / kTile);
  return wtile_nt() == 0 && n_rows <= 2 * kquant_skinny_max_rows() && n_rows <= 128 && tiles < device_sm_count();
}
}  // namespace

void matmul_kquant_n(const DevMatrix *ws, float *const *ys, int n_mat, const int8_t *xq, const float *xd, int n_rows,
                     CudaStream s) {
  if (n_mat <= 0) return;
  if (const int t = kquant_tail_rows(n_rows, ws, n_mat); t > 0 && n_mat <= kMaxTailSet) {
    const int h = n_rows - t;  // a multiple of 64: not split again
    const int64_t K = ws[0].n_in;
    matmul_kquant_n(ws, ys, n_mat, xq, xd, h, s);
    const auto yt = rows_after(ws, ys, n_mat, h);
    matmul_kquant_n(ws, yt.data(), n_mat, xq + size_t(h) * size_t(K), xd + size_t(h) * size_t(K / 256), t, s);
    return;
  }
  dispatch_kquant(ws[0].type, [&](auto tag) {
    constexpr GgmlType T = decltype(tag)::value;
    // One row of Q4_K / Q5_K / Q6_K (decode; up to mvs_max_rows rows): the shared-memory staged kernel.
    if (launch_mvs<T>(ws, ys, n_mat, xq, xd, n_rows, s)) return;
    const int64_t K = ws[0].n_in;
    const bool mma = kquant_mma_min_rows() < (1 << 30);
    // The few-rows kernel also takes up to twice its row count for a matrix whose 64 x 64
    // tiles would not give every SM one (the down projection, 2560 outputs: 80 tiles at 65-128
    // rows, each a serial walk over K); the bits are the same either way.
    // (Not with matmul_wtile_kernel, which measured faster there: E4B 129 rows 30.4 ms per
    // call against 36.1 for 128 with the down projection and q/k/v/o on the few-rows kernel.)
    auto skinny = [&](const DevMatrix &wm) { return kquant_skinny(wm, n_rows); };
    // One row: the tensor-core kernel only where the matrices give it many tiles (E4B's
    // gate+up and gate: 16.6 vs 18.3 us); on the down projection and the attention
    // matrices the dp4a kernel is faster for one row (H200: down Q6_K 16.9 vs 18.9, q 4.5
    // vs 5.2 us). From 2 rows on the tensor-core kernel wins everywhere measured.
    int64_t all_tiles = 0;
    for (int m = 0; m < n_mat; ++m) all_tiles += (ws[m].n_out + 15) / 16;
    if (mma && n_rows <= kquant_mvmma_max_rows() &&
        (n_rows >= 2 || all_tiles >= kMvmmaMinTiles1 || mvmma_forced_split() != 0)) {
      for (int m0 = 0; m0 < n_mat; m0 += kMaxSet) {
        const int nm = n_mat - m0 < kMaxSet ? n_mat - m0 : kMaxSet;
        MvSet set{};
        set.n = nm;
        // No L2 prefetch by default: asking for the whole matrix at launch queues each warp's
        // first blocks behind every other warp's (measured on the H200: gate+up 19.5 -> 16.6
        // us). GEIST_CUDA_MVMMA_PREFETCH=1/2 turns it on as GEIST_CUDA_PREFETCH does.
        static const int mvmma_pf = [] {
          const char *e = std::getenv("GEIST_CUDA_MVMMA_PREFETCH");
          return e != nullptr && e[0] >= '0' && e[0] <= '2' ? e[0] - '0' : 0;
        }();
        set.prefetch = mvmma_pf;
        for (int i = 0; i < nm; ++i) {
          const DevMatrix &w = ws[m0 + i];
          set.w[i] = w.data;
          set.row_bytes[i] = w.row_bytes;
          set.y[i] = ys[m0 + i];
          set.n_out[i] = w.n_out;
          set.first[i + 1] = set.first[i] + (w.n_out + 15) / 16;
        }
        launch_mvmma<T>(set, K, xq, xd, n_rows, s);
      }
      return;
    }
    bool all_skinny = mma;
    for (int m = 0; all_skinny && m < n_mat; ++m) all_skinny = skinny(ws[m]);
    if (all_skinny) {
      for (int m = 0; m < n_mat; ++m) {
        const dim3 grid(unsigned((ws[m].n_out + 15) / 16));
        for (int r = 0; r < n_rows; r += 32) {
          const int nr = n_rows - r < 32 ? n_rows - r : 32;
          const int8_t *xr = xq + size_t(r) * K;
          const float *dr = xd + size_t(r) * (K / 256);
          float *yr = ys[m] + size_t(r) * ws[m].n_out;
          auto go = [&](auto kernel) {
            launch(kernel, grid, kSkWarps * 32, s, ws[m].data, ws[m].row_bytes, K, ws[m].n_out, xr, dr, yr, nr,
                   prefetch_mode());
          };
          if (nr <= 8) {
            go(matmul_skinny_kernel<T, 1>);
          } else if (nr <= 16) {
            go(matmul_skinny_kernel<T, 2>);
          } else {
            go(matmul_skinny_kernel<T, 4>);
          }
        }
      }
      return;
    }
    if (n_rows >= kquant_mma_min_rows() && n_rows > kquant_matvec_max_rows()) {
      for (int m = 0; m < n_mat; ++m) {
        if (skinny(ws[m])) {
          matmul_kquant_n(ws + m, ys + m, 1, xq, xd, n_rows, s);  // the few-rows kernel for this one
          continue;
        }
        if (wtile_nt() != 0) {
          launch_wtile<T>(ws[m], xq, xd, ys[m], n_rows, s);
          continue;
        }
        const dim3 grid(unsigned((ws[m].n_out + kTile - 1) / kTile), unsigned((n_rows + kTile - 1) / kTile));
        launch(matmul_mma_kernel<T>, grid, 128, s, ws[m].data, ws[m].row_bytes, K, ws[m].n_out, xq, xd, ys[m], n_rows,
               prefetch_mode());
      }
      return;
    }
    for (int m0 = 0; m0 < n_mat; m0 += kMaxSet) {
      const int nm = n_mat - m0 < kMaxSet ? n_mat - m0 : kMaxSet;
      // 1..8 rows per launch (more rows on a device without int8 MMA: blocks of 8).
      for (int r = 0; r < n_rows; r += 8) {
        const int nr = n_rows - r < 8 ? n_rows - r : 8;
        MvSet set{};
        set.n = nm;
        set.prefetch = prefetch_mode();
        set.first[0] = 0;
        for (int i = 0; i < nm; ++i) {
          const DevMatrix &w = ws[m0 + i];
          set.w[i] = w.data;
          set.row_bytes[i] = w.row_bytes;
          set.y[i] = ys[m0 + i] + size_t(r) * w.n_out;
          set.n_out[i] = w.n_out;
          set.first[i + 1] = set.first[i] + w.n_out;
        }
        const int8_t *xr = xq + size_t(r) * K;
        const float *dr = xd + size_t(r) * (K / 256);
        if (nr == 1) {
          launch_matvec<T, 1>(set, K, xr, dr, nr, s);
        } else if (nr == 2) {
          launch_matvec<T, 2>(set, K, xr, dr, nr, s);
        } else if (nr <= 4) {
          launch_matvec<T, 4>(set, K, xr, dr, nr, s);
        } else {
          launch_matvec<T, 8>(set, K, xr, dr, nr, s);
        }
      }
    }
  });
}

bool q32_mma_type(quant::GgmlType t) {
  return t == GgmlType::Q4_0 || t == GgmlType::Q5_0 || t == GgmlType::Q8_0;
}

void matmul_q32_mma(const DevMatrix &w, const int8_t *xq, const float *xd, float *y, int n_rows, CudaStream s) {
  const dim3 grid(unsigned((w.n_out + kTile - 1) / kTile), unsigned((n_rows + kTile - 1) / kTile));
  using G = GgmlType;
  dispatch_among<G, G::Q4_0, G::Q5_0, G::Q8_0>(w.type, [&](auto tag) {
    constexpr GgmlType T = decltype(tag)::value;
    launch(matmul_q32_mma_kernel<T>, grid, 128, s, w.data, w.row_bytes, w.n_in, w.n_out, xq, xd, y, n_rows,
           prefetch_mode());
  });
}

// GEIST_CUDA_WTILE_SET=0: a launch of matmul_wtile_kernel per matrix (a knob to compare).
bool wtile_set_enabled() {
  static const bool v = env_int("GEIST_CUDA_WTILE_SET", 1) != 0;
  return v;
}

bool matmul_kquant_wtile_set(const DevMatrix *ws, float *const *ys, int n_mat, const int8_t *xq, const float *xd,
                             int n_rows, CudaStream s) {
  using G = GgmlType;
  if (!wtile_set_enabled() || reference_kernels() || wtile_nt() == 0 || n_mat < 2 || n_mat > kWtSetMax ||
      n_rows < kquant_mma_min_rows() || n_rows <= kquant_matvec_max_rows() || n_rows <= kquant_mvmma_max_rows()) {
    return false;
  }
  if (const int t = kquant_tail_rows(n_rows, ws, n_mat)) {
    // The set for the rows up to the last multiple of 64, then the tail's rows as calls of
    // their own (a run of one type per call).
    const int h = n_rows - t;
    if (!matmul_kquant_wtile_set(ws, ys, n_mat, xq, xd, h, s)) return false;
    const int64_t K = ws[0].n_in;
    const auto yt = rows_after(ws, ys, n_mat, h);
    for (int m0 = 0; m0 < n_mat;) {
      int m1 = m0 + 1;
      while (m1 < n_mat && ws[m1].type == ws[m0].type) ++m1;
      matmul_kquant_n(ws + m0, yt.data() + m0, m1 - m0, xq + size_t(h) * size_t(K), xd + size_t(h) * size_t(K / 256), t,
                      s);
      m0 = m1;
    }
    return true;
  }
  const G t0 = ws[0].type;
  G t1 = t0;
  for (int m = 0; m < n_mat; ++m) {
    if (!kquant_fast_path(ws[m].type) || ws[m].n_in != ws[0].n_in || kquant_skinny(ws[m], n_rows)) return false;
    if (ws[m].type != t0) {
      if (t1 != t0 && ws[m].type != t1) return false;
      t1 = ws[m].type;
    }
  }
  // Two types only as Q4_K_M mixes them (Q4_K with Q6_K).
  const bool mixed = t1 != t0;
  if (mixed && !((t0 == G::Q4_K && t1 == G::Q6_K) || (t0 == G::Q6_K && t1 == G::Q4_K))) return false;
  WtSet set{};
  set.n = n_mat;
  int64_t cols = 0;
  for (int m = 0; m < n_mat; ++m) {
    set.w[m] = ws[m].data;
    set.row_bytes[m] = ws[m].row_bytes;
    set.n_out[m] = ws[m].n_out;
    set.y[m] = ys[m];
    set.alt[m] = mixed && ws[m].type != G::Q4_K;  // T0 = Q4_K, T1 = Q6_K
    set.first[m] = cols;
    cols += (ws[m].n_out + 16 * kWtWarps - 1) / (16 * kWtWarps);
  }
  set.first[n_mat] = cols;
  if (wtile_persist() != 0) {
    if (mixed) return launch_wtile_persist<G::Q4_K, G::Q6_K>(set, ws[0].n_in, xq, xd, n_rows, s);
    return dispatch_kquant(t0, [&](auto tag) {
      constexpr G T = decltype(tag)::value;
      launch_wtile_persist<T, T>(set, ws[0].n_in, xq, xd, n_rows, s);
    });
  }
  const bool nt4 = wtile_nt4(cols, n_rows);  // on the whole grid
  const int rpb = wtile_grid_rows(cols, n_rows);  // 32: the 4-tile kernel, else the 8-tile one
  auto go = [&](auto kernel, size_t smem) {
    const dim3 grid(unsigned(cols), unsigned((n_rows + rpb - 1) / rpb));
    launch_smem(kernel, grid, dim3(kWtWarps * 32), smem, s, set, ws[0].n_in, xq, xd, n_rows, rpb);
  };
  // The wide blocks (wtile_wide_rows) where the set's grid asks for them. `done`: the
  // kernel's own opt-in flags (every set kernel has the same type, so not a static here).
  const int wide = wtile_wide_rows(cols, n_rows, nt4 ? 32 : 64, true);
  auto go_wide = [&](auto kernel, size_t smem, std::atomic<uint64_t> &done) {
    if (!allow_dynamic_smem(kernel, smem, done)) return false;
    const dim3 grid(unsigned(cols), unsigned((n_rows + wide - 1) / wide));
    launch_smem(kernel, grid, dim3(kWtWarps * 32), smem, s, set, ws[0].n_in, xq, xd, n_rows, wide);
    return true;
  };
  if (mixed) {
    static std::atomic<uint64_t> done_mixed{0};
    if (wide > 0 && go_wide(matmul_wtile_set_kernel<G::Q4_K, G::Q6_K, 12>,
                            std::max(wtile_smem<G::Q4_K, 12>(), wtile_smem<G::Q6_K, 12>()), done_mixed)) {
      return true;
    }
    if (rpb == 32) {
      go(matmul_wtile_set_kernel<G::Q4_K, G::Q6_K, 4>, std::max(wtile_smem<G::Q4_K, 4>(), wtile_smem<G::Q6_K, 4>()));
    } else {
      go(matmul_wtile_set_kernel<G::Q4_K, G::Q6_K, 8>, std::max(wtile_smem<G::Q4_K, 8>(), wtile_smem<G::Q6_K, 8>()));
    }
    return true;
  }
  return dispatch_kquant(t0, [&](auto tag) {
    constexpr G T = decltype(tag)::value;
    if constexpr (wtile_wide_type(T)) {
      static std::atomic<uint64_t> done{0};  // one per T: this lambda's body is instantiated per type
      if (wide > 0 && go_wide(matmul_wtile_set_kernel<T, T, 12>, wtile_smem<T, 12>(), done)) return;
    }
    if (rpb == 32) {
      go(matmul_wtile_set_kernel<T, T, 4>, wtile_smem<T, 4>());
    } else {
      go(matmul_wtile_set_kernel<T, T, 8>, wtile_smem<T, 8>());
    }
  });
}

bool matmul_kquant_mixed(const DevMatrix *ws, float *const *ys, int n_mat, const int8_t *xq, const float *xd,
                         int n_rows, CudaStream s) {
  using G = GgmlType;
  if (!mixed_set_enabled() || n_rows != 1 || n_mat < 2 || reference_kernels()) return false;
  int split = 0;
  while (split < n_mat && ws[split].type == G::Q4_K) ++split;
  if (split == 0 || split == n_mat || split > kMaxSet || n_mat - split > kMaxSet) return false;
  for (int m = split; m < n_mat; ++m) {
    if (ws[m].type != G::Q6_K) return false;
  }
  // Only where each run alone would take the dp4a matvec: under the staged kernel's size and
  // the one-row tensor-core kernel's tile count.
  auto dp4a_alone = [&](int m0, int m1) {
    int64_t bytes = 0, tiles = 0;
    for (int m = m0; m < m1; ++m) {
      bytes += int64_t(ws[m].row_bytes) * ws[m].n_out;
      tiles += (ws[m].n_out + 15) / 16;
    }
    const bool mma = kquant_mma_min_rows() < (1 << 30) && kquant_mvmma_max_rows() >= 1;
    return (!mvs_enabled() || bytes < mvs_min_bytes()) &&
           !(mma && (tiles >= kMvmmaMinTiles1 || mvmma_forced_split() != 0));
  };
  if (!dp4a_alone(0, split) || !dp4a_alone(split, n_mat)) return false;
  const int64_t K = ws[0].n_in;
  const MvSet s1 = one_row_set(ws, ys, split), s2 = one_row_set(ws + split, ys + split, n_mat - split);
  const int64_t outputs = s1.first[s1.n] + s2.first[s2.n];
  auto go = [&](auto kernel, int p) {
    const int outs = kMvWarps / p;
    const int64_t b1 = (s1.first[s1.n] + outs - 1) / outs, b2 = (s2.first[s2.n] + outs - 1) / outs;
    launch(kernel, dim3(unsigned(b1 + b2)), kMvWarps * 32, s, s1, s2, b1, K, xq, xd);
  };
  switch (matvec_split(outputs, K / 256, 1)) {
    case 2: go(matvec2_kernel<G::Q4_K, G::Q6_K, 2>, 2); break;
    case 4: go(matvec2_kernel<G::Q4_K, G::Q6_K, 4>, 4); break;
    case 8: go(matvec2_kernel<G::Q4_K, G::Q6_K, 8>, 8); break;
    default: go(matvec2_kernel<G::Q4_K, G::Q6_K, 1>, 1); break;
  }
  return true;
}

void matmul_kquant(const DevMatrix &w, const int8_t *xq, const float *xd, float *y, int n_rows, CudaStream s) {
  float *ys[1] = {y};
  matmul_kquant_n(&w, ys, 1, xq, xd, n_rows, s);
}

}  // namespace geist::cuda
