// Scalar reference dequantization for GGUF block formats: the oracle every fast kernel
// is tested against. Pure functions, thread-safe, no allocation.
#pragma once

#include <cstdint>
#include <cstring>

#include "quant/ggml_type.h"

namespace geist::quant {

// IEEE half / bfloat16 <-> float. Exact (round-to-nearest-even on the way down).
float fp16_to_fp32(uint16_t h);
uint16_t fp32_to_fp16(float f);
inline float bf16_to_fp32(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Dequantize n elements of type t (n a multiple of the block size) from src, which holds
// row_bytes(t, n) bytes, into dst[n]. Returns false (and writes nothing) if t has no
// dequantizer (traits(t).has_dequant == false) or n is not a multiple of the block size.
bool dequantize_row(GgmlType t, const void *src, float *dst, int64_t n);

}  // namespace geist::quant
