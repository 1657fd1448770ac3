// exactjit segment tiles: how a backward kernel walks the segment plan (NUMERICS.md "Segment
// sums"; kernels/segment_plan.hpp builds it). Table row k owns B * count[k] positions: for each
// batch copy b in order, the positions s with key[s] = k in ascending order (row b * S + s). That
// list is cut into tiles of kTilePositions; tile t of the launch belongs to row tile_row[t]
// (-1: past the last tile). A tile is summed from zero in list order, so every partial sum is a
// function of the index and the data only.
#ifndef EXACTJIT_SEGMENT_TILES_CUH
#define EXACTJIT_SEGMENT_TILES_CUH

namespace xj {

struct SegmentPlan {
  const int* sorted;          // (S,) positions grouped by row, ascending within a row
  const int* row_start;       // (R + 1,) where each row's positions start in `sorted`
  const int* row_count;       // (R,) positions of each row per batch copy
  const int* row_tile_start;  // (R + 1,) each row's first tile
  const int* tile_row;        // (max tiles,) the row of each tile, -1 past the end
  long long seq;              // S
  long long batch;            // B = M / S
};

struct SegmentTile {
  int row;           // table row k
  long long first;   // list positions [first, end) of row k
  long long end;
  long long count;   // count[k]
};

// Kernel parameters of a plan (seven slots, in this order) and the struct built from them.
#define XJ_SEGMENT_PLAN_PARAMS                                                                        \
  const int *__restrict__ plan_sorted, const int *__restrict__ plan_row_start,                      \
      const int *__restrict__ plan_row_count, const int *__restrict__ plan_row_tile_start,          \
      const int *__restrict__ plan_tile_row, long long plan_seq, long long plan_batch
#define XJ_SEGMENT_PLAN \
  xj::SegmentPlan{plan_sorted, plan_row_start, plan_row_count, plan_row_tile_start, plan_tile_row, plan_seq, plan_batch}

#if defined(__CUDA_ARCH__)
XJ_DEVICE bool segment_tile(const SegmentPlan& plan, int tile, SegmentTile& out) {
  const int row = plan.tile_row[tile];
  if (row < 0) return false;
  out.row = row;
  out.count = plan.row_count[row];
  out.first = (long long)(tile - plan.row_tile_start[row]) * spec::kTilePositions;
  const long long total = plan.batch * out.count;
  out.end = out.first + spec::kTilePositions < total ? out.first + spec::kTilePositions : total;
  return true;
}

// The flattened row (b * S + s) of list position j of the tile's table row.
XJ_DEVICE long long segment_row(const SegmentPlan& plan, const SegmentTile& tile, long long j) {
  const long long b = j / tile.count;
  return b * plan.seq + plan.sorted[plan.row_start[tile.row] + (j - b * tile.count)];
}

// Stages the flattened rows of the tile's list positions in rows[j - tile.first] (and, given
// per_row, per_row[row] in per_row_out[j - tile.first]): once per block rather than by each
// thread, whose pack of columns costs less than finding the row (a division, two dependent
// loads). Every thread of the block calls it; the caller synchronises before reading.
XJ_DEVICE void stage_segment_rows(const SegmentPlan& plan, const SegmentTile& tile, long long* rows,
                                  const float* per_row = nullptr, float* per_row_out = nullptr) {
#pragma unroll 1
  for (long long j = tile.first + threadIdx.x; j < tile.end; j += blockDim.x) {
    const long long row = segment_row(plan, tile, j);
    rows[j - tile.first] = row;
    if (per_row) per_row_out[j - tile.first] = per_row[row];
  }
}
#endif

}  // namespace xj

#endif  // EXACTJIT_SEGMENT_TILES_CUH
