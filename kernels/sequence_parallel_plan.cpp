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
    mine.send.resize(static_cast<size_t>(ranks));
  }
  // First pass: each tile's owner, and what every holder of one of its other rows sends it.
  const int64_t tiles = static_cast<int64_t>(plan.global.tile_row.size());
  plan.tile_owner.resize(static_cast<size_t>(tiles));
  for (int64_t t = 0; t < tiles; ++t) {
    const std::vector<int64_t> rows = segment_tile_rows(plan.global, t);
    const int64_t owner = rank_of(rows.front() % seq);
    plan.tile_owner[t] = static_cast<int32_t>(owner);
    plan.ranks[owner].tiles.push_back(t);
    for (int64_t row : rows)
      if (const int64_t holder = rank_of(row % seq); holder != owner)
        plan.ranks[holder].send[owner].push_back(local_row(row, holder));
  }
  // Received rows follow the local ones, grouped by source rank in rank order (as an all-to-all
  // delivers them), each source's in its send order.
  std::vector<std::vector<int64_t>> next_received(static_cast<size_t>(ranks));
  for (int64_t r = 0; r < ranks; ++r) {
    RankTiles& mine = plan.ranks[r];
    int64_t at = mine.local_rows;
    for (int64_t q = 0; q < ranks; ++q) {
      mine.receive_counts.push_back(static_cast<int64_t>(plan.ranks[q].send[r].size()));
      next_received[r].push_back(at);
      at += mine.receive_counts.back();
    }
    plan.max_tiles = std::max(plan.max_tiles, static_cast<int64_t>(mine.tiles.size()));
  }
  // Second pass: each owned tile's rows in summation order, in its owner's extended buffer.
  for (int64_t t = 0; t < tiles; ++t) {
    const int64_t owner = plan.tile_owner[t];
    RankTiles& mine = plan.ranks[owner];
    for (int64_t row : segment_tile_rows(plan.global, t)) {
      const int64_t holder = rank_of(row % seq);
      mine.rows.push_back(holder == owner ? local_row(row, owner) : next_received[owner][holder]++);
    }
    mine.tile_start.push_back(static_cast<int64_t>(mine.rows.size()));
  }
  plan.gathered_slot.resize(static_cast<size_t>(tiles));
  for (int64_t r = 0; r < ranks; ++r)
    for (size_t i = 0; i < plan.ranks[r].tiles.size(); ++i)
      plan.gathered_slot[plan.ranks[r].tiles[i]] = r * plan.max_tiles + static_cast<int64_t>(i);
  return plan;
}

}  // namespace exactjit
