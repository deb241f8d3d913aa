// The integer-form dot products (quantized weights x quantized activations) against the
// dequantized weights times the exact activations in double. The error allowed per block
// is what 8-bit activation quantization can cost: |w_block| * |x_block| * 2^-7.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "quant/dot.h"
#include "quant/quant.h"
#include "test_util.h"

namespace geist::quant {
namespace {

using test::random_row;

class QuantDot : public ::testing::TestWithParam<GgmlType> {};

TEST_P(QuantDot, CloseToExactDot) {
  const GgmlType t = GetParam();
  const int64_t k = 1024;
  std::mt19937 rng(1234 + static_cast<int>(t));
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (int trial = 0; trial < 20; ++trial) {
    std::vector<uint8_t> w = random_row(t, k, rng);
    std::vector<float> wf(k), x(k);
    ASSERT_TRUE(dequantize_row(t, w.data(), wf.data(), k));
    for (auto &v : x) v = nd(rng) * (trial % 3 == 0 ? 100.0f : 1.0f);
    double exact = 0, bound = 0;
    for (int64_t i = 0; i < k; ++i) exact += double(wf[i]) * x[i];
    const int bs = act_block(act_format(t));
    for (int64_t b = 0; b < k / bs; ++b) {
      double wa = 0, xa = 0;
      for (int j = 0; j < bs; ++j) {
        wa += std::fabs(wf[b * bs + j]);
        xa = std::max(xa, double(std::fabs(x[b * bs + j])));
      }
      bound += wa * xa / 127.0 * 0.5 * 1.01 + 1e-6;
    }
    QuantizedRow xq;
    quantize_row(act_format(t), x.data(), k, &xq);
    UnpackedRow wu;
    ASSERT_TRUE(unpack_row(t, w.data(), k, &wu));
    const double got = dot_unpacked(wu, xq);
    EXPECT_NEAR(got, exact, bound) << type_name(t) << " trial " << trial;
  }
}

// The integer form reconstructs the dequantized weights: d * a - dmin * m.
TEST_P(QuantDot, UnpackedFormReconstructsWeights) {
  const GgmlType t = GetParam();
  const int64_t k = 512;
  std::mt19937 rng(99 + static_cast<int>(t));
  for (int trial = 0; trial < 10; ++trial) {
    std::vector<uint8_t> w = random_row(t, k, rng);
    std::vector<float> wf(k);
    ASSERT_TRUE(dequantize_row(t, w.data(), wf.data(), k));
    UnpackedRow u;
    ASSERT_TRUE(unpack_row(t, w.data(), k, &u));
    for (int64_t e = 0; e < k; ++e) {
      const int64_t b = e / u.block;
      double v = double(u.d[b]) * u.a[e];
      if (!u.m.empty()) v -= double(u.dmin[b]) * u.m[e];
      ASSERT_NEAR(v, wf[e], 1e-6 * std::max(1.0, std::fabs(double(wf[e])))) << type_name(t) << " element " << e;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllIntegerTypes, QuantDot,
                         ::testing::Values(GgmlType::Q4_0, GgmlType::Q5_0, GgmlType::Q8_0, GgmlType::Q2_K,
                                           GgmlType::Q3_K, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K),
                         [](const auto &info) { return std::string(type_name(info.param)); });

TEST(QuantDot, ActivationQuantizationRoundTrips) {
  std::vector<float> x(256);
  for (int i = 0; i < 256; ++i) x[i] = std::sin(0.37f * i) * 3.0f;
  for (ActFormat f : {ActFormat::Q8_0, ActFormat::Q8_K}) {
    QuantizedRow q;
    quantize_row(f, x.data(), 256, &q);
    const int bs = act_block(f);
    for (int i = 0; i < 256; ++i) {
      EXPECT_NEAR(q.d[i / bs] * q.q[i], x[i], 3.0f / 127 * 0.51f + 3e-3f) << i;
    }
  }
  std::vector<float> zeros(256, 0.0f);
  QuantizedRow q;
  quantize_row(ActFormat::Q8_K, zeros.data(), 256, &q);
  EXPECT_EQ(q.d[0], 0.0f);
}

TEST(QuantDot, Q8_0BlocksEqualUnpackedBitForBit) {
  std::mt19937 rng(5);
  std::normal_distribution<float> nd;
  for (int trial = 0; trial < 20; ++trial) {
    std::vector<uint8_t> w = random_row(GgmlType::Q8_0, 640, rng);
    std::vector<float> x(640);
    for (auto &v : x) v = nd(rng) * 10;
    QuantizedRow xq;
    quantize_row(ActFormat::Q8_0, x.data(), 640, &xq);
    UnpackedRow u;
    ASSERT_TRUE(unpack_row(GgmlType::Q8_0, w.data(), 640, &u));
    const float a = dot_unpacked(u, xq), b = dot_q8_0_blocks(w.data(), xq);
    EXPECT_EQ(std::memcmp(&a, &b, 4), 0) << a << " vs " << b;
  }
}

TEST(QuantDot, TypesWithoutIntegerForm) {
  UnpackedRow u;
  uint8_t buf[64] = {};
  EXPECT_FALSE(unpack_row(GgmlType::F16, buf, 32, &u));
  EXPECT_FALSE(unpack_row(GgmlType::Q4_1, buf, 32, &u));
  EXPECT_EQ(act_format(GgmlType::BF16), ActFormat::F32);
}

}  // namespace
}  // namespace geist::quant
