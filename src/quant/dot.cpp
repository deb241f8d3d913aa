#include "quant/dot.h"

#include <cmath>
#include <cstring>

#include "base/cpu_clones.h"
#include "quant/block_formats.h"
#include "quant/quant.h"

namespace geist::quant {
namespace {

// Round half to even, as ggml's nearest_int and _mm256_round_ps(_MM_ROUND_NEAREST) do:
// adding 1.5 * 2^23 puts v in the binade where one ulp is 1, so the addition itself rounds
// (ties to even, the default mode), with no libm call and in a form compilers vectorize.
// NaN gives 0 and the result is clamped to int8's range, so non-finite activations (from a
// corrupt restored KV row, say) give garbage but never undefined behaviour; finite inputs
// of the quantizers below are already within [-127, 127].
inline int round_even(float v) {
  v = v == v ? v : 0.0f;
  v = v < -128.0f ? -128.0f : v;
  v = v > 127.0f ? 127.0f : v;
  return static_cast<int>((v + 12582912.0f) - 12582912.0f);
}

GEIST_CPU_CLONES
void quantize_q8_0(const float *x, int64_t k, float *rd, int8_t *rq) {
  for (int64_t b = 0; b < k / 32; ++b) {
    const float *xb = x + b * 32;
    float amax = 0.0f;
    for (int j = 0; j < 32; ++j) {
      const float ax = std::fabs(xb[j]);
      amax = ax > amax ? ax : amax;  // fmax: NaN ignored
    }
    const float d = amax / 127.0f;
    const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    rd[b] = fp16_to_fp32(fp32_to_fp16(d));
    for (int j = 0; j < 32; ++j) rq[b * 32 + j] = static_cast<int8_t>(round_even(xb[j] * id));
  }
}

GEIST_CPU_CLONES
void quantize_q8_k(const float *x, int64_t k, float *rd, int8_t *rq) {
  for (int64_t b = 0; b < k / 256; ++b) {
    const float *xb = x + b * 256;
    float amax = 0.0f, mx = 0.0f;
    for (int j = 0; j < 256; ++j) {
      const float ax = std::fabs(xb[j]);
      amax = ax > amax ? ax : amax;
    }
    for (int j = 0; j < 256; ++j) {  // the first element of largest magnitude
      if (std::fabs(xb[j]) == amax) {
        mx = xb[j];
        break;
      }
    }
    if (amax == 0.0f) {
      rd[b] = 0.0f;
      std::memset(&rq[b * 256], 0, 256);
      continue;
    }
    const float iscale = -127.0f / mx;
    for (int j = 0; j < 256; ++j) {
      const int v = round_even(iscale * xb[j]);
      rq[b * 256 + j] = static_cast<int8_t>(v < 127 ? v : 127);
    }
    rd[b] = 1.0f / iscale;
  }
}

// Header bytes of the super-scale fields of each block, so that a block can be turned
// into its integer form by dequantizing it with d = 1 (and dmin = 0), then with d = 0 and
// dmin = 1 for the mins. The products scale * quant are integers below 2^11, exact in f32.
struct ScaleFields {
  int d_off;     // byte offset of the f16 d
  int dmin_off;  // byte offset of the f16 dmin, -1 if none
};
bool scale_fields(GgmlType t, ScaleFields *f) {
  switch (t) {
    case GgmlType::Q4_0: case GgmlType::Q5_0: case GgmlType::Q8_0: *f = {0, -1}; return true;
    case GgmlType::Q2_K: *f = {80, 82}; return true;
    case GgmlType::Q3_K: *f = {108, -1}; return true;
    case GgmlType::Q4_K: case GgmlType::Q5_K: *f = {0, 2}; return true;
    case GgmlType::Q6_K: *f = {208, -1}; return true;
    default: return false;
  }
}

inline void put_f16(uint8_t *p, uint16_t h) { std::memcpy(p, &h, 2); }
inline float get_f16(const uint8_t *p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return fp16_to_fp32(h);
}

}  // namespace

ActFormat act_format(GgmlType w) {
  switch (w) {
    case GgmlType::Q4_0: case GgmlType::Q5_0: case GgmlType::Q8_0: return ActFormat::Q8_0;
    case GgmlType::Q2_K: case GgmlType::Q3_K: case GgmlType::Q4_K: case GgmlType::Q5_K: case GgmlType::Q6_K:
      return ActFormat::Q8_K;
    default: return ActFormat::F32;
  }
}

int act_block(ActFormat f) { return f == ActFormat::Q8_0 ? 32 : f == ActFormat::Q8_K ? 256 : 1; }

void quantize_row(ActFormat f, const float *x, int64_t k, QuantizedRow *row) {
  row->format = f;
  row->k = k;
  const int bs = act_block(f);
  row->d.resize(static_cast<size_t>(k / bs));
  row->q.resize(static_cast<size_t>(k));
  quantize_row_to(f, x, k, row->d.data(), row->q.data());
}

void quantize_row_to(ActFormat f, const float *x, int64_t k, float *d, int8_t *q) {
  if (f == ActFormat::Q8_0) quantize_q8_0(x, k, d, q);
  if (f == ActFormat::Q8_K) quantize_q8_k(x, k, d, q);
}

// The 32-element formats directly: a = signed quant, d = the block's f16 scale.
static bool unpack_row_q32(GgmlType t, const uint8_t *p, int64_t k, UnpackedRow *out) {
  const int64_t nb = k / 32;
  out->k = k;
  out->block = 32;
  out->d.resize(nb);
  out->a.resize(k);
  out->dmin.clear();
  out->m.clear();
  const size_t bb = traits(t).block_bytes;
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t *bp = p + b * bb;
    int16_t *a = out->a.data() + b * 32;
    out->d[b] = get_f16(bp);
    if (t == GgmlType::Q8_0) {
      for (int j = 0; j < 32; ++j) a[j] = static_cast<int8_t>(bp[2 + j]);
    } else if (t == GgmlType::Q4_0) {
      for (int j = 0; j < 16; ++j) {
        a[j] = static_cast<int16_t>((bp[2 + j] & 0x0F) - 8);
        a[j + 16] = static_cast<int16_t>((bp[2 + j] >> 4) - 8);
      }
    } else {  // Q5_0: f16 d, 32 high bits, 16 bytes of low nibbles
      uint32_t qh;
      std::memcpy(&qh, bp + 2, 4);
      for (int j = 0; j < 16; ++j) {
        const int lo0 = bp[6 + j] & 0x0F, lo1 = bp[6 + j] >> 4;
        a[j] = static_cast<int16_t>((lo0 | (((qh >> j) & 1) << 4)) - 16);
        a[j + 16] = static_cast<int16_t>((lo1 | (((qh >> (j + 16)) & 1) << 4)) - 16);
      }
    }
  }
  return true;
}

// Q4_K / Q5_K / Q6_K directly (the layouts of block_formats.h).
static bool unpack_row_k(GgmlType t, const uint8_t *p, int64_t k, UnpackedRow *out) {
  const int64_t nb = k / 256;
  const bool has_min = t != GgmlType::Q6_K;
  out->k = k;
  out->block = 256;
  out->d.resize(nb);
  out->a.resize(k);
  out->dmin.resize(has_min ? nb : 0);
  out->m.resize(has_min ? k : 0);
  const size_t bb = traits(t).block_bytes;
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t *bp = p + b * bb;
    int16_t *a = out->a.data() + b * 256;
    if (t == GgmlType::Q6_K) {
      const uint8_t *ql = bp, *qh = bp + 128;
      const auto *sc = reinterpret_cast<const int8_t *>(bp + 192);
      out->d[b] = get_f16(bp + 208);
      for (int e = 0; e < 256; ++e) {
        const int h = e / 128, s = (e / 32) % 4, l = e % 32;
        const int lo = (ql[64 * h + 32 * (s % 2) + l] >> (4 * (s / 2))) & 0x0F;
        const int hi = (qh[32 * h + l] >> (2 * s)) & 0x03;
        a[e] = static_cast<int16_t>(sc[e / 16] * ((lo | (hi << 4)) - 32));
      }
      continue;
    }
    out->d[b] = get_f16(bp);
    out->dmin[b] = get_f16(bp + 2);
    const uint8_t *sc = bp + 4;
    const uint8_t *qh = bp + 16;                                  // Q5_K only
    const uint8_t *qs = bp + (t == GgmlType::Q5_K ? 48 : 16);
    int16_t *m = out->m.data() + b * 256;
    for (int j = 0; j < 8; ++j) {
      int scale, min;
      unpack_scale_min_k4(sc, j, &scale, &min);
      for (int l = 0; l < 32; ++l) {
        const int e = 32 * j + l;
        int q = (qs[32 * (j / 2) + l] >> (4 * (j % 2))) & 0x0F;
        if (t == GgmlType::Q5_K) q |= ((qh[l] >> j) & 1) << 4;
        a[e] = static_cast<int16_t>(scale * q);
        m[e] = static_cast<int16_t>(min);
      }
    }
  }
  return true;
}

bool unpack_row(GgmlType t, const void *src, int64_t k, UnpackedRow *out) {
  if (t == GgmlType::Q8_0 || t == GgmlType::Q4_0 || t == GgmlType::Q5_0) {
    return unpack_row_q32(t, static_cast<const uint8_t *>(src), k, out);
  }
  if (t == GgmlType::Q4_K || t == GgmlType::Q5_K || t == GgmlType::Q6_K) {
    return unpack_row_k(t, static_cast<const uint8_t *>(src), k, out);
  }
  ScaleFields sf;
  if (!scale_fields(t, &sf)) return false;
  const TypeTraits &tt = traits(t);
  const int bs = static_cast<int>(tt.block_size);
  const int64_t nb = k / bs;
  out->k = k;
  out->block = bs;
  out->d.resize(nb);
  out->a.resize(k);
  const bool has_min = sf.dmin_off >= 0;
  out->dmin.resize(has_min ? nb : 0);
  out->m.resize(has_min ? k : 0);
  uint8_t blk[256];
  float tmp[256];
  const auto *p = static_cast<const uint8_t *>(src);
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t *bp = p + b * tt.block_bytes;
    std::memcpy(blk, bp, tt.block_bytes);
    out->d[b] = get_f16(bp + sf.d_off);
    put_f16(blk + sf.d_off, 0x3C00);  // 1.0
    if (has_min) {
      out->dmin[b] = get_f16(bp + sf.dmin_off);
      put_f16(blk + sf.dmin_off, 0x0000);
    }
    dequantize_row(t, blk, tmp, bs);
    for (int j = 0; j < bs; ++j) out->a[b * bs + j] = static_cast<int16_t>(tmp[j]);
    if (has_min) {
      put_f16(blk + sf.d_off, 0x0000);
      put_f16(blk + sf.dmin_off, 0x3C00);
      dequantize_row(t, blk, tmp, bs);  // = -m per element
      for (int j = 0; j < bs; ++j) out->m[b * bs + j] = static_cast<int16_t>(-tmp[j]);
    }
  }
  return true;
}

GEIST_CPU_CLONES
float dot_unpacked(const UnpackedRow &w, const QuantizedRow &x) {
  const int bs = w.block;
  const int64_t nb = w.k / bs;
  float sum = 0.0f;
  const int16_t *a = w.a.data();
  const int8_t *q = x.q.data();
  for (int64_t b = 0; b < nb; ++b) {
    int32_t isum = 0;
    for (int j = 0; j < bs; ++j) isum += int32_t(a[b * bs + j]) * int32_t(q[b * bs + j]);
    const float dx = x.d[b];
    float v = (w.d[b] * dx) * static_cast<float>(isum);
    if (!w.m.empty()) {
      int32_t msum = 0;
      const int16_t *m = w.m.data() + b * bs;
      for (int j = 0; j < bs; ++j) msum += int32_t(m[j]) * int32_t(q[b * bs + j]);
      v -= (w.dmin[b] * dx) * static_cast<float>(msum);
    }
    sum += v;
  }
  return sum;
}

GEIST_CPU_CLONES
float dot_q8_0_blocks(const void *wrow, const QuantizedRow &x) {
  const auto *p = static_cast<const uint8_t *>(wrow);
  const int64_t nb = x.k / 32;
  const int8_t *q = x.q.data();
  float sum = 0.0f;
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t *bp = p + b * 34;
    int8_t w[32];
    std::memcpy(w, bp + 2, 32);
    int32_t isum = 0;
    for (int j = 0; j < 32; ++j) isum += int32_t(w[j]) * int32_t(q[b * 32 + j]);
    sum += (get_f16(bp) * x.d[b]) * static_cast<float>(isum);
  }
  return sum;
}

}  // namespace geist::quant
