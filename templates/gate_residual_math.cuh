// gate_residual element math, shared by the kernel (device) and the host model (host):
//   out = rT(add(residual, rT(mul(gate, y))))
// two roundings, exactly as eager's `gate * y` then `residual + ...`; never an FMA.
#ifndef EXACTJIT_GATE_RESIDUAL_MATH_CUH
#define EXACTJIT_GATE_RESIDUAL_MATH_CUH

namespace xj {

template <typename T> XJ_HD T gate_residual_element(T residual, T gate, T y) {
  const float product = to_float(round_to<T>(mul(to_float(gate), to_float(y))));
  return round_to<T>(add(to_float(residual), product));
}

}  // namespace xj

#endif  // EXACTJIT_GATE_RESIDUAL_MATH_CUH
