// CPU operators against direct double-precision formulas.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "backends/cpu/ops.h"

namespace geist::cpu {
namespace {

TEST(CpuOps, RopeFrequenciesMatchSpec) {
  // model-spec.md 1.3 test values.
  RopeTable local, global;
  local.init(1e4, 256, 1.0, nullptr);
  global.init(1e6, 256, 1.0, nullptr);
  EXPECT_NEAR(local.omega(1), 0.930572041, 1e-9);
  EXPECT_NEAR(local.omega(127), 1.07460783e-4, 1e-12);
  EXPECT_NEAR(global.omega(1), 0.897687132, 1e-9);
  EXPECT_NEAR(global.omega(127), 1.11397386e-6, 1e-14);
  std::vector<float> ff(256, 1.0f);
  for (int i = 64; i < 256; ++i) ff[i] = 1e30f;
  RopeTable prop;
  prop.init(1e6, 512, 1.0, ff.data());
  EXPECT_NEAR(prop.omega(1), 0.947463526, 1e-9);
  EXPECT_NEAR(prop.omega(63), 0.0333762469, 1e-10);
  EXPECT_EQ(prop.omega(64), 0.0);
}

TEST(CpuOps, RopeRotatesHalfSplitPairs) {
  RopeTable t;
  t.init(1e4, 8, 1.0, nullptr);
  std::vector<float> cs(8), x(8);
  for (int i = 0; i < 8; ++i) x[i] = float(i + 1);
  t.fill(3, 1, cs.data());
  std::vector<float> y = x;
  rope_neox(y.data(), 1, 1, 8, 8, cs.data());
  for (int i = 0; i < 4; ++i) {
    const double th = 3.0 * std::pow(1e4, -2.0 * i / 8);
    EXPECT_NEAR(y[i], x[i] * std::cos(th) - x[i + 4] * std::sin(th), 1e-5);
    EXPECT_NEAR(y[i + 4], x[i + 4] * std::cos(th) + x[i] * std::sin(th), 1e-5);
  }
}

TEST(CpuOps, RmsNorm) {
  std::vector<float> x = {1, -2, 3, -4}, g = {1, 2, 3, 4}, out(4);
  rmsnorm_to(x.data(), g.data(), out.data(), 1, 4, 1e-6f);
  const double r = 1.0 / std::sqrt((1 + 4 + 9 + 16) / 4.0 + 1e-6);
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(out[i], x[i] * r * g[i], 1e-6);
}

// Naive attention in double for one query.
void naive(const std::vector<float> &q, const std::vector<float> &k, const std::vector<float> &v, int64_t p, int hd,
           int window, float scale, std::vector<double> *out) {
  const int64_t j0 = window > 0 ? std::max<int64_t>(0, p - window + 1) : 0;
  std::vector<double> s;
  double mx = -1e300;
  for (int64_t j = j0; j <= p; ++j) {
    double d = 0;
    for (int i = 0; i < hd; ++i) d += double(q[i]) * k[j * hd + i];
    s.push_back(d * scale);
    mx = std::max(mx, s.back());
  }
  double sum = 0;
  for (double &e : s) sum += e = std::exp(e - mx);
  out->assign(hd, 0.0);
  for (int64_t j = j0; j <= p; ++j) {
    for (int i = 0; i < hd; ++i) (*out)[i] += s[j - j0] / sum * v[j * hd + i];
  }
}

TEST(CpuOps, AttentionCausalAndSlidingMatchNaive) {
  ThreadPool pool(2);
  std::mt19937 rng(7);
  std::normal_distribution<float> nd;
  const int hd = 16, n_head = 4, n_kv = 2, n_pos = 40, n_rows = 7;
  for (int window : {0, 5}) {
    std::vector<float> k(n_pos * n_kv * hd), v(k.size()), q(n_rows * n_head * hd), out(q.size());
    for (auto &e : k) e = nd(rng);
    for (auto &e : v) e = nd(rng);
    for (auto &e : q) e = nd(rng);
    AttentionArgs a{q.data(), k.data(), v.data(), out.data(), n_rows, n_pos - n_rows, n_pos, n_head, n_kv, hd,
                    window, 0.25f};
    attention(a, pool);
    for (int r = 0; r < n_rows; ++r) {
      for (int h = 0; h < n_head; ++h) {
        const int g = h / (n_head / n_kv);
        std::vector<float> qh(q.begin() + (r * n_head + h) * hd, q.begin() + (r * n_head + h + 1) * hd);
        std::vector<float> kg(n_pos * hd), vg(n_pos * hd);
        for (int j = 0; j < n_pos; ++j) {
          for (int i = 0; i < hd; ++i) {
            kg[j * hd + i] = k[(j * n_kv + g) * hd + i];
            vg[j * hd + i] = v[(j * n_kv + g) * hd + i];
          }
        }
        std::vector<double> ref;
        naive(qh, kg, vg, n_pos - n_rows + r, hd, window, 0.25f, &ref);
        for (int i = 0; i < hd; ++i) EXPECT_NEAR(out[(r * n_head + h) * hd + i], ref[i], 1e-5);
      }
    }
  }
}

// The pool's softcap is the serial loop's, element for element, for any thread count.
TEST(CpuOps, SoftcapOverThePoolIsTheSerialLoop) {
  std::mt19937 rng(5);
  std::normal_distribution<float> d(0.0f, 40.0f);
  std::vector<float> x(262144 + 17);
  for (float &v : x) v = d(rng);
  std::vector<float> want = x;
  for (float &v : want) v = 30.0f * std::tanh(v / 30.0f);
  for (int threads : {1, 2, 3, 8}) {
    ThreadPool pool(threads);
    std::vector<float> got = x;
    softcap(got.data(), 30.0f, int64_t(got.size()), pool);
    for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], want[i]) << i << " threads " << threads;
  }
}

TEST(CpuOps, GeluMulMatchesTanhFormula) {
  std::vector<float> g = {-3, -1, 0, 0.5f, 2, 8}, u = {1, 2, 3, 4, 5, 6}, out(6);
  gelu_mul(g.data(), u.data(), out.data(), 6);
  for (int i = 0; i < 6; ++i) {
    const double x = g[i];
    const double ref = 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x))) * u[i];
    EXPECT_NEAR(out[i], ref, 1e-5 * std::max(1.0, std::fabs(ref)));
  }
}

}  // namespace
}  // namespace geist::cpu
