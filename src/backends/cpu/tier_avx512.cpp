// The AVX-512 tier: F/BW/DQ/VL + VNNI (this file is compiled with those -m flags and its
// code runs only when isa.cpp found them). One 512-bit vector = 16 packed weight rows.
#include <immintrin.h>

#include <algorithm>
#include <bit>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "backends/cpu/qgemm.h"
#include "quant/quant.h"

namespace geist::cpu {
namespace {

#include "backends/cpu/simd_math_impl.h"

struct Avx512 {
  using I = __m512i;
  using F = __m512;
  static constexpr int L = 16;
  static constexpr int RT = 8;
  static constexpr int kQ8Offset = 128;
  static constexpr bool kUnpackOnce = false;
  static constexpr bool kI16Dp = false;  // vpdpbusd sums into int32 (qgemm_impl.h)
  static constexpr int kAttnScoreHeads = 4;  // attention scores: 4 heads x 4 keys per pass
  static constexpr int kAttnDv = 4;
  static constexpr int kFloatWT = 4;  // float GEMM tile: 4 weight rows x 4 activation rows
  static constexpr int kFloatRT = 4;

  static I load(const uint8_t *p) { return _mm512_loadu_si512(p); }
  static I zero() { return _mm512_setzero_si512(); }
  static I set1(int32_t v) { return _mm512_set1_epi32(v); }
  static I nib_lo(I v) { return _mm512_and_si512(v, _mm512_set1_epi8(0x0F)); }
  static I nib_hi(I v) { return _mm512_and_si512(_mm512_srli_epi16(v, 4), _mm512_set1_epi8(0x0F)); }
  // w | 2^pos where bit j of the plane byte is set (w < 2^pos; j and pos constants after
  // unrolling): the 16-bit shifts move bit j of each byte to bit pos of the same byte.
  static I or_bit(I w, I planes, int j, int pos) {
    const I b = j <= pos ? _mm512_slli_epi16(planes, pos - j) : _mm512_srli_epi16(planes, j - pos);
    return _mm512_or_si512(w, _mm512_and_si512(b, _mm512_set1_epi8(static_cast<char>(1 << pos))));
  }
  // Bits 2n..2n + 1 of every byte (n a constant after unrolling).
  static I crumb(I v, int n) { return _mm512_and_si512(_mm512_srli_epi16(v, 2 * n), _mm512_set1_epi8(3)); }
  static I hi2(I hv) { return _mm512_and_si512(hv, _mm512_set1_epi8(0x30)); }
  static I or_hi2_shl4(I lo, I hv) { return _mm512_or_si512(lo, hi2(_mm512_slli_epi16(hv, 4))); }
  static I or_hi2_shl2(I lo, I hv) { return _mm512_or_si512(lo, hi2(_mm512_slli_epi16(hv, 2))); }
  static I or_hi2_shl0(I lo, I hv) { return _mm512_or_si512(lo, hi2(hv)); }
  static I or_hi2_shr2(I lo, I hv) { return _mm512_or_si512(lo, hi2(_mm512_srli_epi16(hv, 2))); }
  static I dp(I acc, I w, int32_t x) { return _mm512_dpbusd_epi32(acc, w, _mm512_set1_epi32(x)); }
  static I dp_q8(I acc, I w, int32_t x) { return dp(acc, w, x); }
  static I dpwssd(I acc, I w, int32_t x) { return _mm512_dpwssd_epi32(acc, w, _mm512_set1_epi32(x)); }
  static I add(I a, I b) { return _mm512_add_epi32(a, b); }
  static I mullo(I a, I b) { return _mm512_mullo_epi32(a, b); }
  static I load_u8_i32(const uint8_t *p) { return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i *>(p))); }
  static I load_s8_i32(const uint8_t *p) { return _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i *>(p))); }

  static F fzero() { return _mm512_setzero_ps(); }
  static F cvt(I v) { return _mm512_cvtepi32_ps(v); }
  static F cvtph(const uint8_t *p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(p))); }
  static F cvtbf16(const uint8_t *p) {
    return _mm512_castsi512_ps(
        _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(p))), 16));
  }
  // The 16 lanes of v[0] summed as the tree l += l + 8, l += l + 4, l += l + 2, l += l + 1.
  static float hsum16(const F *v) {
    const __m256 t = _mm256_add_ps(_mm512_castps512_ps256(v[0]), _mm512_extractf32x8_ps(v[0], 1));
    __m128 u = _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
    u = _mm_add_ps(u, _mm_movehl_ps(u, u));
    return _mm_cvtss_f32(_mm_add_ss(u, _mm_movehdup_ps(u)));
  }
  // The f16 at p (unaligned) as a float (F16C: exact; a signaling NaN comes back quiet).
  static float half1(const uint8_t *p) {
    uint16_t h;
    std::memcpy(&h, p, 2);
    return _cvtsh_ss(h);
  }
  // 16 lanes: ((p[l] >> sh) & 15) + (bit l of hb) * 16, as floats (Q4_1/Q5_1 quants).
  static F nib_f(const uint8_t *p, int sh, uint32_t hb) {
    __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i *>(p)));
    v = _mm512_and_si512(_mm512_srli_epi32(v, sh), _mm512_set1_epi32(15));
    v = _mm512_mask_add_epi32(v, static_cast<__mmask16>(hb), v, _mm512_set1_epi32(16));
    return _mm512_cvtepi32_ps(v);
  }
  static F set1f(float v) { return _mm512_set1_ps(v); }
  static F mul(F a, F b) { return _mm512_mul_ps(a, b); }
  static F div(F a, F b) { return _mm512_div_ps(a, b); }
  static F add(F a, F b) { return _mm512_add_ps(a, b); }
  static F sub(F a, F b) { return _mm512_sub_ps(a, b); }
  static F loadf(const float *p) { return _mm512_loadu_ps(p); }
  static void storef(float *p, F v) { _mm512_storeu_ps(p, v); }
  static F fmadd(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
  // out[i] = scale * (sum of the lanes of v_i), i = 0..3, by a transpose-and-add tree.
  static void hsum4(F a, F b, F c, F d, float scale, float *out) {
    const F t0 = _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
    const F t1 = _mm512_add_ps(_mm512_unpacklo_ps(c, d), _mm512_unpackhi_ps(c, d));
    const F t2 = _mm512_add_ps(_mm512_shuffle_ps(t0, t1, _MM_SHUFFLE(1, 0, 1, 0)),
                               _mm512_shuffle_ps(t0, t1, _MM_SHUFFLE(3, 2, 3, 2)));
    const __m256 t3 = _mm256_add_ps(_mm512_castps512_ps256(t2), _mm512_extractf32x8_ps(t2, 1));
    const __m128 t4 = _mm_add_ps(_mm256_castps256_ps128(t3), _mm256_extractf128_ps(t3, 1));
    _mm_storeu_ps(out, _mm_mul_ps(t4, _mm_set1_ps(scale)));
  }
  static F fmin(F a, F b) { return _mm512_min_ps(a, b); }
  // 1.0f in the lanes where a >= b, else 0.0f (false for NaNs).
  static F step_ge(F a, F b) { return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(a, b, _CMP_GE_OQ), _mm512_set1_ps(1.0f)); }
  static F fmax(F a, F b) { return _mm512_max_ps(a, b); }
  static F fnmadd(F a, F b, F c) { return _mm512_fnmadd_ps(a, b, c); }
  static F round(F v) { return _mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  // 2^n for integral n in [-126, 127].
  static F pow2i(F n) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23));
  }
  static F exp(F x) { return exp_poly<Avx512>(x); }
  static float exp1(float x) { return _mm_cvtss_f32(_mm512_castps512_ps128(exp(_mm512_set1_ps(x)))); }
  static void store(float *y, F v, int n) {
    if (n == 16) {
      _mm512_storeu_ps(y, v);
    } else {
      _mm512_mask_storeu_ps(y, static_cast<__mmask16>((1u << n) - 1), v);
    }
  }
};

#include "backends/cpu/attn_impl.h"
#include "backends/cpu/ew_impl.h"
#include "backends/cpu/fgemm_impl.h"
#include "backends/cpu/qgemm_impl.h"
#include "backends/cpu/tier_table_impl.h"

#include "backends/cpu/amx_impl.h"

// Q8_0 / Q4_0 / Q5_0 with at least one full 16-row tile: on AMX where amx_enabled().
template <quant::GgmlType T>
void run_q32(const GemmArgs &a, int64_t g0, int64_t g1) {
  count_tier_call(Isa::Avx512);
  if (a.n_rows >= AmxQ32<Avx512>::kRows && amx_enabled()) {
    count_amx_call();
    AmxQ32<Avx512>::gemm<T>(a, g0, g1);
  } else {
    Kernels<Avx512>::gemm<T>(a, g0, g1);
  }
}

// Q4_K / Q5_K likewise (AmxK45), but only with GEIST_AMX_KQUANTS=1: measured on the 2-core
// Xeon (2026-12-05) it is no faster than VNNI (Q4_K 2560 x 10240 at 512 rows 35.9 against
// 36.3 ms) and slower at 16-128 rows (2048 x 640: 108 against 70 us at 16): the B tiles
// double with the scale split, and their loads and the strided activation tiles wait on L2.
bool amx_kquants() {
  static const bool on = [] {
    const char *e = std::getenv("GEIST_AMX_KQUANTS");
    return e != nullptr && std::strcmp(e, "1") == 0;
  }();
  return on;
}

template <quant::GgmlType T>
void run_k45(const GemmArgs &a, int64_t g0, int64_t g1) {
  count_tier_call(Isa::Avx512);
  if (a.n_rows >= AmxK45<Avx512>::kRows && amx_kquants() && amx_enabled()) {
    count_amx_call();
    AmxK45<Avx512>::gemm<T>(a, g0, g1);
  } else {
    Kernels<Avx512>::gemm<T>(a, g0, g1);
  }
}

// quant::quantize_q8_0 / quantize_q8_k (quant/dot.cpp) 16 lanes at a time, with their
// operations: the block's largest magnitude by max (NaN ignored, as the scalar `ax > amax`
// does: vmaxps returns its second operand when either is NaN), the scale in scalar code,
// then round_even's steps (NaN to 0, clamp to [-128, 127], + 1.5 * 2^23 - 1.5 * 2^23) per
// lane, and the int8 narrowing of values that are already integers in range.
__m512 round_even16(__m512 v) {
  v = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(v, v, _CMP_ORD_Q), v);
  v = _mm512_max_ps(v, _mm512_set1_ps(-128.0f));
  v = _mm512_min_ps(v, _mm512_set1_ps(127.0f));
  const __m512 magic = _mm512_set1_ps(12582912.0f);
  return _mm512_sub_ps(_mm512_add_ps(v, magic), magic);
}
__m128i to_i8(__m512 v) { return _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(v)); }
__m512 abs16(__m512 v) { return _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(v), _mm512_set1_epi32(0x7FFFFFFF))); }

void quantize_row_avx512(quant::ActFormat f, const float *x, int64_t k, float *rd, int8_t *rq) {
  if (f == quant::ActFormat::Q8_0) {
    for (int64_t b = 0; b < k / 32; ++b) {
      const float *xb = x + b * 32;
      const __m512 x0 = _mm512_loadu_ps(xb), x1 = _mm512_loadu_ps(xb + 16);
      const float amax = _mm512_reduce_max_ps(_mm512_max_ps(abs16(x1), _mm512_max_ps(abs16(x0), _mm512_setzero_ps())));
      const float d = amax / 127.0f;
      const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
      rd[b] = quant::fp16_to_fp32(quant::fp32_to_fp16(d));
      const __m512 vid = _mm512_set1_ps(id);
      _mm_storeu_si128(reinterpret_cast<__m128i *>(rq + b * 32), to_i8(round_even16(_mm512_mul_ps(x0, vid))));
      _mm_storeu_si128(reinterpret_cast<__m128i *>(rq + b * 32 + 16), to_i8(round_even16(_mm512_mul_ps(x1, vid))));
    }
    return;
  }
  if (f != quant::ActFormat::Q8_K) return;
  for (int64_t b = 0; b < k / 256; ++b) {
    const float *xb = x + b * 256;
    __m512 m = _mm512_setzero_ps();
    for (int c = 0; c < 16; ++c) m = _mm512_max_ps(abs16(_mm512_loadu_ps(xb + 16 * c)), m);
    const float amax = _mm512_reduce_max_ps(m);
    if (amax == 0.0f) {
      rd[b] = 0.0f;
      std::memset(&rq[b * 256], 0, 256);
      continue;
    }
    float mx = 0.0f;  // the first element of largest magnitude
    const __m512 va = _mm512_set1_ps(amax);
    for (int c = 0; c < 16; ++c) {
      const __mmask16 eq = _mm512_cmp_ps_mask(abs16(_mm512_loadu_ps(xb + 16 * c)), va, _CMP_EQ_OQ);
      if (eq != 0) {
        mx = xb[16 * c + __builtin_ctz(eq)];
        break;
      }
    }
    const float iscale = -127.0f / mx;
    const __m512 vs = _mm512_set1_ps(iscale);
    for (int c = 0; c < 16; ++c) {
      const __m512 v = _mm512_min_ps(round_even16(_mm512_mul_ps(vs, _mm512_loadu_ps(xb + 16 * c))), _mm512_set1_ps(127.0f));
      _mm_storeu_si128(reinterpret_cast<__m128i *>(rq + b * 256 + 16 * c), to_i8(v));
    }
    rd[b] = 1.0f / iscale;
  }
}

#include "backends/cpu/amx_attn_impl.h"

// Attention: bf16 K and V rings on AMX-BF16 tiles where it can (AmxAttnBf16), else the
// tier's f32 kernels.
void attn_rows_avx512(const AttentionArgs &a, int g, int r0, int r1, int64_t lo, int64_t hi, float *const *st) {
  if (AmxAttnBf16<Avx512>::usable(a, r0, r1, lo, hi)) {
    count_amx_call();
    AmxAttnBf16<Avx512>::rows(a, g, r0, r1, lo, hi, st);
  } else {
    Attn<Avx512>::rows_any(a, g, r0, r1, lo, hi, st);
  }
}

// Up to 32 rows per call where the AMX-BF16 kernel takes the arguments (each reads a chunk's keys
// once for all its rows; pp64 at depth 8192 +3 % on the 2-core Xeon), else the default 16.
int attn_row_block_avx512(const AttentionArgs &a) {
  return AmxAttnBf16<Avx512>::takes(a) ? AmxAttnBf16<Avx512>::rows_per_call(a) : 16;
}

constexpr TierKernels table() {
  TierKernels t = TierTable<Avx512, Isa::Avx512>::table();
  t.attn_rows = attn_rows_avx512;
  t.attn_row_block = attn_row_block_avx512;
  t.q8_0 = run_q32<quant::GgmlType::Q8_0>;
  t.q4_0 = run_q32<quant::GgmlType::Q4_0>;
  t.q5_0 = run_q32<quant::GgmlType::Q5_0>;
  t.q4_k = run_k45<quant::GgmlType::Q4_K>;
  t.q5_k = run_k45<quant::GgmlType::Q5_K>;
  t.quantize_row = quantize_row_avx512;
  return t;
}

constexpr TierKernels kTable = table();

}  // namespace

const TierKernels *tier_kernels_avx512() { return &kTable; }

}  // namespace geist::cpu
