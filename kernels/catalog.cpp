// exactjit kernel catalog (see catalog.hpp).
#include "kernels/catalog.hpp"

#include "kernels/det_linear.hpp"
#include "kernels/det_linear_backward.hpp"
#include "kernels/rms_norm.hpp"
#include "kernels/spec_limits.hpp"
#include "kernels/timestep_sinusoid.hpp"
#include "runtime/errors.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <llvm/ADT/STLExtras.h>

#include <tuple>

namespace exactjit {

namespace {

// The backward and segment-plan kernels a call of this shape can select.
std::vector<KernelSpec> backward_family(Op op, DType dtype, int64_t hidden, int64_t table_stride) {
  const int wide = static_cast<int>(16 / dtype_size(dtype));
  const std::vector<IndexType> both = {IndexType::I64, IndexType::I32};
  const std::vector<IndexType> index_types = table_stride > 0 ? both : std::vector<IndexType>{IndexType::I64};
  std::vector<KernelSpec> specs;
  switch (op) {
    case Op::GateResidualBackward:
    case Op::AdalnRowGatherBackward: {
      const int64_t stride = op == Op::GateResidualBackward ? table_stride : 0;
      if (hidden % wide == 0 && stride % wide == 0) specs.push_back(make_spec(op, dtype, IndexType::I64, hidden, stride, wide));
      specs.push_back(make_spec(op, dtype, IndexType::I64, hidden, stride, 1));
      break;
    }
    case Op::RmsNormBackward:
      for (IndexType index : index_types)
        for (bool weighted : {true, false}) specs.push_back(make_spec(op, dtype, index, hidden, table_stride, 4, weighted));
      break;
    case Op::RmsNormTableGrad:
      for (bool weighted : {true, false}) specs.push_back(make_spec(op, dtype, IndexType::I64, hidden, 0, 4, weighted));
      break;
    case Op::RmsNormWeightGrad:
      for (IndexType index : index_types) specs.push_back(make_spec(op, dtype, index, hidden, table_stride, 4));
      break;
    case Op::TimestepSinusoidBackward:
      specs.push_back(make_spec(op, DType::F32, IndexType::I64, hidden, 0, 1));
      break;
    case Op::DetLinearInputGrad:  // hidden = in_features, table_stride = out_features; both activations
    case Op::DetLinearWeightGrad:
    case Op::DetLinearInputFold:  // bf16 weights: both gradient dtypes and every row tile
      for (bool silu : {false, true}) {
        if (dtype != DType::BF16) {
          if (op != Op::DetLinearInputFold) specs.push_back(det_linear_spec(DType::F32, hidden, table_stride, silu, op));
          continue;
        }
        for (DType grad : {DType::BF16, DType::F32})
          for (int rows : det_linear_backward_row_tiles(DType::BF16, op))
            specs.push_back(det_linear_backward_spec(DType::BF16, hidden, table_stride, silu, op, grad, rows));
      }
      break;
    case Op::SegmentCount:  // hidden: index tensors per key (1, or 2 for adaln_row_gather)
      for (IndexType index : both) specs.push_back(make_spec(op, DType::F32, index, hidden, 0, 1));
      break;
    case Op::SegmentScan:
    case Op::SegmentScatter:
      specs.push_back(make_spec(op, DType::F32, IndexType::I64, 1, 0, 1));
      break;
    case Op::SegmentFold:
      specs.push_back(make_spec(op, dtype, IndexType::I64, 1, 0, 1));
      break;
    default:
      break;
  }
  return specs;
}

bool is_backward(Op op) { return op >= Op::GateResidualBackward; }

}  // namespace

std::vector<KernelSpec> spec_family(Op op, DType dtype, int64_t hidden, int64_t table_stride, Target target) {
  std::vector<KernelSpec> specs;
  if (op == Op::DetLinear) {  // hidden = in_features, table_stride = out_features; both activations
    for (bool silu : {false, true}) {
      KernelSpec spec = det_linear_spec(dtype, hidden, table_stride, silu);
      spec.target = target;
      specs.push_back(spec);
    }
    return specs;
  }
  if (is_backward(op)) {
    specs = backward_family(op, dtype, hidden, table_stride);
    for (KernelSpec& spec : specs) spec.target = target;
    return specs;
  }
  if (op == Op::TimestepSinusoid) {  // fp32 only; `hidden` is the channel count
    KernelSpec spec = timestep_sinusoid_spec(hidden);
    spec.target = target;
    return {spec};
  }
  if (op == Op::RmsNorm) {  // fixed 4-element vectors; weighted and unweighted; index types if modulated
    for (IndexType index : table_stride > 0 ? std::vector<IndexType>{IndexType::I64, IndexType::I32}
                                            : std::vector<IndexType>{IndexType::I64}) {
      for (bool weighted : {true, false}) {
        KernelSpec spec = rms_norm_spec(dtype, index, hidden, table_stride, weighted);
        spec.target = target;
        specs.push_back(spec);
      }
    }
    return specs;
  }
  const int wide = static_cast<int>(16 / dtype_size(dtype));
  std::vector<int> widths{1};
  if (hidden % wide == 0 && table_stride % wide == 0) widths.insert(widths.begin(), wide);
  for (IndexType index : {IndexType::I64, IndexType::I32}) {
    for (int vec : widths) {
      KernelSpec spec = make_spec(op, dtype, index, hidden, table_stride, vec);  // the row-wise ops
      spec.target = target;
      specs.push_back(spec);
    }
  }
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
  // The caps first: the rules below (and the templates) compute with these sizes.
  if (std::string rule = cap_rule(hidden_cap(spec.op), spec.hidden); !rule.empty()) return bad(rule);
  if (std::string rule = cap_rule(kTableStrideCap, spec.table_stride); spec.table_stride != 0 && !rule.empty())
    return bad(rule);
  if (std::string rule = cap_rule(kOutFeaturesCap, spec.out_features); is_det_linear(spec.op) && !rule.empty())
    return bad(rule);
  if (spec.target.sm < 75) return bad("targets older than sm_75 are not supported");
  switch (spec.op) {
    case Op::DetLinear:
      if (spec.dtype == DType::F16) return bad("det_linear weights are bf16 or fp32");
      if (spec.dtype == DType::BF16 && spec.target.sm < 80)
        return bad("det_linear with bf16 weights needs sm_80 or newer (bf16 tensor-core mma)");
      if (spec.hidden % (spec.dtype == DType::BF16 ? 16 : 4) != 0)
        return bad("in_features must be a multiple of 16 (bf16) or 4 (fp32)");
      if (spec.row_tile != 8) return bad("the row tile is 8");
      return llvm::Error::success();
    case Op::RmsNormBackward:
    case Op::RmsNormTableGrad:
    case Op::RmsNormWeightGrad:
      if (spec.hidden % 4 != 0) return bad("rms_norm needs hidden % 4 == 0 (PyTorch's vectorized path)");
      if (spec.table_stride != 0 && (spec.table_stride < spec.hidden || spec.table_stride % 4 != 0))
        return bad("table stride must be 0 (plain) or a multiple of 4 that is >= hidden");
      return llvm::Error::success();
    case Op::GateResidualBackward:
    case Op::AdalnRowGatherBackward: {
      if (spec.op == Op::GateResidualBackward && spec.table_stride < spec.hidden)
        return bad("table stride must be >= hidden");
      const int wide = static_cast<int>(16 / dtype_size(spec.dtype));
      if ((spec.vec != 1 && spec.vec != wide) || spec.hidden % spec.vec != 0 || spec.table_stride % spec.vec != 0)
        return bad(fmt::format("vec must be 1 or {} and divide hidden and the table stride", wide));
      return llvm::Error::success();
    }
    case Op::DetLinearInputGrad:
    case Op::DetLinearWeightGrad:
    case Op::DetLinearInputFold:
      if (spec.dtype == DType::F16) return bad("det_linear weights are bf16 or fp32");
      if (spec.dtype == DType::F32 && (spec.op == Op::DetLinearInputFold || spec.grad_dtype != DType::F32))
        return bad("the fp32 det_linear backward takes an fp32 gradient and folds with segment_fold");
      if (spec.dtype == DType::BF16 && (spec.grad_dtype == DType::F16 || spec.hidden % 16 != 0))
        return bad("the bf16 det_linear backward takes a bf16 or fp32 gradient and in_features % 16 == 0");
      if (const llvm::ArrayRef<int> tiles = det_linear_backward_row_tiles(spec.dtype, spec.op);
          !llvm::is_contained(tiles, spec.row_tile))
        return bad(
            fmt::format("rows (the row tile) must be in {{{}}} (got {})", fmt::join(tiles, ", "), spec.row_tile));
      return llvm::Error::success();
    case Op::SegmentCount:
      if (spec.hidden > 2) return bad("segment_count combines 1 or 2 index tensors (hidden = 1 or 2)");
      return llvm::Error::success();
    case Op::TimestepSinusoidBackward:
      if (spec.hidden < 2) return bad("channels must be >= 2");
      return llvm::Error::success();
    case Op::SegmentScan:
    case Op::SegmentScatter:
    case Op::SegmentFold:
      return llvm::Error::success();
    default:
      break;
  }
  if (spec.op == Op::TimestepSinusoid) {
    if (spec.hidden < 2) return bad("channels must be >= 2");
    if (spec.target.sm < 75) return bad("targets older than sm_75 are not supported");
    return llvm::Error::success();
  }
  if (spec.op == Op::RmsNorm) {
    if (spec.hidden % 4 != 0) return bad("rms_norm needs hidden % 4 == 0 (PyTorch's vectorized path)");
    if (spec.table_stride != 0 && (spec.table_stride < spec.hidden || spec.table_stride % 4 != 0))
      return bad("table stride must be 0 (plain) or a multiple of 4 that is >= hidden");
    if (spec.target.sm < 75) return bad("targets older than sm_75 are not supported");
    return llvm::Error::success();
  }
  const int64_t row_elements = spec.op == Op::AdalnRowGather ? 6 * spec.hidden : spec.hidden;
  if (spec.table_stride < row_elements)
    return bad(spec.op == Op::AdalnRowGather ? "table stride must be >= 6 x hidden" : "table stride must be >= hidden");
  const int wide = static_cast<int>(16 / dtype_size(spec.dtype));
  if (spec.vec != 1 && spec.vec != wide) return bad(fmt::format("vec must be 1 or {}", wide));
  if (spec.hidden % spec.vec != 0 || spec.table_stride % spec.vec != 0)
    return bad("hidden and table stride must be multiples of vec");
  if (spec.target.sm < 75) return bad("targets older than sm_75 are not supported");
  return llvm::Error::success();
}

}  // namespace exactjit
