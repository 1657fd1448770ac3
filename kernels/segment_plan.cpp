// exactjit segment plan: workspace layout and launches (see segment_plan.hpp).
#include "kernels/segment_plan.hpp"

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
                       IndexType index_type, uint64_t first, uint64_t second, int64_t first_bound, Op report_op) {
  LaunchPlan& count = sequence.add(make_spec(Op::SegmentCount, DType::F32, index_type, second ? 2 : 1, 0, 1),
                                   device_id, static_cast<uint32_t>(l.chunks), 256);
  count.push(first);
  count.push(second);
  count.push(static_cast<uint64_t>(l.seq));
  count.push(static_cast<uint64_t>(l.table_rows));
  count.push(static_cast<uint64_t>(first_bound));
  count.push(static_cast<uint64_t>(report_op) + 1);  // error-record op codes are op + 1
  count.push(workspace + l.keys);
  count.push(workspace + l.chunk_counts);

  LaunchPlan& scan = sequence.add(make_spec(Op::SegmentScan, DType::F32, IndexType::I64, 1, 0, 1), device_id, 1, 256);
  scan.push(workspace + l.chunk_counts);
  scan.push(static_cast<uint64_t>(l.chunks));
  scan.push(static_cast<uint64_t>(l.table_rows));
  scan.push(static_cast<uint64_t>(l.batch));
  scan.push(workspace + l.row_count);
  scan.push(workspace + l.row_start);
  scan.push(workspace + l.row_tile_start);
  scan.push(workspace + l.tile_row);
  scan.push(static_cast<uint64_t>(l.max_tiles));

  LaunchPlan& scatter = sequence.add(make_spec(Op::SegmentScatter, DType::F32, IndexType::I64, 1, 0, 1), device_id,
                                     static_cast<uint32_t>(l.chunks), 256);
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
                     uint64_t partials, int64_t tiles, int64_t width, uint64_t out) {
  LaunchPlan& fold = sequence.add(make_spec(Op::SegmentFold, dtype, IndexType::I64, 1, 0, 1), device_id,
                                  static_cast<uint32_t>((width + 255) / 256), 256);
  fold.grid_y = static_cast<uint32_t>(l ? l->table_rows : 1);
  fold.push(partials);
  fold.push(l ? workspace + l->row_tile_start : 0);
  fold.push(static_cast<uint64_t>(tiles));
  fold.push(static_cast<uint64_t>(width));
  fold.push(out);
}

}  // namespace exactjit
