// Vector math over a tier's SIMD abstraction S (fmin, fmax, mul, add, fmadd, fnmadd,
// round, pow2i, set1f). Include only from a tier TU, inside its anonymous namespace.

// e^x to about 2 ulp (Cephes' polynomial), x clamped to [-87.3, 88.3]: n = round(x log2 e),
// r = x - n ln 2 in two parts, e^r by a degree-5 polynomial, times 2^n.
template <class S>
typename S::F exp_poly(typename S::F x) {
  using F = typename S::F;
  x = S::fmin(S::fmax(x, S::set1f(-87.33f)), S::set1f(88.37f));
  const F n = S::round(S::mul(x, S::set1f(1.44269504088896341f)));
  F r = S::fnmadd(n, S::set1f(0.693359375f), x);
  r = S::fnmadd(n, S::set1f(-2.12194440e-4f), r);
  F p = S::set1f(1.9875691500e-4f);
  p = S::fmadd(p, r, S::set1f(1.3981999507e-3f));
  p = S::fmadd(p, r, S::set1f(8.3334519073e-3f));
  p = S::fmadd(p, r, S::set1f(4.1665795894e-2f));
  p = S::fmadd(p, r, S::set1f(1.6666665459e-1f));
  p = S::fmadd(p, r, S::set1f(5.0000001201e-1f));
  const F y = S::add(S::fmadd(S::mul(p, r), r, r), S::set1f(1.0f));
  return S::mul(y, S::pow2i(n));
}
