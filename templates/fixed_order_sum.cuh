// exactjit sums in a fixed order (NUMERICS.md "Segment sums"; docs/backward.md "Accuracy").
// Every backward reduction adds its terms strictly in the documented order through one of these:
// - PlainSum: add(sum, v) from 0. Used when the result is bf16 or fp16: its final rounding is
//   ~2^16 times coarser than the fp32 chain's error.
// - CompensatedSum: the same order, but each add's rounding error is recovered exactly (Knuth's
//   branch-free TwoSum, every operation written out) and carried in a second float, and
//   add_product adds a*b exactly (fma gives the product's rounding error). Used when the result
//   is fp32, where a plain chain of n adds is ~sqrt(n) roundings off and can lose to eager's
//   tree reductions; compensated, the error is about one rounding at any length.
// value() is the result to round or store: sum + error (sum alone once it is inf or NaN, which
// the compensation would turn into NaN).
// This file is compiled into the kernels and into the host models (kernels/backward_model.cpp).
#ifndef EXACTJIT_FIXED_ORDER_SUM_CUH
#define EXACTJIT_FIXED_ORDER_SUM_CUH

namespace xj {

struct PlainSum {
  float sum = 0.0f;
  XJ_HD void add(float v) { sum = xj::add(sum, v); }
  XJ_HD void add_product(float a, float b) { sum = xj::add(sum, xj::mul(a, b)); }
  XJ_HD float value() const { return sum; }
};

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

// The accumulator for a result stored as T.
template <typename T> struct SumFor { typedef PlainSum type; };
template <> struct SumFor<float> { typedef CompensatedSum type; };

}  // namespace xj

#endif  // EXACTJIT_FIXED_ORDER_SUM_CUH
