// exactjit op det_linear, backward (NUMERICS.md; docs/det_linear.md): d_input in fixed output
// chunks (fp32 weights: 64 outputs, bf16: 256) folded in ascending order, d_weight and d_bias as
// ascending-row chains, fp32, no atomics.
// fp32 weights: with SiLU the gradient passes through the saved pre-activation (the output's
// SiLU). bf16 weights (the AdaLN projections, out = rT(x @ W^T + b), x = rT(silu(temb)) or
// rT(temb)): grad bf16 or fp32, d_input is d_temb (fp32, through the cast as identity and SiLU's
// derivative at temb), d_weight and d_bias bf16 (one rounding each).
// Tensor parallelism (docs/tensor-parallel.md): the per-chunk partials of d_input as an output
// (DetLinearBackwardArgs::partials) and their fold as an entry point (det_linear_input_fold).
#pragma once

#include "codegen/op_row.hpp"
#include "kernels/launch_plan.hpp"

#include <dlpack/dlpack.h>
#include <llvm/ADT/ArrayRef.h>
#include <llvm/Support/Error.h>

namespace exactjit {

/// Stable op codes (OpCode, codegen/kernel_spec.hpp).
namespace Op {
inline constexpr OpCode DetLinearInputGrad{12};
inline constexpr OpCode DetLinearWeightGrad{13};
inline constexpr OpCode DetLinearInputFold{18};
}  // namespace Op

struct DetLinearBackwardArgs {
  const DLTensor& grad;            ///< (T, N), T <= 8: float32 (bf16 weights: float32 or bfloat16)
  const DLTensor* pre_activation;  ///< fp32 weights: (T, N) float32 saved by the forward (required with silu);
                                   ///< bf16: null
  const DLTensor& x;               ///< (T, K) float32, the forward's input (bf16 weights: temb, before SiLU and
                                   ///< the cast)
  const DLTensor& weight;          ///< (N, K) float32 or bfloat16
  const DLTensor* d_input;         ///< (T, K) float32, or null
  const DLTensor* d_weight;        ///< (N, K) in the weight's dtype, or null
  const DLTensor* d_bias;          ///< (N,) in the weight's dtype, or null
  const DLTensor* workspace;       ///< uint8, det_linear_backward_workspace bytes (needed for d_input)
  bool silu;                       ///< fp32: SiLU on the output; bf16: SiLU on temb before the cast
  /// (ceil(N / chunk), T, K) float32 (chunk: det_linear_input_chunk), or null: the input pass's
  /// per-chunk partials of d_input, written here and not folded, in place of d_input and the
  /// workspace (tensor parallelism: det_linear_input_fold folds every rank's; the entry point
  /// xj_det_linear_backward_partials, whose name the messages then carry).
  const DLTensor* partials = nullptr;
};

/// The fold of given per-chunk partials into d_input (det_linear_input_fold, the fold kernel's own
/// entry point): the partials of every chunk of the outputs in order, computed anywhere (each rank
/// its column shard's chunks, in tensor parallelism: docs/tensor-parallel.md), added in ascending
/// chunk order, compensated, then (bf16 weights with SiLU) through SiLU's derivative at temb: the
/// bits the backward's own fold gives for those partials (it is the same launch).
struct DetLinearInputFoldArgs {
  const DLTensor& partials;  ///< (C, T, K) float32 contiguous: chunk c's partials in [c]
  const DLTensor& x;         ///< (T, K) float32, the forward's input (bf16 weights: temb, before SiLU)
  const DLTensor& d_input;   ///< (T, K) float32
  bool bf16_weights;         ///< the forward's weight dtype: bf16 (else fp32)
  bool silu;                 ///< the forward's; with bf16 weights the fold applies SiLU's derivative
};

/// Outputs per d_input chunk: kDetLinearBf16Chunk for bf16 weights, kDetLinearFp32Chunk for fp32.
int64_t det_linear_input_chunk(bool bf16_weights);

llvm::Expected<LaunchSequence> plan_det_linear_input_fold(const DetLinearInputFoldArgs& args);

/// Workspace bytes: the d_input partials, ceil(N / 64) x T x K floats, enough for either weight
/// dtype's chunks (-1: invalid shapes).
int64_t det_linear_backward_workspace(int64_t rows, int64_t in_features, int64_t out_features);

llvm::Expected<LaunchSequence> plan_det_linear_backward(const DetLinearBackwardArgs& args);

/// The bf16 backward's order and geometry (baked into the generated source and used by the planner
/// and the host model): d_input sums chunks of kDetLinearBf16Chunk outputs, each a compensated sum
/// of fma chains over kDetLinearBf16Group outputs; the fold stages kDetLinearFoldColumns columns
/// per block; the weight grad stages g for kDetLinearWeightStage rows at a time.
inline constexpr int kDetLinearBf16Chunk = 256;
/// The fp32 backward's d_input chunk: 64 outputs, folded by segment_fold (templates/det_linear_grad.cuh).
inline constexpr int kDetLinearFp32Chunk = 64;
inline constexpr int kDetLinearBf16Group = 8;
inline constexpr int kDetLinearFoldColumns = 16;
inline constexpr int kDetLinearWeightStage = 64;
/// Threads per block: 256 for the fold, 128 for the weight grad, and for the input pass the block
/// of 96 to 192 threads that leaves the fewest threads past K in its last column block.
int det_linear_bf16_backward_threads(OpCode op, int64_t in_features);
/// Consecutive inputs k a thread owns: 4 in the input pass (an 8-byte vector of a weight row), 8 in
/// the weight grad (a 16-byte vector of a d_weight row).
int det_linear_bf16_backward_inputs_per_thread(OpCode op);
/// Column blocks (grid x) of the bf16 input pass and weight grad.
int64_t det_linear_bf16_backward_column_blocks(OpCode op, int64_t in_features);

/// The row tiles a det_linear backward kernel is compiled for, ascending. The bf16 input pass and
/// weight grad unroll over their row slots (sums and inputs in registers), so each compiled kernel
/// holds one R: the input pass 1, 2, 3, 4 or 8 (it computes every slot), the weight grad 1, 2, 4 or
/// 8; the other kernels' code does not depend on the rows (8).
llvm::ArrayRef<int> det_linear_backward_row_tiles(DType weight_dtype, OpCode op);
/// The row tile a call of `rows` live rows selects: the smallest row tile >= rows (8 past 8).
int det_linear_backward_row_tile(DType weight_dtype, OpCode op, int64_t rows);

/// The spec of a det_linear backward kernel for a call of `rows` live rows: DetLinearInputGrad,
/// DetLinearWeightGrad, or (bf16) DetLinearInputFold; grad_dtype is the incoming gradient's (bf16
/// weights only).
KernelSpec det_linear_backward_spec(DType weight_dtype, int64_t in_features, int64_t out_features, bool silu, OpCode op,
                                    DType grad_dtype, int64_t rows);

/// The rows of det_linear's backward kernels: the input partials (bf16: the input pass, with
/// d_weight and d_bias), their fold (bf16), the weight grad alone.
extern const OpRow kDetLinearInputGradRow;
extern const OpRow kDetLinearInputFoldRow;
extern const OpRow kDetLinearWeightGradRow;

}  // namespace exactjit
