// exactjit rms_norm backward, the per-element arithmetic (NUMERICS.md; docs/backward.md) shared by
// the dx kernel (rms_norm_backward.cuh), the parameter tiles (rms_norm_param_grad.cuh) and the
// one-pass kernel (rms_norm_one_pass.cuh), so the three agree bit for bit. Every operation is
// written out; nothing is left for the compiler to contract.
#ifndef EXACTJIT_RMS_NORM_GRAD_MATH_CUH
#define EXACTJIT_RMS_NORM_GRAD_MATH_CUH

namespace xj {

#if defined(__CUDA_ARCH__)
// m = rT(add(1, scale)): the modulation factor as the forward rounds it.
template <typename T> XJ_DEVICE T modulation(T scale) { return round_to<T>(add(1.0f, to_float(scale))); }

// wd = w * d_n with d_n = grad (plain) or mul(grad, m) (modulated); given lo, also its rounding
// error wd_lo (exact up to a rounding of the tiny lo terms): wd + wd_lo = w * grad * m, each
// product's error taken as 0 where the product is not finite (product_error; kGuarded).
// Unguarded, the errors are plain fma(a, b, -p): the same values wherever wd is finite, since then
// so are d and every product before it (w * inf is inf or NaN).
template <bool kModulated, bool kWeighted, bool kGuarded>
XJ_DEVICE float weighted_grad_terms(float grad, float m, float weight, float* lo) {
  auto error = [](float a, float b, float p) { return kGuarded ? product_error(a, b, p) : fma(a, b, -p); };
  float d = grad, d_lo = 0.0f;
  if (kModulated) {
    d = mul(grad, m);
    if (lo) d_lo = error(grad, m, d);
  }
  if (!kWeighted) {
    if (lo) *lo = d_lo;
    return d;
  }
  const float wd = mul(weight, d);
  if (lo) *lo = kModulated ? fma(weight, d_lo, error(weight, d, wd)) : error(weight, d, wd);
  return wd;
}

// weighted_grad_terms, guarded. kFiniteFirst: unguarded first (fewer instructions per element),
// the guarded path only for a non-finite wd; the same values either way.
template <bool kModulated, bool kWeighted, bool kFiniteFirst = false>
XJ_DEVICE float weighted_grad(float grad, float m, float weight, float* lo = nullptr) {
  if (kFiniteFirst && lo) {
    float wd_lo;
    const float wd = weighted_grad_terms<kModulated, kWeighted, false>(grad, m, weight, &wd_lo);
    if (is_finite(wd)) {
      *lo = wd_lo;
      return wd;
    }
  }
  return weighted_grad_terms<kModulated, kWeighted, true>(grad, m, weight, lo);
}

// dx before its rounding to T: fma(r, wd, small), small = mul(-x, coef), then + fma(r_lo, wd, .)
// where the row's rstd is recomputed (kExactRstd), then + fma(r, wd_lo, .) where wd is rounded
// (kHasLo).
template <bool kExactRstd, bool kHasLo>
XJ_DEVICE float dx_value(float x, float wd, float wd_lo, float r, float r_lo, float coef) {
  float small = mul(-x, coef);
  if (kExactRstd) small = fma(r_lo, wd, small);
  if (kHasLo) small = fma(r, wd_lo, small);
  return fma(r, wd, small);
}

// A modulated row's terms of its table row's sums, xhat = mul(rstd, x), n = rT(mul(w, xhat))
// (no weight: rT(xhat)): dshift += grad, dscale += grad * n, and dweight's group of rows
// += mul(mul(grad, m), xhat).
template <typename T, bool kWeighted, typename Sum>
XJ_DEVICE void add_table_terms(float grad, float xhat, float weight, float m, bool weight_terms, Sum& shift, Sum& scale,
                               float& weight_group) {
  const float n = kWeighted ? mul(weight, xhat) : xhat;
  shift.add(grad);
  scale.add_product(grad, to_float(round_to<T>(n)));
  if (weight_terms) weight_group = add(weight_group, mul(mul(grad, m), xhat));
}
#endif

}  // namespace xj

#endif  // EXACTJIT_RMS_NORM_GRAD_MATH_CUH
