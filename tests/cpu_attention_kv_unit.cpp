// Attention over typed KV rings (f16, bf16, q8_0, and K and V of different types) on every
// tier this CPU has, generic included: bit for bit the same attention, on the same tier,
// over the rings read back to f32 by kv_load_rows. Ragged row counts, sliding windows over
// wrapping rings, GQA, head dims 64/256/512, the decode path (key chunks split over
// threads), blocks of rows sharing each key block, 1 to 3 threads, and rings holding inf
// and NaN.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backends/cpu/isa.h"
#include "backends/cpu/kv_rows.h"
#include "backends/cpu/ops.h"
#include "backends/cpu/qgemm.h"
#include "backends/kv_type.h"
#include "base/thread_pool.h"
#include "test_util.h"

namespace geist::cpu {
namespace {

bool tier_missing(Isa isa) {
  return !isa_supported(isa);
}

// Whether the avx512 tier runs bf16 K and V rings on AMX-BF16 tiles here (amx_attn_impl.h).
bool amx_bf16_attention() {
  return isa_supported(Isa::Avx512) && cpu_features().amx_bf16 && cpu_features().avx512bf16 && amx_usable();
}

// The AMX kernels off while in scope: the tests of the f32 kernels' contract (bit for bit
// the attention over the rings read back to f32) are about the path AMX-BF16 replaces for
// bf16 rings; AmxBf16Attention below tests that one.
struct AmxOff {
  AmxOff() : was_(amx_enabled()) { set_amx_enabled(false); }
  ~AmxOff() { set_amx_enabled(was_); }
  AmxOff(const AmxOff &) = delete;
  AmxOff &operator=(const AmxOff &) = delete;

 private:
  bool was_;
};

// A K or V ring of cap rows of [n_kv][hd]: the typed bytes and the f32 they read back as.
struct Ring {
  std::vector<uint8_t> typed;
  std::vector<float> f32;
};

Ring make_ring(KvType t, int64_t cap, int n_kv, int hd, std::mt19937 &rng) {
  std::normal_distribution<float> nd;
  const int64_t row = int64_t(n_kv) * hd;
  std::vector<float> x(size_t(cap * row));
  for (float &v : x) v = nd(rng);
  Ring r;
  r.typed.resize(size_t(cap) * kv_row_bytes(t, row));
  r.f32.resize(x.size());
  kv_store_rows(t, x.data(), cap, row, r.typed.data());
  kv_load_rows(t, r.typed.data(), cap, row, r.f32.data());
  return r;
}

struct Geo {
  int n_head, n_kv, hd, window;
  int64_t depth;  // positions cached before the chunk's first query
  int64_t cap;    // ring rows; 0: exactly what the chunk needs
};

std::string geo_name(const Geo &G, int rows) {
  return "heads " + std::to_string(G.n_head) + "/" + std::to_string(G.n_kv) + " hd " +
         std::to_string(G.hd) + " window " + std::to_string(G.window) + " depth " +
         std::to_string(G.depth) + " rows " + std::to_string(rows);
}

struct KvTypes {
  KvType k, v;
};

class CpuAttentionKv : public ::testing::TestWithParam<std::tuple<Isa, KvTypes>> {};

TEST_P(CpuAttentionKv, TypedRingEqualsItsF32ReadBack) {
  const auto [isa, t] = GetParam();
  if (tier_missing(isa)) GEIST_SKIP(std::string("this CPU has no ") + isa_name(isa) + " tier");
  AmxOff amx_off;
  std::mt19937 rng(21 + 4 * int(t.k) + int(t.v));
  std::normal_distribution<float> nd;
  // Windows smaller than depth + rows make the ring wrap (cap = window + rows - 1 is the
  // least a chunk needs); global layers hold every position.
  const Geo geos[] = {
      {4, 1, 256, 0, 250, 0}, {4, 1, 256, 64, 300, 0}, {8, 2, 64, 0, 40, 0},
      {8, 2, 64, 32, 100, 0}, {2, 2, 512, 0, 240, 0},  {8, 1, 512, 48, 90, 0},
      {3, 1, 64, 0, 17, 0},   {6, 6, 64, 20, 33, 0},   {4, 1, 256, 0, 5, 1000},
  };
  // 1 and 3 rows take the decode path (key chunks of 256 split over the threads); depths
  // of 250 and 240 put the 256-key chunk boundary inside the chunk of rows.
  const int row_list[] = {1, 3, 17, 33};
  ThreadPool pool1(1), pool2(2);
  for (const Geo &G : geos) {
    for (int rows : row_list) {
      SCOPED_TRACE(geo_name(G, rows));
      const int64_t need = G.window > 0 ? G.window + rows - 1 : G.depth + rows;
      const int64_t cap = G.cap > 0 ? G.cap : need;
      Ring k = make_ring(t.k, cap, G.n_kv, G.hd, rng), v = make_ring(t.v, cap, G.n_kv, G.hd, rng);
      std::vector<float> q(size_t(rows) * G.n_head * G.hd);
      for (float &x : q) x = nd(rng);
      std::vector<float> ref(q.size()), got(q.size()), got1(q.size()), one(q.size());
      AttentionArgs a{q.data(), k.f32.data(), v.f32.data(), ref.data(),
                      rows,     G.depth,      cap,          G.n_head,
                      G.n_kv,   G.hd,         G.window,     1.0f / std::sqrt(float(G.hd))};
      attention_on_tier(isa, a, pool2);
      AttentionArgs b = a;
      b.k = k.typed.data();
      b.v = v.typed.data();
      b.k_type = t.k;
      b.v_type = t.v;
      b.out = got.data();
      attention_on_tier(isa, b, pool2);
      ASSERT_EQ(0, std::memcmp(ref.data(), got.data(), ref.size() * sizeof(float)));
      b.out = got1.data();
      attention_on_tier(isa, b, pool1);
      ASSERT_EQ(0, std::memcmp(ref.data(), got1.data(), ref.size() * sizeof(float))) << "1 thread";
      for (int r = 0; r < rows; ++r) {  // row by row, as decode does (chunks split over threads)
        AttentionArgs c = b;
        c.q = q.data() + size_t(r) * G.n_head * G.hd;
        c.out = one.data() + size_t(r) * G.n_head * G.hd;
        c.n_rows = 1;
        c.q_pos0 = G.depth + r;
        attention_on_tier(isa, c, pool2);
      }
      ASSERT_EQ(0, std::memcmp(ref.data(), one.data(), ref.size() * sizeof(float))) << "row by row";
    }
  }
}

// Long rings, many rows: the rows are walked in blocks that share every key block (their
// size follows the thread count and the row count), and a row's bits must not depend on
// which rows share its block: a chunk of rows equals each row alone (the decode path) on
// 1, 2 and 3 threads, over several 256-key chunks, global and sliding, ring wrapping.
TEST_P(CpuAttentionKv, RowBlocksEqualRowByRow) {
  const auto [isa, t] = GetParam();
  if (tier_missing(isa)) GEIST_SKIP(std::string("this CPU has no ") + isa_name(isa) + " tier");
  std::mt19937 rng(77 + 4 * int(t.k) + int(t.v));
  std::normal_distribution<float> nd;
  const Geo geos[] = {{4, 1, 256, 0, 1000, 0}, {4, 1, 256, 300, 1000, 0}, {8, 2, 64, 0, 700, 0},
                      {8, 2, 64, 100, 650, 0}};
  const int rows = 40;
  ThreadPool pool1(1), pool2(2), pool3(3);
  for (const Geo &G : geos) {
    SCOPED_TRACE(geo_name(G, rows));
    const int64_t cap = G.window > 0 ? G.window + rows - 1 : G.depth + rows;
    Ring k = make_ring(t.k, cap, G.n_kv, G.hd, rng), v = make_ring(t.v, cap, G.n_kv, G.hd, rng);
    std::vector<float> q(size_t(rows) * G.n_head * G.hd);
    for (float &x : q) x = nd(rng);
    std::vector<float> one(q.size()), got(q.size());
    AttentionArgs a{q.data(), k.typed.data(), v.typed.data(), one.data(),
                    rows,     G.depth,        cap,            G.n_head,
                    G.n_kv,   G.hd,           G.window,       1.0f / std::sqrt(float(G.hd)),
                    t.k,      t.v};
    for (int r = 0; r < rows; ++r) {
      AttentionArgs c = a;
      c.q = q.data() + size_t(r) * G.n_head * G.hd;
      c.out = one.data() + size_t(r) * G.n_head * G.hd;
      c.n_rows = 1;
      c.q_pos0 = G.depth + r;
      attention_on_tier(isa, c, pool2);
    }
    for (ThreadPool *pool : {&pool1, &pool2, &pool3}) {
      SCOPED_TRACE(std::to_string(pool->n_threads()) + " threads");
      std::fill(got.begin(), got.end(), -1.0f);
      a.out = got.data();
      attention_on_tier(isa, a, *pool);
      ASSERT_EQ(0, std::memcmp(one.data(), got.data(), one.size() * sizeof(float)));
    }
  }
}

// Rings holding inf and NaN give the same bits as their f32 read-back: signaling NaNs
// (the tiers' f16 widening quiets them, kv_load_rows keeps them; the first arithmetic
// quiets them either way) and q8_0 blocks with a NaN or inf scale (a corrupt snapshot).
// The SIMD tiers' exp clamps its argument, so there a NaN score weighs about nothing
// rather than making the output NaN; typed or not, the bits agree.
TEST_P(CpuAttentionKv, NonFiniteRowsGiveTheSameBits) {
  const auto [isa, types] = GetParam();
  if (tier_missing(isa)) GEIST_SKIP(std::string("this CPU has no ") + isa_name(isa) + " tier");
  AmxOff amx_off;
  std::mt19937 rng(5);
  std::normal_distribution<float> nd;
  const int n_head = 4, n_kv = 2, hd = 64, rows = 5;
  const int64_t depth = 40, cap = depth + rows;
  const int64_t row = int64_t(n_kv) * hd;
  ThreadPool pool(2);
  // sNaN, -inf, qNaN, sNaN in each type (for q8_0 as the f16 scale).
  const uint32_t specials[][4] = {{0x7F800001, 0xFF800000, 0x7FC00000, 0x7FAAAAAA},
                                  {0x7C01, 0xFC00, 0x7E00, 0x7D55},
                                  {0x7F81, 0xFF80, 0x7FC0, 0xFFA0},
                                  {0x7C01, 0xFC00, 0x7E00, 0x7D55}};
  for (int trial = 0; trial < 4; ++trial) {
    SCOPED_TRACE(trial);
    Ring k = make_ring(types.k, cap, n_kv, hd, rng), v = make_ring(types.v, cap, n_kv, hd, rng);
    std::vector<float> q(size_t(rows) * n_head * hd), clean(q.size()), ref(q.size()), got(q.size());
    for (float &x : q) x = nd(rng);
    AttentionArgs a{q.data(), k.f32.data(), v.f32.data(), clean.data(), rows, depth,
                    cap,      n_head,       n_kv,         hd,           0,    0.125f};
    attention_on_tier(isa, a, pool);
    // A special value in one element (or one q8_0 scale) of K or V, at a position only
    // some of the queries see.
    Ring &ring = trial % 2 ? v : k;
    const KvType t = trial % 2 ? types.v : types.k;
    const size_t rb = kv_row_bytes(t, row);
    const int64_t pos = depth + trial % rows;
    const size_t at = size_t(pos) * rb + (t == KvType::Q8_0 ? 34 : kv_row_bytes(t, 7));
    const uint32_t special = specials[size_t(t) % 4][trial];  // % 4: GCC 12 -Warray-bounds
    std::memcpy(ring.typed.data() + at, &special, t == KvType::F32 ? 4 : 2);  // little endian
    kv_load_rows(t, ring.typed.data(), cap, row, ring.f32.data());
    a.out = ref.data();
    attention_on_tier(isa, a, pool);
    ASSERT_NE(0, std::memcmp(ref.data(), clean.data(), ref.size() * sizeof(float)))
        << "it mattered";
    AttentionArgs b = a;
    b.k = k.typed.data();
    b.v = v.typed.data();
    b.k_type = types.k;
    b.v_type = types.v;
    b.out = got.data();
    attention_on_tier(isa, b, pool);
    ASSERT_EQ(0, std::memcmp(ref.data(), got.data(), ref.size() * sizeof(float)));
    for (int r = 0; r < rows; ++r) {  // one row per call: f16 and bf16 rings read in place
      AttentionArgs c = b;
      c.q = q.data() + size_t(r) * n_head * hd;
      c.out = got.data() + size_t(r) * n_head * hd;
      c.n_rows = 1;
      c.q_pos0 = depth + r;
      attention_on_tier(isa, c, pool);
    }
    ASSERT_EQ(0, std::memcmp(ref.data(), got.data(), ref.size() * sizeof(float))) << "row by row";
  }
}

std::string param_name(const ::testing::TestParamInfo<std::tuple<Isa, KvTypes>> &info) {
  const KvTypes t = std::get<1>(info.param);
  return std::string(isa_name(std::get<0>(info.param))) + "_k_" + kv_type_name(t.k) + "_v_" +
         kv_type_name(t.v);
}

// Every type for both rings, and K and V of different types (-ctk / -ctv).
INSTANTIATE_TEST_SUITE_P(TiersAndTypes, CpuAttentionKv,
                         ::testing::Combine(::testing::Values(Isa::Generic, Isa::Avx2, Isa::Avx2Vnni, Isa::Avx512),
                                            ::testing::Values(KvTypes{KvType::F32, KvType::F32},
                                                              KvTypes{KvType::F16, KvType::F16},
                                                              KvTypes{KvType::BF16, KvType::BF16},
                                                              KvTypes{KvType::Q8_0, KvType::Q8_0},
                                                              KvTypes{KvType::Q8_0, KvType::F16},
                                                              KvTypes{KvType::F32, KvType::Q8_0},
                                                              KvTypes{KvType::BF16, KvType::F32})),
                         param_name);

// The tiers really run on typed rings: their online softmax differs in the last bits from
// the generic exact one, so equal bits would mean the tier fell back to generic.
TEST(CpuAttentionKvTier, TierPathRunsForTypedRings) {
  if (best_isa() == Isa::Generic) GEIST_SKIP("this CPU has no SIMD tier");
  AmxOff amx_off;
  std::mt19937 rng(9);
  std::normal_distribution<float> nd;
  const int n_head = 4, n_kv = 1, hd = 256, rows = 8;
  const int64_t depth = 500, cap = depth + rows;
  ThreadPool pool(2);
  for (KvType t : {KvType::F16, KvType::BF16, KvType::Q8_0}) {
    SCOPED_TRACE(kv_type_name(t));
    Ring k = make_ring(t, cap, n_kv, hd, rng), v = make_ring(t, cap, n_kv, hd, rng);
    std::vector<float> q(size_t(rows) * n_head * hd), gen(q.size()), tier(q.size());
    for (float &x : q) x = nd(rng);
    AttentionArgs a{q.data(),
                    k.typed.data(),
                    v.typed.data(),
                    gen.data(),
                    rows,
                    depth,
                    cap,
                    n_head,
                    n_kv,
                    hd,
                    0,
                    0.0625f,
                    t,
                    t};
    attention_on_tier(Isa::Generic, a, pool);
    a.out = tier.data();
    attention_on_tier(best_isa(), a, pool);
    ASSERT_NE(0, std::memcmp(gen.data(), tier.data(), gen.size() * sizeof(float)));
    for (size_t i = 0; i < gen.size(); ++i)
      ASSERT_NEAR(tier[i], gen[i], 2e-5f * (1.0f + std::fabs(gen[i])));
  }
}

// ---- bf16 rings on AMX-BF16 tiles (amx_attn_impl.h) -------------------------------------------
// There the queries and the softmax weights are rounded to bfloat16 (the keys and values
// already are), so the result is close to, not equal to, the exact attention; what must hold
// exactly is that a query's bits depend on nothing but its own keys: not on the rows beside
// it, the thread count, or inf and NaN in keys it does not see.

#define REQUIRE_AMX_BF16()                                                                           \
  if (!amx_bf16_attention() || !amx_enabled())                                                      \
  GEIST_SKIP("no AMX-BF16 with AVX512-BF16 here (or the OS does not grant the tile state, or GEIST_AMX=0): " \
             "the avx512 tier keeps its f32 kernels for bf16 rings")

TEST(AmxBf16Attention, CloseToExactAndTheSameBitsWhateverTheRows) {
  REQUIRE_AMX_BF16();
  std::mt19937 rng(31);
  std::normal_distribution<float> nd;
  const Geo geos[] = {
      {4, 1, 256, 0, 250, 0},  {4, 1, 256, 64, 300, 0}, {8, 2, 64, 0, 40, 0},   {8, 2, 64, 32, 100, 0},
      {2, 2, 512, 0, 240, 0},  {8, 1, 512, 48, 90, 0},  {6, 6, 64, 20, 33, 0},  {4, 1, 256, 0, 5, 1000},
      {8, 2, 256, 0, 1000, 0}, {8, 1, 128, 100, 650, 0},
  };
  const int row_list[] = {1, 3, 17, 33};
  ThreadPool pool1(1), pool2(2), pool3(3);
  double worst = 0;
  for (const Geo &G : geos) {
    for (int rows : row_list) {
      SCOPED_TRACE(geo_name(G, rows));
      const int64_t need = G.window > 0 ? G.window + rows - 1 : G.depth + rows;
      const int64_t cap = G.cap > 0 ? G.cap : need;
      Ring k = make_ring(KvType::BF16, cap, G.n_kv, G.hd, rng), v = make_ring(KvType::BF16, cap, G.n_kv, G.hd, rng);
      std::vector<float> q(size_t(rows) * G.n_head * G.hd);
      for (float &x : q) x = nd(rng);
      std::vector<float> exact(q.size()), got(q.size()), other(q.size());
      AttentionArgs a{q.data(), k.f32.data(), v.f32.data(), exact.data(),
                      rows,     G.depth,      cap,          G.n_head,
                      G.n_kv,   G.hd,         G.window,     1.0f / std::sqrt(float(G.hd))};
      attention_on_tier(Isa::Generic, a, pool2);
      AttentionArgs b = a;
      b.k = k.typed.data();
      b.v = v.typed.data();
      b.k_type = b.v_type = KvType::BF16;
      b.out = got.data();
      const uint64_t calls = amx_calls();
      attention_on_tier(Isa::Avx512, b, pool2);
      ASSERT_GT(amx_calls(), calls) << "the AMX kernel did not run";
      // Outputs are weighted means of N(0, 1) values: the weights' bf16 rounding (2^-9
      // relative) and the queries' move them by a few 1e-3.
      for (size_t i = 0; i < got.size(); ++i) {
        ASSERT_NEAR(got[i], exact[i], 0.03) << i;
        worst = std::max(worst, double(std::fabs(got[i] - exact[i])));
      }
      for (ThreadPool *pool : {&pool1, &pool3}) {
        b.out = other.data();
        attention_on_tier(Isa::Avx512, b, *pool);
        ASSERT_EQ(0, std::memcmp(got.data(), other.data(), got.size() * sizeof(float))) << pool->n_threads();
      }
      for (int r = 0; r < rows; ++r) {  // row by row, as decode does
        AttentionArgs c = b;
        c.q = q.data() + size_t(r) * G.n_head * G.hd;
        c.out = other.data() + size_t(r) * G.n_head * G.hd;
        c.n_rows = 1;
        c.q_pos0 = G.depth + r;
        attention_on_tier(Isa::Avx512, c, pool2);
      }
      ASSERT_EQ(0, std::memcmp(got.data(), other.data(), got.size() * sizeof(float))) << "row by row";
    }
  }
  std::printf("largest |AMX bf16 - exact| %.2e\n", worst);
  EXPECT_GT(worst, 0.0) << "bits equal to the exact attention: was it the bf16 arithmetic?";
}

// inf and NaN in one key's K or V row (a corrupt ring): the queries that do not see that key
// keep their bits; those that see a V special get a non-finite output, as the arithmetic
// would give them. (0 x inf inside a tile would otherwise reach every query of the tile.)
TEST(AmxBf16Attention, NonFiniteValuesReachOnlyTheQueriesThatSeeThem) {
  REQUIRE_AMX_BF16();
  std::mt19937 rng(8);
  std::normal_distribution<float> nd;
  const int n_head = 4, n_kv = 1, hd = 256, rows = 24;
  const int64_t depth = 300, cap = depth + rows;
  const int64_t row = int64_t(n_kv) * hd;
  ThreadPool pool(2);
  const uint16_t specials[] = {0x7FC0, 0x7F80, 0xFF80, 0x7F81};  // qNaN, +inf, -inf, sNaN
  for (int trial = 0; trial < 8; ++trial) {
    SCOPED_TRACE(trial);
    const bool in_v = trial % 2 == 1;
    Ring k = make_ring(KvType::BF16, cap, n_kv, hd, rng), v = make_ring(KvType::BF16, cap, n_kv, hd, rng);
    std::vector<float> q(size_t(rows) * n_head * hd), clean(q.size()), got(q.size());
    for (float &x : q) x = nd(rng);
    AttentionArgs a{q.data(), k.typed.data(), v.typed.data(), clean.data(), rows, depth, cap, n_head, n_kv, hd,
                    0,        0.0625f,        KvType::BF16,   KvType::BF16};
    attention_on_tier(Isa::Avx512, a, pool);
    const int64_t pos = depth + 3 + 5 * (trial / 2);  // rows below pos - depth do not see it
    const size_t at = size_t(pos) * kv_row_bytes(KvType::BF16, row) + 2 * size_t((7 + 40 * trial) % hd);
    std::memcpy((in_v ? v : k).typed.data() + at, &specials[trial / 2], 2);
    a.out = got.data();
    attention_on_tier(Isa::Avx512, a, pool);
    const size_t per_row = size_t(n_head) * hd;
    for (int r = 0; r < rows; ++r) {
      const bool sees = depth + r >= pos;
      const float *g = got.data() + r * per_row, *c = clean.data() + r * per_row;
      if (!sees) {
        ASSERT_EQ(0, std::memcmp(g, c, per_row * sizeof(float))) << "row " << r << " does not see the key";
      } else if (in_v) {
        bool nonfinite = false;
        for (size_t i = 0; i < per_row; ++i) nonfinite = nonfinite || !std::isfinite(g[i]);
        ASSERT_TRUE(nonfinite) << "row " << r << " sees the inf / NaN value";
      }
    }
  }
}

}  // namespace
}  // namespace geist::cpu
