// The fast Q8-mode matmul of the K-quants (matmul_kquant.cu), called by cuda::matmul once
// the activations are quantized (Q8_K: xq [n_rows][K] int8, xd [n_rows][K / 256]).
#pragma once

#include <cstddef>
#include <cstdint>

#include "backends/cuda/kernels.h"

namespace geist::cuda {

// Q2_K, Q3_K, Q4_K, Q5_K, Q6_K.
bool kquant_fast_path(quant::GgmlType t);
// Row counts each kernel takes (tuning knobs, no effect on the bits): on sm_80 and later up
// to GEIST_CUDA_MVMMA_ROWS (default and most 32: ceil(rows / 8) B tiles per warp) the
// tensor-core matrix-vector kernel;
// else up to GEIST_CUDA_MATVEC_ROWS (default 2) the dp4a matvec; up to
// GEIST_CUDA_SKINNY_ROWS (default 32; 64 with GEIST_CUDA_WTILE=0) the few-rows MMA kernel;
// above, the prefill tile kernel: matmul_wtile_kernel (64 outputs x 64 or 32 rows per block,
// GEIST_CUDA_WTILE=8 or 4, default 8) or, with GEIST_CUDA_WTILE=0, the older 64 x 64
// matmul_mma_kernel (int8 MMA needs sm_80).
int kquant_mvmma_max_rows();
int kquant_matvec_max_rows();
// The fewest rows for the int8 MMA kernels: 9 on sm_80 and later, 2^30 (never) before.
int kquant_mma_min_rows();
int kquant_skinny_max_rows();
// y = W x with dot_unpacked's bits; enqueues on s (launch errors: cudaGetLastError).
void matmul_kquant(const DevMatrix &w, const int8_t *xq, const float *xd, float *y, int n_rows, CudaStream s);
// The same for n_mat matrices of one K-quant type and one K sharing the activations.
void matmul_kquant_n(const DevMatrix *ws, float *const *ys, int n_mat, const int8_t *xq, const float *xd, int n_rows,
                     CudaStream s);
// One row of a Q4_K run then a Q6_K run sharing x (Q4_K_M's q, k and v) in one launch of
// the dp4a matvec, where GEIST_CUDA_MIXED_SET=1 and each run alone would take that kernel;
// false, with nothing launched, otherwise. The bits of matmul_kquant_n on each run.
bool matmul_kquant_mixed(const DevMatrix *ws, float *const *ys, int n_mat, const int8_t *xq, const float *xd,
                         int n_rows, CudaStream s);
// Up to 4 matrices of one K-quant type, or of Q4_K and Q6_K, sharing x in one launch of the
// prefill tile kernel where each alone would take it (GEIST_CUDA_WTILE_SET, default on);
// false, with nothing launched, otherwise. The bits of matmul_kquant_n on each matrix.
bool matmul_kquant_wtile_set(const DevMatrix *ws, float *const *ys, int n_mat, const int8_t *xq, const float *xd,
                             int n_rows, CudaStream s);

// Q4_0, Q5_0, Q8_0 (Q8_0-mode activations: xq [n_rows][K] int8, xd [n_rows][K / 32]) on
// int8 tensor cores, 64 x 64 tiles: dot_q8_0_blocks's bits (the integer sum of each
// 32-element block is exact, its f32 term is added in block order). Needs sm_80
// (kquant_mma_min_rows() < 2^30).
bool q32_mma_type(quant::GgmlType t);
// Multiprocessors of the current device (read once; 1 if unknown).
int device_sm_count();
// The device's opt-in shared memory per block (at least 48 KiB).
size_t device_optin_smem();
void matmul_q32_mma(const DevMatrix &w, const int8_t *xq, const float *xd, float *y, int n_rows, CudaStream s);

}  // namespace geist::cuda
