// Sampler: greedy and top-k=1 argmax, seed determinism, the sample never leaving the
// top-k / top-p / min-p sets, empirical frequencies against softmax(logits / T), and the
// repetition penalty (divides positive logits, multiplies negative ones), with the
// llama.cpp order: penalties, top-k, top-p and min-p on T=1 probabilities, temperature.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <memory>
#include <set>
#include <vector>

#include "base/thread_pool.h"
#include "engine/sampler.h"

namespace geist {
namespace {

SamplerParams all_off(float temperature, uint64_t seed = 1) {
  SamplerParams p;
  p.temperature = temperature;
  p.top_k = 0;
  p.top_p = 1.0f;
  p.min_p = 0.0f;
  p.repeat_penalty = 1.0f;
  p.repeat_last_n = 64;
  p.seed = seed;
  return p;
}

uint64_t splitmix_for_test(uint64_t &x) {
  uint64_t z = (x += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

std::vector<int32_t> draws(Sampler &s, const std::vector<float> &logits, int n) {
  std::vector<int32_t> out;
  for (int i = 0; i < n; ++i) out.push_back(s.sample(logits.data(), int64_t(logits.size())));
  return out;
}

// Frequencies of each id over n draws.
std::vector<double> frequencies(Sampler &s, const std::vector<float> &logits, int n) {
  std::vector<double> f(logits.size(), 0.0);
  for (int i = 0; i < n; ++i) {
    const int32_t t = s.sample(logits.data(), int64_t(logits.size()));
    EXPECT_GE(t, 0);
    EXPECT_LT(t, int32_t(logits.size()));
    if (t >= 0 && t < int32_t(logits.size())) f[t] += 1.0 / n;
  }
  return f;
}

std::vector<double> softmax(const std::vector<float> &logits, double temperature) {
  double mx = logits[0];
  for (float l : logits) mx = std::max(mx, double(l));
  std::vector<double> p(logits.size());
  double sum = 0;
  for (size_t i = 0; i < logits.size(); ++i) sum += p[i] = std::exp((logits[i] - mx) / temperature);
  for (double &x : p) x /= sum;
  return p;
}

// |f - p| within 5 standard errors of a binomial proportion over n draws (plus a floor so a
// p near 0 does not demand exactly 0).
void expect_matches(const std::vector<double> &f, const std::vector<double> &p, int n) {
  ASSERT_EQ(f.size(), p.size());
  for (size_t i = 0; i < p.size(); ++i) {
    const double se = std::sqrt(p[i] * (1 - p[i]) / n);
    EXPECT_NEAR(f[i], p[i], 5 * se + 1e-3) << "token " << i;
  }
}

TEST(Sampler, TemperatureZeroIsArgmax) {
  const std::vector<float> logits = {0.5f, -1.0f, 3.25f, 3.0f, -7.0f, 2.0f};
  for (float t : {0.0f, -1.0f}) {
    SamplerParams p = all_off(t);
    p.top_k = 40;  // other filters on must not matter for greedy
    p.top_p = 0.5f;
    p.min_p = 0.5f;
    Sampler s(p);
    for (int32_t id : draws(s, logits, 20)) EXPECT_EQ(id, 2);
  }
}

TEST(Sampler, GreedyTiesGoToLowestId) {
  const std::vector<float> logits = {1.0f, 4.0f, 2.0f, 4.0f, 4.0f, -3.0f};
  Sampler s(all_off(0.0f));
  for (int32_t id : draws(s, logits, 10)) EXPECT_EQ(id, 1);
  // The max at id 0 too, and at the last id only.
  const std::vector<float> first = {9.0f, 9.0f, 9.0f};
  EXPECT_EQ(Sampler(all_off(0.0f)).sample(first.data(), 3), 0);
  const std::vector<float> last = {-1.0f, -2.0f, 5.0f};
  EXPECT_EQ(Sampler(all_off(0.0f)).sample(last.data(), 3), 2);
}

// Greedy without a penalty reads the argmax in place; with a repeat penalty it goes
// through the candidate list. Both pick the same id, NaN and infinities included: the
// first index of the largest value, a NaN never replacing the running best (a NaN at id 0
// is never replaced). The penalised sampler's history holds only id 1, whose logit is 0
// in every row, so the penalty changes nothing.
TEST(Sampler, GreedyInPlaceEqualsCandidateList) {
  const float nan = std::nanf(""), inf = INFINITY;
  const std::vector<std::vector<float>> rows = {
      {nan, 0.0f, 5.0f, inf, 2.0f}, {1.0f, 0.0f, nan, 5.0f, 5.0f, inf, nan, -inf},
      {-inf, 0.0f, -0.0f, nan},     {-3.0f, 0.0f, 7.0f, nan, 7.0f, 6.0f},
      {-inf, 0.0f, -inf},           {2.0f, 0.0f, -0.0f, 2.0f}};
  const std::vector<int32_t> expected = {0, 5, 1, 2, 1, 0};
  for (size_t i = 0; i < rows.size(); ++i) {
    Sampler plain(all_off(0.0f));
    SamplerParams pp = all_off(0.0f);
    pp.repeat_penalty = 2.0f;
    Sampler penalised(pp);
    const std::vector<float> prime = {-1.0f, 0.0f};
    ASSERT_EQ(penalised.sample(prime.data(), 2), 1);  // history {1}
    EXPECT_EQ(plain.sample(rows[i].data(), int64_t(rows[i].size())), expected[i]) << "row " << i;
    EXPECT_EQ(penalised.sample(rows[i].data(), int64_t(rows[i].size())), expected[i]) << "row " << i;
  }
}

// The same on long rows (the in-place argmax runs in blocks of 16 lanes): values from a
// small set so that the maximum repeats, NaNs and signed zeros anywhere, a NaN at id 0 in
// some rows, lengths that are and are not multiples of 16. Reference: the scan itself.
TEST(Sampler, GreedyInPlaceLongRows) {
  const float nan = std::nanf("");
  const float pool[] = {-1.0f, 0.0f, -0.0f, 2.5f, 2.5f, nan, -INFINITY, 1.0f};
  uint64_t state = 12345;
  for (int row = 0; row < 200; ++row) {
    const int n = 1 + int(splitmix_for_test(state) % 700);
    std::vector<float> x(static_cast<size_t>(n));
    for (float &v : x) v = pool[splitmix_for_test(state) % 8];
    if (row % 7 == 0) x[0] = nan;
    if (row % 5 == 0) {  // all zeros, the last one +0.0: no zero exceeds another
      std::fill(x.begin(), x.end(), -0.0f);
      x[size_t(n) - 1] = 0.0f;
    }
    int64_t ref = 0;
    for (int i = 1; i < n; ++i) {
      if (x[size_t(i)] > x[size_t(ref)]) ref = i;
    }
    Sampler greedy(all_off(0.0f));
    EXPECT_EQ(greedy.sample(x.data(), n), ref) << "row " << row << ", n " << n;
  }
}

// greedy_argmax over a pool (segments read by separate tasks) against the scan: rows from a
// small value set with NaNs (whole segments of them too), signed zeros and -inf, a NaN at
// index 0 in some, segment sizes from 1 up, pools of 1-4 threads; then the sampler on a
// vocabulary-sized row with its pool.
TEST(Sampler, GreedyArgmaxOverAPoolEqualsTheScan) {
  const float nan = std::nanf("");
  const float values[] = {-1.0f, 0.0f, -0.0f, 2.5f, 2.5f, nan, -INFINITY, 1.0f};
  std::vector<std::unique_ptr<ThreadPool>> pools;
  for (int t = 1; t <= 4; ++t) pools.push_back(std::make_unique<ThreadPool>(t));
  uint64_t state = 777;
  for (int row = 0; row < 300; ++row) {
    const int n = 1 + int(splitmix_for_test(state) % 3000);
    std::vector<float> x(static_cast<size_t>(n));
    for (float &v : x) v = values[splitmix_for_test(state) % 8];
    if (row % 7 == 0) x[0] = nan;
    if (row % 5 == 1) {  // a run of NaNs covering whole segments, then the largest value once
      const int a = int(splitmix_for_test(state) % uint64_t(n)), b = std::min(n, a + 200);
      for (int i = a; i < b; ++i) x[size_t(i)] = nan;
      if (b < n) x[size_t(b)] = 9.0f;
    }
    if (row % 11 == 3) {  // all zeros of both signs, or all -inf: every value ties
      const float z = row % 2 ? -INFINITY : 0.0f;
      for (float &v : x) v = (splitmix_for_test(state) % 2) ? z : -z;
    }
    int64_t ref = 0;
    for (int i = 1; i < n; ++i) {
      if (x[size_t(i)] > x[size_t(ref)]) ref = i;
    }
    for (const auto &pool : pools) {
      for (int64_t seg : {1, 3, 16, 17, 100, 1000}) {
        EXPECT_EQ(greedy_argmax(x.data(), n, pool.get(), seg), ref)
            << "row " << row << ", n " << n << ", " << pool->n_threads() << " threads, segment " << seg;
      }
    }
  }
  std::vector<float> big(262144);
  for (float &v : big) v = float(int(splitmix_for_test(state) % 1000)) / 7.0f;
  big[200000] = 1000.0f;
  big[100001] = nan;
  big[250000] = 1000.0f;
  Sampler greedy(all_off(0.0f));
  EXPECT_EQ(greedy.sample(big.data(), int64_t(big.size()), pools[3].get()), 200000);
  EXPECT_EQ(greedy.sample(big.data(), int64_t(big.size())), 200000);
  EXPECT_EQ(greedy_argmax(big.data(), 0, pools[1].get()), -1);
  EXPECT_EQ(greedy_argmax(nullptr, 5, pools[1].get()), -1);
}

TEST(Sampler, TopKOneIsArgmaxAtAnyTemperature) {
  // A close runner-up and a huge temperature: without top-k the runner-up would win often.
  const std::vector<float> logits = {0.0f, 1.0f, 1.01f, 0.99f, -5.0f, 1.0f};
  for (float t : {0.1f, 1.0f, 5.0f, 100.0f}) {
    SamplerParams p = all_off(t, 42);
    p.top_k = 1;
    Sampler s(p);
    for (int32_t id : draws(s, logits, 200)) ASSERT_EQ(id, 2) << "T=" << t;
  }
  // Tied maxima with top_k = 1: the lowest id of the tie.
  const std::vector<float> tie = {0.0f, 3.0f, 3.0f, 1.0f};
  SamplerParams p = all_off(2.0f, 7);
  p.top_k = 1;
  Sampler s(p);
  for (int32_t id : draws(s, tie, 100)) ASSERT_EQ(id, 1);
}

TEST(Sampler, SameSeedSameSequenceDifferentSeedsDiffer) {
  const std::vector<float> flat(50, 0.0f);
  Sampler a(all_off(1.0f, 123)), b(all_off(1.0f, 123)), c(all_off(1.0f, 124));
  const std::vector<int32_t> sa = draws(a, flat, 200), sb = draws(b, flat, 200), sc = draws(c, flat, 200);
  EXPECT_EQ(sa, sb);
  EXPECT_NE(sa, sc);
  // Not a constant sequence: a flat distribution over 50 ids hits many of them.
  EXPECT_GT(std::set<int32_t>(sa.begin(), sa.end()).size(), 30u);
  // reset() reseeds: the same sequence again.
  a.reset();
  EXPECT_EQ(draws(a, flat, 200), sa);
}

TEST(Sampler, NeverOutsideTopK) {
  // Ids 10..14 have the top five logits; everything else is close behind so that, with a
  // high temperature, an unfiltered draw would often land outside.
  std::vector<float> logits(64, 1.0f);
  for (int i = 10; i < 15; ++i) logits[i] = 1.5f + 0.01f * i;
  SamplerParams p = all_off(10.0f, 5);
  p.top_k = 5;
  Sampler s(p);
  std::set<int32_t> seen;
  for (int32_t id : draws(s, logits, 2000)) {
    ASSERT_GE(id, 10);
    ASSERT_LT(id, 15);
    seen.insert(id);
  }
  EXPECT_EQ(seen.size(), 5u);  // and all five are reachable
}

TEST(Sampler, NeverOutsideTopPNucleus) {
  // T=1 probabilities 0.4, 0.3, 0.2, 0.1 (ids 3, 0, 2, 1): top_p 0.65 keeps {3, 0} (cum
  // 0.4 < 0.65, 0.7 >= 0.65); top_p 0.75 keeps {3, 0, 2}.
  const std::vector<float> logits = {std::log(0.3f), std::log(0.1f), std::log(0.2f), std::log(0.4f)};
  for (float t : {1.0f, 3.0f}) {  // top-p works on T=1 probabilities, so T must not move the set
    SamplerParams p = all_off(t, 9);
    p.top_p = 0.65f;
    Sampler s(p);
    std::set<int32_t> seen;
    for (int32_t id : draws(s, logits, 3000)) seen.insert(id);
    EXPECT_EQ(seen, (std::set<int32_t>{0, 3})) << "T=" << t;
    p.top_p = 0.75f;
    Sampler s2(p);
    seen.clear();
    for (int32_t id : draws(s2, logits, 3000)) seen.insert(id);
    EXPECT_EQ(seen, (std::set<int32_t>{0, 2, 3})) << "T=" << t;
  }
}

TEST(Sampler, NeverOutsideMinPSet) {
  // Relative to the max (id 1, p ratio 1): ids with ratio >= 0.25 survive min_p = 0.25.
  // Ratios: id0 0.5, id1 1, id2 0.2, id3 0.3, id4 0.05, id5 0.26.
  const std::vector<float> ratio = {0.5f, 1.0f, 0.2f, 0.3f, 0.05f, 0.26f};
  std::vector<float> logits;
  for (float r : ratio) logits.push_back(std::log(r));
  SamplerParams p = all_off(4.0f, 11);
  p.min_p = 0.25f;
  Sampler s(p);
  std::set<int32_t> seen;
  for (int32_t id : draws(s, logits, 4000)) seen.insert(id);
  EXPECT_EQ(seen, (std::set<int32_t>{0, 1, 3, 5}));
}

TEST(Sampler, FiltersCompose) {
  // top_k 4 keeps ids {7, 6, 5, 4}; with T=1 probabilities renormalised over those four,
  // top_p then cuts to a nucleus and min_p can only shrink it further. Never an id < 4.
  std::vector<float> logits = {0, 0.1f, 0.2f, 0.3f, 1.0f, 2.0f, 3.0f, 4.0f};
  SamplerParams p = all_off(2.0f, 3);
  p.top_k = 4;
  p.top_p = 0.9f;
  p.min_p = 0.2f;
  Sampler s(p);
  // Over the top four: p(7)=0.644, p(6)=0.237, p(5)=0.087, p(4)=0.032. top_p 0.9: {7,6,5}
  // (0.881 < 0.9 after two, 0.968 after three). min_p 0.2: ratio of 5 is e^-2 = 0.135 < 0.2,
  // so {7, 6}.
  std::set<int32_t> seen;
  for (int32_t id : draws(s, logits, 3000)) seen.insert(id);
  EXPECT_EQ(seen, (std::set<int32_t>{6, 7}));
}

TEST(Sampler, FrequenciesMatchSoftmaxOverTemperature) {
  const std::vector<float> logits = {1.0f, 0.0f, 2.0f, -0.5f};
  const int n = 20000;
  for (float t : {1.0f, 0.5f, 2.0f}) {
    Sampler s(all_off(t, 2024));
    expect_matches(frequencies(s, logits, n), softmax(logits, t), n);
  }
}

TEST(Sampler, FrequenciesAfterTopKRenormalise) {
  // top_k 2 keeps ids 2 and 0; their ratio is softmax over the two at T.
  const std::vector<float> logits = {1.0f, 0.0f, 2.0f, -0.5f};
  const int n = 20000;
  SamplerParams p = all_off(0.7f, 77);
  p.top_k = 2;
  Sampler s(p);
  const std::vector<double> two = softmax({1.0f, 2.0f}, 0.7);
  expect_matches(frequencies(s, logits, n), {two[0], 0.0, two[1], 0.0}, n);
}

TEST(Sampler, RepeatPenaltyGreedy) {
  SamplerParams p = all_off(0.0f);
  p.repeat_penalty = 2.0f;
  {  // Positive logit divided: 2 -> 1 < 1.5.
    const std::vector<float> logits = {2.0f, 1.5f};
    Sampler s(p);
    s.accept(0);
    EXPECT_EQ(s.sample(logits.data(), 2), 1);
  }
  {  // Negative logit multiplied: -1 -> -2 < -1.5 (dividing would give -0.5 and keep id 0).
    const std::vector<float> logits = {-1.0f, -1.5f};
    Sampler s(p);
    s.accept(0);
    EXPECT_EQ(s.sample(logits.data(), 2), 1);
  }
  {  // Applied once per distinct token however often it occurs: 2 -> 1 > 0.9.
    const std::vector<float> logits = {2.0f, 0.9f};
    Sampler s(p);
    for (int i = 0; i < 3; ++i) s.accept(0);
    EXPECT_EQ(s.sample(logits.data(), 2), 0);
  }
  {  // Only the last repeat_last_n tokens count.
    const std::vector<float> logits = {2.0f, 1.5f, -9.0f};
    SamplerParams q = p;
    q.repeat_last_n = 1;
    Sampler s(q);
    s.accept(0);
    s.accept(2);  // pushes 0 out of the window
    EXPECT_EQ(s.sample(logits.data(), 3), 0);
  }
  {  // sample() records its own choice: 0, then 1 (0 penalised), then 0 (both penalised).
    const std::vector<float> logits = {2.0f, 1.5f};
    Sampler s(p);
    EXPECT_EQ(draws(s, logits, 3), (std::vector<int32_t>{0, 1, 0}));
    Sampler r(p);
    r.accept(0);
    r.reset();  // clears the history: id 0 is no longer penalised
    EXPECT_EQ(r.sample(logits.data(), 2), 0);
  }
  {  // Penalty 1 is off; out-of-range history ids are ignored, logits are not modified.
    const std::vector<float> logits = {2.0f, 1.5f};
    SamplerParams q = p;
    q.repeat_penalty = 1.0f;
    Sampler s(q);
    s.accept(0);
    EXPECT_EQ(s.sample(logits.data(), 2), 0);
    Sampler t(p);
    t.accept(-1);
    t.accept(5);
    EXPECT_EQ(t.sample(logits.data(), 2), 0);
    EXPECT_EQ(logits, (std::vector<float>{2.0f, 1.5f}));
  }
}

// Frequency of id 0 with id 0 (and only it) in the history before every draw.
double penalised_frequency(const std::vector<float> &logits, float penalty, int n) {
  SamplerParams p = all_off(1.0f, 99);
  p.repeat_penalty = penalty;
  p.repeat_last_n = 1;  // accept(0) pushes out the previous draw
  Sampler s(p);
  int hits = 0;
  for (int i = 0; i < n; ++i) {
    s.accept(0);
    hits += s.sample(logits.data(), int64_t(logits.size())) == 0;
  }
  return double(hits) / n;
}

TEST(Sampler, RepeatPenaltyLowersFrequency) {
  const int n = 20000;
  auto p0 = [](double l0, double l1) { return 1.0 / (1.0 + std::exp(l1 - l0)); };
  auto tol = [&](double p) { return 5 * std::sqrt(p * (1 - p) / n) + 1e-3; };
  // Positive: logits {2, 1}; penalty 2 makes id 0's logit 1 -> 0.5 (unpenalised 0.731).
  EXPECT_NEAR(penalised_frequency({2.0f, 1.0f}, 1.0f, n), p0(2, 1), tol(p0(2, 1)));
  EXPECT_NEAR(penalised_frequency({2.0f, 1.0f}, 2.0f, n), p0(1, 1), tol(p0(1, 1)));
  // Negative: logits {-1, -1.5}; penalty 2 makes id 0's logit -2 -> 0.378 (unpenalised 0.622).
  EXPECT_NEAR(penalised_frequency({-1.0f, -1.5f}, 1.0f, n), p0(-1, -1.5), tol(p0(-1, -1.5)));
  EXPECT_NEAR(penalised_frequency({-1.0f, -1.5f}, 2.0f, n), p0(-2, -1.5), tol(p0(-2, -1.5)));
}

// top_k_sorted (the sampler's top-k in one pass) against sorting every (logit, id) pair
// by logit descending, id ascending and keeping the first k: rows with many ties, sorted
// rows (ascending: every element displaces the worst kept), NaNs, lengths around the
// 16-float vector and the vocabulary's 262144.
TEST(Sampler, TopKSortedEqualsAFullSort) {
  auto reference = [](const std::vector<float> &x, size_t k) {
    std::vector<std::pair<float, int32_t>> all;
    for (size_t i = 0; i < x.size(); ++i) {
      if (!std::isnan(x[i])) all.push_back({x[i], int32_t(i)});
    }
    std::sort(all.begin(), all.end(), [](const auto &a, const auto &b) {
      return a.first > b.first || (a.first == b.first && a.second < b.second);
    });
    all.resize(std::min(all.size(), k));
    return all;
  };
  uint64_t seed = 42;
  int cases = 0;
  for (int64_t n : {1, 2, 15, 16, 17, 31, 33, 100, 1000, 4099, 262144}) {
    for (int shape = 0; shape < 5; ++shape) {
      std::vector<float> x(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) {
        const uint64_t r = splitmix_for_test(seed);
        switch (shape) {
          case 0: x[i] = float(int64_t(r % 7)) - 3.0f; break;           // few values: ties
          case 1: x[i] = float(double(r >> 11) * 0x1.0p-53 * 20 - 10); break;  // distinct
          case 2: x[i] = float(i); break;                                // ascending
          case 3: x[i] = float(n - i) * 0.5f; break;                     // descending
          default: x[i] = r % 5 == 0 ? NAN : float(int64_t(r % 3)); break;  // NaNs and ties
        }
      }
      for (size_t k : {size_t(1), size_t(5), size_t(40), size_t(n > 1 ? n - 1 : 1), size_t(n), size_t(n + 3)}) {
        const auto want = reference(x, k);
        std::vector<std::pair<float, int32_t>> got(k);
        const size_t m = top_k_sorted(x.data(), n, k, got.data());
        got.resize(m);
        ASSERT_EQ(got, want) << "n " << n << " shape " << shape << " k " << k;
        ++cases;
      }
    }
  }
  EXPECT_EQ(cases, 11 * 5 * 6);
}

// The sampler draws the same tokens through the one-pass top-k as through the sorted
// candidate list it replaced (top_k off keeps that path; a top_k of n_vocab + 1 takes it
// with the same candidates when the filters after it cut the list anyway): same seed,
// rows with ties, top-p and min-p on, with and without a repetition penalty.
TEST(Sampler, TopKPathDrawsWhatTheFullSortDraws) {
  uint64_t seed = 7;
  std::vector<float> logits(5000);
  for (int round = 0; round < 20; ++round) {
    for (float &l : logits) l = float(int64_t(splitmix_for_test(seed) % 200)) * 0.05f;
    for (float penalty : {1.0f, 1.3f}) {
      SamplerParams p;
      p.temperature = 0.9f;
      p.top_k = 40;
      p.top_p = 0.9f;
      p.min_p = 0.02f;
      p.repeat_penalty = penalty;
      p.seed = uint64_t(round) * 31 + 1;
      Sampler fast(p);
      // Reference: the same filters with top-k done by hand on the full list: keep only the
      // 40 best logits (others at -inf), top_k off.
      std::vector<std::pair<float, int32_t>> best(40);
      SamplerParams q = p;
      q.top_k = 0;
      Sampler slow(q);
      for (int step = 0; step < 30; ++step) {
        // The penalised row the reference must cut: penalties apply before top-k.
        std::vector<float> pen = logits;
        if (penalty != 1.0f) {
          const auto st = fast.state();
          std::set<int32_t> seen(st.history.begin(), st.history.end());
          for (int32_t t : seen) pen[size_t(t)] = pen[size_t(t)] > 0 ? pen[size_t(t)] / penalty : pen[size_t(t)] * penalty;
        }
        ASSERT_EQ(top_k_sorted(pen.data(), int64_t(pen.size()), 40, best.data()), 40u);
        std::vector<float> cut(logits.size(), -INFINITY);
        for (const auto &[l, id] : best) cut[size_t(id)] = logits[size_t(id)];
        const int32_t a = fast.sample(logits.data(), int64_t(logits.size()));
        const int32_t b = slow.sample(cut.data(), int64_t(cut.size()));
        ASSERT_EQ(a, b) << "round " << round << " step " << step << " penalty " << penalty;
      }
    }
  }
}

// base/draw.h's exponential (the same bits on the host and the GPU) against the C library's:
// within 2 ulp over the range a draw uses, exact at 0, 0 below -708, NaN kept.
TEST(Sampler, DeterministicExpIsWithinTwoUlpOfLibm) {
  auto ulps = [](double a, double b) {
    int64_t ia, ib;
    std::memcpy(&ia, &a, 8);
    std::memcpy(&ib, &b, 8);
    return ia > ib ? ia - ib : ib - ia;
  };
  std::mt19937_64 rng(3);
  std::uniform_real_distribution<double> wide(-700.0, 700.0), near(-40.0, 0.0);
  int64_t worst = 0;
  for (int i = 0; i < 200000; ++i) {
    const double x = i % 2 ? wide(rng) : near(rng);
    worst = std::max(worst, ulps(draw::det_exp(x), std::exp(x)));
  }
  EXPECT_LE(worst, 2) << "worst ulp distance from std::exp";
  for (double x : {-1e-300, 1e-300, 0.5 * std::log(2.0), -0.5 * std::log(2.0), -707.9, 708.9}) {
    EXPECT_LE(ulps(draw::det_exp(x), std::exp(x)), 2) << x;
  }
  EXPECT_EQ(draw::det_exp(0.0), 1.0);
  EXPECT_EQ(draw::det_exp(-0.0), 1.0);
  EXPECT_EQ(draw::det_exp(-INFINITY), 0.0);
  EXPECT_EQ(draw::det_exp(-709.0), 0.0);
  EXPECT_TRUE(std::isinf(draw::det_exp(INFINITY)));
  EXPECT_TRUE(std::isnan(draw::det_exp(NAN)));
}

// A draw a step computes (Sampler::step_spec, then draw_sampled with the spec's uniform, then
// take_step_draw) is the draw sample() makes on the same row, and leaves the same sampler
// state; the spec for a draw after `pending` others uses the uniform those draws leave; a
// change of the params, a penalty or a top-k the step does not take means no step draw.
TEST(Sampler, StepDrawsEqualHostDraws) {
  std::mt19937_64 rng(11);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  std::vector<float> row(5000);
  SamplerParams p;
  p.temperature = 1.3f;
  p.top_k = 50;
  p.top_p = 0.9f;
  p.min_p = 0.02f;
  p.seed = 17;
  Sampler host(p), step(p);
  std::vector<std::pair<float, int32_t>> cand;
  std::vector<double> pr;
  for (int i = 0; i < 300; ++i) {
    for (float &x : row) x = nd(rng);
    DrawSpec d, after;
    ASSERT_TRUE(step.step_spec(0, int64_t(row.size()), &d));
    ASSERT_TRUE(step.step_spec(1, int64_t(row.size()), &after));
    ASSERT_TRUE(step.takes_step_draw(d));
    const int32_t want = host.sample(row.data(), int64_t(row.size()));
    const int32_t got = draw_sampled(row.data(), int64_t(row.size()), size_t(d.top_k), d.temperature, d.top_p,
                                     d.min_p, d.u, cand, pr);
    ASSERT_EQ(got, want) << "draw " << i;
    step.take_step_draw(d, got);
    EXPECT_FALSE(step.takes_step_draw(d)) << "a spec is taken once";
    DrawSpec next;
    ASSERT_TRUE(step.step_spec(0, int64_t(row.size()), &next));
    EXPECT_EQ(next.u, after.u) << "pending 1 is the draw after this one";
    const Sampler::State a = host.state(), b = step.state();
    ASSERT_EQ(0, std::memcmp(a.rng, b.rng, sizeof a.rng));
    ASSERT_EQ(a.history, b.history);
  }
  DrawSpec d;
  ASSERT_TRUE(step.step_spec(0, int64_t(row.size()), &d));
  SamplerParams q = p;
  q.top_p = 0.8f;
  const Sampler::State keep = step.state();
  step.set_params(q);
  step.set_state(keep);  // the same RNG words: only the params differ
  DrawSpec again;
  EXPECT_EQ(step.step_spec(0, int64_t(row.size()), &again) ? again.u : -1.0, d.u);
  EXPECT_FALSE(step.takes_step_draw(d)) << "other params";
  q.repeat_penalty = 1.1f;
  step.set_params(q);
  EXPECT_FALSE(step.step_spec(0, int64_t(row.size()), &d)) << "a penalty reads the row";
  q.repeat_penalty = 1.0f;
  q.top_k = DrawSpec::kMaxStepTopK + 1;
  step.set_params(q);
  EXPECT_FALSE(step.step_spec(0, int64_t(row.size()), &d)) << "top-k above the step's";
  q.top_k = 0;
  step.set_params(q);
  EXPECT_FALSE(step.step_spec(0, int64_t(row.size()), &d)) << "no top-k";
  q.top_k = 40;
  step.set_params(q);
  EXPECT_TRUE(step.step_spec(0, 41, &d));
  EXPECT_FALSE(step.step_spec(0, 40, &d)) << "top-k of the whole vocabulary";
  q.temperature = 0;
  step.set_params(q);
  ASSERT_TRUE(step.step_spec(0, int64_t(row.size()), &d));
  EXPECT_EQ(d.temperature, 0.0f) << "greedy";
}

}  // namespace
}  // namespace geist
