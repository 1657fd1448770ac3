// exactjit segment plan: workspace layout and launches (see segment_plan.hpp).
#include "kernels/segment_plan.hpp"

#include "codegen/geometry.hpp"
#include "codegen/render.hpp"
#include "kernels/op_rules.hpp"

#include <fmt/format.h>

namespace exactjit {

SegmentLayout segment_layout(int64_t rows, int64_t seq, int64_t table_rows) {
  SegmentLayout l;
  l.seq = seq;
  l.batch = rows / seq;
  l.table_rows = table_rows;
  l.chunks = CheckedSize(seq).ceil_div(kChunkPositions).value_or(-1);
  // Each row has at most floor(B * count / 256) + 1 tiles: at most ceil(M / 256) + R in all.
  const CheckedSize max_tiles = CheckedSize(rows).ceil_div(kTilePositions) + table_rows;
  l.max_tiles = max_tiles.value_or(-1);
  CheckedSize at = 0;  // an overflow anywhere leaves it invalid, and `end` -1
  auto take = [&at](CheckedSize ints) {
    const int64_t offset = at.value_or(-1);
    at = align_workspace(at + ints * 4);
    return offset;
  };
  l.keys = take(seq);
  l.chunk_counts = take(CheckedSize(l.chunks) * table_rows);
  l.row_count = take(table_rows);
  l.row_start = take(CheckedSize(table_rows) + 1);
  l.row_tile_start = take(CheckedSize(table_rows) + 1);
  l.tile_row = take(max_tiles);
  l.sorted = take(seq);
  l.end = at.value_or(-1);
  return l;
}

void add_plan_launches(LaunchSequence& sequence, const SegmentLayout& l, uint64_t workspace, int device_id,
                       IndexType index_type, uint64_t first, uint64_t second, int64_t first_bound, OpCode report_op) {
  const KernelSpec count_spec = make_plan_spec(Op::SegmentCount, DType::F32, index_type, second ? 2 : 1);
  LaunchPlan& count = sequence.add(count_spec, device_id, static_cast<uint32_t>(l.chunks),
                                   codegen::backward_threads(count_spec));
  count.push(first);
  count.push(second);
  count.push(static_cast<uint64_t>(l.seq));
  count.push(static_cast<uint64_t>(l.table_rows));
  count.push(static_cast<uint64_t>(first_bound));
  count.push(op_code(report_op));  // kSegmentCountReportCode: the op whose index is bad
  count.push(workspace + l.keys);
  count.push(workspace + l.chunk_counts);

  const KernelSpec scan_spec = make_plan_spec(Op::SegmentScan, DType::F32, IndexType::I64);
  LaunchPlan& scan = sequence.add(scan_spec, device_id, 1, codegen::backward_threads(scan_spec));
  scan.push(workspace + l.chunk_counts);
  scan.push(static_cast<uint64_t>(l.chunks));
  scan.push(static_cast<uint64_t>(l.table_rows));
  scan.push(static_cast<uint64_t>(l.batch));
  scan.push(workspace + l.row_count);
  scan.push(workspace + l.row_start);
  scan.push(workspace + l.row_tile_start);
  scan.push(workspace + l.tile_row);
  scan.push(static_cast<uint64_t>(l.max_tiles));

  const KernelSpec scatter_spec = make_plan_spec(Op::SegmentScatter, DType::F32, IndexType::I64);
  LaunchPlan& scatter = sequence.add(scatter_spec, device_id, static_cast<uint32_t>(l.chunks),
                                     codegen::backward_threads(scatter_spec));
  scatter.push(workspace + l.keys);
  scatter.push(static_cast<uint64_t>(l.seq));
  scatter.push(static_cast<uint64_t>(l.table_rows));
  scatter.push(workspace + l.chunk_counts);
  scatter.push(workspace + l.row_start);
  scatter.push(workspace + l.sorted);
}

void push_plan_params(LaunchPlan& plan, const SegmentLayout& l, uint64_t workspace) {
  plan.push(workspace + l.sorted);
  plan.push(workspace + l.row_start);
  plan.push(workspace + l.row_count);
  plan.push(workspace + l.row_tile_start);
  plan.push(workspace + l.tile_row);
  plan.push(static_cast<uint64_t>(l.seq));
  plan.push(static_cast<uint64_t>(l.batch));
}

void add_fold_launch(LaunchSequence& sequence, const SegmentLayout* l, uint64_t workspace, int device_id, DType dtype,
                     uint64_t partials, int64_t tiles, int64_t width, uint64_t out, bool whole_table) {
  const KernelSpec fold_spec = make_plan_spec(Op::SegmentFold, dtype, IndexType::I64);
  const int threads = codegen::backward_threads(fold_spec);
  LaunchPlan& fold =
      sequence.add(fold_spec, device_id, static_cast<uint32_t>((width + threads - 1) / threads), threads);
  fold.grid_y = static_cast<uint32_t>(l && !whole_table ? l->table_rows : 1);
  fold.push(partials);
  fold.push(l ? workspace + l->row_tile_start : 0);
  fold.push(static_cast<uint64_t>(tiles));
  fold.push(static_cast<uint64_t>(l && whole_table ? l->table_rows : 1));
  fold.push(static_cast<uint64_t>(width));
  fold.push(out);
}

namespace {
std::string backward_constants(const KernelSpec& spec, bool segmented) {
  return codegen::render_spec_constants(spec) +
         fmt::format(
             "constexpr bool kWeighted = {weighted};\n"
             "constexpr bool kSegmented = {segmented};  // rms_norm parameter grads: table rows (segment tiles)\n"
             "constexpr int kThreads = {threads};\n"
             "constexpr int kRowUnroll = {unroll};  // tile kernels: rows loaded before their adds\n"
             "constexpr long long kTilePositions = {tile};\n"
             "constexpr long long kChunkPositions = {chunk};\n"
             "constexpr int kMaxTableRows = {max_rows};\n"
             "constexpr int kTargetArch = {arch};\n",
             fmt::arg("weighted", spec.weighted ? "true" : "false"),
             fmt::arg("segmented", segmented ? "true" : "false"), fmt::arg("threads", codegen::backward_threads(spec)),
             fmt::arg("unroll", codegen::backward_row_unroll(spec)), fmt::arg("tile", kTilePositions),
             fmt::arg("chunk", kChunkPositions), fmt::arg("max_rows", kMaxPlanTableRows),
             fmt::arg("arch", spec.target.sm));
}
}  // namespace

std::string render_backward_constants(const KernelSpec& spec) { return backward_constants(spec, false); }

std::string render_table_grad_constants(const KernelSpec& spec) { return backward_constants(spec, true); }

namespace {
std::vector<std::string_view> count_templates(const KernelSpec&) { return {"segment_count.cuh"}; }
std::vector<std::string_view> scan_templates(const KernelSpec&) { return {"segment_scan.cuh"}; }
std::vector<std::string_view> scatter_templates(const KernelSpec&) { return {"segment_scatter.cuh"}; }
RuleBreak count_rule(const KernelSpec& spec) {
  if (spec.key_tensors == 1 || spec.key_tensors == 2) return {};
  return {RuleSubject::Sizes,
          fmt::format("segment_count combines 1 or 2 index tensors (keys=1 or 2, got {})", spec.key_tensors)};
}
// The plan kernels are not sized by the call (the backward kernels size their launches): a
// family is its kernels in every index type the key may come in.
std::vector<KernelSpec> count_family(const KernelSpec&) {
  std::vector<KernelSpec> specs;
  for (int keys : {1, 2})  // 2: adaln_row_gather's (index, chunk) keys
    for (IndexType index : {IndexType::I64, IndexType::I32})
      specs.push_back(make_plan_spec(Op::SegmentCount, DType::F32, index, keys));
  return specs;
}
std::vector<KernelSpec> scan_family(const KernelSpec&) {
  return {make_plan_spec(Op::SegmentScan, DType::F32, IndexType::I64)};
}
std::vector<KernelSpec> scatter_family(const KernelSpec&) {
  return {make_plan_spec(Op::SegmentScatter, DType::F32, IndexType::I64)};
}
// The plan kernels are dtype-free (listed once, under fp32).
std::vector<KernelSpec> fp32_only(std::vector<KernelSpec> (*family)(const KernelSpec&), DType dtype) {
  return dtype == DType::F32 ? family(KernelSpec{}) : std::vector<KernelSpec>{};
}
std::vector<KernelSpec> count_catalog(DType dtype) { return fp32_only(count_family, dtype); }
std::vector<KernelSpec> scan_catalog(DType dtype) { return fp32_only(scan_family, dtype); }
std::vector<KernelSpec> scatter_catalog(DType dtype) { return fp32_only(scatter_family, dtype); }
}  // namespace

const OpRow kSegmentCountRow = {
    Op::SegmentCount, "segment_count", OpRole::Plan, "segment_plan",
    SpecShape::Plan, /*describes_weight=*/false, /*row_chunks=*/1, /*threads=*/256, /*row_unroll=*/1,
    {"index", "index"}, ErrorValue::Index, /*value_rule=*/"",
    count_templates, render_backward_constants, count_rule, count_family, count_catalog,
    "(sized by the backward kernels)", "the deterministic segment sums the backwards share",
    /*default_stride_in_h=*/0};
const OpRow kSegmentScanRow = {
    Op::SegmentScan, "segment_scan", OpRole::Plan, "segment_plan",
    SpecShape::Plan, /*describes_weight=*/false, /*row_chunks=*/1, /*threads=*/256, /*row_unroll=*/1,
    {"index", "index"}, ErrorValue::Index, /*value_rule=*/"",
    scan_templates, render_backward_constants, no_rule, scan_family, scan_catalog};
const OpRow kSegmentScatterRow = {
    Op::SegmentScatter, "segment_scatter", OpRole::Plan, "segment_plan",
    SpecShape::Plan, /*describes_weight=*/false, /*row_chunks=*/1, /*threads=*/256, /*row_unroll=*/1,
    {"index", "index"}, ErrorValue::Index, /*value_rule=*/"",
    scatter_templates, render_backward_constants, no_rule, scatter_family, scatter_catalog};

}  // namespace exactjit
