// Elementwise kernels over a SIMD abstraction S (float ops and exp), instantiated by each
// tier TU. Include only from a tier TU, inside its anonymous namespace.

template <class S>
struct Elementwise {
  // The most negative float u with tanhf(u) > -1 (glibc; the next one down gives -1).
  static constexpr float kGeluZeroBelow = -9.0109129f;
  using F = typename S::F;
  static constexpr int L = S::L;

  // out = gelu_tanh(g) * up, as g * up * sigmoid(2u) (0.5 (1 + tanh u) = sigmoid(2u),
  // without the cancellation of 1 + tanh for negative u), with the tier's exp.
  //
  // Below u = -9.0109129 the result is a signed zero, as in the generic kernel (and HF's and
  // llama.cpp's f32 GELU): there tanhf(u) rounds to -1, so 1 + tanh u is exactly 0. The
  // sigmoid form would instead return g up / (1 + e^-2u), which for large negative g (exp
  // clamped at 2^127) is a subnormal float; every later product with one is a microcode
  // assist on x86. On the synthetic E4B at 16 threads the per-layer projection fed by it
  // took 54 % of prefill (issue 15's profile), 57 ms per 512-row call for 0.34 G MACs.
  static F gelu(F g, F up) {
    const F k = S::set1f(0.7978845608028654f), c = S::set1f(0.044715f), one = S::set1f(1.0f);
    const F u = S::mul(k, S::fmadd(S::mul(c, g), S::mul(g, g), g));
    const F e = S::exp(S::sub(S::set1f(0.0f), S::add(u, u)));
    return S::mul(S::div(S::mul(g, up), S::add(one, e)), S::step_ge(u, S::set1f(kGeluZeroBelow)));
  }

  static void gelu_mul(const float *gate, const float *up, float *out, int64_t n) {
    int64_t i = 0;
    for (; i + L <= n; i += L) S::storef(out + i, gelu(S::loadf(gate + i), S::loadf(up + i)));
    if (i < n) {  // tail through a padded vector: the same arithmetic as full vectors
      alignas(64) float g[L] = {}, u[L] = {}, o[L];
      for (int64_t j = i; j < n; ++j) {
        g[j - i] = gate[j];
        u[j - i] = up[j];
      }
      S::storef(o, gelu(S::loadf(g), S::loadf(u)));
      for (int64_t j = i; j < n; ++j) out[j] = o[j - i];
    }
  }
};
