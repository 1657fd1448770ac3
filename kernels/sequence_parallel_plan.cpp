// exactjit sequence-parallel segment sums (see sequence_parallel_plan.hpp).
#include "kernels/sequence_parallel_plan.hpp"

#include "runtime/errors.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <climits>

namespace exactjit {
namespace {

llvm::Error refuse(const std::string& rule) {
  return make_error(ErrorCode::InvalidArgument, "sequence_parallel_plan: " + rule);
}

llvm::Error check_arguments(const std::vector<int64_t>& keys, int64_t table_rows, int64_t batch,
                            const std::vector<int64_t>& shard_start) {
  const int64_t seq = static_cast<int64_t>(keys.size());
  if (seq < 1) return refuse("keys must hold S >= 1 positions");
  if (table_rows < 1) return refuse(fmt::format("table_rows must be >= 1 (got {})", table_rows));
  if (batch < 1 || batch > INT32_MAX / seq)
    return refuse(fmt::format("batch must be >= 1 with B * S <= {} (got B = {}, S = {})", INT32_MAX, batch, seq));
  for (int64_t s = 0; s < seq; ++s)
    if (keys[s] < -1 || keys[s] >= table_rows)
      return refuse(fmt::format("keys[{}] must be in [-1, {}) (got {})", s, table_rows, keys[s]));
  if (shard_start.size() < 2 || shard_start.front() != 0 || shard_start.back() != seq)
    return refuse(fmt::format("shard_start must run from 0 to S = {} over >= 1 ranks", seq));
  if (!std::is_sorted(shard_start.begin(), shard_start.end()))
    return refuse("shard_start must be non-decreasing (a rank's shard may be empty)");
  return llvm::Error::success();
}

}  // namespace

llvm::Expected<SequenceParallelPlan> sequence_parallel_plan(const std::vector<int64_t>& keys, int64_t table_rows,
                                                            int64_t batch, const std::vector<int64_t>& shard_start) {
  if (auto err = check_arguments(keys, table_rows, batch, shard_start)) return err;
  SequenceParallelPlan plan;
  plan.global = segment_plan_model(keys, table_rows, batch);
  plan.shard_start = shard_start;
  const int64_t seq = plan.global.seq;
  const int64_t ranks = static_cast<int64_t>(shard_start.size()) - 1;
  // The rank holding position s: the last shard starting at or before it (empty shards skipped).
  auto rank_of = [&](int64_t s) {
    return static_cast<int64_t>(std::upper_bound(shard_start.begin(), shard_start.end(), s) - shard_start.begin()) - 1;
  };
  auto local_row = [&](int64_t row, int64_t rank) {
    const int64_t b = row / seq, s = row % seq;
    return b * (shard_start[rank + 1] - shard_start[rank]) + (s - shard_start[rank]);
  };

  plan.ranks.resize(static_cast<size_t>(ranks));
  for (int64_t r = 0; r < ranks; ++r) {
    RankTiles& mine = plan.ranks[r];
    mine.local_rows = batch * (shard_start[r + 1] - shard_start[r]);
    mine.tile_start = {0};
    mine.receive_counts.assign(static_cast<size_t>(ranks), 0);
    mine.send.resize(static_cast<size_t>(ranks));
  }
  // First pass: owners, and each owned tile's rows as local ids or, for a row held elsewhere, as
  // -(1 + its place among the rows received from its source) with the source noted beside it.
  const int64_t tiles = static_cast<int64_t>(plan.global.tile_row.size());
  std::vector<std::vector<int64_t>> row_source(static_cast<size_t>(ranks));
  plan.tile_owner.resize(static_cast<size_t>(tiles));
  for (int64_t t = 0; t < tiles; ++t) {
    const std::vector<int64_t> rows = segment_tile_rows(plan.global, t);
    const int64_t owner = rank_of(rows.front() % seq);
    plan.tile_owner[t] = static_cast<int32_t>(owner);
    RankTiles& mine = plan.ranks[owner];
    mine.tiles.push_back(t);
    for (int64_t row : rows) {
      const int64_t holder = rank_of(row % seq);
      if (holder == owner) {
        mine.rows.push_back(local_row(row, owner));
        row_source[owner].push_back(-1);
        continue;
      }
      mine.rows.push_back(-(1 + mine.receive_counts[holder]++));
      row_source[owner].push_back(holder);
      plan.ranks[holder].send[owner].push_back(local_row(row, holder));
    }
    mine.tile_start.push_back(static_cast<int64_t>(mine.rows.size()));
  }
  // Second pass: received rows follow the local ones, grouped by source rank in rank order (as
  // an all-to-all delivers them).
  for (int64_t r = 0; r < ranks; ++r) {
    RankTiles& mine = plan.ranks[r];
    std::vector<int64_t> source_offset(static_cast<size_t>(ranks), mine.local_rows);
    for (int64_t q = 1; q < ranks; ++q) source_offset[q] = source_offset[q - 1] + mine.receive_counts[q - 1];
    for (size_t i = 0; i < mine.rows.size(); ++i)
      if (row_source[r][i] >= 0) mine.rows[i] = source_offset[row_source[r][i]] + (-mine.rows[i] - 1);
    plan.max_tiles = std::max(plan.max_tiles, static_cast<int64_t>(mine.tiles.size()));
  }
  plan.gathered_slot.resize(static_cast<size_t>(tiles));
  for (int64_t r = 0; r < ranks; ++r)
    for (size_t i = 0; i < plan.ranks[r].tiles.size(); ++i)
      plan.gathered_slot[plan.ranks[r].tiles[i]] = r * plan.max_tiles + static_cast<int64_t>(i);
  return plan;
}

}  // namespace exactjit
