// exactjit op rms_norm, backward (NUMERICS.md; docs/backward.md): one pass forms dx in the
// forward's reduction shape and the parameter gradients' tile partials: dshift, dscale and (where
// modulated) dweight over sub-tiles of the table rows' lists, unmodulated dweight over tiles of
// consecutive rows (n recomputed exactly as in the forward); folds finish the sums.
#pragma once

#include "codegen/op_row.hpp"
#include "kernels/launch_plan.hpp"

#include <dlpack/dlpack.h>
#include <llvm/Support/Error.h>

namespace exactjit {

struct RmsNormBackwardArgs {
  const DLTensor& grad;       ///< like x
  const DLTensor& x;          ///< the forward's x
  const DLTensor* weight;     ///< the forward's weight, or null
  const DLTensor* scale;      ///< the forward's scale view (modulated), or null
  const DLTensor* index;      ///< the forward's index (with scale), or null
  const DLTensor& rstd;       ///< (M,) float32 saved by the forward
  double eps;                 ///< the forward's eps (fp32 dx recomputes rstd in fp64 with it)
  const DLTensor* dx;         ///< like x, or null
  const DLTensor* dweight;    ///< (H,) in x's dtype, or null
  const DLTensor* dshift;     ///< (R, H) contiguous in x's dtype, or null
  const DLTensor* dscale;     ///< (R, H) contiguous in x's dtype, or null
  const DLTensor* workspace;  ///< uint8, rms_norm_backward_workspace bytes
};

/// The backward kernel's shape: positions per tile of the parameter sums (a quarter of a
/// segment-plan tile: more blocks at small S); threads that form one row's dx (the forward's
/// reduction shape) and such groups per block.
inline constexpr int64_t kNormSumTilePositions = 64;
inline constexpr int kNormRowThreads = 128;
inline constexpr int kNormGroups = 4;

/// Quads each thread accumulates per column window, in registers: 3 (bf16/fp16: one window up to
/// H = 6144), 2 for fp32 (its sums take twice the registers).
int norm_sum_steps(DType dtype);

/// Workspace bytes (table_rows 0 = plain; -1: invalid shapes).
int64_t rms_norm_backward_workspace(int64_t rows, int64_t seq, int64_t table_rows, int64_t hidden, bool weighted);

llvm::Expected<LaunchSequence> plan_rms_norm_backward(const RmsNormBackwardArgs& args);

/// The backward kernel's templates and constants; with residual_grad its dx adds the residual
/// stream's gradient (gate_residual_rms_norm's backward runs the same template).
std::vector<std::string_view> rms_norm_dx_templates(const KernelSpec& spec);
std::string rms_norm_dx_constants(const KernelSpec& spec, bool residual_grad);

/// The row of rms_norm's backward kernel.
extern const OpRow kRmsNormBackwardRow;

}  // namespace exactjit
