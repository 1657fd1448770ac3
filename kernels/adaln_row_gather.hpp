// exactjit op adaln_row_gather: out[c, s, :] = rows[ti[s] * 3 + tag[s], cH : (c+1)H] for the six
// AdaLN chunks (NUMERICS.md), bitwise equal to six index_selects. Validation, spec, geometry.
#pragma once

#include "codegen/op_row.hpp"
#include "kernels/launch_plan.hpp"

#include <dlpack/dlpack.h>
#include <llvm/Support/Error.h>

namespace exactjit {

/// Stable op codes (OpCode, codegen/kernel_spec.hpp).
namespace Op {
inline constexpr OpCode AdalnRowGather{2};
}  // namespace Op

struct AdalnRowGatherArgs {
  const DLTensor& rows;              ///< (3T, 6H) view, unit column stride, row stride >= 6H
  const DLTensor& timestep_indices;  ///< (S,) int32 or int64, values in [0, T)
  const DLTensor& token_tags;        ///< (S,) same dtype, values in [0, 3)
  const DLTensor& out;               ///< (6, S, H) contiguous, rows' dtype
};

llvm::Expected<LaunchPlan> plan_adaln_row_gather(const AdalnRowGatherArgs& args);


/// adaln_row_gather's row of the op table.
extern const OpRow kAdalnRowGatherRow;

}  // namespace exactjit
