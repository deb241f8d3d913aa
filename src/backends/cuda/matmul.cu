// Matmul of GGUF weights as stored (every supported block format) and the embedding gather.
//
// Q8 mode reproduces quant/dot.cpp: each activation row is quantized by one warp per block
// (quantize_q8_0 / quantize_q8_k), then one warp per (weight row n, 8 activation rows) walks
// the super-blocks in order; within a block the integer products are summed across the
// lanes (integer sums are exact, so their order is free) and the f32 scale math is done
// exactly as dot_unpacked does it, block after block. F32 mode reproduces dot_f32 of
// backends/cpu/ops.cpp: 16 partial sums, lane l taking elements l, l + 16, ... in order,
// then the tree 8, 4, 2, 1; a half-warp is one such dot. Either way an output depends on
// its own weight row and activation row only: batch invariant by construction.
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <type_traits>

#include "backends/cuda/common.cuh"
#include "backends/cuda/matmul_kquant.cuh"

namespace geist::cuda {
namespace {

using quant::GgmlType;
constexpr unsigned kFull = 0xFFFFFFFFu;

size_t align_up(size_t v, size_t a) { return (v + a - 1) / a * a; }


// Block geometry and activation format of the supported types, as quant/ggml_type.cpp and
// quant::act_format give them (repeated here so that this library needs no symbol of
// geist_core). Elements per activation block: 0 = f32 activations, else 32 (Q8_0) or 256 (Q8_K).
struct TypeGeom {
  int block;         // elements per weight block
  int block_bytes;   // bytes per weight block
  int act_block;     // 0, 32 or 256
  const char *name;
};
bool type_geom(GgmlType t, TypeGeom *g) {
  switch (t) {
    case GgmlType::F32: *g = {1, 4, 0, "F32"}; return true;
    case GgmlType::F16: *g = {1, 2, 0, "F16"}; return true;
    case GgmlType::BF16: *g = {1, 2, 0, "BF16"}; return true;
    case GgmlType::Q4_0: *g = {32, 18, 32, "Q4_0"}; return true;
    case GgmlType::Q4_1: *g = {32, 20, 0, "Q4_1"}; return true;
    case GgmlType::Q5_0: *g = {32, 22, 32, "Q5_0"}; return true;
    case GgmlType::Q5_1: *g = {32, 24, 0, "Q5_1"}; return true;
    case GgmlType::Q8_0: *g = {32, 34, 32, "Q8_0"}; return true;
    case GgmlType::Q2_K: *g = {256, 84, 256, "Q2_K"}; return true;
    case GgmlType::Q3_K: *g = {256, 110, 256, "Q3_K"}; return true;
    case GgmlType::Q4_K: *g = {256, 144, 256, "Q4_K"}; return true;
    case GgmlType::Q5_K: *g = {256, 176, 256, "Q5_K"}; return true;
    case GgmlType::Q6_K: *g = {256, 210, 256, "Q6_K"}; return true;
    default: return false;
  }
}

// ---- activation quantizers: x [n_rows][K] -> q [n_rows][K] int8, d [n_rows][K / block] ----

// What the quantizers read: x itself, or gelu_tanh(gate) * up (gelu_mul's values, which
// they also store to out: out may be gate).
struct LoadSrc {
  const float *x;
  __device__ float operator()(size_t i) const { return x[i]; }
};
struct GeluSrc {
  const float *gate;
  const float *up;
  float *out;
  __device__ float operator()(size_t i) const {
    const float v = dev::gelu_times(gate[i], up[i]);
    out[i] = v;
    return v;
  }
};

// One warp per 32-element block; lane j holds element j.
template <class Src>
__global__ void quantize_q8_0_kernel(Src src, int64_t K, int n_rows, int8_t *__restrict__ q, float *__restrict__ d) {
  dev::pdl_start();
  const int lane = threadIdx.x % 32;
  const int64_t nb = K / 32;
  const int64_t blk = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  const int r = blockIdx.y;
  if (blk >= nb || r >= n_rows) return;  // whole warps exit together
  const size_t i0 = size_t(r) * K + blk * 32;
  dev::quant_q8_0_block(src(i0 + lane), lane, q + i0, d + size_t(r) * nb + blk);
}

// One warp per 256-element block; lane j holds elements j + 32 t, t = 0..7.
template <class Src>
__global__ void quantize_q8_k_kernel(Src src, int64_t K, int n_rows, int8_t *__restrict__ q, float *__restrict__ d) {
  dev::pdl_start();
  const int lane = threadIdx.x % 32;
  const int64_t nb = K / 256;
  const int64_t blk = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  const int r = blockIdx.y;
  if (blk >= nb || r >= n_rows) return;
  const size_t i0 = size_t(r) * K + blk * 256;
  float v[8];
#pragma unroll
  for (int t = 0; t < 8; ++t) v[t] = src(i0 + lane + 32 * t);
  dev::quant_q8_k_block(v, lane, q + i0, d + size_t(r) * nb + blk);
}

// gelu_mul then its quantization with one thread per element: a block of 256 threads takes
// 256 elements of a row (one Q8_K block or eight Q8_0 blocks), computes gelu_tanh(gate) * up
// for its element, stores it to out and quantizes as the kernels above (Q8_0: each warp its
// 32 elements in lane order; Q8_K: warp 0 from shared memory, lane j elements j + 32 t).
// quantize_*_kernel<GeluSrc> has one thread per 32 or 8 elements, and so a chain of GELUs
// per lane, which measured slower than gelu_mul + quantize on the 270M's 2048-wide rows.
template <int kBlock>
__global__ void __launch_bounds__(256) gelu_quantize_kernel(GeluSrc src, int64_t K, int8_t *__restrict__ q,
                                                            float *__restrict__ d) {
  dev::pdl_start();
  __shared__ float v_sh[256];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int r = blockIdx.y;
  const int64_t e0 = int64_t(blockIdx.x) * 256;
  const size_t i0 = size_t(r) * K + e0;
  const float v = src(i0 + threadIdx.x);  // K % 256 == 0: every thread has an element
  if constexpr (kBlock == 32) {
    dev::quant_q8_0_block(v, lane, q + i0 + 32 * warp, d + size_t(r) * (K / 32) + e0 / 32 + warp);
  } else {
    v_sh[threadIdx.x] = v;
    __syncthreads();
    if (warp != 0) return;
    float vv[8];
#pragma unroll
    for (int t = 0; t < 8; ++t) vv[t] = v_sh[lane + 32 * t];
    dev::quant_q8_k_block(vv, lane, q + i0, d + size_t(r) * (K / 256) + e0 / 256);
  }
}

// ---- Q8 matmul --------------------------------------------------------------------------------

constexpr int kWarpsPerBlock = 4;  // output rows n per thread block
constexpr int kRowsPerWarp = 8;    // activation rows per warp

template <GgmlType T>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    matmul_q8_kernel(const uint8_t *__restrict__ w, size_t row_bytes, int64_t K, int64_t n_out,
                     const int8_t *__restrict__ xq, const float *__restrict__ xd, float *__restrict__ y, int n_rows) {
  dev::pdl_start();
  using BI = dev::BlockInfo<T>;
  constexpr int kBs = BI::kBlock, kPer = kBs / 32;  // elements per lane per block
  constexpr bool kMin = BI::kDminOff >= 0;
  const int lane = threadIdx.x % 32;
  const int64_t n = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  const int r0 = blockIdx.y * kRowsPerWarp;
  if (n >= n_out) return;
  const int nr = min(kRowsPerWarp, n_rows - r0);
  const uint8_t *wrow = w + size_t(n) * row_bytes;
  const int64_t nb = K / kBs;
  float sum[kRowsPerWarp];
#pragma unroll
  for (int i = 0; i < kRowsPerWarp; ++i) sum[i] = 0.0f;
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t *blk = wrow + b * BI::kBytes;
    int a[kPer], m[kPer];
#pragma unroll
    for (int t = 0; t < kPer; ++t) dev::unpack_elem<T>(blk, lane + 32 * t, &a[t], &m[t]);
    const float dw = dev::fp16_to_fp32(dev::ld_u16(blk + BI::kDOff));
    float dmin = 0.0f;
    if constexpr (kMin) dmin = dev::fp16_to_fp32(dev::ld_u16(blk + BI::kDminOff));
#pragma unroll
    for (int i = 0; i < kRowsPerWarp; ++i) {
      if (i >= nr) break;  // uniform across the warp
      const int8_t *qr = xq + size_t(r0 + i) * K + b * kBs;
      int isum = 0, msum = 0;
#pragma unroll
      for (int t = 0; t < kPer; ++t) {
        const int qv = qr[lane + 32 * t];
        isum += a[t] * qv;
        if constexpr (kMin) msum += m[t] * qv;
      }
      isum = dev::warp_sum_int(isum);
      if constexpr (kMin) msum = dev::warp_sum_int(msum);
      const float dx = xd[size_t(r0 + i) * nb + b];
      // dot_unpacked: v = (d_w * d_x) * isum; v -= (dmin_w * d_x) * msum; sum += v.
      float v = __fmul_rn(__fmul_rn(dw, dx), float(isum));
      if constexpr (kMin) v = __fsub_rn(v, __fmul_rn(__fmul_rn(dmin, dx), float(msum)));
      sum[i] = __fadd_rn(sum[i], v);
    }
  }
  if (lane == 0) {
#pragma unroll
    for (int i = 0; i < kRowsPerWarp; ++i) {
      if (i < nr) y[size_t(r0 + i) * n_out + n] = sum[i];
    }
  }
}

// ---- Q8 matrix-vector for the 32-element block types (Q4_0, Q5_0, Q8_0), 1-8 rows ------------
// matmul_q8_kernel's arithmetic with the blocks spread over the warp: 4 lanes per block (8
// elements each), 8 blocks per step; a block's integer sums meet by two shuffles within its
// lanes (exact in any order), then every lane adds the step's 8 f32 block terms in block
// order (broadcast shuffles), as the K-quant matvec does. The kernel above reduces over the
// whole warp once per block; this one reads a row 8 blocks at a time.

constexpr int kMvq32Warps = 8;

// Up to kQ32SetMax matrices of one type and K over the same activations, in one launch:
// warp g takes output g - first[m] of the matrix m with first[m] <= g < first[m + 1]. Each
// output is computed as in a launch of its matrix alone (the same bits).
constexpr int kQ32SetMax = 4;
struct Q32Set {
  const uint8_t *w[kQ32SetMax];
  size_t row_bytes[kQ32SetMax];
  float *y[kQ32SetMax];
  int64_t n_out[kQ32SetMax];
  int64_t first[kQ32SetMax + 1];  // outputs before matrix m; first[n] = the total
  int n;
  GgmlType type[kQ32SetMax];  // matvec_q32_mixed_kernel: each matrix's type
};

// One warp's output n of a matrix of type T (row wrow, y [rows][n_out]) after pdl_start.
template <GgmlType T, int R>
__device__ __forceinline__ void q32_warp(const uint8_t *wrow, float *__restrict__ y, int64_t n, int64_t n_out,
                                         int64_t K, const int8_t *__restrict__ xq, const float *__restrict__ xd,
                                         int n_rows) {
  using BI = dev::BlockInfo<T>;
  static_assert(BI::kBlock == 32 && BI::kDminOff < 0, "32-element blocks without mins");
  const int lane = threadIdx.x % 32, gb = lane / 4, part = lane % 4;
  const int64_t nb = K / 32;
  float sum[R];
#pragma unroll
  for (int r = 0; r < R; ++r) sum[r] = 0.0f;
  for (int64_t b0 = 0; b0 < nb; b0 += 8) {
    const int64_t b = b0 + gb;
    const bool live = b < nb;
    int isum[R];
#pragma unroll
    for (int r = 0; r < R; ++r) isum[r] = 0;
    float dw = 0.0f;
    if (live) {
      const uint8_t *blk = wrow + b * BI::kBytes;
      int a[8], m[8];
#pragma unroll
      for (int e = 0; e < 8; ++e) dev::unpack_elem<T>(blk, 8 * part + e, &a[e], &m[e]);
      dw = dev::fp16_to_fp32(dev::ld_u16(blk + BI::kDOff));
#pragma unroll
      for (int r = 0; r < R; ++r) {
        if (r < n_rows) {
          const int2 xv = *reinterpret_cast<const int2 *>(xq + size_t(r) * K + b * 32 + 8 * part);
#pragma unroll
          for (int e = 0; e < 8; ++e) {
            const int word = e < 4 ? xv.x : xv.y;
            isum[r] += a[e] * int(int8_t(uint32_t(word) >> (8 * (e % 4))));
          }
        }
      }
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {
      isum[r] += __shfl_xor_sync(kFull, isum[r], 1);
      isum[r] += __shfl_xor_sync(kFull, isum[r], 2);
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {
      float v = 0.0f;
      if (live && r < n_rows) v = __fmul_rn(__fmul_rn(dw, xd[size_t(r) * nb + b]), float(isum[r]));
#pragma unroll
      for (int gg = 0; gg < 8; ++gg) {
        const float vg = __shfl_sync(kFull, v, 4 * gg);
        if (b0 + gg < nb) sum[r] = __fadd_rn(sum[r], vg);
      }
    }
  }
  if (lane == 0) {
#pragma unroll
    for (int r = 0; r < R; ++r) {
      if (r < n_rows) y[size_t(r) * n_out + n] = sum[r];
    }
  }
}

// The warp's place in the set: matrix *m, output *n, its row *wrow (asked of L2 before
// pdl_start). false past the set's last output (whole warps).
__device__ __forceinline__ bool q32_place(const Q32Set &set, int pf, int *m, int64_t *n, const uint8_t **wrow) {
  const int64_t g = int64_t(blockIdx.x) * kMvq32Warps + threadIdx.x / 32;
  int mm = 0;
  while (mm + 1 < set.n && g >= set.first[mm + 1]) ++mm;
  const int64_t nn = g - set.first[mm];
  const bool live = nn < set.n_out[mm];
  *wrow = set.w[mm] + size_t(live ? nn : 0) * set.row_bytes[mm];
  if (live) dev::prefetch_lines(*wrow, set.row_bytes[mm], int(threadIdx.x % 32), 32, pf);
  dev::pdl_start();
  *m = mm;
  *n = nn;
  return live;
}

template <GgmlType T, int R>
__global__ void __launch_bounds__(kMvq32Warps * 32)
    matvec_q32_kernel(Q32Set set, int64_t K, const int8_t *__restrict__ xq, const float *__restrict__ xd,
                      int n_rows, int pf) {
  int m;
  int64_t n;
  const uint8_t *wrow;
  if (!q32_place(set, pf, &m, &n, &wrow)) return;
  q32_warp<T, R>(wrow, set.y[m], n, set.n_out[m], K, xq, xd, n_rows);
}

// The same over a set whose matrices have different 32-block types (set.type): each warp
// runs its matrix's type, so every output gets the bits of its own type's kernel. The 270M's
// q and k (Q5_0) and v (Q8_0) in one launch instead of two.
template <int R>
__global__ void __launch_bounds__(kMvq32Warps * 32)
    matvec_q32_mixed_kernel(Q32Set set, int64_t K, const int8_t *__restrict__ xq, const float *__restrict__ xd,
                            int n_rows, int pf) {
  int m;
  int64_t n;
  const uint8_t *wrow;
  if (!q32_place(set, pf, &m, &n, &wrow)) return;
  float *y = set.y[m];
  const int64_t n_out = set.n_out[m];
  switch (set.type[m]) {
    case GgmlType::Q4_0: q32_warp<GgmlType::Q4_0, R>(wrow, y, n, n_out, K, xq, xd, n_rows); break;
    case GgmlType::Q5_0: q32_warp<GgmlType::Q5_0, R>(wrow, y, n, n_out, K, xq, xd, n_rows); break;
    default: q32_warp<GgmlType::Q8_0, R>(wrow, y, n, n_out, K, xq, xd, n_rows); break;
  }
}

// ---- the norm before a one-row set, folded in (matmul_n_norm) ---------------------------
// A decode step's rmsnorm_add_norm costs a kernel of its own, and the matvec after it waits a
// kernel boundary (~1.7 us, CUDA.md) and a load of its quantized row. Here every block of
// the set's matvec computes the norms of the one row itself, with the tree of
// rmsnorm_add_norm_kernel<kTree, kPer> (threads past kTree hold nothing: rms_scale), and
// quantizes out into shared memory with the same quantizer, so each value is the one the two
// kernels write. x and h are updated in place, so no block may write them while another
// still reads them: after its loads every block takes a ticket, and the block with the last
// one (every other block has read by then) writes x, h and out at its end; the counter
// wraps back to 0 for the next launch (atomicInc). The kernels after this one wait for the
// whole grid (pdl_start), so they see those writes.
template <int kTree, int kPer>
struct FoldRow {
  float x[kPer], h[kPer];  // the thread's elements i = threadIdx.x + j kTree (out: in o_sh)
};

template <int kTree, int kPer>
__device__ __forceinline__ void fold_norm(const NormFold &nf, const float (&gr)[kPer], const float (&nr)[kPer],
                                          FoldRow<kTree, kPer> &r, float *o_sh, int8_t *xs, float *ds,
                                          double *part, float *r_sh) {
  const bool tree = threadIdx.x < kTree;
  const int64_t dim = nf.dim;
  float xr[kPer] = {}, hr[kPer] = {};
  if (tree) {
    dev::load_part<kTree, kPer>(nf.x, dim, xr);
    dev::load_part<kTree, kPer>(nf.h, dim, hr);
  }
  const float r1 = dev::rms_scale<kTree>(tree ? dev::sum_squares<kTree, kPer>(xr, dim) : 0.0, dim, nf.eps, part, r_sh);
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int i = threadIdx.x + j * kTree;
    r.x[j] = 0.0f;
    r.h[j] = 0.0f;
    if (tree && i < dim) {
      float v = __fmul_rn(xr[j], r1);
      if (nf.g) v = __fmul_rn(v, gr[j]);
      r.x[j] = v;
      float t = __fadd_rn(hr[j], v);
      if (nf.h_scale != 1.0f) t = __fmul_rn(t, nf.h_scale);
      r.h[j] = t;
    }
  }
  const float r2 = dev::rms_scale<kTree>(tree ? dev::sum_squares<kTree, kPer>(r.h, dim) : 0.0, dim, nf.eps, part, r_sh);
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int i = threadIdx.x + j * kTree;
    if (tree && i < dim) {
      float v = __fmul_rn(r.h[j], r2);
      if (nf.g_next) v = __fmul_rn(v, nr[j]);
      o_sh[i] = v;
    }
  }
  __syncthreads();
  const int lane = threadIdx.x % 32;
  for (int b = threadIdx.x / 32; b < int(dim / 32); b += int(blockDim.x / 32)) {
    dev::quant_q8_0_block(o_sh[32 * b + lane], lane, xs + 32 * b, ds + b);
  }
  __syncthreads();
}

// T: the set's type; kMixed: each matrix's own (set.type), as matvec_q32_mixed_kernel.
template <GgmlType T, bool kMixed, int kTree, int kPer>
__global__ void __launch_bounds__(kMvq32Warps * 32)
    matvec_q32_norm_kernel(Q32Set set, int64_t K, NormFold nf, int pf) {
  static_assert(kTree <= kMvq32Warps * 32, "the tree fits the block");
  float gr[kPer] = {}, nr[kPer] = {};
  if (threadIdx.x < kTree) {  // the norm weights before the wait, as rmsnorm_add_norm_kernel
    dev::load_part<kTree, kPer>(nf.g, nf.dim, gr);
    dev::load_part<kTree, kPer>(nf.g_next, nf.dim, nr);
  }
  int m = 0;
  int64_t n = 0;
  const uint8_t *wrow = nullptr;
  const bool live = q32_place(set, pf, &m, &n, &wrow);  // weights asked of L2, then pdl_start
  __shared__ __align__(16) int8_t xs[kTree * kPer];
  __shared__ float ds[kTree * kPer / 32];
  __shared__ float o_sh[kTree * kPer];
  __shared__ double part[kMvq32Warps];
  __shared__ float r_sh;
  __shared__ bool last_sh;
  FoldRow<kTree, kPer> r;
  fold_norm<kTree, kPer>(nf, gr, nr, r, o_sh, xs, ds, part, &r_sh);
  // Every load of x and h has been used by now (the barrier after the norms); the fences
  // order the ticket after them and the last block's stores after every ticket, as the
  // attention's merge counters do.
  unsigned ticket = 0;
  if (threadIdx.x == 0) {
    __threadfence();
    ticket = atomicInc(nf.count, gridDim.x - 1);
  }
  if (live) {
    float *y = set.y[m];
    const int64_t n_out = set.n_out[m];
    if constexpr (kMixed) {
      switch (set.type[m]) {
        case GgmlType::Q4_0: q32_warp<GgmlType::Q4_0, 1>(wrow, y, n, n_out, K, xs, ds, 1); break;
        case GgmlType::Q5_0: q32_warp<GgmlType::Q5_0, 1>(wrow, y, n, n_out, K, xs, ds, 1); break;
        default: q32_warp<GgmlType::Q8_0, 1>(wrow, y, n, n_out, K, xs, ds, 1); break;
      }
    } else {
      q32_warp<T, 1>(wrow, y, n, n_out, K, xs, ds, 1);
    }
  }
  if (threadIdx.x == 0) {
    last_sh = ticket == gridDim.x - 1;
    if (last_sh) __threadfence();
  }
  __syncthreads();
  if (!last_sh) return;
  for (int i = threadIdx.x; i < nf.dim; i += blockDim.x) nf.out[i] = o_sh[i];
  if (threadIdx.x >= kTree) return;
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int i = threadIdx.x + j * kTree;
    if (i < nf.dim) {
      nf.x[i] = r.x[j];
      nf.h[i] = r.h[j];
    }
  }
}

// ---- one row of a long 32-block matrix, staged through shared memory ----------------------
// The 270M's output head (Q8_0, 640 x 262144, 178 MB per token) read at ~1.2 TB/s in
// matvec_q32_kernel, where a warp takes one 680-byte row: 3 steps of 8 blocks, each with its
// shuffles, for 21 bytes a lane. Here a block copies tr consecutive rows (one contiguous run
// of tr x row_bytes bytes) into shared memory with 16-byte cp.async issued before pdl_start,
// then the activation row; P = 256 / tr threads per output compute the integer sums of the
// blocks b = p (mod P) and write each block's f32 term (dw * dx_b) * isum_b to shared memory,
// and one thread per output adds the terms in block order, from 0: q32_warp's arithmetic,
// the same bits.
constexpr int kQ32sThreads = 256;

template <GgmlType T>
__device__ __forceinline__ int q32s_isum(const uint8_t *blk, const int8_t *x) {
  using BI = dev::BlockInfo<T>;
  int isum = 0;
  if constexpr (T == GgmlType::Q8_0) {
    // The quants start 2 bytes into the block: 16 two-byte loads make the 8 words.
    const int4 *xv = reinterpret_cast<const int4 *>(x);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int4 xw = xv[h];
      const int xs[4] = {xw.x, xw.y, xw.z, xw.w};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const uint16_t *q = reinterpret_cast<const uint16_t *>(blk + 2 + 16 * h + 4 * j);
        isum = __dp4a(int(uint32_t(q[0]) | (uint32_t(q[1]) << 16)), xs[j], isum);
      }
    }
  } else {
#pragma unroll 8
    for (int i = 0; i < 32; ++i) {
      int a, m;
      dev::unpack_elem<T>(blk, i, &a, &m);
      isum += a * int(x[i]);
    }
  }
  return isum;
}

template <GgmlType T>
__global__ void __launch_bounds__(kQ32sThreads)
    matvec_q32_staged_kernel(const uint8_t *__restrict__ w, size_t row_bytes, int64_t K, int64_t n_out,
                             const int8_t *__restrict__ xq, const float *__restrict__ xd, float *__restrict__ y,
                             int tr) {
  using BI = dev::BlockInfo<T>;
  extern __shared__ __align__(16) uint8_t q32s_sm[];
  const int nb = int(K / 32), tid = threadIdx.x;
  const int64_t n0 = int64_t(blockIdx.x) * tr;
  const int rows = int(n_out - n0 < tr ? n_out - n0 : tr);
  uint8_t *ws = q32s_sm;  // [tr][row_bytes]
  int8_t *xs = reinterpret_cast<int8_t *>(q32s_sm + (size_t(tr) * row_bytes + 15) / 16 * 16);  // [K]
  float *dxs = reinterpret_cast<float *>(xs + K);                                             // [nb]
  float *terms = dxs + nb;                                                                      // [tr][nb]
  const size_t run = size_t(rows) * row_bytes, whole = run / 16 * 16;
  const uint8_t *src = w + size_t(n0) * row_bytes;
  for (size_t c = size_t(tid) * 16; c < whole; c += kQ32sThreads * 16) dev::cp_async16(ws + c, src + c);
  dev::cp_async_commit();
  for (size_t c = whole + size_t(tid); c < run; c += kQ32sThreads) ws[c] = src[c];  // the last block's tail
  dev::pdl_start();
  for (int64_t c = int64_t(tid) * 16; c < K; c += kQ32sThreads * 16) dev::cp_async16(xs + c, xq + c);
  dev::cp_async_commit();
  for (int b = tid; b < nb; b += kQ32sThreads) dxs[b] = xd[b];
  dev::cp_async_wait_all();
  __syncthreads();
  const int P = kQ32sThreads / tr, o = tid / P, p = tid % P;
  if (o < rows) {
    const uint8_t *wr = ws + size_t(o) * row_bytes;
    for (int b = p; b < nb; b += P) {
      const uint8_t *blk = wr + size_t(b) * BI::kBytes;
      const int isum = q32s_isum<T>(blk, xs + 32 * b);
      const float dw = dev::fp16_to_fp32(dev::ld_u16(blk + BI::kDOff));
      terms[o * nb + b] = __fmul_rn(__fmul_rn(dw, dxs[b]), float(isum));
    }
  }
  __syncthreads();
  if (p == 0 && o < rows) {
    float sum = 0.0f;
    for (int b = 0; b < nb; ++b) sum = __fadd_rn(sum, terms[o * nb + b]);
    y[n0 + o] = sum;
  }
}

// The staged kernel for one row of one long matrix (at least 2 blocks of tr outputs per SM),
// with tr the most of 64, 32, 16, 8 rows whose staging fits the device's shared memory and
// keeps each block's run 16-byte aligned. GEIST_CUDA_Q32_STAGED=0: never (a knob to compare;
// the bits are the same). false, with nothing launched, where it does not apply.
template <GgmlType T>
bool launch_q32_staged(const DevMatrix &w, float *y, const int8_t *xq, const float *xd, CudaStream s) {
  static const bool on = env_int("GEIST_CUDA_Q32_STAGED", 1) != 0;
  if (!on || (reinterpret_cast<uintptr_t>(w.data) % 16) != 0 || (reinterpret_cast<uintptr_t>(xq) % 16) != 0 ||
      w.n_in % 32 != 0) {
    return false;
  }
  const int64_t nb = w.n_in / 32;
  auto smem_of = [&](int tr) {
    return (size_t(tr) * w.row_bytes + 15) / 16 * 16 + size_t(w.n_in) + size_t(nb) * 4 + size_t(tr) * size_t(nb) * 4;
  };
  const size_t limit = std::min<size_t>(device_optin_smem(), size_t(64) << 10);
  int tr = 64;
  while (tr >= 8 && ((size_t(tr) * w.row_bytes) % 16 != 0 || smem_of(tr) > limit)) tr /= 2;
  if (tr < 8 || (w.n_out + tr - 1) / tr < 2 * int64_t(device_sm_count())) return false;
  const size_t smem = smem_of(tr);
  static std::atomic<uint64_t> done{0};
  if (smem > size_t(48 * 1024) && !allow_dynamic_smem(matvec_q32_staged_kernel<T>, size_t(64) << 10, done)) {
    return false;
  }
  launch_smem(matvec_q32_staged_kernel<T>, dim3(unsigned((w.n_out + tr - 1) / tr)), dim3(kQ32sThreads), smem, s,
              w.data, w.row_bytes, w.n_in, w.n_out, xq, xd, y, tr);
  return true;
}

// ---- F32 matmul (dequantized weights) ------------------------------------------------------

constexpr int kRowsPerHalf = 4;  // activation rows per half-warp (8 per warp)

template <GgmlType T>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    matmul_f32_kernel(const uint8_t *__restrict__ w, size_t row_bytes, int64_t K, int64_t n_out,
                      const float *__restrict__ x, float *__restrict__ y, int n_rows) {
  dev::pdl_start();
  const int lane = threadIdx.x % 32, l = lane % 16, half = lane / 16;
  const int64_t n = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (n >= n_out) return;
  const int r0 = blockIdx.y * kRowsPerWarp + half * kRowsPerHalf;
  const int nr = max(0, min(kRowsPerHalf, n_rows - r0));
  const uint8_t *wrow = w + size_t(n) * row_bytes;
  float acc[kRowsPerHalf];
#pragma unroll
  for (int i = 0; i < kRowsPerHalf; ++i) acc[i] = 0.0f;
  if (nr > 0) {
    for (int64_t k = l; k < K; k += 16) {
      const float wv = dev::dequant_elem<T>(wrow, k);
#pragma unroll
      for (int i = 0; i < kRowsPerHalf; ++i) {
        if (i < nr) acc[i] = __fadd_rn(acc[i], __fmul_rn(wv, x[size_t(r0 + i) * K + k]));
      }
    }
  }
  // dot_f32's tree: acc[l] += acc[l + w] for w = 8, 4, 2, 1 (lane 0 ends with the sum).
#pragma unroll
  for (int i = 0; i < kRowsPerHalf; ++i) {
#pragma unroll
    for (int o = 8; o >= 1; o /= 2) acc[i] = __fadd_rn(acc[i], __shfl_down_sync(kFull, acc[i], o, 16));
  }
  if (l == 0) {
#pragma unroll
    for (int i = 0; i < kRowsPerHalf; ++i) {
      if (i < nr) y[size_t(r0 + i) * n_out + n] = acc[i];
    }
  }
}

// ---- F32 tiled matmul (more than 8 rows) ----------------------------------------------------
// dot_f32's arithmetic for a 32 x 32 tile of (activation row, output) pairs: a block of 16
// groups x 16 chains; thread (group, l) runs chain l (the elements k = l mod 16, in order)
// of its group's 8 rows x 8 outputs, from tiles of x and W staged in shared memory as
// floats 64 elements of K at a time. A chain element past K is skipped, as dot_f32 never
// adds it (the staged zeros are never added). The 16 chains of a pair then meet by
// dot_f32's tree (shuffles down by 8, 4, 2, 1 within the 16 lanes). Same bits as the
// kernels above, so batch invariance holds across the 8-row boundary; ~10x faster than
// matmul_f32_kernel at 512 rows (Gemma 4's BF16 per-layer projections).

constexpr int kFtM = 32, kFtN = 32, kFtK = 64;
constexpr int kFtStride = kFtK + 2;  // the two halves of a warp read W rows 8 apart: 8 * 66 = 16 (mod 32) banks

// The end of a tile: each pair's 16 chains meet by dot_f32's tree (shuffles down by 8, 4, 2,
// 1 within the 16 lanes) and lane 0 stores the pairs of its 8 rows (r0 + i) and 8 outputs
// (n0 + j * n_step).
__device__ __forceinline__ void f32_tile_store(float (&acc)[8][8], int l, int64_t r0, int n_rows, int64_t n0,
                                               int n_step, int64_t n_out, float *__restrict__ y) {
#pragma unroll
  for (int i = 0; i < 8; ++i) {
#pragma unroll
    for (int j = 0; j < 8; ++j) {
#pragma unroll
      for (int o = 8; o >= 1; o /= 2) acc[i][j] = __fadd_rn(acc[i][j], __shfl_down_sync(kFull, acc[i][j], o, 16));
    }
  }
  if (l == 0) {
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int64_t r = r0 + i;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const int64_t n = n0 + int64_t(j) * n_step;
        if (r < n_rows && n < n_out) y[size_t(r) * n_out + n] = acc[i][j];
      }
    }
  }
}

template <GgmlType T>
__global__ void __launch_bounds__(256, 2)
    matmul_f32_tile_kernel(const uint8_t *__restrict__ w, size_t row_bytes, int64_t K, int64_t n_out,
                           const float *__restrict__ x, float *__restrict__ y, int n_rows) {
  __shared__ float xs[kFtM * kFtStride];
  __shared__ float ws[kFtN * kFtStride];
  const int tid = threadIdx.x, l = tid % 16, grp = tid / 16;
  const int gm = grp / 4, gn = grp % 4;  // a warp's two groups share their rows
  const int64_t r0 = int64_t(blockIdx.y) * kFtM, n0 = int64_t(blockIdx.x) * kFtN;
  dev::pdl_start();
  float acc[8][8];
#pragma unroll
  for (int i = 0; i < 8; ++i)
#pragma unroll
    for (int j = 0; j < 8; ++j) acc[i][j] = 0.0f;
  for (int64_t k0 = 0; k0 < K; k0 += kFtK) {
    float xv[kFtM * kFtK / 256], wv[kFtN * kFtK / 256];
#pragma unroll
    for (int u = 0; u < kFtM * kFtK / 256; ++u) {
      const int e = tid + 256 * u, row = e / kFtK, c = e % kFtK;
      const int64_t k = k0 + c;
      xv[u] = (r0 + row < n_rows && k < K) ? x[size_t(r0 + row) * K + k] : 0.0f;
      wv[u] = (n0 + row < n_out && k < K) ? dev::dequant_elem<T>(w + size_t(n0 + row) * row_bytes, k) : 0.0f;
    }
#pragma unroll
    for (int u = 0; u < kFtM * kFtK / 256; ++u) {
      const int e = tid + 256 * u, row = e / kFtK, c = e % kFtK;
      xs[row * kFtStride + c] = xv[u];
      ws[row * kFtStride + c] = wv[u];
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < kFtK; kk += 16) {
      if (k0 + kk + l < K) {
        float a[8], b[8];
#pragma unroll
        for (int i = 0; i < 8; ++i) a[i] = xs[(gm * 8 + i) * kFtStride + kk + l];
#pragma unroll
        for (int j = 0; j < 8; ++j) b[j] = ws[(gn * 8 + j) * kFtStride + kk + l];
#pragma unroll
        for (int i = 0; i < 8; ++i)
#pragma unroll
          for (int j = 0; j < 8; ++j) acc[i][j] = __fadd_rn(acc[i][j], __fmul_rn(b[j], a[i]));
      }
    }
    __syncthreads();
  }
  f32_tile_store(acc, l, r0 + gm * 8, n_rows, n0 + gn * 8, 1, n_out, y);
}

// The same tile, pipelined, for float weights (F32, F16, BF16) with K a multiple of 8 and
// 16-byte aligned rows: the x and W slabs of the next stages are copied into shared memory
// with cp.async (16-byte chunks; a chunk past n_rows, n_out or K is zero-filled and never
// added) while the current one is computed, where the kernel above stalls on its loads every
// 64 elements of K. W stays in its own format in shared memory and is widened as it is read.
// A group's 8 outputs are 4 apart (n0 + gn + 4j), so the two half-warps of a warp read
// adjacent W rows, 64 bytes apart in banks. Every sum is the kernel above's, element for
// element and in the same order: the same bits. H200, 512 rows: BF16 2560 x 256 81 -> 55 us,
// 256 x 2560 78 -> 59, 2560 x 10752 2.72 -> 1.62 ms. GEIST_CUDA_F32_TILE_ASYNC=0 turns it off.
constexpr int kFaXStride = kFtK + 4;  // floats per staged x row (16-byte aligned)

template <GgmlType T>
struct FaGeom {
  static constexpr int kEsz = T == GgmlType::F32 ? 4 : 2;
  static constexpr int kWStride = kFtK * kEsz + 64;  // bytes per staged W row
  static constexpr int kXBytes = kFtM * kFaXStride * 4;
  static constexpr int kStageBytes = kXBytes + kFtN * kWStride;
  static constexpr int kStages = kEsz == 4 ? 2 : 3;  // under the 48 KB of static shared memory
};

// One staged W element (p aligned to its size; dequant_elem reads bytes, for any alignment).
template <GgmlType T>
__device__ __forceinline__ float staged_elem(const uint8_t *p) {
  if constexpr (T == GgmlType::F32) {
    return *reinterpret_cast<const float *>(p);
  } else if constexpr (T == GgmlType::BF16) {
    return dev::bf16_to_fp32(*reinterpret_cast<const uint16_t *>(p));
  } else {
    return dev::fp16_to_fp32(*reinterpret_cast<const uint16_t *>(p));
  }
}

template <GgmlType T>
__global__ void __launch_bounds__(256, 2)
    matmul_f32_tile_async_kernel(const uint8_t *__restrict__ w, size_t row_bytes, int64_t K, int64_t n_out,
                                 const float *__restrict__ x, float *__restrict__ y, int n_rows) {
  using G = FaGeom<T>;
  __shared__ __align__(16) uint8_t sm[G::kStages * G::kStageBytes];
  const int tid = threadIdx.x, l = tid % 16, grp = tid / 16;
  const int gm = grp / 4, gn = grp % 4;
  const int64_t r0 = int64_t(blockIdx.y) * kFtM, n0 = int64_t(blockIdx.x) * kFtN;
  const int n_k = int((K + kFtK - 1) / kFtK);
  constexpr int kWChunks = kFtK * G::kEsz / 16;  // 16-byte chunks per W row and slab
  constexpr int kWElems = 16 / G::kEsz;
  auto load_w = [&](int it, int slot) {
    uint8_t *dst = sm + slot * G::kStageBytes + G::kXBytes;
    for (int c = tid; c < kFtN * kWChunks; c += 256) {
      const int row = c / kWChunks, cc = c % kWChunks;
      const int64_t k = int64_t(it) * kFtK + int64_t(cc) * kWElems;
      const bool ok = n0 + row < n_out && k < K;
      const uint8_t *src = ok ? w + size_t(n0 + row) * row_bytes + size_t(k) * G::kEsz : w;
      dev::cp_async16_zfill(dst + row * G::kWStride + cc * 16, src, ok ? 16 : 0);
    }
  };
  auto load_x = [&](int it, int slot) {
    float *dst = reinterpret_cast<float *>(sm + slot * G::kStageBytes);
    for (int c = tid; c < kFtM * (kFtK / 4); c += 256) {
      const int row = c / (kFtK / 4), cc = c % (kFtK / 4);
      const int64_t k = int64_t(it) * kFtK + 4 * cc;
      const bool ok = r0 + row < n_rows && k < K;
      const float *src = ok ? x + size_t(r0 + row) * K + k : x;
      dev::cp_async16_zfill(dst + row * kFaXStride + 4 * cc, src, ok ? 16 : 0);
    }
  };
  // The weights do not depend on the kernel before: their first slabs are asked for before
  // pdl_start. Group s holds x's slab s (and, for s = 0, W's first slabs).
  for (int st = 0; st < G::kStages - 1; ++st) {
    if (st < n_k) load_w(st, st);
  }
  dev::pdl_start();
  for (int st = 0; st < G::kStages - 1; ++st) {
    if (st < n_k) load_x(st, st);
    dev::cp_async_commit();
  }
  float acc[8][8];
#pragma unroll
  for (int i = 0; i < 8; ++i)
#pragma unroll
    for (int j = 0; j < 8; ++j) acc[i][j] = 0.0f;
  for (int it = 0; it < n_k; ++it) {
    dev::cp_async_wait<G::kStages - 2>();
    __syncthreads();  // slab it is in; every thread is done with the slot the next load takes
    const int next = it + G::kStages - 1;
    if (next < n_k) {
      load_w(next, next % G::kStages);
      load_x(next, next % G::kStages);
    }
    dev::cp_async_commit();
    const int slot = it % G::kStages;
    const float *xs = reinterpret_cast<const float *>(sm + slot * G::kStageBytes);
    const uint8_t *ws = sm + slot * G::kStageBytes + G::kXBytes;
    const int64_t k0 = int64_t(it) * kFtK;
#pragma unroll
    for (int kk = 0; kk < kFtK; kk += 16) {
      if (k0 + kk + l < K) {
        float a[8], b[8];
#pragma unroll
        for (int i = 0; i < 8; ++i) a[i] = xs[(gm * 8 + i) * kFaXStride + kk + l];
#pragma unroll
        for (int j = 0; j < 8; ++j) b[j] = staged_elem<T>(ws + (gn + 4 * j) * G::kWStride + (kk + l) * G::kEsz);
#pragma unroll
        for (int i = 0; i < 8; ++i)
#pragma unroll
          for (int j = 0; j < 8; ++j) acc[i][j] = __fadd_rn(acc[i][j], __fmul_rn(b[j], a[i]));
      }
    }
  }
  dev::cp_async_wait_all();
  f32_tile_store(acc, l, r0 + gm * 8, n_rows, n0 + gn, 4, n_out, y);
}

// Whether the pipelined tile kernel takes w (a float type) and x.
bool f32_tile_async(const DevMatrix &w, const float *x) {
  static const bool on = env_int("GEIST_CUDA_F32_TILE_ASYNC", 1) != 0;
  return on && w.n_in % 8 == 0 && w.row_bytes % 16 == 0 && reinterpret_cast<uintptr_t>(w.data) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(x) % 16 == 0;
}

// ---- F32 matrix-vector (1..8 rows) ----------------------------------------------------------
// dot_f32's 16 chains again, for few rows: a block stages 8 weight rows and the activation
// rows in shared memory 512 elements at a time (coalesced loads, many in flight), then lane
// l of each half-warp runs chain l over the staged elements, in order. Same bits as
// matmul_f32_kernel, whose latency-bound walk starves a small matrix (few outputs).

constexpr int kMvOut = 8;        // outputs per block (a half-warp each)
constexpr int kMvTk = 512;       // elements staged per step
constexpr int kMvStride = 528;   // floats per staged weight row (no bank conflicts between halves)

// Float weights whose rows are 16-byte aligned are staged with 16-byte loads, all issued
// before any is used (the per-element loop below waits on each load in turn).
template <GgmlType T>
constexpr bool kFloatType = T == GgmlType::F32 || T == GgmlType::F16 || T == GgmlType::BF16;

template <GgmlType T>
__device__ __forceinline__ float elem_of(uint32_t word, int half) {
  if constexpr (T == GgmlType::BF16) {
    return dev::bf16_to_fp32(half ? word >> 16 : word & 0xFFFFu);
  } else {
    return dev::fp16_to_fp32(half ? word >> 16 : word & 0xFFFFu);
  }
}

template <GgmlType T>
__device__ __forceinline__ void stage_weights_vec(const uint8_t *__restrict__ w, size_t row_bytes, int64_t n0,
                                                  int64_t n_out, int64_t k0, int tk, float *ws) {
  constexpr int kElem = T == GgmlType::F32 ? 4 : 2, kPer = 16 / kElem;  // elements per load
  constexpr int kLoads = kMvOut * kMvTk / kPer / (kMvOut * 16);       // per thread
  uint4 buf[kLoads];
#pragma unroll
  for (int i = 0; i < kLoads; ++i) {
    const int u = threadIdx.x + kMvOut * 16 * i, row = u / (kMvTk / kPer), c = (u % (kMvTk / kPer)) * kPer;
    buf[i] = make_uint4(0, 0, 0, 0);
    if (n0 + row < n_out && c < tk) {
      buf[i] = *reinterpret_cast<const uint4 *>(w + size_t(n0 + row) * row_bytes + size_t(k0 + c) * kElem);
    }
  }
#pragma unroll
  for (int i = 0; i < kLoads; ++i) {
    const int u = threadIdx.x + kMvOut * 16 * i, row = u / (kMvTk / kPer), c = (u % (kMvTk / kPer)) * kPer;
    float *d = ws + row * kMvStride + c;
    const uint32_t v[4] = {buf[i].x, buf[i].y, buf[i].z, buf[i].w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      if constexpr (T == GgmlType::F32) {
        d[j] = __uint_as_float(v[j]);
      } else {
        d[2 * j] = elem_of<T>(v[j], 0);
        d[2 * j + 1] = elem_of<T>(v[j], 1);
      }
    }
  }
}

template <GgmlType T, int R>
__global__ void __launch_bounds__(kMvOut * 16)
    matvec_f32_kernel(const uint8_t *__restrict__ w, size_t row_bytes, int64_t K, int64_t n_out,
                      const float *__restrict__ x, float *__restrict__ y, int n_rows, int pf) {
  __shared__ __align__(16) float ws[kMvOut * kMvStride];
  __shared__ __align__(16) float xs[R * kMvTk];
  const int tid = threadIdx.x, o = tid / 16, l = tid % 16;
  const int64_t n0 = int64_t(blockIdx.x) * kMvOut;
  // More than R rows: blockIdx.y takes rows [R y, R y + R), each (row, output) pair computed
  // as in a call of those rows alone.
  x += size_t(blockIdx.y) * R * K;
  y += size_t(blockIdx.y) * R * n_out;
  n_rows -= int(blockIdx.y) * R;
  dev::prefetch_lines(w + size_t(n0) * row_bytes, size_t(n_out - n0 < kMvOut ? n_out - n0 : kMvOut) * row_bytes, tid,
                      kMvOut * 16, pf);
  dev::pdl_start();
  float acc[R];
#pragma unroll
  for (int r = 0; r < R; ++r) acc[r] = 0.0f;
  for (int64_t k0 = 0; k0 < K; k0 += kMvTk) {
    const int tk = K - k0 < kMvTk ? int(K - k0) : kMvTk;
    // 16-byte loads when every row and x row is 16-byte aligned (K a multiple of 8 elements).
    const bool vec = K % 8 == 0 && row_bytes % 16 == 0 && (reinterpret_cast<uintptr_t>(w) % 16) == 0 &&
                     (reinterpret_cast<uintptr_t>(x) % 16) == 0;
    bool staged = false;
    if constexpr (kFloatType<T>) {
      if (vec) {
        stage_weights_vec<T>(w, row_bytes, n0, n_out, k0, tk, ws);
        staged = true;
      }
    }
    if (!staged) {
      for (int u = tid; u < kMvOut * kMvTk; u += kMvOut * 16) {
        const int row = u / kMvTk, c = u % kMvTk;
        float v = 0.0f;
        if (n0 + row < n_out && c < tk) v = dev::dequant_elem<T>(w + size_t(n0 + row) * row_bytes, k0 + c);
        ws[row * kMvStride + c] = v;
      }
    }
    if (vec) {
      for (int u = tid; u < R * kMvTk / 4; u += kMvOut * 16) {
        const int r = u / (kMvTk / 4), c = (u % (kMvTk / 4)) * 4;
        float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (r < n_rows && c < tk) v = *reinterpret_cast<const float4 *>(x + size_t(r) * K + k0 + c);
        *reinterpret_cast<float4 *>(xs + r * kMvTk + c) = v;
      }
    } else {
      for (int u = tid; u < R * kMvTk; u += kMvOut * 16) {
        const int r = u / kMvTk, c = u % kMvTk;
        xs[u] = (r < n_rows && c < tk) ? x[size_t(r) * K + k0 + c] : 0.0f;
      }
    }
    __syncthreads();
    for (int c = l; c < tk; c += 16) {
      const float wv = ws[o * kMvStride + c];
#pragma unroll
      for (int r = 0; r < R; ++r) acc[r] = __fadd_rn(acc[r], __fmul_rn(wv, xs[r * kMvTk + c]));
    }
    __syncthreads();
  }
#pragma unroll
  for (int r = 0; r < R; ++r) {
#pragma unroll
    for (int off = 8; off >= 1; off /= 2) acc[r] = __fadd_rn(acc[r], __shfl_down_sync(kFull, acc[r], off, 16));
  }
  if (l == 0 && n0 + o < n_out) {
#pragma unroll
    for (int r = 0; r < R; ++r) {
      if (r < n_rows) y[size_t(r) * n_out + n0 + o] = acc[r];
    }
  }
}

// One row with all of K staged at once: the block's kMvOut weight rows and the activation
// row go to shared memory with cp.async (the weights requested before pdl_start, so they
// stream in while the kernel before finishes), then each half-warp lane runs its chain over
// all of K. matvec_f32_kernel stages 512 elements at a time between two barriers, one round
// trip to memory per step: Gemma 4's per-layer input gate (BF16 2560 x 256, 32 blocks) took
// ~9 us in its five. The same chains in the same order and the same tree: the same bits.
// Rows are padded by 16 elements, so the two half-warps of a warp read distinct banks.
// blockIdx.y: the activation row (several rows: each block stages its outputs' weights again,
// from L2 for the small matrices it is used for).
template <GgmlType T>
__global__ void __launch_bounds__(kMvOut * 16)
    matvec_f32_whole_kernel(const uint8_t *__restrict__ w, size_t row_bytes, int64_t K, int64_t n_out,
                            const float *__restrict__ x, float *__restrict__ y) {
  extern __shared__ __align__(16) uint8_t whole_sm[];
  x += size_t(blockIdx.y) * size_t(K);
  y += size_t(blockIdx.y) * size_t(n_out);
  constexpr int kElem = T == GgmlType::F32 ? 4 : 2;
  const int tid = threadIdx.x, o = tid / 16, l = tid % 16;
  const int64_t n0 = int64_t(blockIdx.x) * kMvOut;
  const int rows = int(n_out - n0 < kMvOut ? n_out - n0 : kMvOut);
  const size_t pitch = row_bytes + 16 * kElem;
  float *xs = reinterpret_cast<float *>(whole_sm + kMvOut * pitch);
  const int64_t chunks = int64_t(row_bytes / 16);
  for (int r = 0; r < rows; ++r) {
    const uint8_t *src = w + size_t(n0 + r) * row_bytes;
    for (int64_t c = tid; c < chunks; c += kMvOut * 16) dev::cp_async16(whole_sm + r * pitch + 16 * c, src + 16 * c);
  }
  dev::cp_async_commit();
  dev::pdl_start();
  for (int64_t c = tid; c < K / 4; c += kMvOut * 16) dev::cp_async16(xs + 4 * c, x + 4 * c);
  dev::cp_async_commit();
  dev::cp_async_wait_all();
  __syncthreads();
  float acc = 0.0f;
  if (o < rows) {
    const uint8_t *wr = whole_sm + o * pitch;
    for (int64_t c = l; c < K; c += 16) {
      float wv;
      if constexpr (T == GgmlType::F32) {
        wv = reinterpret_cast<const float *>(wr)[c];
      } else {
        const uint32_t h = reinterpret_cast<const uint16_t *>(wr)[c];
        wv = T == GgmlType::BF16 ? dev::bf16_to_fp32(h) : dev::fp16_to_fp32(h);
      }
      acc = __fadd_rn(acc, __fmul_rn(wv, xs[c]));
    }
  }
#pragma unroll
  for (int off = 8; off >= 1; off /= 2) acc = __fadd_rn(acc, __shfl_down_sync(kFull, acc, off, 16));
  if (l == 0 && o < rows) y[n0 + o] = acc;
}

// The whole-K kernel where it applies: float weights with 16-byte aligned rows, an aligned
// x, and shared memory for kMvOut rows and x; one block row per activation row. For one row
// always; for several on matrices of at most kF32WholeRowsMaxBytes where matvec_f32_kernel
// would give the SMs fewer blocks than they are (Gemma 4's per-layer gate, 2560 x 256 BF16:
// 32 blocks per 8 rows, each a serial walk over K; 8 rows took 19.6 us there, 3.2 here,
// where every block is a one-row block reading the matrix again from L2).
// GEIST_CUDA_F32_WHOLE=0: never; GEIST_CUDA_F32_WHOLE_ROWS=0: one row only (knobs to
// compare; the bits are the same).
constexpr size_t kF32WholeRowsMaxBytes = size_t(8) << 20;
template <GgmlType T>
bool launch_matvec_f32_whole(const DevMatrix &w, const float *x, float *y, int n_rows, CudaStream s) {
  if constexpr (!kFloatType<T>) {
    return false;
  } else {
    static const bool on = env_int("GEIST_CUDA_F32_WHOLE", 1) != 0;
    static const bool rows_on = env_int("GEIST_CUDA_F32_WHOLE_ROWS", 1) != 0;
    constexpr int kElem = T == GgmlType::F32 ? 4 : 2;
    if (!on || w.row_bytes % 16 != 0 || w.n_in % 4 != 0 || (reinterpret_cast<uintptr_t>(w.data) % 16) != 0 ||
        (reinterpret_cast<uintptr_t>(x) % 16) != 0) {
      return false;
    }
    if (n_rows > 1 && (!rows_on || n_rows > 65535 || w.row_bytes * size_t(w.n_out) > kF32WholeRowsMaxBytes ||
                       (w.n_out + kMvOut - 1) / kMvOut * ((n_rows + 7) / 8) >= device_sm_count())) {
      return false;
    }
    const size_t smem = size_t(kMvOut) * (w.row_bytes + 16 * kElem) + size_t(w.n_in) * 4;
    static std::atomic<uint64_t> done{0};
    if (smem > size_t(48 * 1024) &&
        (smem > device_optin_smem() || !allow_dynamic_smem(matvec_f32_whole_kernel<T>, device_optin_smem(), done))) {
      return false;
    }
    launch_smem(matvec_f32_whole_kernel<T>, dim3(unsigned((w.n_out + kMvOut - 1) / kMvOut), unsigned(n_rows)),
                dim3(kMvOut * 16), smem, s, w.data, w.row_bytes, w.n_in, w.n_out, x, y);
    return true;
  }
}

template <GgmlType T>
void launch_matvec_f32(const DevMatrix &w, const float *x, float *y, int n_rows, CudaStream s) {
  const dim3 grid(unsigned((w.n_out + kMvOut - 1) / kMvOut), unsigned((n_rows + 7) / 8));
  const dim3 block(kMvOut * 16);
  if (launch_matvec_f32_whole<T>(w, x, y, n_rows, s)) return;
  if (n_rows == 1) {
    launch(matvec_f32_kernel<T, 1>, grid, block, s, w.data, w.row_bytes, w.n_in, w.n_out, x, y, n_rows,
           prefetch_mode());
  } else if (n_rows == 2) {
    launch(matvec_f32_kernel<T, 2>, grid, block, s, w.data, w.row_bytes, w.n_in, w.n_out, x, y, n_rows,
           prefetch_mode());
  } else if (n_rows <= 4) {
    launch(matvec_f32_kernel<T, 4>, grid, block, s, w.data, w.row_bytes, w.n_in, w.n_out, x, y, n_rows,
           prefetch_mode());
  } else {
    launch(matvec_f32_kernel<T, 8>, grid, block, s, w.data, w.row_bytes, w.n_in, w.n_out, x, y, n_rows,
           prefetch_mode());
  }
}

// ---- embedding gather ----------------------------------------------------------------------

template <GgmlType T>
__global__ void embed_kernel(const uint8_t *__restrict__ table, size_t row_bytes, int64_t n_in, int64_t n_out,
                             const int32_t *__restrict__ ids, float scale, float *__restrict__ out) {
  dev::pdl_start();
  const int r = blockIdx.y;
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n_in) return;
  const int32_t id = ids[r];
  float v = 0.0f;
  if (id >= 0 && id < n_out) v = __fmul_rn(dev::dequant_elem<T>(table + size_t(id) * row_bytes, i), scale);
  out[size_t(r) * n_in + i] = v;
}

// Calls f(std::integral_constant<GgmlType, T>{}) for the runtime type t; false if t is not supported.
template <class F>
bool dispatch_all(GgmlType t, F &&f) {
  using G = GgmlType;
  return dispatch_among<G, G::F32, G::F16, G::BF16, G::Q4_0, G::Q4_1, G::Q5_0, G::Q5_1, G::Q8_0, G::Q2_K, G::Q3_K,
                        G::Q4_K, G::Q5_K, G::Q6_K>(t, std::forward<F>(f));
}

// The types with an integer form (act_format Q8_0 or Q8_K).
template <class F>
bool dispatch_q8(GgmlType t, F &&f) {
  using G = GgmlType;
  return dispatch_among<G, G::Q4_0, G::Q5_0, G::Q8_0, G::Q2_K, G::Q3_K, G::Q4_K, G::Q5_K, G::Q6_K>(t,
                                                                                              std::forward<F>(f));
}

// Quantizes x [n_rows][K] per row into scratch (matmul_scratch_bytes' layout: the quants,
// then from the next 256-byte boundary the block scales); act_block 32 (Q8_0) or 256 (Q8_K).
struct QuantizedActs {
  int8_t *q;
  float *d;
};
template <class Src>
QuantizedActs quantize_acts(Src src, int64_t K, int n_rows, int act_block, void *scratch, CudaStream s) {
  QuantizedActs a{act_quants(scratch), act_scales(scratch, n_rows, K)};
  const dim3 grid(unsigned((K / act_block + 3) / 4), unsigned(n_rows));
  if (act_block == 32) {
    launch(quantize_q8_0_kernel<Src>, grid, 128, s, src, K, n_rows, a.q, a.d);
  } else {
    launch(quantize_q8_k_kernel<Src>, grid, 128, s, src, K, n_rows, a.q, a.d);
  }
  return a;
}
QuantizedActs quantize_acts(const float *x, int64_t K, int n_rows, int act_block, void *scratch, CudaStream s) {
  return quantize_acts(LoadSrc{x}, K, n_rows, act_block, scratch, s);
}

Status check_matrix(const DevMatrix &w, const char *op) {
  TypeGeom tg;
  if (!type_geom(w.type, &tg)) {
    return Status(GEIST_E_UNSUPPORTED, std::string(op) + ": weight type " +
                                           std::to_string(static_cast<uint32_t>(w.type)) +
                                           " is not supported by the CUDA kernels");
  }
  if (w.data == nullptr || w.n_in <= 0 || w.n_out <= 0 || w.n_in % tg.block != 0 ||
      w.row_bytes < size_t(w.n_in / tg.block) * size_t(tg.block_bytes)) {
    return bad_arg(std::string(op) + ": bad weight view (null data, bad shape or row_bytes)");
  }
  return Status::ok();
}

}  // namespace

bool matmul_supported(GgmlType t) {
  TypeGeom tg;
  return type_geom(t, &tg);
}

size_t matmul_scratch_bytes(const DevMatrix &w, int max_rows) {
  TypeGeom tg;
  if (!type_geom(w.type, &tg) || tg.act_block == 0 || max_rows <= 0) return 0;
  const size_t rows = size_t(max_rows);
  const size_t nd = size_t(w.n_in / tg.act_block);
  return align_up(rows * size_t(w.n_in), 256) + rows * nd * sizeof(float);
}

namespace {
// The F32-mode kernel for n_rows: the matrix-vector kernel (8 rows per block, blockIdx.y over
// groups of 8) up to 8 rows, and up to 128 where the tile kernel's 32 x 32 tiles would not
// give every SM one (Gemma 4's per-layer input gate, 2560 x 256: 8 tiles from 9 to 32 rows,
// each a serial walk over K = 2560). GEIST_CUDA_F32_MATVEC_ROWS=N instead takes the
// matrix-vector kernel for every call of at most max(N, 8) rows (8: the tile kernel from 9
// rows). The same bits either way (dot_f32's chains and tree).
bool f32_matvec(const DevMatrix &w, int n_rows) {
  static const int knob = env_int("GEIST_CUDA_F32_MATVEC_ROWS", -1);
  if (n_rows <= 8) return true;
  if (knob >= 0) return n_rows <= knob;
  const int64_t tiles = (w.n_out + kFtN - 1) / kFtN * ((n_rows + kFtM - 1) / kFtM);
  return n_rows <= 128 && tiles < device_sm_count();
}
}  // namespace

namespace {
// Q4_0/Q5_0/Q8_0: the matrix-vector kernel for 1-2 rows, and up to 8 where the MMA
// kernel's 64 x 64 tiles would not give every SM one (the 270M's 640-wide matrices: 4 rows
// took 23.5 us in 32 tiles of 2048 outputs, 2 rows 4.6 us); else the MMA kernel.
bool q32_matvec(const DevMatrix &w, int n_rows) {
  TypeGeom tg;
  return type_geom(w.type, &tg) && tg.block == 32 && tg.act_block == 32 && !reference_kernels() &&
         (n_rows <= 2 || (n_rows <= 8 && (w.n_out + 63) / 64 < device_sm_count()));
}

// The set of n (<= kQ32SetMax) matrices and their outputs.
Q32Set q32_set(const DevMatrix *ws, float *const *ys, int n) {
  Q32Set set{};
  set.n = n;
  for (int m = 0; m < n; ++m) {
    set.w[m] = ws[m].data;
    set.row_bytes[m] = ws[m].row_bytes;
    set.y[m] = ys[m];
    set.n_out[m] = ws[m].n_out;
    set.first[m + 1] = set.first[m] + ws[m].n_out;
    set.type[m] = ws[m].type;
  }
  return set;
}

// The matrix-vector kernel over n (<= kQ32SetMax per launch) matrices of one 32-block type
// and K, each with q32_matvec true.
void launch_q32_matvec(const DevMatrix *ws, float *const *ys, int n, const QuantizedActs &qa, int n_rows,
                       CudaStream s) {
  for (int m0 = 0; m0 < n; m0 += kQ32SetMax) {
    const Q32Set set = q32_set(ws + m0, ys + m0, n - m0 < kQ32SetMax ? n - m0 : kQ32SetMax);
    const dim3 g(unsigned((set.first[set.n] + kMvq32Warps - 1) / kMvq32Warps));
    const int64_t K = ws[m0].n_in;
    dispatch_q8(ws[m0].type, [&](auto tag) {
      constexpr GgmlType T = decltype(tag)::value;
      if constexpr (dev::BlockInfo<T>::kBlock == 32) {
        auto go = [&](auto kernel) {
          launch(kernel, g, kMvq32Warps * 32, s, set, K, qa.q, qa.d, n_rows, prefetch_mode());
        };
        if (n_rows == 1 && set.n == 1 && launch_q32_staged<T>(ws[m0], ys[m0], qa.q, qa.d, s)) return;
        if (n_rows == 1) {
          go(matvec_q32_kernel<T, 1>);
        } else if (n_rows == 2) {
          go(matvec_q32_kernel<T, 2>);
        } else if (n_rows <= 4) {
          go(matvec_q32_kernel<T, 4>);
        } else {
          go(matvec_q32_kernel<T, 8>);
        }
      }
    });
  }
}

// Up to kQ32SetMax matrices of 32-block types, not all of one type, each with q32_matvec
// true, in one launch of matvec_q32_mixed_kernel (GEIST_CUDA_MIXED_SET=0 turns it off; on by
// default since it passed its op and model tests on an H100: the 270M's tg128 +2-6 %).
// false, with nothing launched, where that does not apply.
bool launch_q32_matvec_mixed(const DevMatrix *ws, float *const *ys, int n, const QuantizedActs &qa, int n_rows,
                             CudaStream s) {
  static const bool on = env_int("GEIST_CUDA_MIXED_SET", 1) != 0;
  if (!on || n < 2 || n > kQ32SetMax) return false;
  bool mixed = false;
  for (int m = 0; m < n; ++m) {
    if (!q32_matvec(ws[m], n_rows) || ws[m].n_in != ws[0].n_in) return false;
    mixed = mixed || ws[m].type != ws[0].type;
  }
  if (!mixed) return false;
  const Q32Set set = q32_set(ws, ys, n);
  const dim3 g(unsigned((set.first[n] + kMvq32Warps - 1) / kMvq32Warps));
  const int64_t K = ws[0].n_in;
  auto go = [&](auto kernel) { launch(kernel, g, kMvq32Warps * 32, s, set, K, qa.q, qa.d, n_rows, prefetch_mode()); };
  if (n_rows == 1) {
    go(matvec_q32_mixed_kernel<1>);
  } else if (n_rows == 2) {
    go(matvec_q32_mixed_kernel<2>);
  } else if (n_rows <= 4) {
    go(matvec_q32_mixed_kernel<4>);
  } else {
    go(matvec_q32_mixed_kernel<8>);
  }
  return true;
}

// The set takes one launch of matvec_q32_norm_kernel (matmul_n_norm_fits); *mixed: its
// types differ. Sets of 2 to 4 (q/k/v, gate/up): one long matrix alone takes the staged
// kernel (launch_q32_staged), which the fold would replace by a slower one.
bool q32_norm_set(const DevMatrix *ws, int n_mat, int64_t dim, bool *mixed) {
  static const bool mixed_on = env_int("GEIST_CUDA_MIXED_SET", 1) != 0;
  if (n_mat < 2 || n_mat > kQ32SetMax || dim <= 0 || dim % 32 != 0 || dim > kRmsNormAddNormMaxDim) return false;
  *mixed = false;
  for (int m = 0; m < n_mat; ++m) {
    if (!q32_matvec(ws[m], 1) || ws[m].n_in != dim || !check_matrix(ws[m], "cuda::matmul_n_norm").is_ok()) {
      return false;
    }
    *mixed = *mixed || ws[m].type != ws[0].type;
  }
  return !*mixed || mixed_on;
}

// The Q8-mode matmul once x is quantized (qa: matmul_scratch_bytes' layout for w).
Status matmul_quantized(const DevMatrix &w, const QuantizedActs &qa, float *y, int n_rows, CudaStream s) {
  const int8_t *xq = qa.q;
  const float *xd = qa.d;
  if (kquant_fast_path(w.type) && !reference_kernels()) {
    matmul_kquant(w, xq, xd, y, n_rows, s);
    return launch_status("cuda::matmul (k-quant)");
  }
  if (q32_matvec(w, n_rows)) {
    float *const ys[1] = {y};
    launch_q32_matvec(&w, ys, 1, qa, n_rows, s);
    return launch_status("cuda::matmul (q32 matvec)");
  }
  if (q32_mma_type(w.type) && kquant_mma_min_rows() < (1 << 30) && !reference_kernels()) {
    matmul_q32_mma(w, xq, xd, y, n_rows, s);
    return launch_status("cuda::matmul (q32 mma)");
  }
  const dim3 grid(unsigned((w.n_out + kWarpsPerBlock - 1) / kWarpsPerBlock),
                  unsigned((n_rows + kRowsPerWarp - 1) / kRowsPerWarp));
  const dim3 block(kWarpsPerBlock * 32);
  dispatch_q8(w.type, [&](auto tag) {
    constexpr GgmlType T = decltype(tag)::value;
    launch(matmul_q8_kernel<T>, grid, block, s, w.data, w.row_bytes, w.n_in, w.n_out, xq, xd, y, n_rows);
  });
  return launch_status("cuda::matmul (q8)");
}
}  // namespace

Status matmul(const DevMatrix &w, const float *x, float *y, int n_rows, ActMode mode, void *scratch,
              CudaStream s) {
  GEIST_RETURN_IF_ERROR(check_matrix(w, "cuda::matmul"));
  // n_rows is a grid dimension of the activation quantizer (at most 65535).
  if (n_rows < 0 || n_rows > 65535 || (n_rows > 0 && (x == nullptr || y == nullptr))) {
    return bad_arg("cuda::matmul: n_rows outside [0, 65535] or null x/y");
  }
  if (n_rows == 0) return Status::ok();
  const int64_t K = w.n_in;
  const dim3 grid(unsigned((w.n_out + kWarpsPerBlock - 1) / kWarpsPerBlock),
                  unsigned((n_rows + kRowsPerWarp - 1) / kRowsPerWarp));
  const dim3 block(kWarpsPerBlock * 32);
  TypeGeom tg;
  type_geom(w.type, &tg);
  if (mode == ActMode::F32 || tg.act_block == 0) {
    dispatch_all(w.type, [&](auto tag) {
      constexpr GgmlType T = decltype(tag)::value;
      if (f32_matvec(w, n_rows) && !reference_kernels()) {
        launch_matvec_f32<T>(w, x, y, n_rows, s);
      } else if (!reference_kernels()) {
        const dim3 g(unsigned((w.n_out + kFtN - 1) / kFtN), unsigned((n_rows + kFtM - 1) / kFtM));
        bool done = false;
        if constexpr (kFloatType<T>) {
          if (f32_tile_async(w, x)) {
            launch(matmul_f32_tile_async_kernel<T>, g, 256, s, w.data, w.row_bytes, K, w.n_out, x, y, n_rows);
            done = true;
          }
        }
        if (!done) launch(matmul_f32_tile_kernel<T>, g, 256, s, w.data, w.row_bytes, K, w.n_out, x, y, n_rows);
      } else {
        launch(matmul_f32_kernel<T>, grid, block, s, w.data, w.row_bytes, K, w.n_out, x, y, n_rows);
      }
    });
    return launch_status("cuda::matmul (f32)");
  }
  if (scratch == nullptr) return bad_arg("cuda::matmul: Q8 mode needs scratch (matmul_scratch_bytes)");
  const QuantizedActs qa = quantize_acts(x, K, n_rows, tg.act_block, scratch, s);
  GEIST_RETURN_IF_ERROR(launch_status("cuda::matmul (quantize activations)"));
  return matmul_quantized(w, qa, y, n_rows, s);
}

namespace {
// Whether ws (n_mat >= 1) can run on one quantization of x: Q8 mode, one activation format
// and K for all, not the reference kernels. act_block: that format's block.
// all false: only K-quants up to 8 rows (matmul_n's grouping with GEIST_CUDA_GROUP_ALL=0).
bool shares_quantization(const DevMatrix *ws, float *const *ys, int n_mat, int n_rows, bool all, int *act_block) {
  TypeGeom tg0;
  if (n_mat < 1 || ws == nullptr || ys == nullptr || n_rows < 1 || n_rows > 65535 || reference_kernels() ||
      !type_geom(ws[0].type, &tg0) || tg0.act_block == 0) {
    return false;
  }
  for (int m = 0; m < n_mat; ++m) {
    TypeGeom tg;
    if (!check_matrix(ws[m], "cuda::matmul_n").is_ok() || !type_geom(ws[m].type, &tg) ||
        tg.act_block != tg0.act_block || ws[m].n_in != ws[0].n_in || ys[m] == nullptr) {
      return false;
    }
    if (!all && (!kquant_fast_path(ws[m].type) || n_rows > 8)) return false;
  }
  *act_block = tg0.act_block;
  return true;
}

// The matrices on one quantization of their x: one launch per run of same-type matrices
// where the kernel takes sets (the K-quants up to 8 rows, the Q4_0/Q5_0/Q8_0 matrix-vector
// kernel), one per matrix elsewhere.
Status matmul_n_on(const DevMatrix *ws, float *const *ys, int n_mat, const QuantizedActs &qa, int n_rows,
                   CudaStream s) {
  if (matmul_kquant_mixed(ws, ys, n_mat, qa.q, qa.d, n_rows, s) ||
      matmul_kquant_wtile_set(ws, ys, n_mat, qa.q, qa.d, n_rows, s) ||
      launch_q32_matvec_mixed(ws, ys, n_mat, qa, n_rows, s)) {
    return launch_status("cuda::matmul_n (mixed set)");
  }
  for (int m0 = 0; m0 < n_mat;) {
    int m1 = m0 + 1;
    while (m1 < n_mat && ws[m1].type == ws[m0].type) ++m1;
    if (kquant_fast_path(ws[m0].type) && n_rows <= 8) {
      matmul_kquant_n(ws + m0, ys + m0, m1 - m0, qa.q, qa.d, n_rows, s);
      GEIST_RETURN_IF_ERROR(launch_status("cuda::matmul_n (k-quant)"));
    } else {
      bool set = true;
      for (int m = m0; m < m1; ++m) set = set && q32_matvec(ws[m], n_rows);
      if (set) {
        launch_q32_matvec(ws + m0, ys + m0, m1 - m0, qa, n_rows, s);
        GEIST_RETURN_IF_ERROR(launch_status("cuda::matmul_n (q32 matvec)"));
      } else {
        for (int m = m0; m < m1; ++m) GEIST_RETURN_IF_ERROR(matmul_quantized(ws[m], qa, ys[m], n_rows, s));
      }
    }
    m0 = m1;
  }
  return Status::ok();
}
}  // namespace

Status matmul_n(const DevMatrix *ws, float *const *ys, int n_mat, const float *x, int n_rows, ActMode mode,
                void *scratch, CudaStream s) {
  if (n_mat < 0 || (n_mat > 0 && (ws == nullptr || ys == nullptr))) return bad_arg("cuda::matmul_n: bad matrix list");
  // One quantization of x for every matrix, when they all take the same activation format
  // (Q8_0 or Q8_K) and K: the quantized rows depend on x alone, so the bits are the same as
  // quantizing per matrix.
  // Every type shares since 2026-12-05 (CudaOps.MatmulNMixedTypesBitExact and the model
  // tests passed on an H100; 270M tg128 ~810 -> ~985 t/s, E4B unchanged: CUDA.md);
  // GEIST_CUDA_GROUP_ALL=0 shares only among K-quants up to 8 rows, as before.
  static const bool all = env_int("GEIST_CUDA_GROUP_ALL", 1) != 0;
  int act_block = 0;
  if (mode != ActMode::Q8 || n_mat < 2 || scratch == nullptr || x == nullptr ||
      !shares_quantization(ws, ys, n_mat, n_rows, all, &act_block)) {
    for (int m = 0; m < n_mat; ++m) GEIST_RETURN_IF_ERROR(matmul(ws[m], x, ys[m], n_rows, mode, scratch, s));
    return Status::ok();
  }
  const QuantizedActs qa = quantize_acts(x, ws[0].n_in, n_rows, act_block, scratch, s);
  GEIST_RETURN_IF_ERROR(launch_status("cuda::matmul_n (quantize activations)"));
  return matmul_n_on(ws, ys, n_mat, qa, n_rows, s);
}

int matmul_n_act_block(const DevMatrix *ws, float *const *ys, int n_mat, int n_rows) {
  int act_block = 0;
  return shares_quantization(ws, ys, n_mat, n_rows, true, &act_block) ? act_block : 0;
}

Status quantize_rows(const float *x, int64_t K, int n_rows, int act_block, void *scratch, CudaStream s) {
  if (x == nullptr || scratch == nullptr || (act_block != 32 && act_block != 256) || K <= 0 || K % act_block != 0 ||
      n_rows < 0 || n_rows > 65535) {
    return bad_arg("cuda::quantize_rows: bad rows, block or null pointer");
  }
  if (n_rows == 0) return Status::ok();
  quantize_acts(x, K, n_rows, act_block, scratch, s);
  return launch_status("cuda::quantize_rows");
}

bool matmul_n_norm_fits(const DevMatrix *ws, int n_mat, int64_t dim) {
  bool mixed = false;
  return ws != nullptr && q32_norm_set(ws, n_mat, dim, &mixed);
}

Status matmul_n_norm(const DevMatrix *ws, float *const *ys, int n_mat, const NormFold &nf, CudaStream s) {
  bool mixed = false;
  if (ws == nullptr || ys == nullptr || !q32_norm_set(ws, n_mat, nf.dim, &mixed) || nf.x == nullptr ||
      nf.h == nullptr || nf.out == nullptr || nf.count == nullptr) {
    return bad_arg("cuda::matmul_n_norm: matrices it does not take, or null pointers");
  }
  // The blocks write y while the last one writes x, h and out: no output may overlap them.
  auto overlap = [](const float *a, int64_t na, const float *b, int64_t nb) { return a < b + nb && b < a + na; };
  const float *io[3] = {nf.x, nf.h, nf.out};
  for (int i = 0; i < 3; ++i) {
    for (int j = i + 1; j < 3; ++j) {
      if (overlap(io[i], nf.dim, io[j], nf.dim)) return bad_arg("cuda::matmul_n_norm: x, h and out overlap");
    }
  }
  for (int m = 0; m < n_mat; ++m) {
    if (ys[m] == nullptr) return bad_arg("cuda::matmul_n_norm: a null output");
    for (const float *p : io) {
      if (overlap(ys[m], ws[m].n_out, p, nf.dim)) return bad_arg("cuda::matmul_n_norm: an output overlaps x, h or out");
    }
  }
  const Q32Set set = q32_set(ws, ys, n_mat);
  const dim3 g(unsigned((set.first[n_mat] + kMvq32Warps - 1) / kMvq32Warps));
  const int64_t K = nf.dim;
  // The tree of rmsnorm_add_norm_quantize for this dim: 64 threads up to 512, else 256.
  auto go = [&](auto tag, auto mixed_tag) {
    constexpr GgmlType T = decltype(tag)::value;
    constexpr bool kMixed = decltype(mixed_tag)::value;
    auto with = [&](auto kernel) { launch(kernel, g, kMvq32Warps * 32, s, set, K, nf, prefetch_mode()); };
    if (nf.dim <= 512) {
      with(matvec_q32_norm_kernel<T, kMixed, 64, 8>);
    } else if (nf.dim <= 1024) {
      with(matvec_q32_norm_kernel<T, kMixed, 256, 4>);
    } else {
      with(matvec_q32_norm_kernel<T, kMixed, 256, 12>);
    }
  };
  if (mixed) {
    go(std::integral_constant<GgmlType, GgmlType::Q8_0>{}, std::true_type{});
  } else if (!dispatch_among<GgmlType, GgmlType::Q4_0, GgmlType::Q5_0, GgmlType::Q8_0>(
                 ws[0].type, [&](auto tag) { go(tag, std::false_type{}); })) {
    return bad_arg("cuda::matmul_n_norm: not a 32-block type");
  }
  return launch_status("cuda::matmul_n_norm");
}

Status matmul_n_quantized(const DevMatrix *ws, float *const *ys, int n_mat, int n_rows, void *scratch, CudaStream s) {
  int act_block = 0;
  if (scratch == nullptr || !shares_quantization(ws, ys, n_mat, n_rows, true, &act_block)) {
    return bad_arg("cuda::matmul_n_quantized: matrices that do not share one quantization, or no scratch");
  }
  const QuantizedActs qa{act_quants(scratch), act_scales(scratch, n_rows, ws[0].n_in)};
  return matmul_n_on(ws, ys, n_mat, qa, n_rows, s);
}

Status gelu_mul_quantize(const float *gate, const float *up, float *out, int n_rows, int64_t K, int act_block,
                         void *scratch, CudaStream s) {
  if (gate == nullptr || up == nullptr || out == nullptr || scratch == nullptr || n_rows < 0 || n_rows > 65535 ||
      K <= 0 || (act_block != 32 && act_block != 256) || K % act_block != 0) {
    return bad_arg("cuda::gelu_mul_quantize: bad arguments");
  }
  if (n_rows == 0) return Status::ok();
  if (K % 256 == 0) {
    const dim3 grid(unsigned(K / 256), unsigned(n_rows));
    int8_t *q = act_quants(scratch);
    float *d = act_scales(scratch, n_rows, K);
    if (act_block == 32) {
      launch(gelu_quantize_kernel<32>, grid, 256, s, GeluSrc{gate, up, out}, K, q, d);
    } else {
      launch(gelu_quantize_kernel<256>, grid, 256, s, GeluSrc{gate, up, out}, K, q, d);
    }
  } else {
    (void)quantize_acts(GeluSrc{gate, up, out}, K, n_rows, act_block, scratch, s);
  }
  return launch_status("cuda::gelu_mul_quantize");
}

Status embed(const DevMatrix &table, const int32_t *ids, int n, float scale, float *out, CudaStream s) {
  GEIST_RETURN_IF_ERROR(check_matrix(table, "cuda::embed"));
  if (n < 0 || n > 65535 || (n > 0 && (ids == nullptr || out == nullptr))) {
    return bad_arg("cuda::embed: n outside [0, 65535] or null ids/out");
  }
  if (n == 0) return Status::ok();
  const dim3 grid(unsigned((table.n_in + 255) / 256), unsigned(n));
  dispatch_all(table.type, [&](auto tag) {
    constexpr GgmlType T = decltype(tag)::value;
    launch(embed_kernel<T>, grid, 256, s, table.data, table.row_bytes, table.n_in, table.n_out, ids, scale, out);
  });
  return launch_status("cuda::embed");
}

}  // namespace geist::cuda
