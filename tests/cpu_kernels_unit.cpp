// Every SIMD tier's packed quantized matmul against the generic path (the oracle), bit
// for bit: every packed weight type, ragged weight-row counts (n_out % 16 != 0) and the
// activation row counts where tile sizes change (1, 2, 3, 7, 15, 16, 17, ... 511), on 1
// and 2 threads. Tiers the CPU lacks are skipped with the reason.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backends/cpu/isa.h"
#include "backends/cpu/ops.h"
#include "backends/cpu/packed.h"
#include "backends/cpu/qgemm.h"
#include "base/thread_pool.h"
#include "quant/ggml_type.h"
#include "test_util.h"

namespace geist::cpu {
namespace {

using quant::GgmlType;

constexpr int kRowCounts[] = {1, 2, 3, 7, 15, 16, 17, 31, 33, 63, 65, 127, 129, 255, 257, 511};

struct Case {
  GgmlType type;
  int64_t K, N;
};

std::string case_name(const Case &c) {
  return std::string(quant::traits(c.type).name) + "_K" + std::to_string(c.K) + "_N" + std::to_string(c.N);
}

class CpuKernels : public ::testing::TestWithParam<std::tuple<Isa, Case>> {};

TEST_P(CpuKernels, PackedEqualsGenericBitForBit) {
  const auto [isa, c] = GetParam();
  if (static_cast<int>(isa) > static_cast<int>(best_isa())) {
    GEIST_SKIP(std::string("this CPU has no ") + isa_name(isa) + " tier (best: " + isa_name(best_isa()) + ")");
  }
  std::mt19937 rng(77 + static_cast<int>(c.type) * 131 + int(c.K) + int(c.N));
  const size_t rb = quant::row_bytes(c.type, c.K);
  std::vector<uint8_t> data(rb * c.N);
  for (int64_t n = 0; n < c.N; ++n) {
    std::vector<uint8_t> row = test::random_row(c.type, c.K, rng);
    std::memcpy(data.data() + n * rb, row.data(), rb);
  }
  WeightView w;
  w.data = data.data();
  w.type = c.type;
  w.n_in = c.K;
  w.n_out = c.N;
  w.row_bytes = rb;
  WeightView wp = w;
  const size_t gb = packed_group_bytes(c.type, c.K);
  ASSERT_GT(gb, 0u);
  const int64_t n_groups = (c.N + 15) / 16;
  std::vector<uint8_t, std::allocator<uint8_t>> packed(gb * n_groups + 64);
  uint8_t *base = packed.data() + (64 - reinterpret_cast<uintptr_t>(packed.data()) % 64) % 64;
  for (int64_t g = 0; g < n_groups; ++g) {
    pack_group(c.type, w.row(g * 16), rb, int(std::min<int64_t>(16, c.N - g * 16)), c.K, base + g * gb);
  }
  wp.packed = base;
  wp.group_bytes = gb;

  const int max_rows = kRowCounts[std::size(kRowCounts) - 1];
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(size_t(max_rows) * c.K);
  for (float &v : x) v = nd(rng);
  // A few rows with outliers and an all-zero row: scales at the extremes.
  x[5] = 40.0f;
  std::fill(x.begin() + c.K, x.begin() + 2 * c.K, 0.0f);

  ThreadPool pool1(1), pool2(2);
  std::vector<float> ref(size_t(max_rows) * c.N), got(size_t(max_rows) * c.N + 1);
  for (int rows : kRowCounts) {
    SCOPED_TRACE("rows " + std::to_string(rows));
    matmul(w, x.data(), ref.data(), rows, pool1);  // generic: w has no packed copy
    for (ThreadPool *pool : {&pool1, &pool2}) {
      std::fill(got.begin(), got.end(), -7.0f);
      const uint64_t calls = tier_calls(isa);
      ASSERT_TRUE(matmul_on_tier(isa, wp, x.data(), got.data(), rows, *pool));
      EXPECT_GT(tier_calls(isa), calls) << "the " << isa_name(isa) << " kernel did not run";
      ASSERT_EQ(0, std::memcmp(ref.data(), got.data(), sizeof(float) * rows * c.N))
          << "threads " << pool->n_threads();
      EXPECT_EQ(got[size_t(rows) * c.N], -7.0f) << "wrote past the output";
    }
  }
}

const Case kCases[] = {
    {GgmlType::Q8_0, 640, 40},  {GgmlType::Q8_0, 96, 16},   {GgmlType::Q4_0, 640, 33}, {GgmlType::Q5_0, 640, 40},
    {GgmlType::Q5_0, 32, 1},    {GgmlType::Q4_K, 1024, 40}, {GgmlType::Q4_K, 256, 17}, {GgmlType::Q5_K, 512, 40},
    {GgmlType::Q6_K, 2048, 24}, {GgmlType::Q6_K, 256, 7},
};

INSTANTIATE_TEST_SUITE_P(Tiers, CpuKernels,
                         ::testing::Combine(::testing::Values(Isa::Avx2, Isa::Avx512), ::testing::ValuesIn(kCases)),
                         [](const auto &info) {
                           return std::string(isa_name(std::get<0>(info.param))) + "_" +
                                  case_name(std::get<1>(info.param));
                         });

// The tier the machine supports is the one in use (unless GEIST_ISA lowered it), and a
// matmul on a packed weight really runs that tier's kernel.
TEST(CpuIsa, ActiveTierRuns) {
  const char *env = std::getenv("GEIST_ISA");
  if (!env || !*env) EXPECT_EQ(active_isa(), best_isa());
  std::printf("tier: %s (best %s)\n", isa_description().c_str(), isa_name(best_isa()));
  if (active_isa() == Isa::Generic) {
    GEIST_SKIP("generic tier: no packed kernels to check");
  }
  std::mt19937 rng(5);
  std::vector<uint8_t> row = test::random_row(GgmlType::Q8_0, 64, rng);
  std::vector<uint8_t> data;
  for (int i = 0; i < 16; ++i) data.insert(data.end(), row.begin(), row.end());
  WeightView w{data.data(), GgmlType::Q8_0, 64, 16, row.size()};
  PackedStore store;
  ASSERT_TRUE(pack_weight(&w, &store));
  std::vector<float> x(64, 0.5f), y(16);
  ThreadPool pool(1);
  const uint64_t before = tier_calls(active_isa());
  matmul(w, x.data(), y.data(), 1, pool);
  EXPECT_GT(tier_calls(active_isa()), before);
}

TEST(CpuIsa, ParseAndNames) {
  Isa i;
  EXPECT_TRUE(parse_isa("avx2", &i));
  EXPECT_EQ(i, Isa::Avx2);
  EXPECT_TRUE(parse_isa("generic", &i));
  EXPECT_EQ(i, Isa::Generic);
  EXPECT_FALSE(parse_isa("sse9", &i));
  EXPECT_STREQ(isa_name(Isa::Avx512), "avx512");
}

}  // namespace
}  // namespace geist::cpu
