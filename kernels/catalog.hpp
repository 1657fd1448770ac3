// exactjit kernel catalog: which specs exist, which ones `exactjit prewarm` builds by default, and
// the rules a spec given on the command line must follow.
#pragma once

#include "codegen/kernel_spec.hpp"

#include <llvm/Support/Error.h>

#include <vector>

namespace exactjit {

/// H3's hidden size, the default of the embedded catalog (NUMERICS.md).
inline constexpr int64_t kDefaultHidden = 5376;
/// H3's time-embedding width D (the timestep MLP's output, the AdaLN projections' input).
inline constexpr int64_t kTimeEmbedDim = 2688;
/// The sinusoid's channels (the timestep MLP's input).
inline constexpr int64_t kSinusoidChannels = 256;
/// The timesteps T of the default shapes (the AdaLN table's rows, as the benchmarks run it): the
/// rows `inspect` assumes for the det_linear backward's row tile.
inline constexpr int64_t kDefaultTimesteps = 3;

/// Every spec a call of these sizes (rows_sizes, channels_sizes, linear_sizes) can select at run
/// time on `target`: both index types, the 16-byte and scalar vector widths where they differ,
/// and every row tile of the bf16 det_linear backward.
std::vector<KernelSpec> spec_family(OpCode op, const KernelSpec& sizes, Target target);

/// The default pre-warm catalog for one target: every op row's H3 shapes (OpRow::catalog; H = 5376
/// in bf16, fp16 and fp32, the block's 6H and the final norm's 2H table strides, the 256-channel
/// sinusoid, the timestep MLP and AdaLN projections), dtype by dtype in op-table order.
std::vector<KernelSpec> default_catalog(Target target);

/// Rules for a spec built from flags (sizes within kernels/spec_limits.hpp's caps, stride >=
/// hidden, a valid vector width).
llvm::Error validate_spec(const KernelSpec& spec);

}  // namespace exactjit
