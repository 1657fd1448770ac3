// exactjit segment plan, host model (see segment_plan_model.hpp).
#include "kernels/segment_plan_model.hpp"

#include "kernels/segment_plan.hpp"

#include <algorithm>

namespace exactjit {

SegmentPlanModel segment_plan_model(const std::vector<int64_t>& keys, int64_t table_rows, int64_t batch) {
  SegmentPlanModel plan;
  plan.seq = static_cast<int64_t>(keys.size());
  plan.batch = batch;
  plan.row_count.assign(static_cast<size_t>(table_rows), 0);
  for (int64_t key : keys)
    if (key >= 0) ++plan.row_count[static_cast<size_t>(key)];
  plan.row_start.assign(static_cast<size_t>(table_rows + 1), 0);
  plan.row_tile_start.assign(static_cast<size_t>(table_rows + 1), 0);
  for (int64_t k = 0; k < table_rows; ++k) {
    plan.row_start[k + 1] = plan.row_start[k] + plan.row_count[k];
    const int64_t tiles = (batch * plan.row_count[k] + kTilePositions - 1) / kTilePositions;
    plan.row_tile_start[k + 1] = static_cast<int32_t>(plan.row_tile_start[k] + tiles);
    for (int64_t t = 0; t < tiles; ++t) plan.tile_row.push_back(static_cast<int32_t>(k));
  }
  plan.sorted.assign(static_cast<size_t>(plan.row_start[table_rows]), 0);
  std::vector<int32_t> next(plan.row_start.begin(), plan.row_start.end() - 1);
  for (int64_t s = 0; s < plan.seq; ++s)
    if (keys[s] >= 0) plan.sorted[next[keys[s]]++] = static_cast<int32_t>(s);
  return plan;
}

std::vector<int64_t> segment_tile_rows(const SegmentPlanModel& plan, int64_t tile) {
  const int64_t k = plan.tile_row[tile];
  const int64_t count = plan.row_count[k];
  const int64_t first = (tile - plan.row_tile_start[k]) * kTilePositions;
  const int64_t end = std::min(first + kTilePositions, plan.batch * count);
  std::vector<int64_t> rows;
  for (int64_t j = first; j < end; ++j) {
    const int64_t b = j / count;
    rows.push_back(b * plan.seq + plan.sorted[plan.row_start[k] + (j - b * count)]);
  }
  return rows;
}

}  // namespace exactjit
