// exactjit op rms_norm: PyTorch's fused RMSNorm row by row (bitwise), optionally with AdaLN
// modulation n * (1 + scale[i]) + shift[i] gathered from table views (NUMERICS.md).
#pragma once

#include "codegen/op_row.hpp"
#include "kernels/launch_plan.hpp"

#include <dlpack/dlpack.h>
#include <llvm/Support/Error.h>

namespace exactjit {

/// Stable op codes (OpCode, codegen/kernel_spec.hpp).
namespace Op {
inline constexpr OpCode RmsNorm{3};
}  // namespace Op

struct RmsNormArgs {
  const DLTensor& x;       ///< (..., H) contiguous, H % 4 == 0, rows aligned to 4 elements
  const DLTensor* weight;  ///< (H,) in x's dtype, or null
  const DLTensor* shift;   ///< (R, H) table view, or null (then scale and index are null too)
  const DLTensor* scale;   ///< (R, H) table view with shift's row stride
  const DLTensor* index;   ///< (S,) int32/int64 with M % S == 0
  const DLTensor& out;     ///< like x
  const DLTensor* rstd;    ///< (M,) fp32 contiguous, or null
  double eps;
};

llvm::Expected<LaunchPlan> plan_rms_norm(const RmsNormArgs& args);

/// table_stride 0 = plain; > 0 = modulated with tables of that row stride.
KernelSpec rms_norm_spec(DType dtype, IndexType index, int64_t hidden, int64_t table_stride, bool weighted);

/// rms_norm's row of the op table.
extern const OpRow kRmsNormRow;

}  // namespace exactjit
