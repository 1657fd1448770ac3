// exactjit segment plan, host model: the plan the device builds (segment_plan.hpp), computed on
// the host in the obvious way (a stable counting sort). CPU tests pin its rules; GPU tests compare
// the device's sums against sums taken in this order.
#pragma once

#include <cstdint>
#include <vector>

namespace exactjit {

struct SegmentPlanModel {
  int64_t seq = 0, batch = 0;
  std::vector<int32_t> sorted;          ///< positions grouped by key, ascending within a key
  std::vector<int32_t> row_start;       ///< (R + 1,)
  std::vector<int32_t> row_count;       ///< (R,) per batch copy
  std::vector<int32_t> row_tile_start;  ///< (R + 1,)
  std::vector<int32_t> tile_row;        ///< (tiles,)
};

/// keys[s] in [0, R) or -1 (a bad index: in no row); B batch copies of the S positions.
SegmentPlanModel segment_plan_model(const std::vector<int64_t>& keys, int64_t table_rows, int64_t batch);

/// The flattened rows (b * S + s) of tile `tile`, in summation order.
std::vector<int64_t> segment_tile_rows(const SegmentPlanModel& plan, int64_t tile);

}  // namespace exactjit
