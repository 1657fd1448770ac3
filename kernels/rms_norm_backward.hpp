// exactjit op rms_norm, backward (NUMERICS.md; docs/backward.md): dx row-local in the forward's
// reduction shape; dshift, dscale and (modulated) dweight as segment sums over the table rows,
// from one pass of tiles (n recomputed exactly as in the forward); plain dweight over fixed
// tiles of 256 consecutive rows.
#pragma once

#include "codegen/op_row.hpp"
#include "kernels/launch_plan.hpp"

#include <dlpack/dlpack.h>
#include <llvm/Support/Error.h>

namespace exactjit {

/// Stable op codes (OpCode, codegen/kernel_spec.hpp).
namespace Op {
inline constexpr OpCode RmsNormBackward{8};
inline constexpr OpCode RmsNormTableGrad{9};
inline constexpr OpCode RmsNormWeightGrad{10};
inline constexpr OpCode RmsNormOnePass{21};
inline constexpr OpCode GateResidualRmsNormOnePass{22};
}  // namespace Op

/// gate_residual_rms_norm's gate gradients, formed by the one-pass kernel from its dx (d_residual)
/// where that kernel runs: d_y and the gate's tile partials, then their fold into d_gate. The
/// tensors are the ones gate_residual_backward's planner validated; the gate has the scale's rows.
struct OnePassGate {
  const DLTensor& y;
  const DLTensor& gate;
  const DLTensor& d_y;
  const DLTensor& d_gate;
  DType d_gate_dtype;
  uint64_t partials;  ///< the gate's tile partials: the plan's max_tiles x H floats
};

/// The parameter gradients' tile partials, unfolded, in the caller's (P, H) float32 tensors (P >=
/// rms_norm_backward_partial_tiles): sequence parallelism computes a shard's tiles and folds them
/// elsewhere (docs/sequence-parallel.md). Tile t of the backward's own order in row t: modulated,
/// the index's segment plan (its tiles by table row); plain, 256 consecutive rows.
struct RmsNormTilePartials {
  const DLTensor* shift;   ///< dshift's (modulated), or null
  const DLTensor* scale;   ///< dscale's (modulated), or null
  const DLTensor* weight;  ///< dweight's (needs the forward's weight), or null
};

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
  /// Like x, or null: added to dx (gate_residual_rms_norm's backward, where x is the residual
  /// stream h that also flows on; its planner turns the dx kernel into its own).
  const DLTensor* residual_grad = nullptr;
  /// gate_residual_rms_norm's gate part, for the one-pass kernel to form too, or null.
  const OnePassGate* gate_part = nullptr;
  /// Given, the backward writes only these partials (dx, the gradients and their folds are not
  /// asked for: those pointers must be null).
  const RmsNormTilePartials* tile_partials = nullptr;
};

/// Workspace bytes (table_rows 0 = plain; -1: invalid shapes).
int64_t rms_norm_backward_workspace(int64_t rows, int64_t seq, int64_t table_rows, int64_t hidden, bool weighted);

/// The least rows P of RmsNormTilePartials' tensors: the plan's bound ceil(M / 256) + R
/// (modulated), ceil(M / 256) (plain, table_rows 0); -1: invalid sizes.
int64_t rms_norm_backward_partial_tiles(int64_t rows, int64_t seq, int64_t table_rows);

/// `device`: on sm_90 (bulk copies) with enough plan tiles to fill it, the modulated
/// bf16 backward runs in one pass (rms_norm_one_pass.cuh: dx and the tile partials from one
/// read of x and grad) instead of the dx kernel and the parameter tiles; the bits are the same.
/// Given a gate part, that kernel (then gate_residual_rms_norm_one_pass) forms it as well and the
/// sequence ends with its fold; the caller sees which from the sequence's ops.
llvm::Expected<LaunchSequence> plan_rms_norm_backward(const RmsNormBackwardArgs& args, const DeviceTraits& device = {});

/// The dx kernel's templates and constants; with residual_grad it adds the residual stream's
/// gradient (gate_residual_rms_norm's backward runs the same template).
std::vector<std::string_view> rms_norm_dx_templates(const KernelSpec& spec);
std::string rms_norm_dx_constants(const KernelSpec& spec, bool residual_grad);

/// The rows of rms_norm's backward kernels: dx, the table gradients, the weight gradient, and the
/// one-pass kernel that forms dx and the table gradients' partials together, and its gated form
/// (gate_residual_rms_norm's backward, with the gate's gradients).
extern const OpRow kRmsNormBackwardRow;
extern const OpRow kRmsNormTableGradRow;
extern const OpRow kRmsNormWeightGradRow;
extern const OpRow kRmsNormOnePassRow;
extern const OpRow kGateResidualRmsNormOnePassRow;

}  // namespace exactjit
