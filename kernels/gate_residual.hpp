// exactjit op gate_residual: out = rT(residual + rT(gate[index[r mod S]] * y)) (NUMERICS.md).
// Validation, spec and geometry; the runtime compiles and launches the plan.
#pragma once

#include "codegen/op_row.hpp"
#include "kernels/launch_plan.hpp"

#include <dlpack/dlpack.h>
#include <llvm/Support/Error.h>

namespace exactjit {

/// Stable op codes (OpCode, codegen/kernel_spec.hpp).
namespace Op {
inline constexpr OpCode GateResidual{1};
}  // namespace Op

struct GateResidualArgs {
  const DLTensor& residual;  ///< (M, H) or (B, S, H), contiguous
  const DLTensor& gate;      ///< (R, H) table view, unit column stride, row stride >= H
  const DLTensor& index;     ///< (S,) int32 or int64, M % S == 0
  const DLTensor& y;         ///< like residual
  const DLTensor& out;       ///< like residual; may be residual itself, may overlap nothing else
};

/// Checks every rule and returns the launch plan (grid 0 when M == 0).
llvm::Expected<LaunchPlan> plan_gate_residual(const GateResidualArgs& args);


/// gate_residual's row of the op table.
extern const OpRow kGateResidualRow;

}  // namespace exactjit
