// exactjit op det_linear (NUMERICS.md "det_linear"; docs/det_linear.md): out = act(x @ W^T + b)
// for T rows (GEMV-shaped), in a fixed, batch-invariant order. fp32 weights: fp32 fma chains
// (no TF32), optional SiLU on the output, fp32 out. bf16 weights: tensor-core mma over 16-wide K
// groups, input rT(silu(x)) or rT(x) cast while staging, bf16 out (the AdaLN table); sm_80+.
#pragma once

#include "codegen/op_row.hpp"
#include "kernels/launch_plan.hpp"

#include <dlpack/dlpack.h>
#include <llvm/Support/Error.h>

namespace exactjit {

/// Stable op codes (OpCode, codegen/kernel_spec.hpp).
namespace Op {
inline constexpr OpCode DetLinear{5};
}  // namespace Op

struct DetLinearArgs {
  const DLTensor& x;               ///< (T, K) float32 contiguous
  const DLTensor& weight;          ///< (N, K) contiguous, float32 or bfloat16
  const DLTensor* bias;            ///< (N,) in the weight's dtype, or null
  const DLTensor& out;             ///< (T, N) contiguous: float32 (fp32 weights) or bfloat16
  const DLTensor* pre_activation;  ///< (T, N) float32 (x @ W^T + b before the rounding/activation), or null
  bool silu;                       ///< fp32: SiLU on the output; bf16: SiLU on x before the cast
};

/// `device`: the target and SM count the runtime will launch on (the bf16 path picks its kernel and
/// its persistent grid by them); unknown (zeros): the register-streaming kernel, one block per 8 warps.
llvm::Expected<LaunchPlan> plan_det_linear(const DetLinearArgs& args, const DeviceTraits& device = {});

/// Launch geometry of the det_linear forward kernel, a function of the weight dtype, the shape and
/// the target architecture: baked into the generated source (render_det_linear_constants) and used
/// by the planner, so the two cannot disagree. The order of operations does not depend on it: it
/// sets only how the work is spread over warps and how the weights stream in (docs/det_linear.md).
struct DetLinearGeometry {
  int warps = 0;             ///< warps per block (bulk: the most; the planner may use fewer)
  int columns_per_warp = 0;  ///< output columns a warp owns (bf16: 16, the mma's M)
  int depth = 0;             ///< register streaming: loads a lane keeps in flight (fp32 groups, bf16 32-wide chunks)
  int tile_chunks = 0;       ///< bf16 register streaming: 32-wide chunks of x staged in shared memory at a time
  bool bulk = false;         ///< bf16 on sm_90/sm_100: weights by bulk copies through a ring per warp,
                             ///< persistent blocks
  int stage_chunks = 0;      ///< bulk: 32-wide chunks of each of a warp's 16 rows per ring slot
  int stages = 0;            ///< bulk: ring slots per warp
  uint32_t shared_fixed = 0;     ///< bulk: dynamic shared bytes per block for x and nothing else
  uint32_t shared_per_warp = 0;  ///< bulk: dynamic shared bytes per warp (ring and barriers)
  int64_t columns_per_block() const { return int64_t{warps} * columns_per_warp; }
};
DetLinearGeometry det_linear_geometry(DType weight_dtype, int64_t in_features, int64_t out_features, int target_sm);

/// The spec of one det_linear kernel (row tile 8); `op` is DetLinear or one of its backward kernels.
KernelSpec det_linear_spec(DType weight_dtype, int64_t in_features, int64_t out_features, bool silu,
                           OpCode op = Op::DetLinear);

/// det_linear's reduction runs over K in 16-element (bf16 mma) or 4-element (fp32) steps: K is a
/// multiple of that step. A rule of the forward and the backward rows.
RuleBreak in_features_rule(const KernelSpec& spec);

/// det_linear's row of the op table.
extern const OpRow kDetLinearRow;
/// The constant block of det_linear and its backward kernels (K, N, the row tile, the activation,
/// the geometry).
std::string render_det_linear_constants(const KernelSpec& spec);

}  // namespace exactjit
