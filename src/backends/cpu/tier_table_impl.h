// A tier's kernel table (qgemm.h's TierKernels) from its SIMD abstraction S and its Isa:
// every entry is the shared template (qgemm_impl.h, fgemm_impl.h, attn_impl.h,
// ew_impl.h) instantiated for S, counting its calls for the tests. Include only from a
// tier TU, inside its anonymous namespace, after those headers.

template <class S, Isa kTierIsa>
struct TierTable {
  template <quant::GgmlType T>
  static void run(const GemmArgs &a, int64_t g0, int64_t g1) {
    count_tier_call(kTierIsa);
    Kernels<S>::template gemm<T>(a, g0, g1);
  }

  template <quant::GgmlType T>
  static void run_float(const FloatGemmArgs &a, int64_t n0, int64_t n1) {
    count_tier_call(kTierIsa);
    FloatGemm<S>::template gemm<T>(a, n0, n1);
  }

  static void attn_rows(const AttentionArgs &a, int g, int r0, int r1, int64_t lo, int64_t hi, float *const *st) {
    Attn<S>::rows_any(a, g, r0, r1, lo, hi, st);
  }

  static void gelu_mul(const float *gate, const float *up, float *out, int64_t n) {
    Elementwise<S>::gelu_mul(gate, up, out, n);
  }

  static constexpr TierKernels table() {
    using G = quant::GgmlType;
    return TierKernels{kTierIsa,          run<G::Q8_0>,       run<G::Q4_0>,       run<G::Q5_0>,       run<G::Q4_K>,
                       run<G::Q5_K>,      run<G::Q6_K>,       run<G::Q2_K>,       run<G::Q3_K>,       attn_rows,
                       gelu_mul,          S::L,               run_float<G::F32>,  run_float<G::F16>,  run_float<G::BF16>,
                       run_float<G::Q4_1>, run_float<G::Q5_1>};
  }
};
