// Tensor element types as numbered by GGUF/ggml, and their block geometry.
// The numbering is the on-disk format's; never renumber.
#pragma once

#include <cstddef>
#include <cstdint>

namespace geist::quant {

enum class GgmlType : uint32_t {
  F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q8_1 = 9,
  Q2_K = 10, Q3_K = 11, Q4_K = 12, Q5_K = 13, Q6_K = 14, Q8_K = 15,
  IQ2_XXS = 16, IQ2_XS = 17, IQ3_XXS = 18, IQ1_S = 19, IQ4_NL = 20, IQ3_S = 21, IQ2_S = 22,
  IQ4_XS = 23, I8 = 24, I16 = 25, I32 = 26, I64 = 27, F64 = 28, IQ1_M = 29, BF16 = 30,
  TQ1_0 = 34, TQ2_0 = 35, MXFP4 = 39, NVFP4 = 40, Q1_0 = 41,
};

struct TypeTraits {
  const char *name;      // "Q4_K"
  int64_t block_size;    // elements per block (1 for plain types)
  size_t block_bytes;    // bytes per block
  bool has_dequant;      // geist can dequantize (and therefore compute with) this type
};

// Traits of a raw type id as read from a file; nullptr if the id is not a known ggml type.
const TypeTraits *type_traits(uint32_t type_id);
inline const TypeTraits &traits(GgmlType t) { return *type_traits(static_cast<uint32_t>(t)); }
inline const char *type_name(GgmlType t) { return traits(t).name; }

// Bytes of a row of n elements; n must be a multiple of the block size.
inline size_t row_bytes(GgmlType t, int64_t n) {
  const TypeTraits &tt = traits(t);
  return static_cast<size_t>(n / tt.block_size) * tt.block_bytes;
}

}  // namespace geist::quant
