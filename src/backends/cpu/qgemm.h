// Quantized matmul over packed weights (packed.h), one implementation per SIMD tier.
//
// y[r][n] = sum_k W[n][k] x[r][k] with x quantized per row (quant/dot.h's formats) and the
// arithmetic of quant/dot.h's scalar oracle, element for element: per block an exact
// integer sum, then the block scales in f32, accumulated in block order. So every tier,
// every row count and every thread count gives the same bits as the generic path.
//
// A call covers groups [g0, g1) of 16 weight rows for all n_rows activation rows, in
// tiles of up to 8 (or 4) rows; a ragged tail of rows runs the same kernel instantiated
// for fewer rows, a ragged tail of weight rows (n_out % 16) a masked store.
#pragma once

#include <cstddef>
#include <cstdint>

#include "backends/cpu/isa.h"
#include "backends/cpu/ops.h"
#include "quant/dot.h"
#include "quant/ggml_type.h"

namespace geist::cpu {

struct GemmArgs {
  const uint8_t *w = nullptr;  // packed groups
  size_t group_bytes = 0;
  int64_t K = 0;
  int64_t n_out = 0;           // valid weight rows
  // Quantized activations, n_rows rows each of: q [K] int8, d [K / act_block] f32,
  // s32 [K / 32] and s16 [K / 16] int16 sums of q over 32 and 16 elements.
  const int8_t *xq = nullptr;
  const float *xd = nullptr;
  const int16_t *xs32 = nullptr;
  const int16_t *xs16 = nullptr;
  int n_rows = 0;
  float *y = nullptr;          // y[r * ldy + n]
  int64_t ldy = 0;
};

using GemmFn = void (*)(const GemmArgs &a, int64_t g0, int64_t g1);

// Float weights (F32, F16, BF16; also Q4_1, Q5_1, whose generic path dequantizes rows to
// f32; rows of row_bytes, unpacked) times f32 activations
// x [n_rows][K]: y[r * ldy + (n - n_begin)] for weight rows n in the call's [n0, n1), with
// the generic dot_f32's arithmetic (fgemm_impl.h).
struct FloatGemmArgs {
  const uint8_t *w = nullptr;
  size_t row_bytes = 0;
  int64_t K = 0;
  const float *x = nullptr;
  int n_rows = 0;
  float *y = nullptr;
  int64_t ldy = 0;
  int64_t n_begin = 0;
};

using FloatGemmFn = void (*)(const FloatGemmArgs &a, int64_t n0, int64_t n1);

// Attention's partial states over keys [lo, hi] (inclusive) for query rows [r0, r1) and
// KV head g (attn_impl.h, Attn::rows): row r's state, at st[r - r0], holds m[group],
// l[group], acc[group][head_dim] for the n_head / n_head_kv query heads of the group, over
// the keys of [lo, hi] the row sees; a row that sees none is left untouched. head_dim
// must be a multiple of the tier's lanes. Any k_type, v_type: typed rings are read to f32
// a block of keys at a time, once for all the rows. A row's bits do not depend on r0, r1.
using AttnRowsFn = void (*)(const AttentionArgs &a, int g, int r0, int r1, int64_t lo, int64_t hi,
                            float *const *st);
// Within one task of the attention's pool runs the AttnRowsFn calls are for the same query
// rows (their chunks in order); this is a number no other task on this thread has had (0:
// outside any task), so that a kernel may keep what it made of the queries across them.
uint64_t attention_task_id();

struct TierKernels {
  Isa isa;
  GemmFn q8_0, q4_0, q5_0, q4_k, q5_k, q6_k, q2_k, q3_k;  // nullptr: not implemented on this tier
  AttnRowsFn attn_rows;
  void (*gelu_mul)(const float *gate, const float *up, float *out, int64_t n);
  int lanes;  // f32 lanes per vector
  FloatGemmFn f32, f16, bf16, q4_1, q5_1;  // q4_1, q5_1: f32 activations, as the generic path
  // quant::quantize_row_to's bits for Q8_0 and Q8_K activation rows, vectorized; nullptr:
  // the tier has none (the scalar one runs).
  void (*quantize_row)(quant::ActFormat f, const float *x, int64_t k, float *d, int8_t *q) = nullptr;
  // The most query rows attn_rows takes per call for these arguments (it then also gets one
  // task per thread rather than two); nullptr: 16. More rows share each key block read: the
  // AMX-BF16 kernel takes 32.
  int (*attn_row_block)(const AttentionArgs &a) = nullptr;
  GemmFn for_type(quant::GgmlType t) const;
  FloatGemmFn float_for_type(quant::GgmlType t) const;
};

// The kernels of a tier (nullptr for generic, which has no packed path, or for a tier
// this build does not contain). The tier's own ISA must be supported by the CPU to call them.
const TierKernels *tier_kernels(Isa isa);
// Kernel calls made on each tier since start (for tests that check a tier really ran).
uint64_t tier_calls(Isa isa);
void count_tier_call(Isa isa);
// Kernel calls that ran on AMX tiles (amx_impl.h) since start.
uint64_t amx_calls();
void count_amx_call();

// Defined in the tier translation units.
const TierKernels *tier_kernels_avx2();
const TierKernels *tier_kernels_avx2vnni();
const TierKernels *tier_kernels_avx512();

}  // namespace geist::cpu
