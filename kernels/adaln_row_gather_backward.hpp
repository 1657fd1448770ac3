// exactjit op adaln_row_gather, backward: per table row, the segment sum of the positions that
// gathered it, for each of the six chunks (NUMERICS.md).
#pragma once

#include "codegen/op_row.hpp"
#include "kernels/launch_plan.hpp"

#include <dlpack/dlpack.h>
#include <llvm/Support/Error.h>

namespace exactjit {

/// Stable op codes (OpCode, codegen/kernel_spec.hpp).
namespace Op {
inline constexpr OpCode AdalnRowGatherBackward{7};
}  // namespace Op

struct AdalnRowGatherBackwardArgs {
  const DLTensor& grad;              ///< (6, S, H) contiguous
  const DLTensor& timestep_indices;  ///< the forward's (S,)
  const DLTensor& token_tags;        ///< the forward's (S,), same type
  const DLTensor& d_rows;            ///< (R, 6H) contiguous, R = 3T, in grad's dtype or float32
  const DLTensor* workspace;         ///< uint8, adaln_row_gather_backward_workspace bytes
};

int64_t adaln_row_gather_backward_workspace(int64_t seq, int64_t table_rows, int64_t hidden);

llvm::Expected<LaunchSequence> plan_adaln_row_gather_backward(const AdalnRowGatherBackwardArgs& args);

/// adaln_row_gather_backward's row of the op table.
extern const OpRow kAdalnRowGatherBackwardRow;

}  // namespace exactjit
