// exactjit op adaln_row_gather, backward: validate, plan (keys t * 3 + tag), tiles, fold.
#include "kernels/adaln_row_gather_backward.hpp"

#include "api/c_entry.hpp"
#include "codegen/geometry.hpp"
#include "kernels/backward_check.hpp"
#include "kernels/op_rules.hpp"
#include "kernels/segment_plan.hpp"
#include "kernels/spec_limits.hpp"

#include <fmt/format.h>

namespace exactjit {
namespace {
constexpr std::string_view kOp = "adaln_row_gather_backward";
ArgName arg(std::string_view name) { return {kOp, name}; }
constexpr int64_t kChunks = 6;
}  // namespace

int64_t adaln_row_gather_backward_workspace(int64_t seq, int64_t table_rows, int64_t hidden) {
  if (seq < 1 || table_rows < 3 || table_rows % 3 != 0 || !cap_rule(kHiddenCap, hidden).empty()) return -1;
  const SegmentLayout layout = segment_layout(seq, seq, table_rows);
  return (CheckedSize(layout.end) + align_workspace(CheckedSize(layout.max_tiles) * kChunks * hidden * 4)).value_or(-1);
}

llvm::Expected<LaunchSequence> plan_adaln_row_gather_backward(const AdalnRowGatherBackwardArgs& a) {
  llvm::SmallVector<NamedTensor, 5> tensors = {{"grad", &a.grad}, {"timestep_indices", &a.timestep_indices},
                                               {"token_tags", &a.token_tags}, {"d_rows", &a.d_rows}};
  if (a.workspace) tensors.push_back({"workspace", a.workspace});
  if (auto err = require_cuda_on_one_device(kOp, tensors)) return err;
  auto dtype = float_dtype(arg("grad"), a.grad);
  if (!dtype) return dtype.takeError();
  if (a.grad.ndim != 3 || a.grad.shape[0] != kChunks || !is_contiguous(a.grad))
    return invalid(arg("grad"), fmt::format("must be (6, S, H) contiguous (got {})", shape_string(a.grad)));
  const int64_t seq = a.grad.shape[1], hidden = a.grad.shape[2];
  if (seq < 1 || hidden < 1) return invalid(arg("grad"), "must have S >= 1 and H >= 1");
  if (std::string rule = cap_rule(kHiddenCap, hidden); !rule.empty()) return invalid(arg("grad"), rule);
  auto index_type = index_dtype(arg("timestep_indices"), a.timestep_indices);
  if (!index_type) return index_type.takeError();
  auto tag_type = index_dtype(arg("token_tags"), a.token_tags);
  if (!tag_type) return tag_type.takeError();
  if (*tag_type != *index_type) return invalid(arg("token_tags"), "must have timestep_indices' integer type");
  for (const auto& [name, t] : {tensors[1], tensors[2]})
    if (t->ndim != 1 || t->shape[0] != seq || !is_contiguous(*t))
      return invalid(arg(name), fmt::format("must be ({},) contiguous (got {})", seq, shape_string(*t)));
  auto out_dtype = gradient_dtype(arg("d_rows"), a.d_rows, "grad", *dtype);
  if (!out_dtype) return out_dtype.takeError();
  const int64_t table_rows = a.d_rows.ndim == 2 ? a.d_rows.shape[0] : 0;
  if (table_rows < 3 || table_rows % 3 != 0)
    return invalid(arg("d_rows"), fmt::format("must be (3T, {}) (got {})", kChunks * hidden, shape_string(a.d_rows)));
  if (auto err = require_dense(arg("d_rows"), a.d_rows, {table_rows, kChunks * hidden}, *out_dtype))
    return err;
  if (auto err = require_plan_limits(arg("timestep_indices"), seq, arg("d_rows"), table_rows)) return err;
  const int64_t bytes = adaln_row_gather_backward_workspace(seq, table_rows, hidden);
  if (auto err = require_workspace(arg("workspace"), a.workspace, bytes)) return err;
  for (const auto& [name, t] : {tensors[0], tensors[1], tensors[2]})
    for (const DLTensor* out : {&a.d_rows, a.workspace})
      if (overlaps(*out, *t)) return invalid(arg(name), "must not overlap d_rows or the workspace");
  if (overlaps(a.d_rows, *a.workspace)) return invalid(arg("d_rows"), "must not overlap the workspace");

  LaunchSequence sequence;
  const SegmentLayout layout = segment_layout(seq, seq, table_rows);
  const uint64_t ws = data_address(*a.workspace);
  const int device = a.grad.device.device_id;
  add_plan_launches(sequence, layout, ws, device, *index_type, data_address(a.timestep_indices),
                    data_address(a.token_tags), table_rows / 3, Op::AdalnRowGatherBackward);
  const int vec = pack_width(*dtype, hidden, 0, {&a.grad});
  const KernelSpec spec = make_spec(Op::AdalnRowGatherBackward, *dtype, IndexType::I64, hidden, 0, vec);
  LaunchPlan& tiles = sequence.add(spec, device, static_cast<uint32_t>(layout.max_tiles),
                                   static_cast<uint32_t>(codegen::backward_threads(spec)));
  tiles.grid_y = static_cast<uint32_t>(kChunks * codegen::column_slices(spec));
  const uint64_t partials = ws + layout.end;
  tiles.push(data_address(a.grad));
  tiles.push(partials);
  push_plan_params(tiles, layout, ws);
  add_fold_launch(sequence, &layout, ws, device, *out_dtype, partials, layout.max_tiles, kChunks * hidden,
                  data_address(a.d_rows));
  return sequence;
}

namespace {
std::vector<std::string_view> adaln_row_gather_backward_templates(const KernelSpec&) {
  return {"fixed_order_sum.cuh", "segment_tiles.cuh", "adaln_row_gather_backward.cuh"};
}
// d_rows is a dense (3T, 6H) gradient: no table stride.
std::vector<KernelSpec> adaln_row_gather_backward_family(const KernelSpec& sizes) {
  return backward_vec_family(Op::AdalnRowGatherBackward, sizes.dtype, sizes.hidden, 0);
}
}  // namespace

const OpRow kAdalnRowGatherBackwardRow = {
    Op::AdalnRowGatherBackward, "adaln_row_gather_backward", OpRole::Backward, "adaln_row_gather",
    SpecShape::Rows, /*describes_weight=*/false, /*row_chunks=*/1, /*threads=*/128, /*row_unroll=*/8,
    {"timestep_indices", "token_tags"}, ErrorValue::Index, /*value_rule=*/"",
    adaln_row_gather_backward_templates, render_backward_constants, backward_vec_rule,
    adaln_row_gather_backward_family, [](DType dtype) { return h3_strides(Op::AdalnRowGatherBackward, dtype, {0}); }};

}  // namespace exactjit

extern "C" long long xj_adaln_row_gather_backward_workspace_bytes(long long seq, long long table_rows,
                                                                  long long hidden) {
  return exactjit::adaln_row_gather_backward_workspace(seq, table_rows, hidden);
}

extern "C" exactjit_status_t xj_adaln_row_gather_backward(xj_runtime* runtime, const DLTensor* grad,
                                                          const DLTensor* timestep_indices,
                                                          const DLTensor* token_tags, const DLTensor* d_rows,
                                                          const DLTensor* workspace, void* stream) {
  return exactjit::c_abi::call_op(
      runtime, "adaln_row_gather_backward",
      {{"grad", grad}, {"timestep_indices", timestep_indices}, {"token_tags", token_tags}, {"d_rows", d_rows}},
      [&](exactjit::Runtime& r) {
        return r.launch(
            exactjit::plan_adaln_row_gather_backward({*grad, *timestep_indices, *token_tags, *d_rows, workspace}),
            stream);
      });
}
