// exactjit op det_linear, backward with fp32 weights (NUMERICS.md; docs/det_linear.md): d_input in
// fixed 64-output chunks folded in ascending order, d_weight and d_bias as ascending-row chains,
// fp32, no atomics. With SiLU the gradient passes through the saved pre-activation.
#pragma once

#include "kernels/launch_plan.hpp"

#include <dlpack/dlpack.h>
#include <llvm/Support/Error.h>

namespace exactjit {

struct DetLinearBackwardArgs {
  const DLTensor& grad;            ///< (T, N) float32, T <= 8: the gradient at the output
  const DLTensor* pre_activation;  ///< (T, N) float32 saved by the forward (required with silu)
  const DLTensor& x;               ///< (T, K) float32, the forward's input
  const DLTensor& weight;          ///< (N, K) float32
  const DLTensor* d_input;         ///< (T, K) float32, or null
  const DLTensor* d_weight;        ///< (N, K) float32, or null
  const DLTensor* d_bias;          ///< (N,) float32, or null
  const DLTensor* workspace;       ///< uint8, det_linear_backward_workspace bytes (needed for d_input)
  bool silu;
};

/// Workspace bytes: the d_input partials, ceil(N / 64) x T x K floats (-1: invalid shapes).
int64_t det_linear_backward_workspace(int64_t rows, int64_t in_features, int64_t out_features);

llvm::Expected<LaunchSequence> plan_det_linear_backward(const DetLinearBackwardArgs& args);

}  // namespace exactjit
