// Element types of the KV cache, shared by every backend. A row of n elements (n a
// multiple of 32 for q8_0) is stored as:
//   F32   n floats;
//   F16   n IEEE halves, round-to-nearest-even (quant::fp32_to_fp16);
//   BF16  n bfloat16, round-to-nearest-even of the top 16 bits (a NaN stays a quiet NaN);
//   Q8_0  n/32 blocks of ggml's Q8_0 layout (f16 d, then 32 int8 q), with the arithmetic
//         of the activation quantizer (quant/dot.h, ActFormat::Q8_0): amax = max |x_j|,
//         d = f16(amax / 127), q_j = round-half-even(x_j * (127 / amax)) (0 when amax is 0);
//         read back as f32(d) * q_j.
// Every backend stores and reads these exact bits, so a snapshot image moves between
// backends unchanged.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace geist {

enum class KvType : uint8_t { F32 = 0, F16 = 1, BF16 = 2, Q8_0 = 3 };

inline const char *kv_type_name(KvType t) {
  switch (t) {
    case KvType::F32: return "f32";
    case KvType::F16: return "f16";
    case KvType::BF16: return "bf16";
    case KvType::Q8_0: return "q8_0";
  }
  return "?";
}

// "f32", "f16", "bf16", "q8_0" (as llama.cpp's -ctk/-ctv spell them); nullopt otherwise.
inline std::optional<KvType> kv_type_from_name(std::string_view s) {
  if (s == "f32") return KvType::F32;
  if (s == "f16") return KvType::F16;
  if (s == "bf16") return KvType::BF16;
  if (s == "q8_0") return KvType::Q8_0;
  return std::nullopt;
}

// Bytes of one row of n elements (n a multiple of 32 for q8_0).
inline size_t kv_row_bytes(KvType t, int64_t n) {
  switch (t) {
    case KvType::F32: return size_t(n) * 4;
    case KvType::F16:
    case KvType::BF16: return size_t(n) * 2;
    case KvType::Q8_0: return size_t(n / 32) * 34;
  }
  return 0;
}

}  // namespace geist
