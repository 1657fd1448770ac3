// exactjit op det_linear, backward: validate, then the input partials + fold and the weight/bias
// chains; the partials alone and the fold of given partials (tensor parallelism).
#include "kernels/det_linear_backward.hpp"

#include "api/c_entry.hpp"
#include "kernels/backward_check.hpp"
#include "kernels/catalog.hpp"
#include "kernels/det_linear.hpp"
#include "kernels/segment_plan.hpp"
#include "kernels/spec_limits.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <llvm/ADT/STLExtras.h>

#include <algorithm>

namespace exactjit {
namespace {
// The entry point a call came through: the per-chunk partials are xj_det_linear_backward_partials'.
std::string_view op_of(const DetLinearBackwardArgs& a) {
  return a.partials ? "det_linear_backward_partials" : "det_linear_backward";
}
ArgName arg(const DetLinearBackwardArgs& a, std::string_view name) { return {op_of(a), name}; }
constexpr std::string_view kFoldOp = "det_linear_input_fold";
ArgName fold_arg(std::string_view name) { return {kFoldOp, name}; }
constexpr int64_t kColumns = 128, kWeightGridBlocks = 704;
constexpr int kMaxRows = static_cast<int>(kLinearRowsCap.max);
}  // namespace

int64_t det_linear_backward_workspace(int64_t rows, int64_t in_features, int64_t out_features) {
  if (rows < 1 || rows > kMaxRows || !cap_rule(kInFeaturesCap, in_features).empty() ||
      !cap_rule(kOutFeaturesCap, out_features).empty())
    return -1;
  static_assert(kDetLinearFp32Chunk <= kDetLinearBf16Chunk, "the fp32 chunks bound the workspace");
  return align_workspace(CheckedSize(out_features).ceil_div(kDetLinearFp32Chunk) * rows * in_features * 4).value_or(-1);
}

int64_t det_linear_input_chunk(bool bf16_weights) { return bf16_weights ? kDetLinearBf16Chunk : kDetLinearFp32Chunk; }

int det_linear_bf16_backward_inputs_per_thread(OpCode op) { return op == Op::DetLinearInputGrad ? 4 : 8; }

int det_linear_bf16_backward_threads(OpCode op, int64_t in_features) {
  if (op == Op::DetLinearInputFold) return 256;
  if (op != Op::DetLinearInputGrad) return static_cast<int>(kColumns);
  // The input pass streams a weight row slice per thread for the whole chunk, so a thread past K
  // holds a block slot for nothing: take the block of 3 to 6 warps that leaves the fewest of them,
  // 4 on a tie (K = 2688: 3 warps, 7 blocks exactly, where 4 warps left a last block a quarter
  // busy). 6 warps at most: the ring (192 bytes per thread) and 8 rows of staged g stay in the
  // 48 KB of static shared memory.
  const int64_t vectors = in_features / det_linear_bf16_backward_inputs_per_thread(op);
  auto idle = [&](int64_t threads) { return (vectors + threads - 1) / threads * threads - vectors; };
  int best = static_cast<int>(kColumns);
  for (int threads : {96, 160, 192})
    if (idle(threads) < idle(best)) best = threads;
  return best;
}

int64_t det_linear_bf16_backward_column_blocks(OpCode op, int64_t in_features) {
  const int64_t threads = det_linear_bf16_backward_threads(op, in_features);
  return (in_features / det_linear_bf16_backward_inputs_per_thread(op) + threads - 1) / threads;
}

llvm::ArrayRef<int> det_linear_backward_row_tiles(DType weight_dtype, OpCode op) {
  static constexpr int kInputPassSlots[] = {1, 2, 3, 4, kMaxRows};  // T = 3 is the models' batch
  static constexpr int kRowSlots[] = {1, 2, 4, kMaxRows};
  if (weight_dtype == DType::BF16 && op == Op::DetLinearInputGrad) return kInputPassSlots;
  if (weight_dtype == DType::BF16 && op == Op::DetLinearWeightGrad) return kRowSlots;
  return llvm::ArrayRef<int>(kRowSlots).take_back();
}

int det_linear_backward_row_tile(DType weight_dtype, OpCode op, int64_t rows) {
  const llvm::ArrayRef<int> tiles = det_linear_backward_row_tiles(weight_dtype, op);
  return *std::lower_bound(tiles.begin(), tiles.end(), std::min<int64_t>(rows, kMaxRows));
}

KernelSpec det_linear_backward_spec(DType weight_dtype, int64_t in_features, int64_t out_features, bool silu, OpCode op,
                                    DType grad_dtype, int64_t rows) {
  KernelSpec spec = det_linear_spec(weight_dtype, in_features, out_features, silu, op);
  if (weight_dtype == DType::BF16) spec.grad_dtype = grad_dtype;
  spec.row_tile = det_linear_backward_row_tile(weight_dtype, op, rows);
  return spec;
}

namespace {

// Appends the fold of the partials (ceil(out_features / chunk), rows, in_features) at `partials` into
// d_input: bf16 weights, the DetLinearInputFold kernel of out_features compiled for grad_dtype (it
// reads no gradient; the dtype only names the kernel); fp32 weights, one row of segment_fold tiles.
// The backward and the fold of given partials share it, so the two folds cannot differ.
void add_det_linear_input_fold(LaunchSequence& sequence, int device_id, bool bf16_weights, int64_t rows,
                               int64_t in_features, int64_t out_features, bool silu, DType grad_dtype, uint64_t x,
                               uint64_t partials, uint64_t d_input) {
  const int64_t chunk = det_linear_input_chunk(bf16_weights), chunks = (out_features + chunk - 1) / chunk;
  if (!bf16_weights) {
    // fp32 weights: SiLU is on the output, its derivative already inside the partials.
    add_fold_launch(sequence, nullptr, 0, device_id, DType::F32, partials, chunks, rows * in_features, d_input);
    return;
  }
  const OpCode op = Op::DetLinearInputFold;
  const int64_t blocks = (rows * in_features + kDetLinearFoldColumns - 1) / kDetLinearFoldColumns;
  LaunchPlan& plan =
      sequence.add(det_linear_backward_spec(DType::BF16, in_features, out_features, silu, op, grad_dtype, rows),
                   device_id, static_cast<uint32_t>(blocks),
                   static_cast<uint32_t>(det_linear_bf16_backward_threads(op, in_features)));
  // The backward kernels' parameters; the fold reads neither the gradient nor the weights.
  for (uint64_t v :
       {uint64_t{0}, x, uint64_t{0}, partials, d_input, uint64_t{0}, uint64_t{0}, static_cast<uint64_t>(rows)})
    plan.push(v);
}

// Where the input pass writes d_input's per-chunk partials: the caller's tensor, or the workspace
// the fold reads them from; null when d_input is not asked for.
const DLTensor* input_partials(const DetLinearBackwardArgs& a) {
  return a.partials ? a.partials : a.d_input ? a.workspace : nullptr;
}

// The outputs asked for: d_input (T, K) fp32 (with the workspace) or the per-chunk partials
// (C, T, K) fp32, d_weight (N, K) and d_bias (N,) in the weights' dtype; none overlapping an input
// or each other.
llvm::Error require_outputs(const DetLinearBackwardArgs& a, const llvm::SmallVector<NamedTensor, 8>& tensors,
                            DType weight_dtype) {
  const int64_t rows = a.x.shape[0], in_features = a.x.shape[1], out_features = a.weight.shape[0];
  if (a.partials) {
    if (a.d_input || a.workspace)
      return invalid(arg(a, "partials"), "replace d_input and the workspace (they are not folded here): pass neither");
    const int64_t chunk = det_linear_input_chunk(weight_dtype == DType::BF16);
    if (auto err = require_dense(arg(a, "partials"), *a.partials,
                                 {(out_features + chunk - 1) / chunk, rows, in_features}, DType::F32))
      return err;
  }
  if (a.d_input)
    if (auto err = require_dense(arg(a, "d_input"), *a.d_input, {rows, in_features}, DType::F32)) return err;
  if (a.d_weight)
    if (auto err = require_dense(arg(a, "d_weight"), *a.d_weight, {out_features, in_features}, weight_dtype))
      return err;
  if (a.d_bias)
    if (auto err = require_dense(arg(a, "d_bias"), *a.d_bias, {out_features}, weight_dtype)) return err;
  if (a.d_input)
    if (auto err = require_workspace(arg(a, "workspace"), a.workspace,
                                     det_linear_backward_workspace(rows, in_features, out_features)))
      return err;
  // The workspace is written only when d_input is asked for.
  if (a.partials) return require_disjoint_outputs(op_of(a), tensors, {"partials", "d_weight", "d_bias"});
  if (a.d_input) return require_disjoint_outputs(op_of(a), tensors, {"d_input", "d_weight", "d_bias", "workspace"});
  return require_disjoint_outputs(op_of(a), tensors, {"d_weight", "d_bias"});
}

// bf16 weights (templates/det_linear_grad_bf16.cuh): x is temb (fp32, before SiLU and the cast),
// grad bf16 or fp32, d_weight and d_bias bf16, d_input fp32. The partials kernel and its fold
// (the fold applies SiLU's derivative), then the weight/bias kernel over a wave-sized grid; the
// partials and weight/bias kernels are the ones compiled for the row tile the rows select.
llvm::Expected<LaunchSequence> plan_bf16(const DetLinearBackwardArgs& a, llvm::SmallVector<NamedTensor, 8>& tensors) {
  const int64_t rows = a.x.shape[0], in_features = a.x.shape[1], out_features = a.weight.shape[0];
  if (RuleBreak broken = in_features_rule(det_linear_spec(DType::BF16, in_features, out_features, a.silu)))
    return invalid(arg(a, "x"), broken.rule);
  if (auto err = require_dense(arg(a, "weight"), a.weight, {out_features, in_features}, DType::BF16)) return err;
  auto grad_dtype = float_dtype(arg(a, "grad"), a.grad);
  if (!grad_dtype) return grad_dtype.takeError();
  if (*grad_dtype == DType::F16) return invalid(arg(a, "grad"), "must be bfloat16 or float32 for bfloat16 weights");
  if (auto err = require_dense(arg(a, "grad"), a.grad, {rows, out_features}, *grad_dtype)) return err;
  if (a.pre_activation)
    return invalid(arg(a, "pre_activation"),
                   "must be null for bfloat16 weights (SiLU is on the input, recomputed from x)");
  if (auto err = require_outputs(a, tensors, DType::BF16)) return err;
  if (data_address(a.x) % 16 != 0 || data_address(a.weight) % 16 != 0 ||
      (a.d_weight && data_address(*a.d_weight) % 16 != 0))
    return invalid(arg(a, "x"), "x, weight and d_weight must be 16-byte aligned (16-byte vectors)");

  LaunchSequence sequence;
  const int device = a.x.device.device_id;
  auto add = [&](OpCode op, uint32_t grid_x, uint32_t grid_y, uint64_t partials, uint64_t d_input, uint64_t d_weight,
                 uint64_t d_bias) {
    LaunchPlan& plan =
        sequence.add(det_linear_backward_spec(DType::BF16, in_features, out_features, a.silu, op, *grad_dtype, rows),
                     device, grid_x, static_cast<uint32_t>(det_linear_bf16_backward_threads(op, in_features)));
    plan.grid_y = grid_y;
    for (uint64_t v : {data_address(a.grad), data_address(a.x), data_address(a.weight), partials, d_input, d_weight,
                       d_bias, static_cast<uint64_t>(rows)})
      plan.push(v);
  };
  auto column_blocks = [&](OpCode op) {
    return static_cast<uint32_t>(det_linear_bf16_backward_column_blocks(op, in_features));
  };
  const DLTensor* partials = input_partials(a);
  if (partials) {
    const int64_t chunks = (out_features + kDetLinearBf16Chunk - 1) / kDetLinearBf16Chunk;
    // The input pass also writes d_weight and d_bias where asked for: W read, d_W written, once.
    add(Op::DetLinearInputGrad, column_blocks(Op::DetLinearInputGrad), static_cast<uint32_t>(chunks),
        data_address(*partials), 0, a.d_weight ? data_address(*a.d_weight) : 0, a.d_bias ? data_address(*a.d_bias) : 0);
    if (a.d_input)
      add_det_linear_input_fold(sequence, device, true, rows, in_features, out_features, a.silu, *grad_dtype,
                                data_address(a.x), data_address(*partials), data_address(*a.d_input));
  }
  if (!partials && (a.d_weight || a.d_bias)) {
    // Each block stores a contiguous range of rows n in whole stages of g: the fewest stages per
    // block that keep the grid within about one wave of kWeightGridBlocks row ranges.
    const int64_t stages = (out_features + kDetLinearWeightStage - 1) / kDetLinearWeightStage;
    const int64_t stages_per_block = (stages + kWeightGridBlocks - 1) / kWeightGridBlocks;
    const int64_t ranges = (stages + stages_per_block - 1) / stages_per_block;
    add(Op::DetLinearWeightGrad, column_blocks(Op::DetLinearWeightGrad), static_cast<uint32_t>(ranges), 0, 0,
        a.d_weight ? data_address(*a.d_weight) : 0, a.d_bias ? data_address(*a.d_bias) : 0);
  }
  return sequence;
}

}  // namespace

llvm::Expected<LaunchSequence> plan_det_linear_backward(const DetLinearBackwardArgs& a) {
  llvm::SmallVector<NamedTensor, 8> tensors = {{"grad", &a.grad}, {"x", &a.x}, {"weight", &a.weight}};
  for (const auto& [name, t] : {std::pair{"pre_activation", a.pre_activation}, {"d_input", a.d_input},
                                {"d_weight", a.d_weight}, {"d_bias", a.d_bias}, {"workspace", a.workspace},
                                {"partials", a.partials}})
    if (t) tensors.push_back({name, t});
  if (auto err = require_cuda_on_one_device(op_of(a), tensors)) return err;
  if (a.x.ndim != 2 || a.weight.ndim != 2)
    return invalid(arg(a, "x"), "x must be (T, K) and weight (N, K)");
  const int64_t rows = a.x.shape[0], in_features = a.x.shape[1], out_features = a.weight.shape[0];
  if (rows < 1 || rows > kMaxRows)
    return invalid(arg(a, "x"), fmt::format("must have 1..{} rows (got {})", kMaxRows, rows));
  if (std::string rule = cap_rule(kInFeaturesCap, in_features); !rule.empty()) return invalid(arg(a, "x"), rule);
  if (std::string rule = cap_rule(kOutFeaturesCap, out_features); !rule.empty()) return invalid(arg(a, "weight"), rule);
  if (auto err = require_dense(arg(a, "x"), a.x, {rows, in_features}, DType::F32)) return err;
  auto weight_dtype = float_dtype(arg(a, "weight"), a.weight);
  if (!weight_dtype) return weight_dtype.takeError();
  if (*weight_dtype == DType::BF16) return plan_bf16(a, tensors);
  if (auto err = require_dense(arg(a, "weight"), a.weight, {out_features, in_features}, DType::F32)) return err;
  if (auto err = require_dense(arg(a, "grad"), a.grad, {rows, out_features}, DType::F32)) return err;
  if (a.silu && !a.pre_activation)
    return invalid(arg(a, "pre_activation"), "is required with silu (the forward saves it)");
  if (a.pre_activation)
    if (auto err = require_dense(arg(a, "pre_activation"), *a.pre_activation, {rows, out_features}, DType::F32))
      return err;
  if (auto err = require_outputs(a, tensors, DType::F32)) return err;

  LaunchSequence sequence;
  const int device = a.x.device.device_id;
  const uint32_t column_blocks = static_cast<uint32_t>((in_features + kColumns - 1) / kColumns);
  const uint64_t pre = a.pre_activation ? data_address(*a.pre_activation) : 0;
  auto add = [&](OpCode op, uint32_t grid_y, uint64_t partials, uint64_t d_weight, uint64_t d_bias) {
    LaunchPlan& plan = sequence.add(det_linear_spec(DType::F32, in_features, out_features, a.silu, op),
                                    device, column_blocks, static_cast<uint32_t>(kColumns));
    plan.grid_y = grid_y;
    for (uint64_t v : {data_address(a.grad), pre, data_address(a.x), data_address(a.weight), partials, d_weight, d_bias,
                       static_cast<uint64_t>(rows)})
      plan.push(v);
  };
  if (const DLTensor* partials = input_partials(a)) {
    const int64_t chunks = (out_features + kDetLinearFp32Chunk - 1) / kDetLinearFp32Chunk;
    if (chunks > 65535) return invalid(arg(a, "weight"), "has too many rows for the chunked d_input");
    add(Op::DetLinearInputGrad, static_cast<uint32_t>(chunks), data_address(*partials), 0, 0);
    if (a.d_input)
      add_det_linear_input_fold(sequence, device, false, rows, in_features, out_features, a.silu, DType::F32,
                                data_address(a.x), data_address(*partials), data_address(*a.d_input));
  }
  if (a.d_weight || a.d_bias) {
    if (out_features > 65535) return invalid(arg(a, "weight"), "has too many rows for one d_weight launch");
    add(Op::DetLinearWeightGrad, static_cast<uint32_t>(out_features), 0, a.d_weight ? data_address(*a.d_weight) : 0,
        a.d_bias ? data_address(*a.d_bias) : 0);
  }
  return sequence;
}

llvm::Expected<LaunchSequence> plan_det_linear_input_fold(const DetLinearInputFoldArgs& a) {
  const NamedTensor tensors[] = {{"partials", &a.partials}, {"x", &a.x}, {"d_input", &a.d_input}};
  if (auto err = require_cuda_on_one_device(kFoldOp, tensors)) return err;
  if (a.x.ndim != 2) return invalid(fold_arg("x"), fmt::format("must be (T, K) (got {})", shape_string(a.x)));
  const int64_t rows = a.x.shape[0], in_features = a.x.shape[1];
  if (rows < 1 || rows > kMaxRows)
    return invalid(fold_arg("x"), fmt::format("must have 1..{} rows (got {})", kMaxRows, rows));
  if (std::string rule = cap_rule(kInFeaturesCap, in_features); !rule.empty()) return invalid(fold_arg("x"), rule);
  if (auto err = require_dense(fold_arg("x"), a.x, {rows, in_features}, DType::F32)) return err;
  if (auto err = require_dense(fold_arg("d_input"), a.d_input, {rows, in_features}, DType::F32)) return err;
  const int64_t chunk = det_linear_input_chunk(a.bf16_weights);
  if (a.partials.ndim != 3 || a.partials.shape[0] < 1)
    return invalid(fold_arg("partials"), fmt::format("must be (C, {}, {}) with C >= 1 chunks (got {})", rows,
                                                     in_features, shape_string(a.partials)));
  const int64_t chunks = a.partials.shape[0];
  // The fold is the backward's for N = C whole chunks, so N's cap bounds C.
  if (chunks > kOutFeaturesCap.max / chunk)
    return invalid(fold_arg("partials"), fmt::format("must have at most {} chunks of {} outputs (N <= {}; got {})",
                                                kOutFeaturesCap.max / chunk, chunk, kOutFeaturesCap.max, chunks));
  if (auto err = require_dense(fold_arg("partials"), a.partials, {chunks, rows, in_features}, DType::F32)) return err;
  const int64_t out_features = chunks * chunk;
  const DType weight_dtype = a.bf16_weights ? DType::BF16 : DType::F32;
  if (RuleBreak broken = in_features_rule(det_linear_spec(weight_dtype, in_features, out_features, a.silu)))
    return invalid(fold_arg("x"), broken.rule);
  if (auto err = require_disjoint_outputs(kFoldOp, tensors, {"d_input"})) return err;

  LaunchSequence sequence;
  // The gradient dtype only names the bf16 fold kernel: the AdaLN table's, bf16.
  add_det_linear_input_fold(sequence, a.x.device.device_id, a.bf16_weights, rows, in_features, out_features, a.silu,
                            DType::BF16, data_address(a.x), data_address(a.partials), data_address(a.d_input));
  return sequence;
}

namespace {
std::vector<std::string_view> backward_templates(const KernelSpec& spec) {
  return {"fixed_order_sum.cuh", spec.dtype == DType::F32 ? "det_linear_grad.cuh" : "det_linear_grad_bf16.cuh"};
}
RuleBreak backward_rule(const KernelSpec& spec) {
  if (spec.dtype == DType::F16) return {RuleSubject::Spec, "det_linear weights are bf16 or fp32"};
  if (spec.dtype == DType::F32 && (spec.op == Op::DetLinearInputFold || spec.grad_dtype != DType::F32))
    return {RuleSubject::Spec, "the fp32 det_linear backward takes an fp32 gradient and folds with segment_fold"};
  if (spec.dtype == DType::BF16 && spec.grad_dtype == DType::F16)
    return {RuleSubject::Spec, "the bf16 det_linear backward takes a bf16 or fp32 gradient"};
  if (spec.dtype == DType::BF16)
    if (RuleBreak broken = in_features_rule(spec)) return broken;
  if (const llvm::ArrayRef<int> tiles = det_linear_backward_row_tiles(spec.dtype, spec.op);
      !llvm::is_contained(tiles, spec.row_tile))
    return {RuleSubject::Spec,
            fmt::format("rows (the row tile) must be in {{{}}} (got {})", fmt::join(tiles, ", "), spec.row_tile)};
  return {};
}
// Both activations; fp32 weights: one kernel each (no fold); bf16 weights: both gradient dtypes
// at every row tile, so a cache shipped read-only serves every T.
std::vector<KernelSpec> backward_family(OpCode op, const KernelSpec& sizes) {
  const DType dtype = sizes.dtype;
  const int64_t in_features = sizes.in_features, out_features = sizes.out_features;
  std::vector<KernelSpec> specs;
  for (bool silu : {false, true}) {
    if (dtype != DType::BF16) {
      if (op != Op::DetLinearInputFold)
        specs.push_back(det_linear_spec(DType::F32, in_features, out_features, silu, op));
      continue;
    }
    for (DType grad : {DType::BF16, DType::F32})
      for (int rows : det_linear_backward_row_tiles(DType::BF16, op))
        specs.push_back(det_linear_backward_spec(DType::BF16, in_features, out_features, silu, op, grad, rows));
  }
  return specs;
}
// The same layers' backward (det_linear_catalog): fp32 one spec each; bf16 (SiLU on the input)
// every row tile and incoming-gradient dtype, so a cache shipped read-only serves every T.
std::vector<KernelSpec> backward_catalog(OpCode op, DType dtype) {
  std::vector<KernelSpec> specs;
  if (dtype == DType::F32 && op != Op::DetLinearInputFold) {
    specs.push_back(det_linear_spec(DType::F32, kSinusoidChannels, 2 * kTimeEmbedDim, true, op));
    specs.push_back(det_linear_spec(DType::F32, 2 * kTimeEmbedDim, kTimeEmbedDim, false, op));
  }
  if (dtype == DType::BF16)
    for (int64_t n : {18 * kDefaultHidden, 2 * kDefaultHidden})
      for (const KernelSpec& spec : backward_family(op, linear_sizes(dtype, kTimeEmbedDim, n)))
        if (spec.silu) specs.push_back(spec);
  return specs;
}
std::vector<KernelSpec> input_grad_catalog(DType dtype) { return backward_catalog(Op::DetLinearInputGrad, dtype); }
std::vector<KernelSpec> input_fold_catalog(DType dtype) { return backward_catalog(Op::DetLinearInputFold, dtype); }
std::vector<KernelSpec> weight_grad_catalog(DType dtype) { return backward_catalog(Op::DetLinearWeightGrad, dtype); }
std::vector<KernelSpec> input_grad_family(const KernelSpec& sizes) {
  return backward_family(Op::DetLinearInputGrad, sizes);
}
std::vector<KernelSpec> input_fold_family(const KernelSpec& sizes) {
  return backward_family(Op::DetLinearInputFold, sizes);
}
std::vector<KernelSpec> weight_grad_family(const KernelSpec& sizes) {
  return backward_family(Op::DetLinearWeightGrad, sizes);
}
// The bf16 kernels are compiled per row tile: a call of T rows runs the one
// det_linear_backward_row_tile picks.
bool serves_rows(const KernelSpec& spec, int64_t rows) {
  return det_linear_backward_row_tiles(spec.dtype, spec.op).size() <= 1 ||
         spec.row_tile == det_linear_backward_row_tile(spec.dtype, spec.op, rows);
}
}  // namespace

const OpRow kDetLinearInputGradRow = {
    Op::DetLinearInputGrad, "det_linear_input_grad", OpRole::Backward, "det_linear",
    SpecShape::Linear, /*describes_weight=*/false, /*row_chunks=*/1, /*threads=*/0, /*row_unroll=*/1,
    {"index", "index"}, ErrorValue::Index, /*value_rule=*/"",
    backward_templates, render_det_linear_constants, backward_rule, input_grad_family, input_grad_catalog,
    /*family_sizes=*/{}, /*family_summary=*/{}, /*default_stride_in_h=*/0, serves_rows};
const OpRow kDetLinearInputFoldRow = {
    Op::DetLinearInputFold, "det_linear_input_fold", OpRole::Backward, "det_linear",
    SpecShape::Linear, /*describes_weight=*/false, /*row_chunks=*/1, /*threads=*/0, /*row_unroll=*/1,
    {"index", "index"}, ErrorValue::Index, /*value_rule=*/"",
    backward_templates, render_det_linear_constants, backward_rule, input_fold_family, input_fold_catalog,
    /*family_sizes=*/{}, /*family_summary=*/{}, /*default_stride_in_h=*/0, serves_rows};
const OpRow kDetLinearWeightGradRow = {
    Op::DetLinearWeightGrad, "det_linear_weight_grad", OpRole::Backward, "det_linear",
    SpecShape::Linear, /*describes_weight=*/false, /*row_chunks=*/1, /*threads=*/0, /*row_unroll=*/1,
    {"index", "index"}, ErrorValue::Index, /*value_rule=*/"",
    backward_templates, render_det_linear_constants, backward_rule, weight_grad_family, weight_grad_catalog,
    /*family_sizes=*/{}, /*family_summary=*/{}, /*default_stride_in_h=*/0, serves_rows};

}  // namespace exactjit

extern "C" long long xj_det_linear_backward_workspace_bytes(long long rows, long long in_features,
                                                            long long out_features) {
  return exactjit::det_linear_backward_workspace(rows, in_features, out_features);
}

extern "C" exactjit_status_t xj_det_linear_backward(xj_runtime* runtime, const DLTensor* grad,
                                                    const DLTensor* pre_activation, const DLTensor* x,
                                                    const DLTensor* weight, const DLTensor* d_input,
                                                    const DLTensor* d_weight, const DLTensor* d_bias,
                                                    const DLTensor* workspace, int silu, void* stream) {
  return exactjit::c_abi::call_op(
      runtime, "det_linear_backward", {{"grad", grad}, {"x", x}, {"weight", weight}}, [&](exactjit::Runtime& r) {
        return r.launch(exactjit::plan_det_linear_backward(
                            {*grad, pre_activation, *x, *weight, d_input, d_weight, d_bias, workspace, silu != 0}),
                        stream);
      });
}

extern "C" exactjit_status_t xj_det_linear_backward_partials(xj_runtime* runtime, const DLTensor* grad,
                                                             const DLTensor* pre_activation, const DLTensor* x,
                                                             const DLTensor* weight, const DLTensor* partials,
                                                             const DLTensor* d_weight, const DLTensor* d_bias,
                                                             int silu, void* stream) {
  return exactjit::c_abi::call_op(
      runtime, "det_linear_backward_partials", {{"grad", grad}, {"x", x}, {"weight", weight}, {"partials", partials}},
      [&](exactjit::Runtime& r) {
        return r.launch(exactjit::plan_det_linear_backward({*grad, pre_activation, *x, *weight, nullptr, d_weight,
                                                            d_bias, nullptr, silu != 0, partials}),
                        stream);
      });
}

extern "C" long long xj_det_linear_input_chunk(int bf16_weights) {
  return exactjit::det_linear_input_chunk(bf16_weights != 0);
}

extern "C" exactjit_status_t xj_det_linear_input_fold(xj_runtime* runtime, const DLTensor* partials, const DLTensor* x,
                                                      const DLTensor* d_input, int bf16_weights, int silu,
                                                      void* stream) {
  return exactjit::c_abi::call_op(
      runtime, "det_linear_input_fold", {{"partials", partials}, {"x", x}, {"d_input", d_input}},
      [&](exactjit::Runtime& r) {
        return r.launch(exactjit::plan_det_linear_input_fold({*partials, *x, *d_input, bf16_weights != 0, silu != 0}),
                        stream);
      });
}
