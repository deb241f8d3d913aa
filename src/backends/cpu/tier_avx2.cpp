// The AVX2 tier: AVX2 + FMA + F16C (compiled with those -m flags; runs only where isa.cpp
// found them). A packed group of 16 rows is processed as two halves of 8 lanes.
// Compiled a second time as the avx2vnni tier (tier_avx2vnni.cpp defines
// GEIST_TIER_AVXVNNI, adds -mavxvnni): the int8 dot products become AVX-VNNI's vpdpbusd
// (Alder Lake and later without AVX-512), everything else is this file's.
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "backends/cpu/qgemm.h"
#include "quant/quant.h"

namespace geist::cpu {
namespace {

#include "backends/cpu/simd_math_impl.h"

#if defined(GEIST_TIER_AVXVNNI)
constexpr Isa kIsa = Isa::Avx2Vnni;
#else
constexpr Isa kIsa = Isa::Avx2;
#endif

struct Avx2 {
  using I = __m256i;
  using F = __m256;
  static constexpr int L = 8;
  static constexpr int RT = 4;
#if defined(GEIST_TIER_AVXVNNI)
  // Q8_0 as stored (int8 + 128, unsigned) x the signed activations; the kernel takes
  // 128 * sum(x) back off (qgemm_impl.h), as on the AVX-512 tier.
  static constexpr int kQ8Offset = 128;
#else
  // Q8_0 is multiplied signed x signed (dp_q8 flips the stored + 128 back), so no offset.
  static constexpr int kQ8Offset = 0;
#endif
  static constexpr bool kUnpackOnce = true;  // qgemm_impl.h: unpack_once
  // Attention scores of 2 heads x 4 keys per pass (8 accumulators): 4 x 4 spilled out of
  // the 16 ymm registers (BM_AttentionKv 64 rows at 8128: 23.9-24.8 -> 22.5-22.7 ms).
  static constexpr int kAttnScoreHeads = 2;
  static constexpr int kAttnDv = 2;
  static constexpr int kFloatWT = 2;  // float GEMM tile: 2 weight rows x 3 activation rows
  static constexpr int kFloatRT = 3;

  static I load(const uint8_t *p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i *>(p)); }
  static I zero() { return _mm256_setzero_si256(); }
  static void storei(uint8_t *p, I v) { _mm256_storeu_si256(reinterpret_cast<__m256i *>(p), v); }
  static I set1(int32_t v) { return _mm256_set1_epi32(v); }
  static I nib_lo(I v) { return _mm256_and_si256(v, _mm256_set1_epi8(0x0F)); }
  static I nib_hi(I v) { return _mm256_and_si256(_mm256_srli_epi16(v, 4), _mm256_set1_epi8(0x0F)); }
  // w | 2^pos where bit j of the plane byte is set (w < 2^pos; j and pos constants after
  // unrolling): the 16-bit shifts move bit j of each byte to bit pos of the same byte.
  static I or_bit(I w, I planes, int j, int pos) {
    const I b = j <= pos ? _mm256_slli_epi16(planes, pos - j) : _mm256_srli_epi16(planes, j - pos);
    return _mm256_or_si256(w, _mm256_and_si256(b, _mm256_set1_epi8(static_cast<char>(1 << pos))));
  }
  // Bits 2n..2n + 1 of every byte (n a constant after unrolling).
  static I crumb(I v, int n) { return _mm256_and_si256(_mm256_srli_epi16(v, 2 * n), _mm256_set1_epi8(3)); }
  static I hi2(I hv) { return _mm256_and_si256(hv, _mm256_set1_epi8(0x30)); }
  static I or_hi2_shl4(I lo, I hv) { return _mm256_or_si256(lo, hi2(_mm256_slli_epi16(hv, 4))); }
  static I or_hi2_shl2(I lo, I hv) { return _mm256_or_si256(lo, hi2(_mm256_slli_epi16(hv, 2))); }
  static I or_hi2_shl0(I lo, I hv) { return _mm256_or_si256(lo, hi2(hv)); }
  static I or_hi2_shr2(I lo, I hv) { return _mm256_or_si256(lo, hi2(_mm256_srli_epi16(hv, 2))); }
#if defined(GEIST_TIER_AVXVNNI)
  // u8 x s8, four products summed into each int32 lane (exact: no int16 step).
  static I dp(I acc, I w, int32_t x) { return _mm256_dpbusd_avx_epi32(acc, w, _mm256_set1_epi32(x)); }
  static I dp_q8(I acc, I w, int32_t x) { return dp(acc, w, x); }
#else
  // u8 (<= 63) x s8: the int16 pair sums stay below 2^15, so maddubs does not saturate.
  static I dp(I acc, I w, int32_t x) {
    const I p = _mm256_maddubs_epi16(w, _mm256_set1_epi32(x));
    return _mm256_add_epi32(acc, _mm256_madd_epi16(p, _mm256_set1_epi16(1)));
  }
  // Q8_0: w holds int8 + 128; |w| x sign(x, w) keeps the pair sums within int16.
  static I dp_q8(I acc, I w, int32_t x) {
    const I ws = _mm256_xor_si256(w, _mm256_set1_epi8(static_cast<char>(0x80)));
    const I p = _mm256_maddubs_epi16(_mm256_abs_epi8(ws), _mm256_sign_epi8(_mm256_set1_epi32(x), ws));
    return _mm256_add_epi32(acc, _mm256_madd_epi16(p, _mm256_set1_epi16(1)));
  }
#endif
#if defined(GEIST_TIER_AVXVNNI)
  static constexpr bool kI16Dp = false;
#else
  // The quantized kernels sum runs of maddubs results in int16 lanes (dp16) and widen a
  // run once (widen16, or scale16 for a K-quant sub-block's scale): one multiply per
  // k-group and row instead of two. The callers bound each run so that no int16 sum can
  // leave [-32768, 32767]: a pair of products is at most 2 x wmax x 128.
  static constexpr bool kI16Dp = true;
  // The empty asm keeps the sum a chain in program order: GCC otherwise reassociates a run
  // of 8 into a tree, computes all the products of a tile first and spills them.
  static I dp16(I acc, I w, int32_t x) {
    I s = _mm256_add_epi16(acc, _mm256_maddubs_epi16(w, _mm256_set1_epi32(x)));
    __asm__("" : "+x"(s));
    return s;
  }
  static I widen16(I p) { return _mm256_madd_epi16(p, _mm256_set1_epi16(1)); }
  // p's int16 pairs summed and multiplied by the scale in each 32-bit lane (sc2 holds it
  // twice, as two int16).
  static I scale16(I p, I sc2) { return _mm256_madd_epi16(p, sc2); }
  static I mul16_m32(I v) { return _mm256_mullo_epi16(v, _mm256_set1_epi16(-32)); }
  // 8 bytes at p0 and at p1 (signed): lane k the int16 pair (p0[k], p1[k]).
  static I load_s8_pair_i16(const uint8_t *p0, const uint8_t *p1) {
    return _mm256_cvtepi8_epi16(_mm_unpacklo_epi8(_mm_loadl_epi64(reinterpret_cast<const __m128i *>(p0)),
                                                  _mm_loadl_epi64(reinterpret_cast<const __m128i *>(p1))));
  }
  // 8 bytes at p (unsigned / signed), byte k as the int16 pair (v, v) of lane k.
  static I load_u8_i16x2(const uint8_t *p) {
    const I b = _mm256_set1_epi64x(static_cast<int64_t>(x8(p)));
    return _mm256_srli_epi16(_mm256_shuffle_epi8(b, dup16()), 8);
  }
  static I load_s8_i16x2(const uint8_t *p) {
    const I b = _mm256_set1_epi64x(static_cast<int64_t>(x8(p)));
    return _mm256_srai_epi16(_mm256_shuffle_epi8(b, dup16()), 8);
  }
  static uint64_t x8(const uint8_t *p) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    return v;
  }
  // Byte k (k = 4 * lane half + i) into the high byte of both int16 of 32-bit lane k.
  static I dup16() {
    return _mm256_setr_epi8(-1, 0, -1, 0, -1, 1, -1, 1, -1, 2, -1, 2, -1, 3, -1, 3, -1, 4, -1, 4, -1, 5, -1, 5, -1, 6,
                            -1, 6, -1, 7, -1, 7);
  }
#endif
  static I dpwssd(I acc, I w, int32_t x) { return _mm256_add_epi32(acc, _mm256_madd_epi16(w, _mm256_set1_epi32(x))); }
  static I add(I a, I b) { return _mm256_add_epi32(a, b); }
  static I mullo(I a, I b) { return _mm256_mullo_epi32(a, b); }
  static I load_u8_i32(const uint8_t *p) { return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i *>(p))); }
  static I load_s8_i32(const uint8_t *p) { return _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i *>(p))); }

  static F fzero() { return _mm256_setzero_ps(); }
  static F cvt(I v) { return _mm256_cvtepi32_ps(v); }
  static F cvtph(const uint8_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i *>(p))); }
  static F cvtbf16(const uint8_t *p) {
    return _mm256_castsi256_ps(
        _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i *>(p))), 16));
  }
  // The 16 lanes of v[0] (lanes 0-7) and v[1] (8-15) summed as the tree l += l + 8,
  // l += l + 4, l += l + 2, l += l + 1.
  static float hsum16(const F *v) {
    const __m256 t = _mm256_add_ps(v[0], v[1]);
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
  // 8 lanes: ((p[l] >> sh) & 15) + (bit l of hb) * 16, as floats (Q4_1/Q5_1 quants).
  static F nib_f(const uint8_t *p, int sh, uint32_t hb) {
    __m256i v = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i *>(p)));
    v = _mm256_and_si256(_mm256_srli_epi32(v, sh), _mm256_set1_epi32(15));
    const __m256i bits = _mm256_and_si256(
        _mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int32_t>(hb)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)),
        _mm256_set1_epi32(1));
    v = _mm256_or_si256(v, _mm256_slli_epi32(bits, 4));
    return _mm256_cvtepi32_ps(v);
  }
  static F set1f(float v) { return _mm256_set1_ps(v); }
  static F mul(F a, F b) { return _mm256_mul_ps(a, b); }
  static F div(F a, F b) { return _mm256_div_ps(a, b); }
  static F add(F a, F b) { return _mm256_add_ps(a, b); }
  static F sub(F a, F b) { return _mm256_sub_ps(a, b); }
  static F loadf(const float *p) { return _mm256_loadu_ps(p); }
  static void storef(float *p, F v) { _mm256_storeu_ps(p, v); }
  static F fmadd(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
  // out[i] = scale * (sum of the lanes of v_i), i = 0..3, by a transpose-and-add tree.
  static void hsum4(F a, F b, F c, F d, float scale, float *out) {
    const F t0 = _mm256_add_ps(_mm256_unpacklo_ps(a, b), _mm256_unpackhi_ps(a, b));
    const F t1 = _mm256_add_ps(_mm256_unpacklo_ps(c, d), _mm256_unpackhi_ps(c, d));
    const F t2 = _mm256_add_ps(_mm256_shuffle_ps(t0, t1, _MM_SHUFFLE(1, 0, 1, 0)),
                               _mm256_shuffle_ps(t0, t1, _MM_SHUFFLE(3, 2, 3, 2)));
    const __m128 t4 = _mm_add_ps(_mm256_castps256_ps128(t2), _mm256_extractf128_ps(t2, 1));
    _mm_storeu_ps(out, _mm_mul_ps(t4, _mm_set1_ps(scale)));
  }
  static F fmin(F a, F b) { return _mm256_min_ps(a, b); }
  // 1.0f in the lanes where a >= b, else 0.0f (false for NaNs).
  static F step_ge(F a, F b) { return _mm256_and_ps(_mm256_cmp_ps(a, b, _CMP_GE_OQ), _mm256_set1_ps(1.0f)); }
  static F fmax(F a, F b) { return _mm256_max_ps(a, b); }
  static F fnmadd(F a, F b, F c) { return _mm256_fnmadd_ps(a, b, c); }
  static F round(F v) { return _mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  // 2^n for integral n in [-126, 127].
  static F pow2i(F n) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23));
  }
  static F exp(F x) { return exp_poly<Avx2>(x); }
  static float exp1(float x) { return _mm256_cvtss_f32(exp(_mm256_set1_ps(x))); }
  static void store(float *y, F v, int n) {
    if (n == 8) {
      _mm256_storeu_ps(y, v);
    } else {
      alignas(32) float t[8];
      _mm256_store_ps(t, v);
      std::memcpy(y, t, sizeof(float) * n);
    }
  }
};

#include "backends/cpu/attn_impl.h"
#include "backends/cpu/ew_impl.h"
#include "backends/cpu/fgemm_impl.h"
#include "backends/cpu/qgemm_impl.h"
#include "backends/cpu/tier_table_impl.h"

// quant::quantize_q8_0 / quantize_q8_k 8 lanes at a time with their operations, as the
// avx512 tier's quantize_row_avx512 (the largest magnitude by max, NaN ignored as vmaxps
// returns its second operand; the scale in scalar code; round_even's steps per lane).
__m256 abs8(__m256 v) { return _mm256_and_ps(v, _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF))); }
float hmax8(__m256 v) {  // lanes free of NaN
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
}
__m256 round_even8(__m256 v) {
  v = _mm256_and_ps(v, _mm256_cmp_ps(v, v, _CMP_ORD_Q));  // NaN -> 0
  v = _mm256_max_ps(v, _mm256_set1_ps(-128.0f));
  v = _mm256_min_ps(v, _mm256_set1_ps(127.0f));
  const __m256 magic = _mm256_set1_ps(12582912.0f);
  return _mm256_sub_ps(_mm256_add_ps(v, magic), magic);
}
void store_i8(int8_t *dst, __m256 v) {  // integral values in [-128, 127]
  const __m256i i = _mm256_cvtps_epi32(v);
  const __m128i w = _mm_packs_epi32(_mm256_castsi256_si128(i), _mm256_extracti128_si256(i, 1));
  _mm_storel_epi64(reinterpret_cast<__m128i *>(dst), _mm_packs_epi16(w, w));
}

void quantize_row_avx2(quant::ActFormat f, const float *x, int64_t k, float *rd, int8_t *rq) {
  if (f == quant::ActFormat::Q8_0) {
    for (int64_t b = 0; b < k / 32; ++b) {
      const float *xb = x + b * 32;
      __m256 m = _mm256_setzero_ps();
      for (int c = 0; c < 4; ++c) m = _mm256_max_ps(abs8(_mm256_loadu_ps(xb + 8 * c)), m);
      const float amax = hmax8(m);
      const float d = amax / 127.0f;
      const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
      rd[b] = quant::fp16_to_fp32(quant::fp32_to_fp16(d));
      const __m256 vid = _mm256_set1_ps(id);
      for (int c = 0; c < 4; ++c) store_i8(rq + b * 32 + 8 * c, round_even8(_mm256_mul_ps(_mm256_loadu_ps(xb + 8 * c), vid)));
    }
    return;
  }
  if (f != quant::ActFormat::Q8_K) return;
  for (int64_t b = 0; b < k / 256; ++b) {
    const float *xb = x + b * 256;
    __m256 m = _mm256_setzero_ps();
    for (int c = 0; c < 32; ++c) m = _mm256_max_ps(abs8(_mm256_loadu_ps(xb + 8 * c)), m);
    const float amax = hmax8(m);
    if (amax == 0.0f) {
      rd[b] = 0.0f;
      std::memset(&rq[b * 256], 0, 256);
      continue;
    }
    float mx = 0.0f;  // the first element of largest magnitude
    const __m256 va = _mm256_set1_ps(amax);
    for (int c = 0; c < 32; ++c) {
      const int eq = _mm256_movemask_ps(_mm256_cmp_ps(abs8(_mm256_loadu_ps(xb + 8 * c)), va, _CMP_EQ_OQ));
      if (eq != 0) {
        mx = xb[8 * c + __builtin_ctz(unsigned(eq))];
        break;
      }
    }
    const float iscale = -127.0f / mx;
    const __m256 vs = _mm256_set1_ps(iscale);
    for (int c = 0; c < 32; ++c) {
      store_i8(rq + b * 256 + 8 * c,
               _mm256_min_ps(round_even8(_mm256_mul_ps(vs, _mm256_loadu_ps(xb + 8 * c))), _mm256_set1_ps(127.0f)));
    }
    rd[b] = 1.0f / iscale;
  }
}

constexpr TierKernels table() {
  TierKernels t = TierTable<Avx2, kIsa>::table();
  t.quantize_row = quantize_row_avx2;
  return t;
}

constexpr TierKernels kTable = table();

}  // namespace

#if defined(GEIST_TIER_AVXVNNI)
const TierKernels *tier_kernels_avx2vnni() { return &kTable; }
#else
const TierKernels *tier_kernels_avx2() { return &kTable; }
#endif

}  // namespace geist::cpu
