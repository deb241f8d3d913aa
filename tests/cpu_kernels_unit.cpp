// Every SIMD tier's matmul (packed quantized, and float weights) against the generic path (the oracle), bit
// for bit: every packed weight type, ragged weight-row counts (n_out % 16 != 0) and the
// activation row counts where tile sizes change (1, 2, 3, 7, 15, 16, 17, ... 511), on 1
// and 2 threads. Tiers the CPU lacks are skipped with the reason.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "backends/cpu/isa.h"
#include "backends/cpu/kv_rows.h"
#include "backends/cpu/ops.h"
#include "backends/cpu/packed.h"
#include "backends/cpu/qgemm.h"
#include "base/thread_pool.h"
#include "quant/ggml_type.h"
#include "quant/quant.h"
#include "test_util.h"

namespace geist::cpu {
namespace {

using quant::GgmlType;

constexpr int kRowCounts[] = {1, 2, 3, 7, 15, 16, 17, 31, 33, 63, 65, 127, 129, 255, 257, 511};

struct Case {
  GgmlType type;
  int64_t K, N;
  bool extreme = false;  // every other block's scales at the extremes of f16
};

std::string case_name(const Case &c) {
  return std::string(quant::traits(c.type).name) + "_K" + std::to_string(c.K) + "_N" + std::to_string(c.N) +
         (c.extreme ? "_extreme" : "");
}

// Overwrites the f16 scale fields (d, and the min/dmin where the type has one) of every
// other block of a row with values from the ends of f16's range: 0, the smallest
// subnormal, the largest finite, negatives. Finite products: the kernels and the oracle
// must agree on every bit, with no NaN to hide a difference.
void extreme_scales(GgmlType t, uint8_t *row, int64_t K, std::mt19937 &rng) {
  static const uint16_t kExtreme[] = {0x0000, 0x0001, 0x03FF, 0x7BFF, 0xFBFF, 0x8001, 0x3C00, 0x0400};
  const quant::TypeTraits &tt = quant::traits(t);
  int offs[2] = {-1, -1};
  switch (t) {
    case GgmlType::Q2_K: offs[0] = 80; offs[1] = 82; break;
    case GgmlType::Q3_K: offs[0] = 108; break;
    case GgmlType::Q4_1: case GgmlType::Q5_1: offs[0] = 0; offs[1] = 2; break;
    default: offs[0] = 0; break;
  }
  for (int64_t b = 0; b < K / tt.block_size; b += 2) {
    for (int off : offs) {
      if (off < 0) continue;
      const uint16_t h = kExtreme[rng() % std::size(kExtreme)];
      std::memcpy(row + b * tt.block_bytes + off, &h, 2);
    }
  }
}

// The view of N rows of type t at data, and (pack) its packed copy in `packed` as the
// loader makes it: groups of 16 rows, 64-byte aligned. Empty `packed`: no packed path.
WeightView view_and_pack(GgmlType t, int64_t K, int64_t N, const std::vector<uint8_t> &data, bool pack,
                         std::vector<uint8_t> *packed) {
  WeightView w;
  w.data = data.data();
  w.type = t;
  w.n_in = K;
  w.n_out = N;
  w.row_bytes = quant::row_bytes(t, K);
  const size_t gb = pack ? packed_group_bytes(t, K) : 0;
  if (gb == 0) return w;
  const int64_t n_groups = (N + 15) / 16;
  packed->resize(gb * n_groups + 64);
  uint8_t *base = packed->data() + (64 - reinterpret_cast<uintptr_t>(packed->data()) % 64) % 64;
  for (int64_t g = 0; g < n_groups; ++g) {
    pack_group(t, w.row(g * 16), w.row_bytes, int(std::min<int64_t>(16, N - g * 16)), K, base + g * gb);
  }
  w.packed = base;
  w.group_bytes = gb;
  return w;
}

class CpuKernels : public ::testing::TestWithParam<std::tuple<Isa, Case>> {};

TEST_P(CpuKernels, PackedEqualsGenericBitForBit) {
  const auto [isa, c] = GetParam();
  if (!isa_supported(isa)) {
    GEIST_SKIP(std::string("this CPU has no ") + isa_name(isa) + " tier (best: " + isa_name(best_isa()) + ")");
  }
  std::mt19937 rng(77 + static_cast<int>(c.type) * 131 + int(c.K) + int(c.N));
  const size_t rb = quant::row_bytes(c.type, c.K);
  std::vector<uint8_t> data(rb * c.N);
  // Q4_1 and Q5_1 run unpacked on the float kernels (f32 activations), like the floats.
  const bool is_float = c.type == GgmlType::F32 || c.type == GgmlType::F16 || c.type == GgmlType::BF16 ||
                        c.type == GgmlType::Q4_1 || c.type == GgmlType::Q5_1;
  for (int64_t n = 0; n < c.N; ++n) {
    std::vector<uint8_t> row = test::random_row(c.type, c.K, rng);
    if (c.extreme) extreme_scales(c.type, row.data(), c.K, rng);
    std::memcpy(data.data() + n * rb, row.data(), rb);
  }
  std::vector<uint8_t> packed;
  const WeightView w = view_and_pack(c.type, c.K, c.N, data, false, nullptr);
  const WeightView wp = view_and_pack(c.type, c.K, c.N, data, !is_float, &packed);  // float weights run unpacked
  ASSERT_TRUE(is_float || wp.packed != nullptr);

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
    matmul_generic(w, x.data(), ref.data(), rows, pool1);
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

// Every quant at its largest magnitude and activation rows of one value (all 127 or -127
// after quantization): the longest integer runs the kernels add. The AVX2 tier without
// VNNI adds its maddubs pair sums in int16 for runs bounded so that these cannot overflow
// (qgemm_impl.h, i16_run); an overflow, or a saturating maddubs, would show here.
TEST_P(CpuKernels, ExtremeQuantsEqualGeneric) {
  const auto [isa, c] = GetParam();
  if (!isa_supported(isa)) {
    GEIST_SKIP(std::string("this CPU has no ") + isa_name(isa) + " tier (best: " + isa_name(best_isa()) + ")");
  }
  if (c.type == GgmlType::F32 || c.type == GgmlType::F16 || c.type == GgmlType::BF16 || c.type == GgmlType::Q4_1 ||
      c.type == GgmlType::Q5_1) {
    GTEST_SKIP() << "float kernels (no integer runs)";
  }
  const auto &tr = quant::traits(c.type);
  const size_t rb = quant::row_bytes(c.type, c.K);
  const int64_t nblk = c.K / tr.block_size;
  // Byte offsets of each block's f16 fields (set to 1.0; every other byte 0xFF: all quant
  // bits set, 6-bit scales and mins 63) and of Q6_K's int8 scales (-128).
  std::vector<int> f16_fields;
  switch (c.type) {
    case GgmlType::Q4_K: case GgmlType::Q5_K: f16_fields = {0, 2}; break;
    case GgmlType::Q6_K: f16_fields = {208}; break;
    case GgmlType::Q2_K: f16_fields = {80, 82}; break;  // quants 3, scales and mins 15
    case GgmlType::Q3_K: f16_fields = {108}; break;     // quants 3 (+ 4), scales 31
    default: f16_fields = {0}; break;
  }
  std::vector<uint8_t> data(rb * c.N, 0xFF);
  for (int64_t n = 0; n < c.N; ++n) {
    for (int64_t b = 0; b < nblk; ++b) {
      uint8_t *blk = data.data() + n * rb + b * tr.block_bytes;
      for (int o : f16_fields) {
        blk[o] = 0x00;
        blk[o + 1] = 0x3C;
      }
      if (c.type == GgmlType::Q6_K) std::memset(blk + 192, 0x80, 16);
      if (c.type == GgmlType::Q8_0) std::memset(blk + 2, 0x81, 32);  // -127
    }
  }
  std::vector<uint8_t> packed;
  const WeightView w = view_and_pack(c.type, c.K, c.N, data, false, nullptr);
  const WeightView wp = view_and_pack(c.type, c.K, c.N, data, true, &packed);
  ASSERT_NE(wp.packed, nullptr);
  constexpr int kRows = 9;  // a full tile and a tail on every tier
  std::vector<float> x(size_t(kRows) * c.K);
  for (int r = 0; r < kRows; ++r) {
    for (int64_t k = 0; k < c.K; ++k) {
      const float v = r % 3 == 0 ? 1.0f : r % 3 == 1 ? -1.0f : (k % 2 ? 0.5f : -0.5f);
      x[size_t(r) * c.K + k] = v * float(r + 1);
    }
  }
  ThreadPool pool(1);
  std::vector<float> ref(size_t(kRows) * c.N), got(size_t(kRows) * c.N);
  matmul_generic(w, x.data(), ref.data(), kRows, pool);
  ASSERT_TRUE(matmul_on_tier(isa, wp, x.data(), got.data(), kRows, pool));
  EXPECT_EQ(0, std::memcmp(ref.data(), got.data(), sizeof(float) * ref.size()));
}

const Case kCases[] = {
    {GgmlType::Q8_0, 640, 40},  {GgmlType::Q8_0, 96, 16},   {GgmlType::Q4_0, 640, 33}, {GgmlType::Q5_0, 640, 40},
    {GgmlType::Q5_0, 32, 1},    {GgmlType::Q4_K, 1024, 40}, {GgmlType::Q4_K, 256, 17}, {GgmlType::Q5_K, 512, 40},
    {GgmlType::Q6_K, 2048, 24}, {GgmlType::Q6_K, 256, 7},
    // Float weights: K with and without a tail of K % 16, weight-row tails of the 4- and 2-row tiles.
    {GgmlType::F32, 640, 19},   {GgmlType::F32, 37, 5},     {GgmlType::F16, 640, 18},  {GgmlType::F16, 100, 7},
    {GgmlType::BF16, 256, 17},  {GgmlType::BF16, 9, 3},
    // Q2_K, Q3_K (packed, integer sums); Q4_1, Q5_1 (float kernels, dequantized on the fly).
    {GgmlType::Q2_K, 2048, 40}, {GgmlType::Q2_K, 256, 17},  {GgmlType::Q3_K, 1024, 40}, {GgmlType::Q3_K, 256, 7},
    {GgmlType::Q4_1, 640, 19},  {GgmlType::Q4_1, 32, 5},    {GgmlType::Q5_1, 640, 18}, {GgmlType::Q5_1, 96, 3},
    {GgmlType::Q2_K, 512, 33, true}, {GgmlType::Q3_K, 512, 33, true}, {GgmlType::Q4_1, 256, 17, true},
    {GgmlType::Q5_1, 256, 17, true}, {GgmlType::Q4_K, 512, 33, true}, {GgmlType::Q6_K, 512, 33, true},
};

INSTANTIATE_TEST_SUITE_P(Tiers, CpuKernels,
                         ::testing::Combine(::testing::Values(Isa::Avx2, Isa::Avx2Vnni, Isa::Avx512), ::testing::ValuesIn(kCases)),
                         [](const auto &info) {
                           return std::string(isa_name(std::get<0>(info.param))) + "_" +
                                  case_name(std::get<1>(info.param));
                         });

// The AMX tile kernels of the avx512 tier (Q8_0, Q4_0, Q5_0, Q4_K, Q5_K; 16-row tiles, the
// rest of the rows on VNNI) give the VNNI kernels' bits and the generic path's: block counts
// odd and even, extreme scales, a ragged last group, rows with and without a tail, 1 and 2
// threads.
TEST(CpuKernelsAmx, TilesEqualVnniAndGeneric) {
  if (!isa_supported(Isa::Avx512) || !amx_usable()) {
    GEIST_SKIP("this CPU (or OS) has no AMX-INT8 for the avx512 tier");
  }
  std::mt19937 rng(91);
  ThreadPool pool1(1), pool2(2);
  // The K-quants' AMX kernel runs only with GEIST_AMX_KQUANTS=1 (a ctest entry sets it).
  const char *kq = std::getenv("GEIST_AMX_KQUANTS");
  const bool with_k = kq != nullptr && std::strcmp(kq, "1") == 0;
  for (GgmlType t : {GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q5_0, GgmlType::Q4_K, GgmlType::Q5_K}) {
    const bool k_quant = quant::traits(t).block_size == 256;
    if (k_quant && !with_k) continue;
    for (int64_t K : k_quant ? std::vector<int64_t>{256, 512, 2048} : std::vector<int64_t>{32, 64, 96, 640}) {
      const int64_t N = 40;
      const size_t rb = quant::row_bytes(t, K);
      std::vector<uint8_t> data(rb * N);
      for (int64_t n = 0; n < N; ++n) {
        std::vector<uint8_t> row = test::random_row(t, K, rng);
        if (n % 3 == 0) extreme_scales(t, row.data(), K, rng);
        std::memcpy(data.data() + n * rb, row.data(), rb);
      }
      std::vector<uint8_t> packed;
      const WeightView w = view_and_pack(t, K, N, data, false, nullptr);
      const WeightView wp = view_and_pack(t, K, N, data, true, &packed);
      for (int rows : {16, 17, 31, 32, 33, 64, 65, 100, 130, 300}) {
        SCOPED_TRACE(std::string(quant::traits(t).name) + " K " + std::to_string(K) + " rows " + std::to_string(rows));
        std::normal_distribution<float> nd(0.0f, 1.0f);
        std::vector<float> x(size_t(rows) * K);
        for (float &v : x) v = nd(rng);
        x[3] = -60.0f;
        std::fill(x.begin() + K, x.begin() + 2 * K, 0.0f);
        std::vector<float> ref(size_t(rows) * N), vnni(ref.size()), amx(ref.size() + 1);
        matmul_generic(w, x.data(), ref.data(), rows, pool1);
        set_amx_enabled(false);
        ASSERT_TRUE(matmul_on_tier(Isa::Avx512, wp, x.data(), vnni.data(), rows, pool1));
        set_amx_enabled(true);
        for (ThreadPool *pool : {&pool1, &pool2}) {
          std::fill(amx.begin(), amx.end(), -7.0f);
          const uint64_t before = amx_calls();
          ASSERT_TRUE(matmul_on_tier(Isa::Avx512, wp, x.data(), amx.data(), rows, *pool));
          EXPECT_GT(amx_calls(), before) << "the AMX kernel did not run";
          ASSERT_EQ(0, std::memcmp(vnni.data(), amx.data(), sizeof(float) * ref.size())) << "vs VNNI";
          ASSERT_EQ(0, std::memcmp(ref.data(), amx.data(), sizeof(float) * ref.size())) << "vs generic";
          EXPECT_EQ(amx[ref.size()], -7.0f) << "wrote past the output";
        }
      }
    }
  }
  set_amx_enabled(true);
}

// A tier's vectorized activation quantizer (TierKernels::quantize_row) gives quant's scalar
// bits, scales and quants, for Q8_0 and Q8_K rows of normal values and of the edges: zero
// blocks, NaNs (ignored by the scale), infinities, -0, subnormals, exact halves after
// scaling, the largest magnitude twice with both signs.
TEST(CpuQuantize, TierQuantizerEqualsScalar) {
  int tested = 0;
  for (Isa isa : {Isa::Avx2, Isa::Avx2Vnni, Isa::Avx512}) {
    const TierKernels *tk = isa_supported(isa) ? tier_kernels(isa) : nullptr;
    if (!tk || !tk->quantize_row) continue;
    ++tested;
    std::mt19937 rng(3);
    std::normal_distribution<float> nd(0.0f, 2.0f);
    const int64_t k = 256 * 12;
    for (int trial = 0; trial < 40; ++trial) {
      std::vector<float> x(k);
      for (float &v : x) v = nd(rng);
      if (trial % 4 == 1) {
        std::fill(x.begin(), x.begin() + 256, 0.0f);  // a zero block
        x[300] = std::nanf("");
        x[301] = -0.0f;
        x[700] = std::numeric_limits<float>::infinity();
        x[1100] = -std::numeric_limits<float>::infinity();
        x[1500] = 1e-40f;
        std::fill(x.begin() + 1536, x.begin() + 1792, std::nanf(""));  // a NaN-only block
      }
      if (trial % 4 == 2) {  // ties: values that scale to n + 0.5
        for (int64_t i = 0; i < k; ++i) x[i] = float(int(i % 255) - 127) * 0.5f;
      }
      if (trial % 4 == 3) {  // the largest magnitude twice, negative first
        for (int64_t b = 0; b < k / 256; ++b) {
          x[b * 256 + 10] = -9.0f;
          x[b * 256 + 20] = 9.0f;
        }
      }
      for (quant::ActFormat f : {quant::ActFormat::Q8_0, quant::ActFormat::Q8_K}) {
        const int64_t nd_ = k / quant::act_block(f);
        std::vector<float> d0(nd_), d1(nd_);
        std::vector<int8_t> q0(k), q1(k);
        quant::quantize_row_to(f, x.data(), k, d0.data(), q0.data());
        tk->quantize_row(f, x.data(), k, d1.data(), q1.data());
        ASSERT_EQ(0, std::memcmp(d0.data(), d1.data(), d0.size() * sizeof(float))) << isa_name(isa) << " trial " << trial;
        ASSERT_EQ(0, std::memcmp(q0.data(), q1.data(), k)) << isa_name(isa) << " trial " << trial;
      }
    }
  }
  if (tested == 0) GEIST_SKIP("no tier with a vectorized quantizer on this CPU");
}

// The tier the machine supports is the one in use (unless GEIST_ISA lowered it), and a
// matmul on a packed weight really runs that tier's kernel.
TEST(CpuIsa, ActiveTierRuns) {
  const char *env = std::getenv("GEIST_ISA");
  if (!env || !*env) {
    EXPECT_EQ(active_isa(), best_isa());
  }
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
  EXPECT_TRUE(parse_isa("avx2vnni", &i));
  EXPECT_EQ(i, Isa::Avx2Vnni);
  EXPECT_FALSE(parse_isa("sse9", &i));
  EXPECT_STREQ(isa_name(Isa::Avx512), "avx512");
  EXPECT_STREQ(isa_name(Isa::Avx2Vnni), "avx2vnni");
  EXPECT_TRUE(isa_supported(Isa::Generic));
  // A tier is supported only with everything it needs; the best one is always supported.
  EXPECT_TRUE(isa_supported(best_isa()));
  if (isa_supported(Isa::Avx2Vnni)) {
    EXPECT_TRUE(cpu_features().avxvnni);
  }
  if (isa_supported(Isa::Avx512)) {
    EXPECT_TRUE(cpu_features().avx512vnni);
  }
}

}  // namespace
}  // namespace geist::cpu

namespace geist::cpu {
namespace {

bool tier_missing(Isa isa) { return !isa_supported(isa); }

// Attention on a tier against the generic exact softmax (tolerance: the tier's exp and
// FMA), and batch invariance on the tier: the rows of a chunk computed all at once, one at
// a time (the decode path, which splits key chunks over threads), and on 1 or 2 threads,
// are the same bits. Ring buffers of sliding layers wrap.
class CpuAttention : public ::testing::TestWithParam<Isa> {};

TEST_P(CpuAttention, MatchesGenericAndIsBatchInvariant) {
  const Isa isa = GetParam();
  if (tier_missing(isa)) GEIST_SKIP(std::string("this CPU has no ") + isa_name(isa) + " tier");
  std::mt19937 rng(11);
  std::normal_distribution<float> nd;
  struct Geo {
    int n_head, n_kv, hd, window;
    int64_t depth;
  };
  // 16 query heads on one KV head: more (row, head) pairs than the kernel keeps on its stack.
  const Geo geos[] = {{4, 1, 256, 0, 300}, {4, 1, 256, 64, 300}, {8, 2, 64, 0, 0}, {6, 2, 32, 16, 40},
                      {1, 1, 16, 0, 700},  {16, 1, 64, 0, 90}};
  ThreadPool pool1(1), pool2(2);
  for (const Geo &G : geos) {
    const bool full = G.hd == 256 && G.window == 0;  // the whole row list on one geometry
    const std::vector<int> row_list = full ? std::vector<int>(std::begin(kRowCounts), std::end(kRowCounts))
                                           : std::vector<int>{1, 2, 3, 7, 17, 33, 65};
    for (int rows : row_list) {
      SCOPED_TRACE("heads " + std::to_string(G.n_head) + "/" + std::to_string(G.n_kv) + " hd " +
                   std::to_string(G.hd) + " window " + std::to_string(G.window) + " depth " +
                   std::to_string(G.depth) + " rows " + std::to_string(rows));
      const int64_t cap = G.window > 0 ? G.window + rows : G.depth + rows;
      std::vector<float> q(size_t(rows) * G.n_head * G.hd), k(size_t(cap) * G.n_kv * G.hd), v(k.size());
      for (auto *vec : {&q, &k, &v})
        for (float &x : *vec) x = nd(rng);
      std::vector<float> ref(q.size()), all(q.size()), all1(q.size()), one(q.size());
      AttentionArgs a{q.data(), k.data(), v.data(), ref.data(), rows, G.depth, cap,
                      G.n_head, G.n_kv, G.hd, G.window, 1.0f / std::sqrt(float(G.hd))};
      attention_on_tier(Isa::Generic, a, pool2);
      a.out = all.data();
      attention_on_tier(isa, a, pool2);
      a.out = all1.data();
      attention_on_tier(isa, a, pool1);
      for (size_t i = 0; i < ref.size(); ++i) ASSERT_NEAR(all[i], ref[i], 2e-5f * (1.0f + std::fabs(ref[i])));
      ASSERT_EQ(0, std::memcmp(all.data(), all1.data(), all.size() * sizeof(float))) << "1 vs 2 threads";
      for (int r = 0; r < rows; ++r) {  // row by row, as decode does
        AttentionArgs b = a;
        b.q = q.data() + size_t(r) * G.n_head * G.hd;
        b.out = one.data() + size_t(r) * G.n_head * G.hd;
        b.n_rows = 1;
        b.q_pos0 = G.depth + r;
        attention_on_tier(isa, b, pool2);
      }
      ASSERT_EQ(0, std::memcmp(all.data(), one.data(), all.size() * sizeof(float))) << "chunk vs row by row";
    }
  }
}

// Several sequences' attention in one call (batched decode, a step of several sessions)
// gives each sequence the bits it gets alone: decode rows at different depths, a sequence
// with several rows, one with none, windows that wrap, 1 and 2 threads, f32 and f16 rings.
TEST_P(CpuAttention, SequencesTogetherEqualEachAlone) {
  const Isa isa = GetParam();
  if (tier_missing(isa)) GEIST_SKIP(std::string("this CPU has no ") + isa_name(isa) + " tier");
  std::mt19937 rng(12);
  std::normal_distribution<float> nd;
  const int n_head = 4, n_kv = 1, hd = 256;
  struct Seq {
    int rows;
    int64_t depth;
    KvType t;
  };
  for (int window : {0, 64}) {
    for (bool many : {false, true}) {  // few units: the chunk-split path; many: one task per unit
      SCOPED_TRACE("window " + std::to_string(window) + (many ? ", many rows" : ", decode rows"));
      // Two decode rows: fewer units than 2 x threads on 2 threads (key chunks split over
      // tasks); with the others, one task per unit.
      std::vector<Seq> seqs = {{1, 700, KvType::F32}, {0, 9, KvType::F32}, {1, 257, KvType::F16}};
      if (many) seqs.insert(seqs.end(), {{1, 40, KvType::F32}, {1, 0, KvType::F16}, {9, 300, KvType::F32}});
      std::vector<std::vector<float>> q(seqs.size()), alone(seqs.size()), together(seqs.size());
      std::vector<std::vector<uint8_t>> k(seqs.size()), v(seqs.size());
      std::vector<AttentionArgs> args;
      for (size_t i = 0; i < seqs.size(); ++i) {
        const Seq &S = seqs[i];
        const int64_t cap = window > 0 ? window + std::max(S.rows, 1) : S.depth + std::max(S.rows, 1);
        const int64_t row = int64_t(n_kv) * hd;
        std::vector<float> kf(size_t(cap * row)), vf(kf.size());
        for (auto *vec : {&kf, &vf})
          for (float &x : *vec) x = nd(rng);
        k[i].resize(size_t(cap) * kv_row_bytes(S.t, row));
        v[i].resize(k[i].size());
        kv_store_rows(S.t, kf.data(), cap, row, k[i].data());
        kv_store_rows(S.t, vf.data(), cap, row, v[i].data());
        q[i].resize(size_t(std::max(S.rows, 1)) * n_head * hd);
        for (float &x : q[i]) x = nd(rng);
        alone[i].assign(q[i].size(), 0.0f);
        together[i].assign(q[i].size(), 0.0f);
        args.push_back({q[i].data(), k[i].data(), v[i].data(), alone[i].data(), S.rows, S.depth, cap, n_head, n_kv,
                        hd, window, 1.0f / 16.0f, S.t, S.t});
      }
      ThreadPool pool1(1), pool2(2);
      for (ThreadPool *pool : {&pool1, &pool2}) {
        for (size_t i = 0; i < seqs.size(); ++i) {
          AttentionArgs a = args[i];
          a.out = alone[i].data();
          attention_on_tier(isa, a, *pool);
          args[i].out = together[i].data();
        }
        attention_seqs_on_tier(isa, args.data(), int(args.size()), *pool);
        for (size_t i = 0; i < seqs.size(); ++i) {
          ASSERT_EQ(0, std::memcmp(alone[i].data(), together[i].data(), alone[i].size() * sizeof(float)))
              << "sequence " << i << ", threads " << pool->n_threads();
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Tiers, CpuAttention, ::testing::Values(Isa::Avx2, Isa::Avx2Vnni, Isa::Avx512),
                         [](const auto &info) { return std::string(isa_name(info.param)); });

// The pool's gelu on the tier in use against libm's tanh, over lengths with every tail.
TEST(CpuElementwise, GeluOnTheTierInUseMatchesGeneric) {
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  ThreadPool pool(2);
  for (int64_t n : {1, 7, 15, 16, 17, 33, 1000, 20000}) {
    std::vector<float> g(n), u(n), ref(n), got(n);
    for (int64_t i = 0; i < n; ++i) {
      g[i] = nd(rng);
      u[i] = nd(rng);
    }
    g[0] = 30.0f;
    if (n > 1) g[1] = -30.0f;
    gelu_mul(g.data(), u.data(), ref.data(), n);
    gelu_mul(g.data(), u.data(), got.data(), n, pool);
    for (int64_t i = 0; i < n; ++i) ASSERT_NEAR(got[i], ref[i], 2e-6f * (1.0f + std::fabs(ref[i]))) << i;
  }
}

// The negative tail: where the generic kernel's 1 + tanhf(u) is exactly 0 the tier gives a
// zero too, and no output is ever a subnormal float (the sigmoid form used to return
// g up / 2^127 there: subnormals that made every later product a microcode assist).
TEST(CpuElementwise, GeluTailIsZeroNotSubnormal) {
  ThreadPool pool(2);
  std::vector<float> g, u;
  for (float x = -60.0f; x < -8.0f; x += 0.0137f) {
    for (float up : {1e-3f, 0.5f, 3.0f, -7.0f, 1e4f}) {
      g.push_back(x);
      u.push_back(up);
    }
  }
  const int64_t n = int64_t(g.size());
  std::vector<float> ref(n), got(n);
  gelu_mul(g.data(), u.data(), ref.data(), n);
  gelu_mul(g.data(), u.data(), got.data(), n, pool);
  int zeros = 0;
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_NE(std::fpclassify(got[i]), FP_SUBNORMAL) << "g " << g[i] << " up " << u[i] << " -> " << got[i];
    ASSERT_NEAR(got[i], ref[i], 2e-6f * (1.0f + std::fabs(ref[i]))) << i;
    // Away from the cutoff (the two kernels round u differently) a zero is a zero.
    const float uu = 0.7978845608028654f * (g[i] + 0.044715f * g[i] * g[i] * g[i]);
    if (uu < -9.02f) {
      ASSERT_EQ(ref[i], 0.0f) << i;
      ASSERT_EQ(got[i], 0.0f) << "g " << g[i] << " up " << u[i] << " -> " << got[i];
      ++zeros;
    }
  }
  EXPECT_GT(zeros, n / 2);
}

}  // namespace
}  // namespace geist::cpu

namespace geist::cpu {
namespace {

// Q, K, V (and gate, up) run as one fused call with the input quantized once: the same
// bits as one matmul each, on the tier in use, also for a mix of Q5_0 and Q8_0.
TEST(CpuKernelsFused, SharedInputEqualsSeparateMatmuls) {
  std::mt19937 rng(9);
  const int64_t K = 640;
  const GgmlType types[] = {GgmlType::Q5_0, GgmlType::Q8_0, GgmlType::Q4_0};
  const int64_t outs[] = {64, 48, 40};
  std::vector<std::vector<uint8_t>> data(3);
  PackedStore store;
  WeightView w[3];
  for (int m = 0; m < 3; ++m) {
    const size_t rb = quant::row_bytes(types[m], K);
    for (int64_t n = 0; n < outs[m]; ++n) {
      std::vector<uint8_t> row = test::random_row(types[m], K, rng);
      data[m].insert(data[m].end(), row.begin(), row.end());
    }
    w[m] = WeightView{data[m].data(), types[m], K, outs[m], rb};
    pack_weight(&w[m], &store);
  }
  ThreadPool pool(2);
  std::normal_distribution<float> nd;
  for (int rows : {1, 9, 33}) {
    std::vector<float> x(size_t(rows) * K);
    for (float &v : x) v = nd(rng);
    std::vector<float> sep[3], fused[3];
    float *ys[3];
    const WeightView *ws[3] = {&w[0], &w[1], &w[2]};
    for (int m = 0; m < 3; ++m) {
      sep[m].resize(size_t(rows) * outs[m]);
      fused[m].resize(size_t(rows) * outs[m]);
      matmul(w[m], x.data(), sep[m].data(), rows, pool);
      ys[m] = fused[m].data();
    }
    matmul_shared_input(ws, 3, x.data(), ys, rows, pool);
    for (int m = 0; m < 3; ++m) {
      ASSERT_EQ(0, std::memcmp(sep[m].data(), fused[m].data(), sep[m].size() * sizeof(float))) << m << " " << rows;
    }
  }
}

}  // namespace
}  // namespace geist::cpu

namespace geist::cpu {
namespace {

// The pool versions of the row-wise ops equal the single-threaded ones bit for bit.
TEST(CpuOpsPool, NormAndRopeSplitOverThreadsAreExact) {
  std::mt19937 rng(4);
  std::normal_distribution<float> nd;
  ThreadPool pool(2);
  const int rows = 37, heads = 4, hd = 256;
  std::vector<float> x(size_t(rows) * heads * hd), g(hd), cs(size_t(rows) * hd);
  for (float &v : x) v = nd(rng);
  for (float &v : g) v = nd(rng);
  RopeTable rt;
  rt.init(10000.0, hd, 1.0, nullptr);
  rt.fill(100, rows, cs.data());
  std::vector<float> a = x, b = x, c(x.size()), d(x.size());
  rmsnorm(a.data(), g.data(), rows * heads, hd, 1e-6f);
  rmsnorm(b.data(), g.data(), rows * heads, hd, 1e-6f, pool);
  ASSERT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float)));
  rmsnorm_to(x.data(), g.data(), c.data(), rows * heads, hd, 1e-6f);
  rmsnorm_to(x.data(), g.data(), d.data(), rows * heads, hd, 1e-6f, pool);
  ASSERT_EQ(0, std::memcmp(c.data(), d.data(), c.size() * sizeof(float)));
  rope_neox(a.data(), rows, heads, hd, hd, cs.data());
  rope_neox(b.data(), rows, heads, hd, hd, cs.data(), pool);
  ASSERT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float)));
}

}  // namespace
}  // namespace geist::cpu

namespace geist::cpu {
namespace {

// RMSNorm as one vector at a time: the sum of squares in one running double, in index
// order. The kernel interleaves several vectors' sums; every bit must stay the same.
void rmsnorm_one_at_a_time(const float *x, const float *g, float *out, int64_t n_vec, int64_t dim, float eps) {
  for (int64_t v = 0; v < n_vec; ++v) {
    const float *xv = x + v * dim;
    double ss = 0.0;
    for (int64_t i = 0; i < dim; ++i) ss += static_cast<double>(xv[i]) * xv[i];
    const float r = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(dim) + eps));
    for (int64_t i = 0; i < dim; ++i) out[v * dim + i] = g ? xv[i] * r * g[i] : xv[i] * r;
  }
}

TEST(CpuOps, RmsNormEqualsOneVectorAtATime) {
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  for (int64_t dim : {640, 256, 37, 1}) {
    for (int64_t n_vec : {1, 2, 3, 5, 8, 9, 15, 16, 17, 31}) {
      SCOPED_TRACE("dim " + std::to_string(dim) + ", vectors " + std::to_string(n_vec));
      std::vector<float> x(size_t(n_vec * dim)), g(static_cast<size_t>(dim)), ref(x.size()), got(x.size());
      for (float &v : x) v = nd(rng);
      for (float &v : g) v = nd(rng);
      x[0] = 1e20f;  // a sum far from 1: rounding of the double adds matters
      for (const float *gp : {static_cast<const float *>(g.data()), static_cast<const float *>(nullptr)}) {
        rmsnorm_one_at_a_time(x.data(), gp, ref.data(), n_vec, dim, 1e-6f);
        rmsnorm_to(x.data(), gp, got.data(), n_vec, dim, 1e-6f);
        ASSERT_EQ(0, std::memcmp(ref.data(), got.data(), ref.size() * sizeof(float)));
        std::vector<float> in_place = x;
        rmsnorm(in_place.data(), gp, n_vec, dim, 1e-6f);
        ASSERT_EQ(0, std::memcmp(ref.data(), in_place.data(), ref.size() * sizeof(float)));
      }
    }
  }
}

}  // namespace
}  // namespace geist::cpu
