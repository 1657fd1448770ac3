// exactjit sums in a fixed order (NUMERICS.md "Segment sums"; docs/backward.md "Segment sum").
// Every backward reduction over positions adds its terms strictly in the documented order into
// one of these accumulators:
// - CompensatedSum: each add's rounding error is recovered exactly (Knuth's branch-free TwoSum,
//   every operation written out) and carried in a second float, and add_product adds a*b exactly
//   (fma gives the product's rounding error). A plain fp32 chain of n adds is ~sqrt(n) roundings
//   off and can lose to eager's tree reductions; compensated, the result is about one fp32
//   rounding off at any length. value() is sum + error (sum alone once it is inf or NaN, which
//   the compensation would turn into NaN).
// - PlainSum: add(sum, v), a product term mul(a, b) first. Where the result is bf16/fp16 and the
//   sum is short (a table row's positions), its error stays far below the final rounding, and it
//   costs a third of the instructions (measured: compensated bf16 tiles made rms_norm +
//   modulation forward + backward 2.69 -> 3.53 ms at S = 131072 with no accuracy change).
// Compiled into the kernels and into the host models (kernels/backward_model.cpp).
#ifndef EXACTJIT_FIXED_ORDER_SUM_CUH
#define EXACTJIT_FIXED_ORDER_SUM_CUH

namespace xj {

struct CompensatedSum {
  float sum = 0.0f, error = 0.0f;
  XJ_HD void add(float v) {
    const float s = xj::add(sum, v);
    const float v_part = xj::sub(s, sum);
    const float sum_part = xj::sub(s, v_part);
    error = xj::add(error, xj::add(xj::sub(sum, sum_part), xj::sub(v, v_part)));
    sum = s;
  }
  XJ_HD void add_product(float a, float b) {
    const float p = xj::mul(a, b);
    add(p);
    error = xj::add(error, xj::product_error(a, b, p));
  }
  XJ_HD float value() const { return is_finite(sum) ? xj::add(sum, error) : sum; }
};

struct PlainSum {
  float sum = 0.0f;
  XJ_HD void add(float v) { sum = xj::add(sum, v); }
  XJ_HD void add_product(float a, float b) { sum = xj::add(sum, xj::mul(a, b)); }
  XJ_HD float value() const { return sum; }
};

// The tile accumulator of a segment sum whose result is stored as T: compensated for fp32.
template <typename T> struct SegmentSumFor { typedef PlainSum type; };
template <> struct SegmentSumFor<float> { typedef CompensatedSum type; };

}  // namespace xj

#endif  // EXACTJIT_FIXED_ORDER_SUM_CUH
