// exactjit op gate_residual_rms_norm: the gated residual feeding the next RMSNorm, in one pass
// (NUMERICS.md): h = rT(residual + rT(gate[i] * y)) and out = rms_norm(h) [modulated by
// shift[i], scale[i]], i = index[r mod S]. Its backward adds the residual stream's gradient to
// the norm's dx in one kernel, then runs rms_norm's parameter gradients and gate_residual's.
#pragma once

#include "codegen/op_row.hpp"
#include "kernels/launch_plan.hpp"

#include <dlpack/dlpack.h>
#include <llvm/Support/Error.h>

namespace exactjit {

/// Stable op codes (OpCode, codegen/kernel_spec.hpp).
namespace Op {
inline constexpr OpCode GateResidualRmsNorm{19};
inline constexpr OpCode GateResidualRmsNormBackward{20};
}  // namespace Op

struct GateResidualRmsNormArgs {
  const DLTensor& residual;  ///< (M, H) or (B, S, H), contiguous
  const DLTensor& gate;      ///< (R, H) table view, unit column stride, row stride >= H
  const DLTensor& index;     ///< (S,) int32 or int64, M % S == 0
  const DLTensor& y;         ///< like residual
  const DLTensor* weight;    ///< (H,) or null
  const DLTensor* shift;     ///< (R, H) view with the gate's row stride, or null (with scale)
  const DLTensor* scale;     ///< like shift
  const DLTensor& h;         ///< like residual; may be residual itself
  const DLTensor& out;       ///< like residual
  const DLTensor* rstd;      ///< (M,) float32, or null
  double eps;
};

llvm::Expected<LaunchPlan> plan_gate_residual_rms_norm(const GateResidualRmsNormArgs& args);

struct GateResidualRmsNormBackwardArgs {
  const DLTensor& grad_out;    ///< like out
  const DLTensor* grad_h;      ///< like h, or null (h feeds only the norm)
  const DLTensor& h;           ///< the forward's h
  const DLTensor& y;           ///< the forward's y
  const DLTensor& gate;        ///< the forward's gate view
  const DLTensor& index;       ///< the forward's index
  const DLTensor* weight;      ///< the forward's weight, or null
  const DLTensor* scale;       ///< the forward's scale view (modulated), or null
  const DLTensor& rstd;        ///< (M,) float32 saved by the forward
  double eps;                  ///< the forward's
  const DLTensor& d_residual;  ///< like h: rT(grad_h + the norm's dh)
  const DLTensor* d_y;         ///< like y, or null
  const DLTensor* d_gate;      ///< (R, H) contiguous, or null
  const DLTensor* d_weight;    ///< (H,), or null
  const DLTensor* d_shift;     ///< (R, H) contiguous, or null
  const DLTensor* d_scale;     ///< (R, H) contiguous, or null
  const DLTensor* workspace;   ///< uint8, gate_residual_rms_norm_backward_workspace bytes
};

/// Workspace bytes (-1: invalid shapes): rms_norm's backward's, then gate_residual's.
int64_t gate_residual_rms_norm_backward_workspace(int64_t rows, int64_t seq, int64_t table_rows, int64_t hidden,
                                                  bool weighted, bool modulated);

/// `device`: as rms_norm's backward (its one-pass kernel adds grad_h itself).
llvm::Expected<LaunchSequence> plan_gate_residual_rms_norm_backward(const GateResidualRmsNormBackwardArgs& args,
                                                                    const DeviceTraits& device = {});

/// The forward's row and the row of the backward's dx kernel (rms_norm_backward.cuh with the
/// residual gradient added).
extern const OpRow kGateResidualRmsNormRow;
extern const OpRow kGateResidualRmsNormBackwardRow;

}  // namespace exactjit
