// Quantized dot products with quantized activations, the arithmetic of ggml's CPU
// kernels: activations are quantized per row to 8-bit blocks (Q8_0 for the 32-element
// weight formats, Q8_K for the K-quants), the products are summed exactly in integers per
// block, and only the block scales are applied in f32. This is what fast SIMD/VNNI kernels
// compute too, so it is the scalar oracle for them.
//
// Two steps: `unpack_row` turns one weight row into integers once (reused across every
// activation row of a matmul), `dot_unpacked` takes it against one quantized activation row.
// Pure functions, thread-safe.
#pragma once

#include <cstdint>
#include <vector>

#include "quant/ggml_type.h"

namespace geist::quant {

enum class ActFormat { F32, Q8_0, Q8_K };
// The activation format a weight type is multiplied with. F32 for F32/F16/BF16 and for
// Q4_1/Q5_1 (computed from dequantized weights instead).
ActFormat act_format(GgmlType w);
// Elements per activation block of a format (1 for F32).
int act_block(ActFormat f);

// A quantized activation row of k elements: scales [k / block], quants [k]. d is the scale
// as the dot product uses it (for Q8_0 rounded through f16, as ggml stores it).
struct QuantizedRow {
  ActFormat format = ActFormat::F32;
  int64_t k = 0;
  std::vector<float> d;    // [k / block]
  std::vector<int8_t> q;   // [k]
};

// x[k] -> row (k a multiple of the block). Q8_0: per 32, d = amax/127 rounded to f16,
// q = round-half-even(x * 127/amax). Q8_K: per 256, d = max/-127 with max the element of
// largest magnitude, q = min(127, round-half-even(x * -127/max)).
void quantize_row(ActFormat f, const float *x, int64_t k, QuantizedRow *row);
// The same into caller buffers: d [k / block], q [k].
void quantize_row_to(ActFormat f, const float *x, int64_t k, float *d, int8_t *q);

// A weight row in integer form: element e of super-block s contributes
// d[s] * a[e] * x[e]  -  dmin[s] * m[e] * x[e]   (m is empty for types without mins).
struct UnpackedRow {
  int64_t k = 0;
  int block = 0;             // elements per super-block (32 or 256)
  std::vector<float> d;      // [k / block]
  std::vector<float> dmin;   // [k / block], empty if no mins
  std::vector<int16_t> a;    // [k] scale * quant
  std::vector<int16_t> m;    // [k] min (per element), empty if no mins
};

// Unpack a row of k elements of weight type t (act_format(t) must not be F32).
// Returns false for types without an integer form.
bool unpack_row(GgmlType t, const void *src, int64_t k, UnpackedRow *out);

// sum over super-blocks of (d_w * d_x) * isum - (dmin_w * d_x) * msum, in f32 in block
// order. w and x must have the same k and matching block sizes.
float dot_unpacked(const UnpackedRow &w, const QuantizedRow &x);

// Q8_0 weights straight from their blocks (no unpack): the same integer sums and the same
// f32 operations in the same order as unpack_row + dot_unpacked, so the same bits.
float dot_q8_0_blocks(const void *wrow, const QuantizedRow &x);

}  // namespace geist::quant
