// exactjit sequence-parallel segment sums (see sequence_parallel_plan.hpp).
#include "kernels/sequence_parallel_plan.hpp"

#include "api/c_entry.hpp"
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

namespace {
// Copies `from` into a caller's array, when the caller gave one.
void copy_out(const std::vector<int64_t>& from, long long* to) {
  if (to) std::copy(from.begin(), from.end(), to);
}
}  // namespace

extern "C" exactjit_status_t xj_sequence_parallel_plan(const long long* keys, long long seq, long long table_rows,
                                                       long long batch, const long long* shard_start,
                                                       long long ranks, long long rank,
                                                       xj_sequence_parallel_sizes* sizes, long long* tile_start,
                                                       long long* rows, long long* receive_counts,
                                                       long long* send_counts, long long* send_rows,
                                                       long long* gathered_slot) {
  using exactjit::c_abi::fail;
  constexpr const char* kName = "sequence_parallel_plan";
  if (!keys || !shard_start || !sizes)
    return fail(XJ_ERROR_INVALID_ARGUMENT,
                fmt::format("{}: {} must not be NULL", kName, !keys ? "keys" : !shard_start ? "shard_start" : "sizes"));
  if (seq < 1 || ranks < 1 || rank < 0 || rank >= ranks)
    return fail(XJ_ERROR_INVALID_ARGUMENT,
                fmt::format("{}: needs seq >= 1, ranks >= 1 and 0 <= rank < ranks "
                            "(got seq = {}, ranks = {}, rank = {})",
                            kName, seq, ranks, rank));
  auto plan = exactjit::sequence_parallel_plan(std::vector<int64_t>(keys, keys + seq), table_rows, batch,
                                               std::vector<int64_t>(shard_start, shard_start + ranks + 1));
  if (!plan) {
    exactjit::ErrorReport report = exactjit::take_error(plan.takeError());
    return fail(static_cast<exactjit_status_t>(report.code), std::move(report.message));
  }
  const exactjit::RankTiles& mine = plan->ranks[static_cast<size_t>(rank)];
  std::vector<int64_t> counts, sent;
  for (const std::vector<int64_t>& to : mine.send) {
    counts.push_back(static_cast<int64_t>(to.size()));
    sent.insert(sent.end(), to.begin(), to.end());
  }
  *sizes = {static_cast<long long>(plan->gathered_slot.size()), plan->max_tiles,
            static_cast<long long>(mine.tiles.size()), static_cast<long long>(mine.rows.size()),
            mine.local_rows, static_cast<long long>(sent.size())};
  copy_out(mine.tile_start, tile_start);
  copy_out(mine.rows, rows);
  copy_out(mine.receive_counts, receive_counts);
  copy_out(counts, send_counts);
  copy_out(sent, send_rows);
  copy_out(plan->gathered_slot, gathered_slot);
  exactjit::c_abi::last_error.clear();
  return XJ_OK;
}
