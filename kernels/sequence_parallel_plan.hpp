// exactjit sequence-parallel segment sums (issue 18): which rank computes which tile of the
// single-GPU segment plan, and which rows move to it, so that the table gradients summed over
// ranks are byte-equal to one GPU's.
//
// Rank r holds positions [start[r], start[r+1]) of every batch copy: its local rows are
// b * (start[r+1] - start[r]) + (s - start[r]), the (B, S_r, H) shard of a (B, S, H) tensor. The
// tiles are the single-GPU plan's (segment_plan_model: each table row's list, b-major then s
// ascending, cut every kTilePositions). A tile's partial is computed, in its own order, on the
// rank that holds its first row; its other rows are sent there first (an all-to-all of rows, the
// sizes known from the replicated index). The partials are then gathered (copies only) into the
// global tile order and folded as on one GPU. Built once per index layout on the host. rms_norm's
// plain weight gradient (tiles of 256 consecutive rows) is the plan of one table row: every key 0.
#pragma once

#include "kernels/segment_plan_model.hpp"

#include <llvm/Support/Error.h>

#include <cstdint>
#include <vector>

namespace exactjit {

/// One rank's share of the plan.
struct RankTiles {
  int64_t local_rows = 0;                  ///< B * its shard's positions
  std::vector<int64_t> tiles;              ///< global tile ids it computes, ascending
  std::vector<int64_t> tile_start;         ///< (tiles + 1,) offsets into `rows`
  /// The rows of its tiles in summation order, in its extended buffer: [0, local_rows) its own
  /// rows, then the received rows (source rank 0's first, each source's in its send order).
  std::vector<int64_t> rows;
  std::vector<int64_t> receive_counts;     ///< (ranks,) rows received from each rank (0 from itself)
  std::vector<std::vector<int64_t>> send;  ///< (ranks,) its local rows each rank receives, in order
};

struct SequenceParallelPlan {
  SegmentPlanModel global;            ///< the single-GPU plan
  std::vector<int64_t> shard_start;   ///< (ranks + 1,) position bounds
  std::vector<int32_t> tile_owner;    ///< (tiles,) the rank that computes each tile
  std::vector<RankTiles> ranks;
  int64_t max_tiles = 0;              ///< the most tiles one rank computes (the gather's stride)
  /// (tiles,) where global tile t's partial lies after an all-gather of every rank's partials,
  /// each padded to max_tiles: owner * max_tiles + its position in the owner's list.
  std::vector<int64_t> gathered_slot;
};

/// The plan for keys (S,) (table rows in [0, R), or -1: in no sum), B batch copies and shard
/// bounds 0 = start[0] <= start[1] <= ... <= start[ranks] = S (empty shards allowed).
llvm::Expected<SequenceParallelPlan> sequence_parallel_plan(const std::vector<int64_t>& keys, int64_t table_rows,
                                                            int64_t batch, const std::vector<int64_t>& shard_start);

}  // namespace exactjit
