// A sampled draw's arithmetic, shared by the host sampler (engine/sampler.cpp), the CPU
// exec's draw op and the CUDA kernel that draws on the device (backends/cuda): the same
// operations in the same order on both sides, so a token drawn on a GPU is the token the
// host would draw from the same row with the same uniform.
//
// Bit-identity rests on IEEE arithmetic only: +, -, *, / and fma are correctly rounded on
// the host and on the device, and neither build contracts a*b+c into an fma
// (-ffp-contract=off, nvcc -fmad=false: CMakeLists.txt). The exponential is our own
// (det_exp): the C library's exp and CUDA's may differ in the last bit.
#pragma once

#include <math.h>

#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#if defined(__CUDACC__)
#define GEIST_HD __host__ __device__
#else
#define GEIST_HD
#endif

namespace geist {

// How a step draws the token of a logits row it writes (Exec::draw): the argmax where
// temperature <= 0, else the sampler's top-k, top-p, min-p and temperature draw
// (engine/sampler.h) with the uniform u in [0, 1) that the sampler's RNG gives that draw.
struct DrawSpec {
  float temperature = 0.0f;  // <= 0: greedy
  int top_k = 0;             // 1 .. kMaxStepTopK where temperature > 0
  float top_p = 1.0f;
  float min_p = 0.0f;
  double u = 0.0;
  // The largest top_k a step draws (the CUDA kernels' candidate lists); a sampler with a
  // larger one, or none, draws on the host from the logits row.
  static constexpr int kMaxStepTopK = 256;
};

// A draw a step computes: its spec, and the token written by end_step (or at
// Exec::wait_queued for a queued step); -1 until then.
struct StepDraw {
  DrawSpec spec;
  int32_t token = -1;
};

namespace draw {

// e^x to within a few ulp, the same bits on the host and on a GPU: Cody-Waite reduction
// x = k ln2 + r, |r| <= ln2 / 2, a degree-13 Taylor polynomial in Horner form with fma,
// then the exponent. 0 below -708 (where e^x is subnormal), infinity above 709; NaN stays.
GEIST_HD inline double det_exp(double x) {
  if (x != x) return x;
  if (x < -708.0) return 0.0;
  if (x > 709.0) return HUGE_VAL;
  const double k = rint(x * 0x1.71547652b82fep+0);  // x / ln2, to the nearest integer
  double r = fma(-k, 0x1.62e42feep-1, x);         // ln2's high part
  r = fma(-k, 0x1.a39ef35793c76p-33, r);           // and its low part
  double p = 0x1.6124613a86d09p-33;                // 1/13!
  p = fma(p, r, 0x1.1eed8eff8d898p-29);            // 1/12!
  p = fma(p, r, 0x1.ae64567f544e4p-26);
  p = fma(p, r, 0x1.27e4fb7789f5cp-22);
  p = fma(p, r, 0x1.71de3a556c734p-19);
  p = fma(p, r, 0x1.a01a01a01a01ap-16);
  p = fma(p, r, 0x1.a01a01a01a01ap-13);
  p = fma(p, r, 0x1.6c16c16c16c17p-10);
  p = fma(p, r, 0x1.1111111111111p-7);
  p = fma(p, r, 0x1.5555555555555p-5);
  p = fma(p, r, 0x1.5555555555555p-3);
  p = fma(p, r, 0x1.0000000000000p-1);
  p = fma(p, r, 1.0);
  p = fma(p, r, 1.0);
  // 2^k, k in [-1022, 1023]: a normal double built from its exponent field.
  const uint64_t bits = uint64_t(int64_t(k) + 1023) << 52;
  double two_k;
#if defined(__CUDA_ARCH__)
  two_k = __longlong_as_double(static_cast<long long>(bits));
#else
  std::memcpy(&two_k, &bits, sizeof two_k);
#endif
  return p * two_k;
}

// The weight of candidate value v at temperature 1 (top-p, min-p) and at temperature t,
// against the largest candidate value mx.
GEIST_HD inline double weight(float v, float mx) { return det_exp(double(v) - double(mx)); }
GEIST_HD inline double weight_t(float v, float mx, float t) { return det_exp((double(v) - double(mx)) / double(t)); }

// The draw among n >= 1 candidates sorted by value (descending, ties by id ascending), as
// llama.cpp's chain orders it: top-p then min-p on the temperature-1 weights pr[i], then
// the pick on the temperature-t weights w[i] with the uniform u01 in [0, 1). Returns the
// index of the chosen candidate. pr: weight() of the candidates; w(i): weight_t() of
// candidate i (read for the kept ones only).
template <class W>
GEIST_HD inline int pick(const double *pr, W w, int n, float top_p, float min_p, double u01) {
  double sum = 0;
  for (int i = 0; i < n; ++i) sum += pr[i];
  int keep = n;
  if (top_p < 1.0f) {
    double cum = 0;
    for (int i = 0; i < n; ++i) {
      cum += pr[i] / sum;
      if (cum >= top_p) {
        keep = i + 1;
        break;
      }
    }
  }
  if (min_p > 0.0f) {
    int k = 1;
    while (k < keep && pr[k] >= double(min_p) * pr[0]) ++k;
    keep = k;
  }
  double wsum = 0;
  for (int i = 0; i < keep; ++i) wsum += w(i);
  double u = u01 * wsum;
  for (int i = 0; i < keep; ++i) {
    const double wi = w(i);
    if (u < wi) return i;
    u -= wi;
  }
  return keep - 1;
}

}  // namespace draw

// The k best (logit, id) of x[0..n) in the order of a sort by logit descending, then id
// ascending (what sorting all n pairs and keeping the first k gives), written to out[0..k);
// NaNs are never taken. Returns how many were written: k, or fewer if x has fewer non-NaN
// values. One pass over x; the sampler's top-k.
size_t top_k_sorted(const float *x, int64_t n, size_t k, std::pair<float, int32_t> *out);

// A sampled draw (temperature > 0) from row x[0..n) with the uniform u01: the top k
// candidates (top_k_sorted), then base/draw.h's pick. 0 where the row holds no number.
// cand: scratch. What the CPU exec's draw op and Sampler::sample run.
int32_t draw_sampled(const float *x, int64_t n, size_t k, float temperature, float top_p, float min_p, double u01,
                     std::vector<std::pair<float, int32_t>> &cand, std::vector<double> &pr);

}  // namespace geist
