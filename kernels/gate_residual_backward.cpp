// exactjit op gate_residual, backward: validate, plan the segment sums, tiles, fold.
#include "kernels/gate_residual_backward.hpp"

#include "api/c_entry.hpp"
#include "codegen/geometry.hpp"
#include "kernels/backward_check.hpp"
#include "kernels/op_rules.hpp"
#include "kernels/segment_plan.hpp"
#include "kernels/spec_limits.hpp"

#include <fmt/format.h>

namespace exactjit {
namespace {
constexpr std::string_view kOp = "gate_residual_backward";
ArgName arg(std::string_view name) { return {kOp, name}; }
}  // namespace

int64_t gate_residual_backward_workspace(int64_t rows, int64_t seq, int64_t table_rows, int64_t hidden) {
  if (rows < 0 || seq < 1 || rows % seq != 0 || table_rows < 1 || !cap_rule(kHiddenCap, hidden).empty()) return -1;
  const SegmentLayout layout = segment_layout(rows, seq, table_rows);
  return (CheckedSize(layout.end) + align_workspace(CheckedSize(layout.max_tiles) * hidden * 4)).value_or(-1);
}

llvm::Expected<LaunchSequence> plan_gate_residual_backward(const GateResidualBackwardArgs& a) {
  llvm::SmallVector<NamedTensor, 7> tensors = {{"grad", &a.grad}, {"gate", &a.gate}, {"index", &a.index}, {"y", &a.y}};
  if (a.d_y) tensors.push_back({"d_y", a.d_y});
  if (a.d_gate) tensors.push_back({"d_gate", a.d_gate});
  if (a.workspace) tensors.push_back({"workspace", a.workspace});
  if (auto err = require_cuda_on_one_device(kOp, tensors)) return err;
  auto dtype = float_dtype(arg("y"), a.y);
  if (!dtype) return dtype.takeError();
  if (a.y.ndim != 2 && a.y.ndim != 3)
    return invalid(arg("y"), fmt::format("must be (M, H) or (B, S, H) (got {})", shape_string(a.y)));
  if (!is_contiguous(a.y)) return invalid(arg("y"), "must be contiguous");
  if (auto err = require_like(arg("grad"), a.grad, "y", a.y)) return err;
  if (a.d_y)
    if (auto err = require_like(arg("d_y"), *a.d_y, "y", a.y)) return err;
  const int64_t hidden = a.y.shape[a.y.ndim - 1];
  if (std::string rule = cap_rule(kHiddenCap, hidden); !rule.empty()) return invalid(arg("y"), rule);
  const int64_t rows = element_count(a.y) / hidden;

  auto gate_dtype = float_dtype(arg("gate"), a.gate);
  if (!gate_dtype) return gate_dtype.takeError();
  if (*gate_dtype != *dtype) return invalid(arg("gate"), fmt::format("must have y's dtype {}", dtype_name(*dtype)));
  if (a.gate.ndim != 2 || a.gate.shape[1] != hidden || a.gate.shape[0] < 1)
    return invalid(arg("gate"), fmt::format("must be (R, {}) with R >= 1 (got {})", hidden, shape_string(a.gate)));
  const int64_t table_rows = a.gate.shape[0];
  if (hidden > 1 && stride_of(a.gate, 1) != 1) return invalid(arg("gate"), "must have unit column stride");
  const int64_t table_stride = table_rows == 1 ? hidden : stride_of(a.gate, 0);
  if (std::string rule = cap_rule(kTableStrideCap, table_stride); !rule.empty()) return invalid(arg("gate"), rule);
  if (auto err = require_row_rules(make_spec(Op::GateResidualBackward, *dtype, IndexType::I64, hidden, table_stride, 1),
                                   arg("y"), arg("gate")))
    return err;

  auto index_type = index_dtype(arg("index"), a.index);
  if (!index_type) return index_type.takeError();
  if (a.index.ndim != 1 || a.index.shape[0] < 1 || !is_contiguous(a.index))
    return invalid(arg("index"), fmt::format("must be (S,) contiguous with S >= 1 (got {})", shape_string(a.index)));
  const int64_t seq = a.index.shape[0];
  if (rows % seq != 0)
    return invalid(arg("index"), fmt::format("length S = {} must divide the M = {} rows of y", seq, rows));
  if (auto err = require_plan_limits(arg("index"), seq, arg("gate"), table_rows)) return err;
  // d_gate in y's dtype or, rounded once to fp32 instead, in float32 (for a projection backward
  // that takes an fp32 gradient, and for sequence-parallel partials).
  DType d_gate_dtype = *dtype;
  if (a.d_gate) {
    auto out = gradient_dtype(arg("d_gate"), *a.d_gate, "y", *dtype);
    if (!out) return out.takeError();
    d_gate_dtype = *out;
    if (auto err = require_dense(arg("d_gate"), *a.d_gate, {table_rows, hidden}, d_gate_dtype)) return err;
  }

  LaunchSequence sequence;
  if ((!a.d_y && !a.d_gate) || rows == 0) return sequence;
  const int64_t bytes = gate_residual_backward_workspace(rows, seq, table_rows, hidden);
  if (auto err = require_workspace(arg("workspace"), a.workspace, bytes)) return err;
  if (auto err = require_disjoint_outputs(kOp, tensors, {"d_y", "d_gate", "workspace"})) return err;

  const SegmentLayout layout = segment_layout(rows, seq, table_rows);
  const uint64_t ws = data_address(*a.workspace);
  const int device = a.y.device.device_id;
  add_plan_launches(sequence, layout, ws, device, *index_type, data_address(a.index), 0, table_rows,
                    Op::GateResidualBackward);
  const int vec = pack_width(*dtype, hidden, table_stride, {&a.grad, &a.gate, &a.y, a.d_y});
  const KernelSpec spec = make_spec(Op::GateResidualBackward, *dtype, IndexType::I64, hidden, table_stride, vec);
  LaunchPlan& tiles = sequence.add(spec, device, static_cast<uint32_t>(layout.max_tiles),
                                   static_cast<uint32_t>(codegen::backward_threads(spec)));
  tiles.grid_y = static_cast<uint32_t>(codegen::column_slices(spec));
  const uint64_t partials = a.d_gate ? ws + layout.end : 0;
  tiles.push(data_address(a.grad));
  tiles.push(data_address(a.gate));
  tiles.push(data_address(a.y));
  tiles.push(a.d_y ? data_address(*a.d_y) : 0);
  tiles.push(partials);
  push_plan_params(tiles, layout, ws);
  if (a.d_gate)
    add_fold_launch(sequence, &layout, ws, device, d_gate_dtype, partials, layout.max_tiles, hidden,
                    data_address(*a.d_gate));
  return sequence;
}

namespace {
std::vector<std::string_view> gate_residual_backward_templates(const KernelSpec&) {
  return {"fixed_order_sum.cuh", "segment_tiles.cuh", "gate_residual_backward.cuh"};
}
RuleBreak gate_residual_backward_rule(const KernelSpec& spec) {
  if (RuleBreak broken = table_stride_rule(spec)) return broken;
  return backward_vec_rule(spec);
}
std::vector<KernelSpec> gate_residual_backward_family(const KernelSpec& sizes) {
  return backward_vec_family(Op::GateResidualBackward, sizes.dtype, sizes.hidden, sizes.table_stride);
}
}  // namespace

// row_unroll 8: a tile is one block's serial walk over up to kTilePositions rows and small S has
// few tiles; 8 rows of 16-byte packs in flight help there and cost nothing at large S
// (docs/perf-notes.md, backward v3). adaln_row_gather_backward's tiles are the same walk.
const OpRow kGateResidualBackwardRow = {
    Op::GateResidualBackward, "gate_residual_backward", OpRole::Backward, "gate_residual",
    SpecShape::Rows, /*describes_weight=*/false, /*row_chunks=*/1, /*threads=*/128, /*row_unroll=*/8,
    {"index", "index"}, ErrorValue::Index, /*value_rule=*/"",
    gate_residual_backward_templates, render_backward_constants, gate_residual_backward_rule,
    gate_residual_backward_family, [](DType dtype) { return h3_strides(Op::GateResidualBackward, dtype, {6, 2}); }};

}  // namespace exactjit

extern "C" long long xj_gate_residual_backward_workspace_bytes(long long rows, long long seq, long long table_rows,
                                                               long long hidden) {
  return exactjit::gate_residual_backward_workspace(rows, seq, table_rows, hidden);
}

extern "C" exactjit_status_t xj_gate_residual_backward(xj_runtime* runtime, const DLTensor* grad,
                                                       const DLTensor* gate, const DLTensor* index, const DLTensor* y,
                                                       const DLTensor* d_y, const DLTensor* d_gate,
                                                       const DLTensor* workspace, void* stream) {
  return exactjit::c_abi::call_op(
      runtime, "gate_residual_backward", {{"grad", grad}, {"gate", gate}, {"index", index}, {"y", y}},
      [&](exactjit::Runtime& r) {
        return r.launch(exactjit::plan_gate_residual_backward({*grad, *gate, *index, *y, d_y, d_gate, workspace}),
                        stream);
      });
}
