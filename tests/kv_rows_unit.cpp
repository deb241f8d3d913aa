// kv_store_rows / kv_load_rows (backends/cpu/kv_rows.h) for every KvType, against the
// byte format of backends/kv_type.h: F16 against quant::fp32_to_fp16 and the CPU's F16C
// conversion, BF16 against a rounding computed in double, Q8_0 against the activation
// quantizer (quant/dot.h) and ggml's block_q8_0 layout read back by the Q8_0 weight
// dequantizer (itself checked against gguf-py). Ties, subnormals, inf and NaN included.
#include <gtest/gtest.h>
#include <immintrin.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "backends/cpu/isa.h"
#include "backends/cpu/kv_rows.h"
#include "backends/kv_type.h"
#include "quant/block_formats.h"
#include "quant/dot.h"
#include "quant/quant.h"
#include "test_util.h"

namespace geist::cpu {
namespace {

constexpr KvType kTypes[] = {KvType::F32, KvType::F16, KvType::BF16, KvType::Q8_0};

uint16_t store1(KvType t, float x) {
  uint16_t h;
  kv_store_rows(t, &x, 1, 1, &h);
  return h;
}

float load1(KvType t, uint16_t h) {
  float x;
  kv_load_rows(t, &h, 1, 1, &x);
  return x;
}

// Floats with every kind of value: normal over a wide range, f16 and f32 subnormals,
// exact ties of both 16-bit formats, zeros of both signs, infinities; no NaN.
std::vector<float> mixed_values(size_t n, std::mt19937 &rng) {
  std::vector<float> x(n);
  std::uniform_int_distribution<uint32_t> bits;
  std::uniform_int_distribution<int> kind(0, 7);
  const float inf = std::numeric_limits<float>::infinity();
  for (float &v : x) {
    const uint32_t u = bits(rng);
    const int k = kind(rng);
    if (k == 0) v = std::ldexp(float(int32_t(u) >> 8), -30);                // +-2^-7, 24 bits
    if (k == 1) v = std::bit_cast<float>((u & 0x807FFFFFu) | 0x33800000u);  // f16 subnormals
    if (k == 2) v = std::bit_cast<float>(u & 0x807FFFFFu);                  // f32 subnormals
    if (k == 3) v = std::bit_cast<float>((u & 0xFFFF0000u) | 0x8000u);      // bf16 ties
    if (k == 4) v = std::bit_cast<float>((u & 0xBFFFE000u) | 0x1000u);      // f16 ties (< 2)
    if (k == 5) v = (u & 1) ? -0.0f : 0.0f;
    if (k == 6) v = (u & 1) ? -inf : inf;
    if (k == 7) v = std::bit_cast<float>(u & 0xBFFFFFFFu);  // any magnitude below 2
    // A NaN pattern (from k == 3) made finite and huge by clearing an exponent bit.
    if (std::isnan(v)) v = std::bit_cast<float>(std::bit_cast<uint32_t>(v) & 0xFF7FFFFFu);
  }
  return x;
}

// ---- F32 -------------------------------------------------------------------------------

TEST(KvRows, F32IsACopyOfTheBits) {
  std::mt19937 rng(1);
  std::vector<uint32_t> bits(96);
  for (uint32_t &b : bits) b = rng();  // NaNs of every payload included
  std::vector<float> x(96), back(96);
  std::memcpy(x.data(), bits.data(), 96 * 4);
  std::vector<uint8_t> row(kv_row_bytes(KvType::F32, 96));
  kv_store_rows(KvType::F32, x.data(), 3, 32, row.data());
  ASSERT_EQ(0, std::memcmp(row.data(), bits.data(), row.size()));
  kv_load_rows(KvType::F32, row.data(), 3, 32, back.data());
  ASSERT_EQ(0, std::memcmp(back.data(), bits.data(), row.size()));
}

// ---- F16 -------------------------------------------------------------------------------

TEST(KvRows, F16EveryHalfReadsExactlyAndStoresBack) {
  for (uint32_t i = 0; i < 65536; ++i) {
    const uint16_t h = uint16_t(i);
    const float f = load1(KvType::F16, h);
    ASSERT_EQ(std::bit_cast<uint32_t>(f), std::bit_cast<uint32_t>(quant::fp16_to_fp32(h)))
        << std::hex << i;
    if (std::isnan(f)) {
      ASSERT_EQ(store1(KvType::F16, f) & 0x7C00u, 0x7C00u);
      ASSERT_NE(store1(KvType::F16, f) & 0x3FFu, 0u) << "a NaN stays NaN";
      ASSERT_EQ(store1(KvType::F16, f) & 0x8000u, h & 0x8000u) << "and keeps its sign";
    } else {
      ASSERT_EQ(store1(KvType::F16, f), h) << std::hex << i;
    }
  }
}

TEST(KvRows, F16RoundsToNearestEven) {
  // Every midpoint between neighbouring finite halves of one sign (exact in f32: 12
  // significant bits), and one f32 ulp either side of it.
  for (uint32_t i = 0; i < 0x7BFF; ++i) {
    for (uint32_t s : {0u, 0x8000u}) {
      const uint16_t lo = uint16_t(i | s), hi = uint16_t((i + 1) | s);
      const float mid = (quant::fp16_to_fp32(lo) + quant::fp16_to_fp32(hi)) / 2;
      ASSERT_EQ(double(mid),
                (double(quant::fp16_to_fp32(lo)) + double(quant::fp16_to_fp32(hi))) / 2);
      ASSERT_EQ(store1(KvType::F16, mid), (i & 1) ? hi : lo) << std::hex << i << " tie to even";
      const float toward_hi = std::nextafter(mid, quant::fp16_to_fp32(hi));
      const float toward_lo = std::nextafter(mid, quant::fp16_to_fp32(lo));
      ASSERT_EQ(store1(KvType::F16, toward_hi), hi) << std::hex << i;
      ASSERT_EQ(store1(KvType::F16, toward_lo), lo) << std::hex << i;
    }
  }
  // Overflow: 65520 (the midpoint above 65504, tie to the even inf) and beyond give inf.
  EXPECT_EQ(store1(KvType::F16, 65504.0f), 0x7BFFu);
  EXPECT_EQ(store1(KvType::F16, std::nextafter(65520.0f, 0.0f)), 0x7BFFu);
  EXPECT_EQ(store1(KvType::F16, 65520.0f), 0x7C00u);
  EXPECT_EQ(store1(KvType::F16, -1e30f), 0xFC00u);
  EXPECT_EQ(store1(KvType::F16, std::numeric_limits<float>::infinity()), 0x7C00u);
  // Underflow: 2^-25 is the tie between 0 and the smallest subnormal (even: 0).
  EXPECT_EQ(store1(KvType::F16, std::ldexp(1.0f, -25)), 0x0000u);
  EXPECT_EQ(store1(KvType::F16, std::nextafter(std::ldexp(1.0f, -25), 1.0f)), 0x0001u);
  EXPECT_EQ(store1(KvType::F16, -std::ldexp(1.0f, -30)), 0x8000u);
}

__attribute__((target("f16c"))) uint16_t f16c_round(float x) {
  return uint16_t(_cvtss_sh(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

TEST(KvRows, F16MatchesQuantAndTheCpusConversion) {
  std::mt19937 rng(2);
  const std::vector<float> x = mixed_values(1 << 16, rng);
  std::vector<uint16_t> h(x.size());
  kv_store_rows(KvType::F16, x.data(), int64_t(x.size()) / 64, 64, h.data());
  const bool f16c = cpu_features().f16c;
  for (size_t i = 0; i < x.size(); ++i) {
    ASSERT_EQ(h[i], quant::fp32_to_fp16(x[i])) << x[i];
    if (f16c) {  // an independent implementation (there is no NaN here)
      ASSERT_EQ(h[i], f16c_round(x[i])) << x[i];
    }
  }
  if (!f16c) GEIST_SKIP("no F16C on this CPU: checked against quant::fp32_to_fp16 only");
}

// ---- BF16 ------------------------------------------------------------------------------

// Round-to-nearest-even to bfloat16 computed on values in double: the two bf16 around x
// (truncation and the next one up in magnitude, 2^128 standing for inf), the nearer wins,
// a tie goes to the even one.
uint16_t bf16_reference(float x) {
  const uint32_t u = std::bit_cast<uint32_t>(x);
  if (std::isinf(x)) return uint16_t(u >> 16);
  const uint32_t lo = u >> 16, hi = lo + 1;
  auto value = [](uint32_t b) {
    const uint32_t mag = b & 0x7FFFu;
    const double v =
        mag == 0x7F80u ? std::ldexp(1.0, 128) : double(std::bit_cast<float>((b & 0x7FFFu) << 16));
    return v;
  };
  const double ax = std::fabs(double(x)), dlo = ax - value(lo), dhi = value(hi) - ax;
  if (dlo < dhi) return uint16_t(lo);
  if (dhi < dlo) return uint16_t(hi);
  return uint16_t((lo & 1) ? hi : lo);
}

TEST(KvRows, Bf16RoundsToNearestEven) {
  std::mt19937 rng(3);
  const std::vector<float> x = mixed_values(1 << 16, rng);
  std::vector<uint16_t> h(x.size());
  kv_store_rows(KvType::BF16, x.data(), int64_t(x.size()) / 32, 32, h.data());
  for (size_t i = 0; i < x.size(); ++i) {
    ASSERT_EQ(h[i], bf16_reference(x[i])) << std::hex << std::bit_cast<uint32_t>(x[i]);
    ASSERT_EQ(h[i], quant::fp32_to_bf16(x[i]));
  }
  // Ties both ways, the largest bf16, overflow and subnormals.
  EXPECT_EQ(store1(KvType::BF16, std::bit_cast<float>(0x3F808000u)), 0x3F80u);  // tie, even below
  EXPECT_EQ(store1(KvType::BF16, std::bit_cast<float>(0x3F818000u)), 0x3F82u);  // tie, even above
  EXPECT_EQ(store1(KvType::BF16, std::bit_cast<float>(0x3F808001u)), 0x3F81u);
  EXPECT_EQ(store1(KvType::BF16, std::bit_cast<float>(0x7F7F7FFFu)), 0x7F7Fu);
  EXPECT_EQ(store1(KvType::BF16, std::bit_cast<float>(0x7F7F8000u)),
            0x7F80u);  // tie to the even inf
  EXPECT_EQ(store1(KvType::BF16, std::numeric_limits<float>::max()), 0x7F80u);
  EXPECT_EQ(store1(KvType::BF16, -std::numeric_limits<float>::infinity()), 0xFF80u);
  EXPECT_EQ(store1(KvType::BF16, std::bit_cast<float>(0x00018000u)), 0x0002u);  // subnormal tie
  EXPECT_EQ(store1(KvType::BF16, std::bit_cast<float>(0x80008000u)), 0x8000u);  // to -0
  EXPECT_EQ(store1(KvType::BF16, std::bit_cast<float>(0x007FFFFFu)),
            0x0080u);  // up to the smallest normal
}

TEST(KvRows, Bf16NanStaysAQuietNan) {
  for (uint32_t hi : {0x7F80u, 0xFF80u, 0x7FC0u, 0xFFC0u, 0x7FFFu}) {
    for (uint32_t lo : {0x0001u, 0x8000u, 0xFFFFu, 0x0000u}) {
      const uint32_t u = (hi << 16) | lo;
      const float x = std::bit_cast<float>(u);
      if (!std::isnan(x)) continue;
      const uint16_t h = store1(KvType::BF16, x);
      ASSERT_TRUE(std::isnan(quant::bf16_to_fp32(h))) << std::hex << u;
      ASSERT_EQ(h & 0x40u, 0x40u) << std::hex << u << " quiet";
      ASSERT_EQ(h & 0x8000u, (u >> 16) & 0x8000u) << std::hex << u << " sign kept";
      ASSERT_EQ(h, uint16_t((u >> 16) | 0x40u)) << std::hex << u << " top payload kept";
    }
  }
}

TEST(KvRows, Bf16EveryValueReadsExactlyAndStoresBack) {
  for (uint32_t i = 0; i < 65536; ++i) {
    const uint16_t h = uint16_t(i);
    const float f = load1(KvType::BF16, h);
    ASSERT_EQ(std::bit_cast<uint32_t>(f), i << 16) << std::hex << i;
    if (!std::isnan(f)) {
      ASSERT_EQ(store1(KvType::BF16, f), h) << std::hex << i;
    }
  }
}

// ---- Q8_0 ------------------------------------------------------------------------------

TEST(KvRows, Q8_0IsGgmlsBlockWithTheActivationQuantizersArithmetic) {
  std::mt19937 rng(4);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const int64_t n_rows = 5, n = 256;
  std::vector<float> x(n_rows * n);
  for (float &v : x) v = nd(rng) * 3.0f;
  for (int j = 0; j < 32; ++j) x[64 + j] = 0.0f;                      // an all-zero block
  for (int j = 0; j < 32; ++j) x[n + 32 + j] = j % 2 ? -0.0f : 0.0f;  // signed zeros
  for (int j = 0; j < 32; ++j) x[2 * n + j] *= 1e-30f;  // amax far below f16's range: d = 0
  for (int j = 0; j < 32; ++j)
    x[3 * n + j] = std::ldexp(1.0f, -20) * float(j - 7);  // d subnormal in f16
  ASSERT_EQ(kv_row_bytes(KvType::Q8_0, n), size_t(n / 32) * 34);
  std::vector<uint8_t> rows(n_rows * kv_row_bytes(KvType::Q8_0, n));
  kv_store_rows(KvType::Q8_0, x.data(), n_rows, n, rows.data());
  std::vector<float> rd(n / 32), got(x.size()), deq(x.size());
  std::vector<int8_t> rq(n);
  for (int64_t r = 0; r < n_rows; ++r) {
    quant::quantize_row_to(quant::ActFormat::Q8_0, x.data() + r * n, n, rd.data(), rq.data());
    const uint8_t *row = rows.data() + r * kv_row_bytes(KvType::Q8_0, n);
    for (int64_t b = 0; b < n / 32; ++b) {
      quant::BlockQ8_0 blk;
      std::memcpy(&blk, row + b * 34, 34);
      ASSERT_EQ(blk.d, quant::fp32_to_fp16(rd[b])) << r << " " << b;
      ASSERT_EQ(quant::fp16_to_fp32(blk.d), rd[b]);
      ASSERT_EQ(0, std::memcmp(blk.qs, rq.data() + b * 32, 32)) << r << " " << b;
      // The layout by hand: little-endian f16 in bytes 0-1, then the int8 quants.
      ASSERT_EQ(row[b * 34] | (row[b * 34 + 1] << 8), blk.d);
      for (int j = 0; j < 32; ++j) ASSERT_EQ(int8_t(row[b * 34 + 2 + j]), rq[b * 32 + j]);
    }
  }
  // Reading back is the Q8_0 weight dequantizer's arithmetic, bit for bit.
  kv_load_rows(KvType::Q8_0, rows.data(), n_rows, n, got.data());
  ASSERT_TRUE(quant::dequantize_row(quant::GgmlType::Q8_0, rows.data(), deq.data(), n_rows * n));
  ASSERT_EQ(0, std::memcmp(got.data(), deq.data(), got.size() * 4));
  for (int j = 0; j < 32; ++j) {
    ASSERT_EQ(rows[2 * 34 + j + 2], 0) << "zero block: q = 0";
    ASSERT_EQ(std::bit_cast<uint32_t>(got[64 + j]), 0u) << "zero block reads +0";
  }
  ASSERT_EQ(rows[2 * 34], 0);
  ASSERT_EQ(rows[2 * 34 + 1], 0);
}

TEST(KvRows, Q8_0RoundsHalfToEven) {
  // amax 127: d = 1 exactly (f16 0x3C00), 127 / amax = 1, so q = round-half-even(x).
  std::vector<float> x(32, 0.0f);
  const float in[] = {127.0f, 0.5f, 1.5f,   2.5f,    -0.5f,       -1.5f,
                      -2.5f,  3.5f, 126.5f, -126.5f, 0.49999997f, -127.0f};
  const int8_t want[] = {127, 0, 2, 2, 0, -2, -2, 4, 126, -126, 0, -127};
  std::memcpy(x.data(), in, sizeof(in));
  uint8_t blk[34];
  kv_store_rows(KvType::Q8_0, x.data(), 1, 32, blk);
  EXPECT_EQ(blk[0], 0x00);
  EXPECT_EQ(blk[1], 0x3C);
  for (size_t j = 0; j < sizeof(want); ++j) EXPECT_EQ(int8_t(blk[2 + j]), want[j]) << in[j];
  for (size_t j = sizeof(want); j < 32; ++j) EXPECT_EQ(blk[2 + j], 0);
}

TEST(KvRows, Q8_0NonFiniteInputsAreDefined) {
  // NaN elements are ignored by amax and quantize to 0; an inf makes d inf and every q 0.
  std::vector<float> x(64, 1.0f);
  x[3] = std::numeric_limits<float>::quiet_NaN();
  x[40] = std::numeric_limits<float>::infinity();
  uint8_t rows[68];
  kv_store_rows(KvType::Q8_0, x.data(), 1, 64, rows);
  std::vector<float> rd(2);
  std::vector<int8_t> rq(64);
  quant::quantize_row_to(quant::ActFormat::Q8_0, x.data(), 64, rd.data(), rq.data());
  EXPECT_EQ(int8_t(rows[2 + 3]), 0);
  EXPECT_EQ(int8_t(rows[2 + 0]), 127);
  EXPECT_EQ(rows[34] | (rows[35] << 8), 0x7C00);
  for (int b = 0; b < 2; ++b) {
    EXPECT_EQ(rows[b * 34] | (rows[b * 34 + 1] << 8), quant::fp32_to_fp16(rd[b]));
    EXPECT_EQ(0, std::memcmp(rows + b * 34 + 2, rq.data() + b * 32, 32));
  }
}

TEST(KvRows, Q8_0RoundTripErrorIsHalfAStep) {
  // |x - f32(d) q| <= d / 2 from rounding q, plus 127 |d - f16(d)| from the scale's f16
  // rounding: at most half an f16 ulp, d 2^-11 for a normal d, 2^-25 for a subnormal one.
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const int64_t n = 4096;
  std::vector<float> x(n), y(n);
  for (int64_t i = 0; i < n; ++i) x[i] = nd(rng) * std::ldexp(1.0f, int(i / 32) % 20 - 10);
  std::vector<uint8_t> row(kv_row_bytes(KvType::Q8_0, n));
  kv_store_rows(KvType::Q8_0, x.data(), 1, n, row.data());
  kv_load_rows(KvType::Q8_0, row.data(), 1, n, y.data());
  for (int64_t b = 0; b < n / 32; ++b) {
    float amax = 0.0f;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[b * 32 + j]));
    const double d = amax / 127.0;
    for (int j = 0; j < 32; ++j) {
      const double bound = d / 2 + 127 * std::max(d / 2048, std::ldexp(1.0, -25));
      ASSERT_LE(std::fabs(double(x[b * 32 + j]) - y[b * 32 + j]), bound * (1 + 1e-6))
          << b << " " << j;
    }
  }
}

// ---- all types -------------------------------------------------------------------------

TEST(KvRows, RowsAreIndependentAndExactlyRowBytesLong) {
  std::mt19937 rng(6);
  const int64_t n_rows = 7, n = 96;
  const std::vector<float> x = mixed_values(size_t(n_rows * n), rng);
  for (KvType t : kTypes) {
    SCOPED_TRACE(kv_type_name(t));
    const size_t rb = kv_row_bytes(t, n);
    std::vector<uint8_t> all(n_rows * rb + 64, 0xA5), each(n_rows * rb + 64, 0x5A);
    kv_store_rows(t, x.data(), n_rows, n, all.data());
    for (int64_t r = 0; r < n_rows; ++r)
      kv_store_rows(t, x.data() + r * n, 1, n, each.data() + r * rb);
    ASSERT_EQ(0, std::memcmp(all.data(), each.data(), n_rows * rb));
    for (size_t i = n_rows * rb; i < all.size(); ++i)
      ASSERT_EQ(all[i], 0xA5) << "wrote past the rows";
    std::vector<float> back(n_rows * n + 16, 7.0f), back1(n_rows * n + 16, 7.0f);
    kv_load_rows(t, all.data(), n_rows, n, back.data());
    for (int64_t r = 0; r < n_rows; ++r)
      kv_load_rows(t, all.data() + r * rb, 1, n, back1.data() + r * n);
    ASSERT_EQ(0, std::memcmp(back.data(), back1.data(), back.size() * 4));
    for (size_t i = n_rows * n; i < back.size(); ++i)
      ASSERT_EQ(back[i], 7.0f) << "read past the rows";
  }
}

TEST(KvRows, StoringWhatWasReadGivesTheSameBytes) {
  // load(store(x)) is a fixed point of store. F16/BF16: every value is a float that stores
  // exactly. Q8_0 (f16(d) not 0): the new amax is 127 f16(d) exactly, so d is f16(d)
  // again, and x' 127 / amax' = q (1 + e) with |e| <= 2^-24 rounds back to q.
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 2.0f);
  const int64_t n = 512;
  std::vector<float> x(n), y(n);
  for (float &v : x) v = nd(rng);
  for (KvType t : kTypes) {
    SCOPED_TRACE(kv_type_name(t));
    std::vector<uint8_t> a(kv_row_bytes(t, n)), b(a.size());
    kv_store_rows(t, x.data(), 1, n, a.data());
    kv_load_rows(t, a.data(), 1, n, y.data());
    kv_store_rows(t, y.data(), 1, n, b.data());
    ASSERT_EQ(0, std::memcmp(a.data(), b.data(), a.size()));
  }
}

TEST(KvRows, NamesAndSizes) {
  for (KvType t : kTypes) ASSERT_EQ(kv_type_from_name(kv_type_name(t)), t);
  EXPECT_FALSE(kv_type_from_name("q4_0").has_value());
  EXPECT_EQ(kv_row_bytes(KvType::F32, 256), 1024u);
  EXPECT_EQ(kv_row_bytes(KvType::F16, 256), 512u);
  EXPECT_EQ(kv_row_bytes(KvType::BF16, 256), 512u);
  EXPECT_EQ(kv_row_bytes(KvType::Q8_0, 256), 272u);
}

}  // namespace
}  // namespace geist::cpu
