// fp16_to_fp32 / fp32_to_fp16: exhaustive over all halves, and float -> half rounding
// against numpy (tests/data/quant/fp32_to_fp16.bin, from scripts/gen_quant_vectors.py).
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "quant/quant.h"
#include "test_util.h"

namespace geist::quant {
namespace {

// Value of a half computed independently of the bit tricks: (-1)^s * 2^e * mantissa.
double half_value(uint16_t h) {
  const int sign = h >> 15, exp = (h >> 10) & 0x1F, mant = h & 0x3FF;
  double v;
  if (exp == 0x1F) v = mant ? NAN : INFINITY;
  else if (exp == 0) v = std::ldexp(mant, -24);
  else v = std::ldexp(1024 + mant, exp - 25);
  return sign ? -v : v;
}

TEST(QuantFp16, AllHalvesConvertExactly) {
  for (uint32_t i = 0; i < 65536; ++i) {
    const uint16_t h = static_cast<uint16_t>(i);
    const float f = fp16_to_fp32(h);
    const double want = half_value(h);
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(f)) << std::hex << i;
      // Sign and payload are kept (shifted into the top mantissa bits), as numpy does.
      ASSERT_EQ(std::bit_cast<uint32_t>(f),
                ((i & 0x8000u) << 16) | 0x7F800000u | ((i & 0x3FFu) << 13)) << std::hex << i;
    } else {
      ASSERT_EQ(static_cast<double>(f), want) << std::hex << i;
      ASSERT_EQ(std::signbit(f), (i & 0x8000u) != 0) << std::hex << i;
    }
  }
}

TEST(QuantFp16, AllHalvesRoundTrip) {
  // Including every NaN: the payload survives both directions, so the round trip is
  // the identity on all 65536 bit patterns.
  for (uint32_t i = 0; i < 65536; ++i) {
    const uint16_t h = static_cast<uint16_t>(i);
    ASSERT_EQ(fp32_to_fp16(fp16_to_fp32(h)), h) << std::hex << i;
  }
}

TEST(QuantFp16, RoundingCases) {
  EXPECT_EQ(fp32_to_fp16(0.0f), 0x0000);
  EXPECT_EQ(fp32_to_fp16(-0.0f), 0x8000);
  EXPECT_EQ(fp32_to_fp16(1.0f), 0x3C00);
  EXPECT_EQ(fp32_to_fp16(65504.0f), 0x7BFF);
  EXPECT_EQ(fp32_to_fp16(65519.996f), 0x7BFF);   // below the midpoint to inf
  EXPECT_EQ(fp32_to_fp16(65520.0f), 0x7C00);     // tie, goes to even (inf)
  EXPECT_EQ(fp32_to_fp16(-1e30f), 0xFC00);
  EXPECT_EQ(fp32_to_fp16(INFINITY), 0x7C00);
  EXPECT_EQ(fp32_to_fp16(std::ldexp(1.0f, -24)), 0x0001);  // smallest subnormal
  EXPECT_EQ(fp32_to_fp16(std::ldexp(1.0f, -25)), 0x0000);  // tie to even: 0
  EXPECT_EQ(fp32_to_fp16(std::ldexp(1.5f, -25)), 0x0001);
  EXPECT_EQ(fp32_to_fp16(std::ldexp(3.0f, -25)), 0x0002);  // 1.5 ulp: tie to even 2
  EXPECT_EQ(fp32_to_fp16(1.0f + std::ldexp(1.0f, -11)), 0x3C00);  // tie to even
  EXPECT_EQ(fp32_to_fp16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3C02);
  EXPECT_TRUE((fp32_to_fp16(NAN) & 0x7FFF) > 0x7C00);
  // A NaN whose payload lives only in the low 13 bits must not become inf.
  EXPECT_EQ(fp32_to_fp16(std::bit_cast<float>(0x7F800001u)), 0x7C01);
}

TEST(QuantFp16, MatchesNumpy) {
  const std::vector<uint8_t> b = test::read_file(test::data_path("quant/fp32_to_fp16.bin"));
  ASSERT_GE(b.size(), 12u);
  ASSERT_EQ(std::memcmp(b.data(), "GQH1", 4), 0);
  uint64_t count;
  std::memcpy(&count, b.data() + 4, 8);
  ASSERT_EQ(b.size(), 12 + count * 6);
  ASSERT_GT(count, 1000u);
  int64_t mismatches = 0;
  for (uint64_t i = 0; i < count; ++i) {
    uint32_t f32;
    uint16_t want;
    std::memcpy(&f32, b.data() + 12 + 4 * i, 4);
    std::memcpy(&want, b.data() + 12 + 4 * count + 2 * i, 2);
    const uint16_t got = fp32_to_fp16(std::bit_cast<float>(f32));
    // Bitwise, NaNs included: we follow numpy's NaN rule exactly.
    if (got != want && ++mismatches <= 8) {
      ADD_FAILURE() << std::hex << "f32 0x" << f32 << ": got 0x" << got << ", numpy 0x" << want;
    }
  }
  EXPECT_EQ(mismatches, 0) << mismatches << " of " << count << " differ";
}

}  // namespace
}  // namespace geist::quant
