// exactjit checked sizes: byte and element counts derived from sizes a caller gives (rows, S, R,
// H, features) in 64-bit signed arithmetic that cannot wrap. Signed overflow is undefined
// behaviour, and a wrapped workspace size would let a kernel write past the caller's buffer, so
// every step checks; a count that overflows, or starts negative, stays invalid to the end, where
// the caller turns it into the documented -1 or an InvalidArgument.
#pragma once

#include <cstdint>

namespace exactjit {

/// A count in [0, INT64_MAX], or invalid once any step left that range.
class CheckedSize {
 public:
  constexpr CheckedSize(int64_t value) : value_(value), valid_(value >= 0) {}  // NOLINT: reads as a number

  CheckedSize operator+(CheckedSize other) const {
    CheckedSize sum = *this;
    sum.valid_ = valid_ && other.valid_ && !__builtin_add_overflow(value_, other.value_, &sum.value_);
    return sum;
  }
  CheckedSize operator*(CheckedSize other) const {
    CheckedSize product = *this;
    product.valid_ = valid_ && other.valid_ && !__builtin_mul_overflow(value_, other.value_, &product.value_);
    return product;
  }
  /// ceil(value / divisor), divisor > 0; never overflows (no value + divisor - 1).
  CheckedSize ceil_div(int64_t divisor) const {
    CheckedSize quotient = *this;
    if (valid_) quotient.value_ = value_ / divisor + (value_ % divisor != 0);
    return quotient;
  }
  /// The next multiple of `unit` (> 0) at or above the value.
  CheckedSize round_up(int64_t unit) const { return ceil_div(unit) * unit; }

  bool valid() const { return valid_; }
  /// The count, or `fallback` (the workspace queries' -1) when it is invalid.
  int64_t value_or(int64_t fallback) const { return valid_ ? value_ : fallback; }

 private:
  int64_t value_;
  bool valid_;
};

}  // namespace exactjit
