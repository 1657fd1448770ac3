// A DLTensor on a fake CUDA address, for planner tests: planning validates shapes, strides,
// dtypes and addresses and touches no memory.
#pragma once

#include "runtime/errors.hpp"

#include <dlpack/dlpack.h>
#include <gtest/gtest.h>
#include <llvm/Support/Error.h>

#include <cstdint>
#include <string>
#include <vector>

namespace exactjit::test {

struct FakeTensor {
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;
  DLTensor t{};
  FakeTensor(uint64_t address, std::vector<int64_t> dims, DLDataType dtype, std::vector<int64_t> stride = {})
      : shape(std::move(dims)), strides(std::move(stride)) {
    t.data = reinterpret_cast<void*>(address);
    t.device = {kDLCUDA, 0};
    t.ndim = static_cast<int>(shape.size());
    t.dtype = dtype;
    t.shape = shape.data();
    t.strides = strides.empty() ? nullptr : strides.data();
  }
};

inline constexpr DLDataType kBF16{kDLBfloat, 16, 1};
inline constexpr DLDataType kF32{kDLFloat, 32, 1};
inline constexpr DLDataType kF16{kDLFloat, 16, 1};
inline constexpr DLDataType kI64{kDLInt, 64, 1};
inline constexpr DLDataType kI32{kDLInt, 32, 1};
inline constexpr DLDataType kU8{kDLUInt, 8, 1};
inline constexpr uint64_t GiB = 1ull << 30;

/// "accepted" for a plan, else its refusal's message (which must be an InvalidArgument).
template <typename T> std::string message_of(llvm::Expected<T> planned) {
  if (planned) return "accepted";
  ErrorReport report = take_error(planned.takeError());
  EXPECT_EQ(report.code, ErrorCode::InvalidArgument) << report.message;
  return report.message;
}

}  // namespace exactjit::test
