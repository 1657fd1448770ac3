// exactjit op det_linear: validate, spec, geometry, parameters.
#include "kernels/det_linear.hpp"

#include "api/c_entry.hpp"
#include "kernels/catalog.hpp"

#include "kernels/det_linear_backward.hpp"
#include "kernels/spec_limits.hpp"
#include "kernels/tensor_check.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace exactjit {
namespace {
constexpr std::string_view kOp = "det_linear";
ArgName arg(std::string_view name) { return {kOp, name}; }
constexpr int kRowTile = 8;
}  // namespace

namespace {
// Dynamic shared memory a block may opt into on sm_90 and sm_100 (227 KB).
constexpr uint32_t kBulkSharedLimit = 232448;
bool has_bulk_copies(int sm) { return sm == 90 || sm == 100 || sm == 103; }
}  // namespace

DetLinearGeometry det_linear_geometry(DType weight_dtype, int64_t in_features, int64_t out_features, int target_sm) {
  DetLinearGeometry g;
  if (weight_dtype == DType::F32) {
    // Lane l reads 16-byte chunks l, l + 32, ... in groups of two (64 chunks = 256 inputs per
    // group and warp). Two-warp blocks spread the columns evenly over the SMs. One group per
    // lane (K <= 256, the MLP's first layer): 4 columns per warp, so every weight load of the
    // layer is in flight at once with all warps resident; longer rows: 2 columns and up to 4
    // groups (64 B each) in flight per lane, 6-8 KB per warp (docs/det_linear.md, "Speed").
    const int64_t full_groups = in_features / 4 / 64;
    g.warps = 2;
    g.columns_per_warp = in_features <= 256 ? 4 : 2;
    g.depth = static_cast<int>(std::clamp<int64_t>(full_groups, 1, 4));
    return g;
  }
  g.columns_per_warp = 16;  // one warp per 16 features (the mma's M)
  const int64_t chunks = (in_features + 31) / 32;
  if (has_bulk_copies(target_sm)) {
    // Rings of 2 slots of 11 chunks (704 contiguous bytes of each of 16 rows, 11 KB) per warp, up
    // to 8 warps next to the whole of x: 22 KB per warp, 176 KB per SM in flight or landed for the
    // 18H projection, where a full-bandwidth SM takes ~32 KB per microsecond. Longer copies in
    // fewer slots measured ~2 % faster than 3 x 7, 3 x 5, 4 x 5 or 3 x 9 (docs/perf-notes.md).
    constexpr int kStageChunks = 11, kStages = 2;
    constexpr int64_t kPerWarp = kStages * (16 * 64 * kStageChunks + 8);
    const int64_t x_bytes = 8 * (4 * chunks + (4 * chunks % 8 == 0 ? 4 : 0)) * 16;  // kRowVecs rows of x
    // Else x leaves no room for a ring (K > ~12000): stream through registers.
    if (x_bytes + kPerWarp <= kBulkSharedLimit) {
      g.bulk = true;
      g.stage_chunks = kStageChunks;
      g.stages = kStages;
      g.shared_fixed = static_cast<uint32_t>(x_bytes);
      g.shared_per_warp = static_cast<uint32_t>(kPerWarp);
      g.warps = static_cast<int>(std::min<int64_t>(8, (kBulkSharedLimit - x_bytes) / kPerWarp));
      return g;
    }
  }
  // Through registers. Many features (>= 264 blocks of 128, two per SM of an H200: the 18H
  // projection): 8-warp blocks, 4 chunks (128 B) in flight per lane at <= 64 registers (4 blocks
  // per SM); few (the 2H projection): 4-warp blocks so more SMs get work, and 12 chunks in flight
  // per lane (<= 128 registers). x is staged whole when its 8 rows fit in 44 KB of static shared
  // memory (K <= 2752), else 64 chunks at a time, and then the depth divides 64 (a tile starts a
  // round).
  const bool many = (out_features + 127) / 128 >= 264;
  g.warps = many ? 8 : 4;
  g.tile_chunks = static_cast<int>(chunks <= 86 ? chunks : 64);
  g.depth = many ? 4 : chunks <= 86 ? 12 : 8;
  return g;
}

KernelSpec det_linear_spec(DType weight_dtype, int64_t in_features, int64_t out_features, bool silu, OpCode op) {
  KernelSpec spec = linear_sizes(weight_dtype, in_features, out_features);
  spec.op = op;
  spec.silu = silu;
  spec.row_tile = kRowTile;
  return spec;
}

llvm::Expected<LaunchPlan> plan_det_linear(const DetLinearArgs& a, const DeviceTraits& device) {
  llvm::SmallVector<NamedTensor, 5> tensors = {{"x", &a.x}, {"weight", &a.weight}, {"out", &a.out}};
  if (a.bias) tensors.push_back({"bias", a.bias});
  if (a.pre_activation) tensors.push_back({"pre_activation", a.pre_activation});
  if (auto err = require_cuda_on_one_device(kOp, tensors)) return err;
  auto dtype = float_dtype(arg("weight"), a.weight);
  if (!dtype) return dtype.takeError();
  if (*dtype == DType::F16) return invalid(arg("weight"), "must be float32 or bfloat16");
  auto is_f32 = [](const DLTensor& t) { return t.dtype.code == kDLFloat && t.dtype.bits == 32 && t.dtype.lanes == 1; };
  if (!is_f32(a.x)) return invalid(arg("x"), "must be float32");
  if (a.x.ndim != 2 || !is_contiguous(a.x))
    return invalid(arg("x"), fmt::format("must be (T, K) contiguous (got {})", shape_string(a.x)));
  const int64_t rows = a.x.shape[0], in_features = a.x.shape[1];
  if (a.weight.ndim != 2 || a.weight.shape[1] != in_features || !is_contiguous(a.weight))
    return invalid(arg("weight"),
                   fmt::format("must be (N, {}) contiguous (got {})", in_features, shape_string(a.weight)));
  const int64_t out_features = a.weight.shape[0];
  if (std::string rule = cap_rule(kInFeaturesCap, in_features); !rule.empty()) return invalid(arg("x"), rule);
  if (std::string rule = cap_rule(kOutFeaturesCap, out_features); !rule.empty()) return invalid(arg("weight"), rule);
  const KernelSpec spec = det_linear_spec(*dtype, in_features, out_features, a.silu);
  if (auto err = require_row_rules(spec, arg("x"), arg("x"))) return err;
  if (data_address(a.x) % 16 != 0 || data_address(a.weight) % 16 != 0)
    return invalid(arg("x"), "x and weight must be 16-byte aligned");
  if (a.bias) {
    auto bias_dtype = float_dtype(arg("bias"), *a.bias);
    if (!bias_dtype) return bias_dtype.takeError();
    if (*bias_dtype != *dtype || a.bias->ndim != 1 || a.bias->shape[0] != out_features || !is_contiguous(*a.bias))
      return invalid(arg("bias"), fmt::format("must be ({},) contiguous in the weight's dtype", out_features));
  }
  const bool out_ok =
      (*dtype == DType::F32 ? is_f32(a.out) : a.out.dtype.code == kDLBfloat && a.out.dtype.bits == 16) &&
      a.out.ndim == 2 && a.out.shape[0] == rows && a.out.shape[1] == out_features && is_contiguous(a.out);
  if (!out_ok)
    return invalid(arg("out"), fmt::format("must be ({}, {}) contiguous in {}", rows, out_features,
                                           *dtype == DType::F32 ? "float32" : "bfloat16"));
  if (a.pre_activation && (!is_f32(*a.pre_activation) || a.pre_activation->ndim != 2 ||
                           a.pre_activation->shape[0] != rows || a.pre_activation->shape[1] != out_features ||
                           !is_contiguous(*a.pre_activation)))
    return invalid(arg("pre_activation"), fmt::format("must be ({}, {}) float32 contiguous", rows, out_features));
  if (auto err = require_disjoint_outputs(kOp, tensors, {"out", "pre_activation"})) return err;

  LaunchPlan plan;
  plan.spec = spec;
  plan.device_id = a.x.device.device_id;
  if (rows == 0) return plan;
  const DetLinearGeometry geometry = det_linear_geometry(*dtype, in_features, out_features, device.sm);
  const int64_t row_tiles = (rows + kRowTile - 1) / kRowTile;
  if (row_tiles > 65535) return invalid(arg("x"), fmt::format("has too many rows ({})", rows));
  int64_t blocks = (out_features + geometry.columns_per_block() - 1) / geometry.columns_per_block();
  int warps = geometry.warps;
  if (geometry.bulk) {
    // Persistent: at most one block per SM, and fewer warps when the tasks do not fill them all.
    const int64_t tasks = (out_features + 15) / 16;
    if (device.multiprocessors > 0) {
      warps = static_cast<int>(
          std::clamp<int64_t>((tasks + device.multiprocessors - 1) / device.multiprocessors, 1, warps));
      blocks = std::min<int64_t>((tasks + warps - 1) / warps, device.multiprocessors);
    }
    plan.shared_bytes = geometry.shared_fixed + static_cast<uint32_t>(warps) * geometry.shared_per_warp;
  }
  plan.grid = static_cast<uint32_t>(blocks);
  plan.grid_y = static_cast<uint32_t>(row_tiles);
  plan.threads = static_cast<uint32_t>(32 * warps);
  plan.push(data_address(a.x));
  plan.push(data_address(a.weight));
  plan.push(a.bias ? data_address(*a.bias) : 0);
  plan.push(data_address(a.out));
  plan.push(a.pre_activation ? data_address(*a.pre_activation) : 0);
  plan.push(static_cast<uint64_t>(rows));
  return plan;
}

std::string render_det_linear_constants(const KernelSpec& spec) {
  std::string geometry;
  if (spec.op == Op::DetLinear) {
    const DetLinearGeometry g = det_linear_geometry(spec.dtype, spec.in_features, spec.out_features, spec.target.sm);
    geometry = fmt::format(
        "constexpr int kWarps = {warps};  // per block\n"
        "constexpr int kColumnsPerWarp = {columns};\n"
        "constexpr int kDepth = {depth};  // weight loads in flight per lane (fp32: groups; bf16: 32-wide chunks)\n"
        "constexpr int kTileChunks = {tile};  // bf16: 32-wide chunks of x staged at a time\n"
        "constexpr int kStageChunks = {stage_chunks};  // bf16 bulk copies: chunks per ring slot\n"
        "constexpr int kStages = {stages};  // bf16 bulk copies: ring slots per warp\n",
        fmt::arg("warps", g.warps), fmt::arg("columns", g.columns_per_warp), fmt::arg("depth", g.depth),
        fmt::arg("tile", g.tile_chunks), fmt::arg("stage_chunks", g.stage_chunks), fmt::arg("stages", g.stages));
  }
  if (spec.op != Op::DetLinear && spec.dtype == DType::BF16)  // the bf16 backward (det_linear_backward.hpp)
    geometry = fmt::format(
        "constexpr bool kGradBf16 = {grad_bf16};  // the incoming gradient: bf16 (else fp32)\n"
        "constexpr int kThreads = {threads};  // per block\n"
        "constexpr int kChunk = {chunk};  // d_input: outputs per folded partial\n"
        "constexpr int kGroup = {group};  // d_input: outputs per fma chain inside a chunk\n"
        "constexpr int kFoldColumns = {fold_columns};  // fold: columns per block\n"
        "constexpr int kWeightStage = {weight_stage};  // weight grad: rows n whose g is staged at a time\n",
        fmt::arg("grad_bf16", spec.grad_dtype == DType::BF16 ? "true" : "false"),
        fmt::arg("threads", det_linear_bf16_backward_threads(spec.op, spec.in_features)),
        fmt::arg("chunk", kDetLinearBf16Chunk), fmt::arg("group", kDetLinearBf16Group),
        fmt::arg("fold_columns", kDetLinearFoldColumns), fmt::arg("weight_stage", kDetLinearWeightStage));
  return fmt::format(
             "constexpr unsigned kOpCode = {op_code};  // error-record op code\n"
             "constexpr int kInFeatures = {k};\n"
             "constexpr long long kOutFeatures = {n};\n"
             "constexpr int kRowTile = {rows};\n"
             "constexpr bool kSilu = {silu};  // fp32: SiLU on the output; bf16: on the input before the cast\n"
             "constexpr int kMode = {mode};  // backward: 0 input partials, 1 weight and bias, 2 input fold (bf16)\n"
             "constexpr int kTargetArch = {arch};\n",
             fmt::arg("op_code", op_code(spec.op)), fmt::arg("k", spec.in_features), fmt::arg("n", spec.out_features),
             fmt::arg("rows", spec.row_tile), fmt::arg("silu", spec.silu ? "true" : "false"),
             fmt::arg("mode", spec.op == Op::DetLinearWeightGrad ? 1 : spec.op == Op::DetLinearInputFold ? 2 : 0),
             fmt::arg("arch", spec.target.sm)) +
         geometry;
}

RuleBreak in_features_rule(const KernelSpec& spec) {
  const int step = spec.dtype == DType::BF16 ? 16 : 4;
  if (spec.in_features % step == 0) return {};
  return {RuleSubject::Sizes, fmt::format("in_features must be a multiple of {} for {} weights (got {})", step,
                                          dtype_name(spec.dtype), spec.in_features)};
}

namespace {
std::vector<std::string_view> det_linear_templates(const KernelSpec& spec) {
  if (spec.dtype == DType::F32) return {"fixed_order_sum.cuh", "det_linear_fp32.cuh"};
  if (det_linear_geometry(spec.dtype, spec.in_features, spec.out_features, spec.target.sm).bulk)
    return {"det_linear_bf16_chunk.cuh", "bulk_copy.cuh", "det_linear_bf16_bulk.cuh"};
  return {"det_linear_bf16_chunk.cuh", "det_linear_bf16.cuh"};
}
RuleBreak det_linear_rule(const KernelSpec& spec) {
  if (spec.dtype == DType::F16) return {RuleSubject::Spec, "det_linear weights are bf16 or fp32"};
  if (spec.dtype == DType::BF16 && spec.target.sm < 80)
    return {RuleSubject::Spec, fmt::format("det_linear with bf16 weights needs sm_80 or newer (bf16 tensor-core mma; "
                                           "the target is {})", spec.target.name())};
  if (RuleBreak broken = in_features_rule(spec)) return broken;
  if (spec.row_tile != kRowTile)
    return {RuleSubject::Spec, fmt::format("the row tile is {} (got {})", kRowTile, spec.row_tile)};
  return {};
}
// Both activations.
std::vector<KernelSpec> det_linear_family(const KernelSpec& sizes) {
  return {det_linear_spec(sizes.dtype, sizes.in_features, sizes.out_features, false),
          det_linear_spec(sizes.dtype, sizes.in_features, sizes.out_features, true)};
}
// The timestep MLP (fp32: 256 -> 5376 + SiLU, 5376 -> 2688) and the AdaLN projections (bf16:
// SiLU(temb) -> 18H for the blocks, -> 2H for the final norm).
std::vector<KernelSpec> det_linear_catalog(DType dtype) {
  if (dtype == DType::F32)
    return {det_linear_spec(DType::F32, kSinusoidChannels, 2 * kTimeEmbedDim, true),
            det_linear_spec(DType::F32, 2 * kTimeEmbedDim, kTimeEmbedDim, false)};
  if (dtype == DType::BF16)
    return {det_linear_spec(DType::BF16, kTimeEmbedDim, 18 * kDefaultHidden, true),
            det_linear_spec(DType::BF16, kTimeEmbedDim, 2 * kDefaultHidden, true)};
  return {};
}
}  // namespace

const OpRow kDetLinearRow = {
    Op::DetLinear, "det_linear", OpRole::Forward, "det_linear",
    SpecShape::Linear, /*describes_weight=*/false, /*row_chunks=*/1, /*threads=*/0, /*row_unroll=*/1,
    {"index", "index"}, ErrorValue::Index, /*value_rule=*/"",
    det_linear_templates, render_det_linear_constants, det_linear_rule, det_linear_family, det_linear_catalog,
    "--in-features K --out-features N [--activation none|silu]",
    "batch-invariant linear layer (timestep MLP, AdaLN projection)", /*default_stride_in_h=*/0};

}  // namespace exactjit

extern "C" exactjit_status_t xj_det_linear(xj_runtime* runtime, const DLTensor* x, const DLTensor* weight,
                                           const DLTensor* bias, const DLTensor* out, const DLTensor* pre_activation,
                                           int silu, void* stream) {
  return exactjit::c_abi::call_op(
      runtime, "det_linear", {{"x", x}, {"weight", weight}, {"out", out}}, [&](exactjit::Runtime& r) {
        return r.launch(
            exactjit::plan_det_linear({*x, *weight, bias, *out, pre_activation, silu != 0}, r.traits(x->device)),
            stream);
      });
}
