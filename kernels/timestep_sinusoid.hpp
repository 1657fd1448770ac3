// exactjit op timestep_sinusoid: diffusers get_timestep_embedding, bitwise equal to PyTorch eager
// evaluating diffusers' expression (NUMERICS.md). fp32 (T,) timesteps -> fp32 (T, C).
#pragma once

#include "codegen/op_row.hpp"
#include "kernels/launch_plan.hpp"

#include <dlpack/dlpack.h>
#include <llvm/Support/Error.h>

#include <string_view>

namespace exactjit {

/// Stable op codes (OpCode, codegen/kernel_spec.hpp).
namespace Op {
inline constexpr OpCode TimestepSinusoid{4};
inline constexpr OpCode TimestepSinusoidBackward{11};
}  // namespace Op

struct SinusoidParams {
  double max_period = 10000;
  bool flip_sin_to_cos = true;
  double downscale_freq_shift = 0;
  double scale = 1;
  bool check_range = false;  ///< report t that is not finite or outside [0, 1] (H3 convention)
};

struct TimestepSinusoidArgs {
  const DLTensor& t;    ///< (T,) float32
  const DLTensor& out;  ///< (T, C) float32 contiguous; C is the channel count
  SinusoidParams params;
};

llvm::Expected<LaunchPlan> plan_timestep_sinusoid(const TimestepSinusoidArgs& args);

/// The fp32 kernel of `channels` channels: the forward, or its backward with op = TimestepSinusoidBackward.
KernelSpec timestep_sinusoid_spec(int64_t channels, OpCode op = Op::TimestepSinusoid);

/// max_period finite and > 0, shift and scale finite; errors name `op`.
llvm::Error check_sinusoid_params(std::string_view op, const SinusoidParams& params);
/// The frequency parameters the forward and backward kernels share: -ln(max_period),
/// 1 / (half - shift), scale, flip_sin_to_cos.
void push_frequency_params(LaunchPlan& plan, const SinusoidParams& params, int64_t half);

struct TimestepSinusoidBackwardArgs {
  const DLTensor& t;     ///< the forward's (T,) float32
  const DLTensor& grad;  ///< (T, C) float32 contiguous
  const DLTensor& d_t;   ///< (T,) float32
  SinusoidParams params;
};

llvm::Expected<LaunchPlan> plan_timestep_sinusoid_backward(const TimestepSinusoidBackwardArgs& args);

/// The rows of timestep_sinusoid and its backward.
extern const OpRow kTimestepSinusoidRow;
extern const OpRow kTimestepSinusoidBackwardRow;

}  // namespace exactjit
