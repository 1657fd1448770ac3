// exactjit op gate_residual, backward (NUMERICS.md): d_y = rT(grad * gate[i]) (bitwise equal to
// eager's VJP) and d_gate = segment sums of grad * y, from one pass over grad and y.
#pragma once

#include "codegen/op_row.hpp"
#include "kernels/launch_plan.hpp"

#include <dlpack/dlpack.h>
#include <llvm/Support/Error.h>

namespace exactjit {

/// Stable op codes (OpCode, codegen/kernel_spec.hpp).
namespace Op {
inline constexpr OpCode GateResidualBackward{6};
}  // namespace Op

struct GateResidualBackwardArgs {
  const DLTensor& grad;        ///< like the forward's out
  const DLTensor& gate;        ///< the forward's (R, H) table view
  const DLTensor& index;       ///< the forward's (S,)
  const DLTensor& y;           ///< the forward's y
  const DLTensor* d_y;         ///< like y, or null
  const DLTensor* d_gate;      ///< (R, H) contiguous in the gate's dtype, or null
  const DLTensor* workspace;   ///< uint8, gate_residual_backward_workspace bytes
};

/// Workspace bytes for M rows, index length S, R table rows, hidden H (-1: invalid shapes).
int64_t gate_residual_backward_workspace(int64_t rows, int64_t seq, int64_t table_rows, int64_t hidden);

llvm::Expected<LaunchSequence> plan_gate_residual_backward(const GateResidualBackwardArgs& args);

/// gate_residual_backward's row of the op table.
extern const OpRow kGateResidualBackwardRow;

}  // namespace exactjit
