// exactjit kernel catalog (see catalog.hpp).
#include "kernels/catalog.hpp"

#include "codegen/op_row.hpp"
#include "kernels/det_linear.hpp"
#include "kernels/det_linear_backward.hpp"
#include "kernels/rms_norm.hpp"
#include "kernels/spec_limits.hpp"
#include "kernels/timestep_sinusoid.hpp"
#include "runtime/errors.hpp"

#include <fmt/format.h>

#include <tuple>

namespace exactjit {

std::vector<KernelSpec> spec_family(Op op, DType dtype, int64_t hidden, int64_t table_stride, Target target) {
  std::vector<KernelSpec> specs = op_row(op).family_specs(dtype, hidden, table_stride);
  for (KernelSpec& spec : specs) spec.target = target;
  return specs;
}

std::vector<KernelSpec> default_catalog(Target target) {
  std::vector<KernelSpec> specs;
  auto add = [&](Op op, DType dtype, int64_t stride) {
    for (const KernelSpec& spec : spec_family(op, dtype, kDefaultHidden, stride, target)) specs.push_back(spec);
  };
  for (DType dtype : {DType::BF16, DType::F16, DType::F32}) {
    add(Op::GateResidual, dtype, 6 * kDefaultHidden);
    add(Op::GateResidual, dtype, 2 * kDefaultHidden);
    add(Op::AdalnRowGather, dtype, 6 * kDefaultHidden);
    add(Op::RmsNorm, dtype, 0);                    // plain (nn.RMSNorm, F.rms_norm)
    add(Op::RmsNorm, dtype, 6 * kDefaultHidden);   // block modulation over the (3T, 6H) chunks
    add(Op::RmsNorm, dtype, 2 * kDefaultHidden);   // final-norm modulation over the (T, 2H) table
    add(Op::GateResidualRmsNorm, dtype, 6 * kDefaultHidden);  // the attention residual into norm2
  }
  KernelSpec sinusoid = timestep_sinusoid_spec(256);  // H3: 256 channels
  sinusoid.target = target;
  specs.push_back(sinusoid);
  // Backward passes of the same shapes, and the segment plan they share.
  for (DType dtype : {DType::BF16, DType::F16, DType::F32}) {
    add(Op::GateResidualBackward, dtype, 6 * kDefaultHidden);
    add(Op::GateResidualBackward, dtype, 2 * kDefaultHidden);
    add(Op::AdalnRowGatherBackward, dtype, 0);
    for (int64_t stride : {int64_t{0}, 6 * kDefaultHidden, 2 * kDefaultHidden}) {
      add(Op::RmsNormBackward, dtype, stride);
      add(Op::RmsNormWeightGrad, dtype, stride);
    }
    add(Op::RmsNormTableGrad, dtype, 0);
    add(Op::GateResidualRmsNormBackward, dtype, 6 * kDefaultHidden);
    for (const KernelSpec& spec : spec_family(Op::SegmentFold, dtype, 1, 0, target)) specs.push_back(spec);
  }
  for (int64_t keys : {1, 2})
    for (const KernelSpec& spec : spec_family(Op::SegmentCount, DType::F32, keys, 0, target)) specs.push_back(spec);
  for (Op op : {Op::SegmentScan, Op::SegmentScatter})
    for (const KernelSpec& spec : spec_family(op, DType::F32, 1, 0, target)) specs.push_back(spec);
  for (const KernelSpec& spec : spec_family(Op::TimestepSinusoidBackward, DType::F32, 256, 0, target))
    specs.push_back(spec);
  // det_linear: the timestep MLP (fp32: 256 -> 5376 + SiLU, 5376 -> 2688), the block's AdaLN
  // projection (bf16: SiLU(temb) -> 18H) and the final one (-> 2H).
  for (const auto& [k, n, silu] : {std::tuple{kSinusoidChannels, 2 * kTimeEmbedDim, true},
                                   std::tuple{2 * kTimeEmbedDim, kTimeEmbedDim, false}})
    for (Op op : {Op::DetLinearInputGrad, Op::DetLinearWeightGrad}) {
      KernelSpec spec = det_linear_spec(DType::F32, k, n, silu, op);
      spec.target = target;
      specs.push_back(spec);
    }
  // Their backward with bf16 weights (SiLU on the input), for a bf16 or an fp32 incoming gradient
  // (the table gradient of adaln_row_gather_backward can stay fp32), at every row tile: a cache
  // shipped read-only serves every T.
  for (int64_t n : {18 * kDefaultHidden, 2 * kDefaultHidden})
    for (Op op : {Op::DetLinearInputGrad, Op::DetLinearInputFold, Op::DetLinearWeightGrad})
      for (const KernelSpec& spec : spec_family(op, DType::BF16, kTimeEmbedDim, n, target))
        if (spec.silu) specs.push_back(spec);
  for (const KernelSpec& spec : {det_linear_spec(DType::F32, kSinusoidChannels, 2 * kTimeEmbedDim, true),
                                 det_linear_spec(DType::F32, 2 * kTimeEmbedDim, kTimeEmbedDim, false),
                                 det_linear_spec(DType::BF16, kTimeEmbedDim, 18 * kDefaultHidden, true),
                                 det_linear_spec(DType::BF16, kTimeEmbedDim, 2 * kDefaultHidden, true)}) {
    KernelSpec targeted = spec;
    targeted.target = target;
    specs.push_back(targeted);
  }
  return specs;
}

llvm::Error validate_spec(const KernelSpec& spec) {
  auto bad = [&](const std::string& rule) {
    return make_error(ErrorCode::InvalidArgument, fmt::format("{}: {}", spec.describe(), rule));
  };
  const OpRow& row = op_row(spec.op);
  // The caps first: the op's rules (and the templates) compute with these sizes.
  if (std::string rule = cap_rule(hidden_cap(spec.op), spec.hidden); !rule.empty()) return bad(rule);
  if (std::string rule = cap_rule(kTableStrideCap, spec.table_stride); spec.table_stride != 0 && !rule.empty())
    return bad(rule);
  if (std::string rule = cap_rule(kOutFeaturesCap, spec.out_features);
      row.shape == SpecShape::Linear && !rule.empty())
    return bad(rule);
  if (spec.target.sm < kMinTargetSm) return bad(fmt::format("targets older than sm_{} are not supported", kMinTargetSm));
  if (std::string rule = row.rule(spec); !rule.empty()) return bad(rule);
  return llvm::Error::success();
}

}  // namespace exactjit
