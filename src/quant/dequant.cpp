// Scalar reference dequantization: the oracle for every fast kernel.
//
// Bit-exactness: every output is computed with the same float32 operations, in the same
// order, as gguf-py's gguf/quants.py (our independent reference, see
// scripts/gen_quant_vectors.py). In particular the f16 super-block scale is first
// widened to float32, multiplied by the integer sub-block scale (giving a float32
// sub-block scale), and only then multiplied by the quant; offsets are subtracted or
// added as a separate, rounded float32 operation. The build is ISO C++ (no GNU
// extensions), so GCC does not contract a*b+c into an fma; do not add -ffp-contract=fast
// or -ffast-math to this file.
#include <bit>
#include <cstdint>
#include <cstring>

#include "quant/block_formats.h"
#include "quant/quant.h"

namespace geist::quant {

// f16 bits -> float32, exactly. Subnormal halves are normalized; NaN keeps its sign and
// payload (shifted into the top mantissa bits, so signaling NaNs stay signaling), as
// numpy does.
float fp16_to_fp32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu;
  uint32_t mant = h & 0x3FFu;
  uint32_t bits;
  if (exp == 0x1F) {
    bits = sign | 0x7F800000u | (mant << 13);                   // inf or NaN
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (mant << 13);           // normal: rebias 15 -> 127
  } else if (mant == 0) {
    bits = sign;                                                // +-0
  } else {
    // Subnormal: mant * 2^-24. Shift the leading one up to bit 10 (the implicit bit);
    // each shift lowers the exponent by one from that of the smallest normal, 2^-14.
    int32_t e = 113;                                            // float exponent of 2^-14
    while ((mant & 0x400u) == 0) {
      mant <<= 1;
      --e;
    }
    bits = sign | (static_cast<uint32_t>(e) << 23) | ((mant & 0x3FFu) << 13);
  }
  return std::bit_cast<float>(bits);
}

// Round-to-nearest-even of m >> shift, shift in 1..31.
static uint32_t shift_round_even(uint32_t m, int shift) {
  const uint32_t q = m >> shift;
  const uint32_t rem = m & ((1u << shift) - 1);
  const uint32_t half = 1u << (shift - 1);
  return (rem > half || (rem == half && (q & 1))) ? q + 1 : q;
}

// float32 -> f16 bits, round to nearest even. Overflow (|f| >= 65520, the midpoint
// above the largest half 65504) gives inf. NaN keeps its sign and the top 10 payload
// bits; a payload that would truncate to zero becomes 1 so the result stays NaN (numpy's
// rule).
uint16_t fp32_to_fp16(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) {                                        // NaN
    uint32_t payload = (a >> 13) & 0x3FFu;
    if (payload == 0) payload = 1;
    return static_cast<uint16_t>(sign | 0x7C00u | payload);
  }
  if (a >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);  // -> inf
  if (a >= 0x38800000u) {
    // Normal half. Rounding may carry into the exponent field, which is the correct
    // encoding of the next binade (it cannot reach inf: a < 65520).
    const uint32_t exp = (a >> 23) - 112;                       // rebias 127 -> 15
    const uint32_t m = (exp << 23) | (a & 0x7FFFFFu);           // exp:mant, 5+23 bits
    return static_cast<uint16_t>(sign | shift_round_even(m, 13));
  }
  if (a <= 0x33000000u) return sign;  // |f| <= 2^-25: rounds to zero (2^-25 ties to even 0)
  // Half subnormal: result = round(|f| / 2^-24). |f| = m * 2^(E - 150) with the implicit
  // bit restored, so |f| / 2^-24 = m >> (126 - E); E is in 102..112, shift in 14..24. A
  // result of 0x400 is the smallest normal, correctly encoded.
  const int32_t e = static_cast<int32_t>(a >> 23);
  const uint32_t m = (a & 0x7FFFFFu) | 0x800000u;
  return static_cast<uint16_t>(sign | shift_round_even(m, 126 - e));
}

namespace {

inline float f16(uint16_t h) { return fp16_to_fp32(h); }

// ---- plain types: src [n] elements, dst [n] ------------------------------------------

void dequant_f32(const void *src, float *dst, int64_t n) {
  std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
}

void dequant_f16(const void *src, float *dst, int64_t n) {
  const auto *p = static_cast<const uint8_t *>(src);
  for (int64_t i = 0; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, p + 2 * i, 2);
    dst[i] = f16(h);
  }
}

void dequant_bf16(const void *src, float *dst, int64_t n) {
  const auto *p = static_cast<const uint8_t *>(src);
  for (int64_t i = 0; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, p + 2 * i, 2);
    dst[i] = bf16_to_fp32(h);
  }
}

// ---- 32-element formats: src [nb] blocks, dst [nb * 32] --------------------------------

void dequant_q4_0(const void *src, float *dst, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, dst += kQK) {
    const auto b = block_load<BlockQ4_0>(src, i);
    const float d = f16(b.d);
    for (int j = 0; j < kQK / 2; ++j) {
      dst[j] = d * static_cast<float>((b.qs[j] & 0x0F) - 8);
      dst[j + kQK / 2] = d * static_cast<float>((b.qs[j] >> 4) - 8);
    }
  }
}

void dequant_q4_1(const void *src, float *dst, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, dst += kQK) {
    const auto b = block_load<BlockQ4_1>(src, i);
    const float d = f16(b.d);
    const float m = f16(b.m);
    for (int j = 0; j < kQK / 2; ++j) {
      dst[j] = d * static_cast<float>(b.qs[j] & 0x0F) + m;
      dst[j + kQK / 2] = d * static_cast<float>(b.qs[j] >> 4) + m;
    }
  }
}

// Quant j of a Q5 block: low nibble from qs, fifth bit from the 32-bit qh mask. [0, 31]
inline int q5_quant(const uint8_t *qs, uint32_t qh, int j) {
  const int lo = j < kQK / 2 ? (qs[j] & 0x0F) : (qs[j - kQK / 2] >> 4);
  const int hi = static_cast<int>((qh >> j) & 1u);
  return lo | (hi << 4);
}

inline uint32_t load_u32_le(const uint8_t *p) {
  return static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) |
         (static_cast<uint32_t>(p[2]) << 16) | (static_cast<uint32_t>(p[3]) << 24);
}

void dequant_q5_0(const void *src, float *dst, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, dst += kQK) {
    const auto b = block_load<BlockQ5_0>(src, i);
    const float d = f16(b.d);
    const uint32_t qh = load_u32_le(b.qh);
    for (int j = 0; j < kQK; ++j) dst[j] = d * static_cast<float>(q5_quant(b.qs, qh, j) - 16);
  }
}

void dequant_q5_1(const void *src, float *dst, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, dst += kQK) {
    const auto b = block_load<BlockQ5_1>(src, i);
    const float d = f16(b.d);
    const float m = f16(b.m);
    const uint32_t qh = load_u32_le(b.qh);
    for (int j = 0; j < kQK; ++j) dst[j] = d * static_cast<float>(q5_quant(b.qs, qh, j)) + m;
  }
}

void dequant_q8_0(const void *src, float *dst, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, dst += kQK) {
    const auto b = block_load<BlockQ8_0>(src, i);
    const float d = f16(b.d);
    for (int j = 0; j < kQK; ++j) dst[j] = static_cast<float>(b.qs[j]) * d;
  }
}

// ---- K-quants: src [nb] super-blocks, dst [nb * 256] -----------------------------------

void dequant_q2_k(const void *src, float *dst, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, dst += kQK_K) {
    const auto b = block_load<BlockQ2_K>(src, i);
    const float d = f16(b.d);
    const float dmin = f16(b.dmin);
    for (int e = 0; e < kQK_K; ++e) {
      const int h = e / 128, s = (e / 32) % 4, l = e % 32;
      const int q = (b.qs[32 * h + l] >> (2 * s)) & 3;
      const uint8_t sc = b.scales[e / 16];
      const float dl = d * static_cast<float>(sc & 0x0F);       // sub-block scale
      const float ml = dmin * static_cast<float>(sc >> 4);      // sub-block min
      dst[e] = dl * static_cast<float>(q) - ml;
    }
  }
}

// The 16 signed 6-bit scales of a Q3_K block, unpacked (see BlockQ3_K). [-32, 31]
void unpack_scales_q3_k(const uint8_t packed[12], int out[16]) {
  for (int j = 0; j < 16; ++j) {
    const int lo = (packed[j % 8] >> (4 * (j / 8))) & 0x0F;
    const int hi = (packed[8 + j % 4] >> (2 * (j / 4))) & 0x03;
    out[j] = (lo | (hi << 4)) - 32;
  }
}

void dequant_q3_k(const void *src, float *dst, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, dst += kQK_K) {
    const auto b = block_load<BlockQ3_K>(src, i);
    const float d = f16(b.d);
    int sc[16];
    unpack_scales_q3_k(b.scales, sc);
    for (int e = 0; e < kQK_K; ++e) {
      const int h = e / 128, s = (e / 32) % 4, l = e % 32;
      const int lo = (b.qs[32 * h + l] >> (2 * s)) & 3;
      const int hbit = (b.hmask[l] >> (e / 32)) & 1;
      const int q = lo - (hbit ? 0 : 4);                         // [-4, 3]
      const float dl = d * static_cast<float>(sc[e / 16]);
      dst[e] = dl * static_cast<float>(q);
    }
  }
}


// Shared by Q4_K and Q5_K: dst[e] = (d * sc) * q[e] - (dmin * m), per 32-element sub-block.
void dequant_k4_core(float d, float dmin, const uint8_t scales[12], const int q[kQK_K],
                     float *dst) {
  for (int j = 0; j < kQK_K / 32; ++j) {
    int sc, mn;
    unpack_scale_min_k4(scales, j, &sc, &mn);
    const float dl = d * static_cast<float>(sc);
    const float ml = dmin * static_cast<float>(mn);
    for (int l = 0; l < 32; ++l) dst[32 * j + l] = dl * static_cast<float>(q[32 * j + l]) - ml;
  }
}

void dequant_q4_k(const void *src, float *dst, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, dst += kQK_K) {
    const auto b = block_load<BlockQ4_K>(src, i);
    int q[kQK_K];                                                // [256] in [0, 15]
    for (int e = 0; e < kQK_K; ++e) {
      const int c = e / 64, s = (e / 32) % 2, l = e % 32;
      q[e] = (b.qs[32 * c + l] >> (4 * s)) & 0x0F;
    }
    dequant_k4_core(f16(b.d), f16(b.dmin), b.scales, q, dst);
  }
}

void dequant_q5_k(const void *src, float *dst, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, dst += kQK_K) {
    const auto b = block_load<BlockQ5_K>(src, i);
    int q[kQK_K];                                                // [256] in [0, 31]
    for (int e = 0; e < kQK_K; ++e) {
      const int c = e / 64, s = (e / 32) % 2, l = e % 32;
      const int lo = (b.qs[32 * c + l] >> (4 * s)) & 0x0F;
      const int hi = (b.qh[l] >> (e / 32)) & 1;
      q[e] = lo | (hi << 4);
    }
    dequant_k4_core(f16(b.d), f16(b.dmin), b.scales, q, dst);
  }
}

void dequant_q6_k(const void *src, float *dst, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, dst += kQK_K) {
    const auto b = block_load<BlockQ6_K>(src, i);
    const float d = f16(b.d);
    for (int e = 0; e < kQK_K; ++e) {
      const int h = e / 128, s = (e / 32) % 4, l = e % 32;
      const int lo = (b.ql[64 * h + 32 * (s % 2) + l] >> (4 * (s / 2))) & 0x0F;
      const int hi = (b.qh[32 * h + l] >> (2 * s)) & 0x03;
      const int q = (lo | (hi << 4)) - 32;                       // [-32, 31]
      const float dl = d * static_cast<float>(b.scales[e / 16]);
      dst[e] = dl * static_cast<float>(q);
    }
  }
}

}  // namespace

bool dequantize_row(GgmlType t, const void *src, float *dst, int64_t n) {
  const TypeTraits *tt = type_traits(static_cast<uint32_t>(t));
  if (tt == nullptr || !tt->has_dequant || n < 0 || n % tt->block_size != 0) return false;
  if (n == 0) return true;
  const int64_t nb = n / tt->block_size;
  switch (t) {
    case GgmlType::F32: dequant_f32(src, dst, n); return true;
    case GgmlType::F16: dequant_f16(src, dst, n); return true;
    case GgmlType::BF16: dequant_bf16(src, dst, n); return true;
    case GgmlType::Q4_0: dequant_q4_0(src, dst, nb); return true;
    case GgmlType::Q4_1: dequant_q4_1(src, dst, nb); return true;
    case GgmlType::Q5_0: dequant_q5_0(src, dst, nb); return true;
    case GgmlType::Q5_1: dequant_q5_1(src, dst, nb); return true;
    case GgmlType::Q8_0: dequant_q8_0(src, dst, nb); return true;
    case GgmlType::Q2_K: dequant_q2_k(src, dst, nb); return true;
    case GgmlType::Q3_K: dequant_q3_k(src, dst, nb); return true;
    case GgmlType::Q4_K: dequant_q4_k(src, dst, nb); return true;
    case GgmlType::Q5_K: dequant_q5_k(src, dst, nb); return true;
    case GgmlType::Q6_K: dequant_q6_k(src, dst, nb); return true;
    default: return false;  // has_dequant in the table but no code here: a table bug
  }
}

}  // namespace geist::quant
