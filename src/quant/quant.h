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
// float -> bfloat16 bits: round to nearest even of the top 16 bits (a value past the
// largest bf16 carries into the exponent and gives inf); a NaN keeps its sign and top
// payload bits and is made quiet (ggml's rule, so its payload never rounds to inf).
inline uint16_t fp32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  return static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

// Dequantize n elements of type t (n a multiple of the block size) from src, which holds
// row_bytes(t, n) bytes, into dst[n]. Returns false (and writes nothing) if t has no
// dequantizer (traits(t).has_dequant == false) or n is not a multiple of the block size.
bool dequantize_row(GgmlType t, const void *src, float *dst, int64_t n);

}  // namespace geist::quant
