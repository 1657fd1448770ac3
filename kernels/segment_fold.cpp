// exactjit segment_fold: the fold kernel's row; the entry point validates, builds the index's plan and
// folds the given partials.
#include "kernels/segment_fold.hpp"

#include "api/c_entry.hpp"
#include "kernels/backward_check.hpp"
#include "kernels/op_rules.hpp"
#include "kernels/segment_plan.hpp"

#include <fmt/format.h>

namespace exactjit {
namespace {
constexpr std::string_view kOp = "segment_fold";
ArgName arg(std::string_view name) { return {kOp, name}; }
bool valid_sizes(int64_t rows, int64_t seq, int64_t table_rows) {
  return seq >= 1 && rows >= seq && rows % seq == 0 && table_rows >= 1;
}
}  // namespace

int64_t segment_fold_tiles(int64_t rows, int64_t seq, int64_t table_rows) {
  return valid_sizes(rows, seq, table_rows) ? segment_layout(rows, seq, table_rows).max_tiles : -1;
}

int64_t segment_fold_workspace(int64_t rows, int64_t seq, int64_t table_rows) {
  return valid_sizes(rows, seq, table_rows) ? segment_layout(rows, seq, table_rows).end : -1;
}

llvm::Expected<LaunchSequence> plan_segment_fold(const SegmentFoldArgs& a) {
  llvm::SmallVector<NamedTensor, 4> tensors = {{"partials", &a.partials}, {"index", &a.index}, {"out", &a.out}};
  if (a.workspace) tensors.push_back({"workspace", a.workspace});
  if (auto err = require_cuda_on_one_device(kOp, tensors)) return err;
  auto out_dtype = float_dtype(arg("out"), a.out);
  if (!out_dtype) return out_dtype.takeError();
  if (a.out.ndim != 2 || a.out.shape[0] < 1 || a.out.shape[1] < 1)
    return invalid(arg("out"), fmt::format("must be (R, W) with R, W >= 1 (got {})", shape_string(a.out)));
  const int64_t table_rows = a.out.shape[0], width = a.out.shape[1];
  if (auto err = require_dense(arg("out"), a.out, {table_rows, width}, *out_dtype)) return err;
  auto index_type = index_dtype(arg("index"), a.index);
  if (!index_type) return index_type.takeError();
  if (a.index.ndim != 1 || a.index.shape[0] < 1 || !is_contiguous(a.index))
    return invalid(arg("index"), fmt::format("must be (S,) contiguous with S >= 1 (got {})", shape_string(a.index)));
  const int64_t seq = a.index.shape[0];
  if (a.rows < seq || a.rows % seq != 0)
    return invalid(arg("rows"), fmt::format("must be a positive multiple of S = {} (got {})", seq, a.rows));
  if (auto err = require_plan_limits(arg("index"), seq, arg("out"), table_rows)) return err;
  const SegmentLayout layout = segment_layout(a.rows, seq, table_rows);
  const int64_t tiles = layout.max_tiles;
  if (auto err = require_partials(arg("partials"), a.partials, width, tiles,
                                  fmt::format("ceil(M / 256) + R = {}", tiles)))
    return err;
  if (auto err = require_workspace(arg("workspace"), a.workspace, layout.end)) return err;
  if (auto err = require_disjoint_outputs(kOp, tensors, {"out", "workspace"})) return err;

  LaunchSequence sequence;
  const uint64_t ws = data_address(*a.workspace);
  const int device = a.out.device.device_id;
  add_plan_launches(sequence, layout, ws, device, *index_type, data_address(a.index), 0, table_rows, Op::SegmentFold);
  add_fold_launch(sequence, &layout, ws, device, *out_dtype, data_address(a.partials), tiles, width,
                  data_address(a.out));
  return sequence;
}

namespace {
std::vector<std::string_view> fold_templates(const KernelSpec&) { return {"fixed_order_sum.cuh", "segment_fold.cuh"}; }
// The fold writes the output's dtype.
std::vector<KernelSpec> fold_family(const KernelSpec& sizes) {
  return {make_plan_spec(Op::SegmentFold, sizes.dtype, IndexType::I64)};
}
std::vector<KernelSpec> fold_catalog(DType dtype) {
  KernelSpec sizes;
  sizes.dtype = dtype;
  return fold_family(sizes);
}
}  // namespace

const OpRow kSegmentFoldRow = {
    Op::SegmentFold, "segment_fold", OpRole::Plan, "segment_plan",
    SpecShape::Plan, /*describes_weight=*/false, /*row_chunks=*/1, /*threads=*/256, /*row_unroll=*/1,
    {"index", "index"}, ErrorValue::Index, /*value_rule=*/"",
    fold_templates, render_backward_constants, no_rule, fold_family, fold_catalog};

}  // namespace exactjit

extern "C" long long xj_segment_fold_tiles(long long rows, long long seq, long long table_rows) {
  return exactjit::segment_fold_tiles(rows, seq, table_rows);
}

extern "C" long long xj_segment_fold_workspace_bytes(long long rows, long long seq, long long table_rows) {
  return exactjit::segment_fold_workspace(rows, seq, table_rows);
}

extern "C" exactjit_status_t xj_segment_fold(xj_runtime* runtime, const DLTensor* partials, const DLTensor* index,
                                             long long rows, const DLTensor* out, const DLTensor* workspace,
                                             void* stream) {
  return exactjit::c_abi::call_op(runtime, "segment_fold",
                                  {{"partials", partials}, {"index", index}, {"out", out}},
                                  [&](exactjit::Runtime& r) {
                                    return r.launch(exactjit::plan_segment_fold({*partials, *index, rows, *out,
                                                                                 workspace}),
                                                    stream);
                                  });
}
