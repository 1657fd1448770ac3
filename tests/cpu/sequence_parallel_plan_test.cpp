// Sequence-parallel tile ownership (issue 18) on the host: every tile is computed once, on the
// rank holding its first row; every row a tile needs is local or received exactly once, and what
// a rank sends is what its peer expects; and, simulated rank by rank with the rows really moved,
// gate_residual's d_gate summed over ranks is byte-equal to the single-GPU host model for shard
// sizes that split segments across several ranks, leave a rank empty, or give one rank all.
#include "exactjit/exactjit.h"
#include "kernels/backward_model.hpp"
#include "kernels/segment_plan.hpp"
#include "kernels/sequence_parallel_plan.hpp"
#include "runtime/errors.hpp"
#include "templates/numerics.cuh"  // before fixed_order_sum.cuh, which it defines XJ_HD for
#include "templates/fixed_order_sum.cuh"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>

namespace exactjit {
namespace {

struct Layout {
  const char* name;
  std::vector<int64_t> keys;
  int64_t table_rows, batch;
  std::vector<int64_t> shard_start;
};

// H3-like keys: contiguous modality blocks per timestep (video, text, audio), plus random keys
// with bad ones, over shards that cut segments, an empty rank and one rank holding everything.
std::vector<Layout> layouts() {
  std::vector<Layout> out;
  std::vector<int64_t> blocks;
  for (int64_t s = 0; s < 1500; ++s) blocks.push_back(s < 1100 ? 0 : s < 1400 ? 1 : 2);
  out.push_back({"blocks, 2 ranks", blocks, 3, 2, {0, 750, 1500}});
  out.push_back({"blocks, 4 uneven ranks", blocks, 3, 1, {0, 10, 700, 1399, 1500}});
  out.push_back({"blocks, an empty rank", blocks, 3, 3, {0, 600, 600, 1500}});
  out.push_back({"blocks, one rank", blocks, 3, 2, {0, 1500}});
  out.push_back({"blocks, all on the last of 3", blocks, 3, 1, {0, 0, 0, 1500}});
  std::mt19937_64 rng(18);
  std::vector<int64_t> random(1021);
  for (int64_t& k : random) k = static_cast<int64_t>(rng() % 6) - 1;  // -1: a bad index, in no sum
  out.push_back({"random keys, 3 ranks", random, 5, 2, {0, 300, 301, 1021}});
  out.push_back({"random keys, 8 ranks", random, 5, 3, {0, 1, 100, 200, 500, 500, 900, 1020, 1021}});
  return out;
}

int64_t rank_of(const std::vector<int64_t>& start, int64_t s) {
  int64_t r = 0;
  while (start[r + 1] <= s) ++r;
  return r;
}

// Every tile computed once, on its first row's rank; every received row used once; what a rank
// sends is what its peer expects; an empty rank computes and sends nothing.
void expect_sound_ownership(const Layout& layout) {
  auto plan = sequence_parallel_plan(layout.keys, layout.table_rows, layout.batch, layout.shard_start);
  ASSERT_TRUE(static_cast<bool>(plan)) << llvm::toString(plan.takeError());
  const int64_t seq = static_cast<int64_t>(layout.keys.size());
  const int64_t ranks = static_cast<int64_t>(layout.shard_start.size()) - 1;
  const int64_t tiles = static_cast<int64_t>(plan->global.tile_row.size());
  std::vector<int> computed(static_cast<size_t>(tiles), 0);
  for (int64_t r = 0; r < ranks; ++r) {
    const RankTiles& mine = plan->ranks[r];
    EXPECT_EQ(mine.local_rows, layout.batch * (layout.shard_start[r + 1] - layout.shard_start[r]));
    EXPECT_TRUE(std::is_sorted(mine.tiles.begin(), mine.tiles.end()));
    EXPECT_LE(static_cast<int64_t>(mine.tiles.size()), plan->max_tiles);
    EXPECT_EQ(mine.receive_counts[r], 0);
    EXPECT_TRUE(mine.send[r].empty());
    int64_t received = 0;
    for (int64_t q = 0; q < ranks; ++q) {
      received += mine.receive_counts[q];
      EXPECT_EQ(static_cast<int64_t>(plan->ranks[q].send[r].size()), mine.receive_counts[q]) << r << " from " << q;
    }
    // Every id of the extended buffer is used exactly once.
    std::vector<int> used(static_cast<size_t>(mine.local_rows + received), 0);
    for (size_t i = 0; i < mine.tiles.size(); ++i) {
      const int64_t t = mine.tiles[i];
      ++computed[t];
      EXPECT_EQ(plan->tile_owner[t], r);
      EXPECT_EQ(rank_of(layout.shard_start, segment_tile_rows(plan->global, t).front() % seq), r) << "tile " << t;
      EXPECT_EQ(plan->gathered_slot[t], r * plan->max_tiles + static_cast<int64_t>(i));
      for (int64_t j = mine.tile_start[i]; j < mine.tile_start[i + 1]; ++j) ++used.at(mine.rows[j]);
    }
    // Local rows not in any of its tiles are in another rank's (they were sent), so a rank
    // uses each received row once and its own rows at most once.
    for (int64_t id = mine.local_rows; id < static_cast<int64_t>(used.size()); ++id) EXPECT_EQ(used[id], 1);
    for (int64_t id = 0; id < mine.local_rows; ++id) EXPECT_LE(used[id], 1);
    if (mine.local_rows == 0) {
      EXPECT_TRUE(mine.tiles.empty());
      for (const auto& to : mine.send) EXPECT_TRUE(to.empty());
    }
  }
  for (int64_t t = 0; t < tiles; ++t) EXPECT_EQ(computed[t], 1) << "tile " << t;
}

TEST(SequenceParallelPlan, EachTileOnceOnItsFirstRowsRankEachRowOnce) {
  for (const Layout& layout : layouts()) {
    SCOPED_TRACE(layout.name);
    expect_sound_ownership(layout);
  }
}

// Segments that span several ranks, as the issue asks: the blocks layout's first segment
// (1100 positions) is cut by each of the 4-rank layout's first two bounds, and its tiles that
// start on one rank take rows from the next.
TEST(SequenceParallelPlan, ASegmentOverSeveralRanksMovesRowsToTheTilesOwner) {
  const Layout layout = layouts()[1];
  auto plan = sequence_parallel_plan(layout.keys, layout.table_rows, layout.batch, layout.shard_start);
  ASSERT_TRUE(static_cast<bool>(plan)) << llvm::toString(plan.takeError());
  // Tile 0 holds positions 0..255: rank 0 has 0..9, rank 1 the rest, so rank 1 sends 246 rows.
  EXPECT_EQ(plan->tile_owner[0], 0);
  EXPECT_EQ(plan->ranks[0].receive_counts[1], 246);
  EXPECT_EQ(plan->ranks[1].send[0].front(), 0);  // its local row 0 = position 10
  // Tile 4 of segment 0 (positions 1024..1099) starts on rank 2 (700..1398): nothing moves.
  EXPECT_EQ(plan->tile_owner[4], 2);
}

// gate_residual's d_gate, simulated on the ranks: each holds its (B, S_r, H) shards of grad and
// y, receives the rows its tiles need (copied from the senders' shards in their send order),
// computes its tiles' partials, then the partials are gathered in global order and folded. True
// when the bytes equal the single-GPU host model's.
bool simulated_ranks_match_one_gpu(const Layout& layout, std::mt19937_64& rng) {
  using T = xj::bf16;
  constexpr int64_t H = 24;
  std::uniform_real_distribution<float> uniform(-2.0f, 2.0f);
  const int64_t seq = static_cast<int64_t>(layout.keys.size()), rows = layout.batch * seq;
  const int64_t ranks = static_cast<int64_t>(layout.shard_start.size()) - 1, table_rows = layout.table_rows;
  std::vector<T> grad(static_cast<size_t>(rows * H)), y(grad.size()), gate(static_cast<size_t>(table_rows * H));
  for (std::vector<T>* v : {&grad, &y, &gate})
    for (T& e : *v) e = xj::round_to<T>(uniform(rng));
  std::vector<T> single(static_cast<size_t>(table_rows * H));
  gate_residual_backward_model(DType::BF16, grad.data(), gate.data(), H, layout.keys, table_rows, y.data(), rows, H,
                               nullptr, single.data(), DType::BF16);

  auto plan = sequence_parallel_plan(layout.keys, table_rows, layout.batch, layout.shard_start);
  EXPECT_TRUE(static_cast<bool>(plan)) << llvm::toString(plan.takeError());
  if (!plan) return false;
  // Each rank's shards of grad and y, rows b * S_r + (s - start).
  std::vector<std::vector<T>> grad_shard(static_cast<size_t>(ranks)), y_shard(static_cast<size_t>(ranks));
  for (int64_t r = 0; r < ranks; ++r)
    for (int64_t b = 0; b < layout.batch; ++b)
      for (int64_t s = layout.shard_start[r]; s < layout.shard_start[r + 1]; ++s)
        for (int64_t j = 0; j < H; ++j) {
          grad_shard[r].push_back(grad[(b * seq + s) * H + j]);
          y_shard[r].push_back(y[(b * seq + s) * H + j]);
        }
  // The all-to-all: rank r's extended buffer is its shard, then each source's rows in order.
  auto extended = [&](std::vector<std::vector<T>>& shard, int64_t r) {
    std::vector<T> buffer = shard[r];
    for (int64_t q = 0; q < ranks; ++q)
      for (int64_t local : plan->ranks[q].send[r])
        buffer.insert(buffer.end(), shard[q].begin() + local * H, shard[q].begin() + (local + 1) * H);
    return buffer;
  };
  // Each rank's partials, padded to max_tiles, then gathered: (ranks * max_tiles, H).
  std::vector<float> gathered(static_cast<size_t>(ranks * plan->max_tiles * H), 0.0f);
  for (int64_t r = 0; r < ranks; ++r) {
    const std::vector<T> g = extended(grad_shard, r), v = extended(y_shard, r);
    const RankTiles& mine = plan->ranks[r];
    for (size_t i = 0; i < mine.tiles.size(); ++i)
      for (int64_t j = 0; j < H; ++j) {
        xj::SegmentSumFor<T>::type partial{};
        for (int64_t at = mine.tile_start[i]; at < mine.tile_start[i + 1]; ++at)
          partial.add_product(xj::to_float(g[mine.rows[at] * H + j]), xj::to_float(v[mine.rows[at] * H + j]));
        gathered[(r * plan->max_tiles + i) * H + j] = partial.value();
      }
  }
  // The fold, in global tile order, as on one GPU.
  std::vector<T> sharded(single.size());
  for (int64_t k = 0; k < table_rows; ++k)
    for (int64_t j = 0; j < H; ++j) {
      xj::CompensatedSum fold;
      for (int64_t t = plan->global.row_tile_start[k]; t < plan->global.row_tile_start[k + 1]; ++t)
        fold.add(gathered[plan->gathered_slot[t] * H + j]);
      sharded[k * H + j] = xj::round_to<T>(fold.value());
    }
  return std::memcmp(sharded.data(), single.data(), single.size() * sizeof(T)) == 0;
}

TEST(SequenceParallelPlan, SimulatedRanksGiveTheSingleGpuTableGradient) {
  std::mt19937_64 rng(3);
  for (const Layout& layout : layouts()) EXPECT_TRUE(simulated_ranks_match_one_gpu(layout, rng)) << layout.name;
}

// Random layouts: S, B, R, the rank count and the shard bounds (empty shards included) drawn at
// random, keys in runs (segments crossing shard bounds) or scattered, some bad: the ownership
// rules hold and the simulated ranks give the single-GPU bytes.
TEST(SequenceParallelPlan, RandomLayoutsGiveTheSingleGpuTableGradient) {
  std::mt19937_64 rng(1818);
  for (int trial = 0; trial < 150; ++trial) {
    Layout layout{"random", {}, static_cast<int64_t>(1 + rng() % 7), static_cast<int64_t>(1 + rng() % 3), {}};
    const int64_t seq = static_cast<int64_t>(1 + rng() % 1200);
    const bool runs = rng() % 2 == 0;
    int64_t key = 0;
    for (int64_t s = 0; s < seq; ++s) {
      if (!runs || rng() % 200 == 0) key = static_cast<int64_t>(rng() % (layout.table_rows + 1)) - 1;
      layout.keys.push_back(key);
    }
    const int64_t ranks = static_cast<int64_t>(1 + rng() % 8);
    std::vector<int64_t> bounds = {0, seq};
    for (int64_t r = 1; r < ranks; ++r) bounds.push_back(static_cast<int64_t>(rng() % (seq + 1)));
    std::sort(bounds.begin(), bounds.end());
    layout.shard_start = bounds;
    SCOPED_TRACE("trial " + std::to_string(trial));
    expect_sound_ownership(layout);
    EXPECT_TRUE(simulated_ranks_match_one_gpu(layout, rng))
        << "trial " << trial << ": S = " << seq << ", B = " << layout.batch << ", R = " << layout.table_rows
        << ", ranks = " << ranks;
  }
}

// rms_norm's plain weight gradient sums tiles of 256 consecutive rows: the plan of one table
// row with every key 0 has exactly those tiles, so its ownership is this plan's too.
TEST(SequenceParallelPlan, PlainWeightGradTilesAreTheOneRowPlans) {
  const int64_t seq = 700, batch = 3;
  auto plan = sequence_parallel_plan(std::vector<int64_t>(seq, 0), 1, batch, {0, 350, 700});
  ASSERT_TRUE(static_cast<bool>(plan)) << llvm::toString(plan.takeError());
  const int64_t tiles = (seq * batch + kTilePositions - 1) / kTilePositions;
  ASSERT_EQ(static_cast<int64_t>(plan->global.tile_row.size()), tiles);
  for (int64_t t = 0; t < tiles; ++t) {
    std::vector<int64_t> consecutive;
    for (int64_t row = t * kTilePositions; row < std::min((t + 1) * kTilePositions, seq * batch); ++row)
      consecutive.push_back(row);
    EXPECT_EQ(segment_tile_rows(plan->global, t), consecutive) << "tile " << t;
  }
}

TEST(SequenceParallelPlan, RefusesBrokenLayoutsByRule) {
  const std::vector<int64_t> keys = {0, 1, 1, 0};
  auto message = [&](std::vector<int64_t> k, int64_t table_rows, int64_t batch, std::vector<int64_t> start) {
    auto plan = sequence_parallel_plan(k, table_rows, batch, start);
    return plan ? std::string("accepted") : take_error(plan.takeError()).message;
  };
  EXPECT_EQ(message(keys, 2, 1, {0, 2, 4}), "accepted");
  EXPECT_EQ(message(keys, 2, 1, {0, 2, 3}),
            "sequence_parallel_plan: shard_start must run from 0 to S = 4 over >= 1 ranks");
  EXPECT_EQ(message(keys, 2, 1, {0, 3, 2, 4}),
            "sequence_parallel_plan: shard_start must be non-decreasing (a rank's shard may be empty)");
  EXPECT_EQ(message(keys, 1, 1, {0, 4}), "sequence_parallel_plan: keys[1] must be in [-1, 1) (got 1)");
  EXPECT_EQ(message(keys, 2, 0, {0, 4}),
            "sequence_parallel_plan: batch must be >= 1 with B * S <= 2147483647 (got B = 0, S = 4)");
  EXPECT_EQ(message({}, 2, 1, {0, 0}), "sequence_parallel_plan: keys must hold S >= 1 positions");
}


// The C ABI's one-rank view (xj_sequence_parallel_plan): sizes first, then every array the C++
// plan holds for that rank, with the sends flattened in receiver order.
TEST(SequenceParallelPlan, TheCAbiGivesEachRanksShare) {
  for (const Layout& layout : layouts()) {
    SCOPED_TRACE(layout.name);
    auto plan = sequence_parallel_plan(layout.keys, layout.table_rows, layout.batch, layout.shard_start);
    ASSERT_TRUE(static_cast<bool>(plan)) << llvm::toString(plan.takeError());
    const std::vector<long long> keys(layout.keys.begin(), layout.keys.end());
    const std::vector<long long> start(layout.shard_start.begin(), layout.shard_start.end());
    const long long ranks = static_cast<long long>(start.size()) - 1;
    for (long long r = 0; r < ranks; ++r) {
      xj_sequence_parallel_sizes sizes{};
      auto call = [&](long long* tile_start, long long* rows, long long* receive, long long* send_counts,
                      long long* send_rows, long long* slot) {
        return xj_sequence_parallel_plan(keys.data(), static_cast<long long>(keys.size()), layout.table_rows,
                                         layout.batch, start.data(), ranks, r, &sizes, tile_start, rows, receive,
                                         send_counts, send_rows, slot);
      };
      ASSERT_EQ(call(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr), XJ_OK) << xj_last_error();
      const RankTiles& mine = plan->ranks[r];
      EXPECT_EQ(sizes.tiles, static_cast<long long>(plan->gathered_slot.size()));
      EXPECT_EQ(sizes.max_tiles, plan->max_tiles);
      EXPECT_EQ(sizes.rank_tiles, static_cast<long long>(mine.tiles.size()));
      EXPECT_EQ(sizes.rank_rows, static_cast<long long>(mine.rows.size()));
      EXPECT_EQ(sizes.local_rows, mine.local_rows);
      std::vector<long long> tile_start(sizes.rank_tiles + 1), rows(sizes.rank_rows), receive(ranks),
          send_counts(ranks), send_rows(sizes.sent_rows), slot(sizes.tiles);
      ASSERT_EQ(call(tile_start.data(), rows.data(), receive.data(), send_counts.data(), send_rows.data(),
                     slot.data()),
                XJ_OK);
      std::vector<long long> sent, counts;
      for (const auto& to : mine.send) {
        counts.push_back(static_cast<long long>(to.size()));
        sent.insert(sent.end(), to.begin(), to.end());
      }
      EXPECT_EQ(tile_start, std::vector<long long>(mine.tile_start.begin(), mine.tile_start.end()));
      EXPECT_EQ(rows, std::vector<long long>(mine.rows.begin(), mine.rows.end()));
      EXPECT_EQ(receive, std::vector<long long>(mine.receive_counts.begin(), mine.receive_counts.end()));
      EXPECT_EQ(send_counts, counts);
      EXPECT_EQ(send_rows, sent);
      EXPECT_EQ(slot, std::vector<long long>(plan->gathered_slot.begin(), plan->gathered_slot.end()));
    }
  }
}

TEST(SequenceParallelPlan, TheCAbiRefusesByName) {
  const long long keys[] = {0, 1, 1, 0}, start[] = {0, 2, 4};
  xj_sequence_parallel_sizes sizes{};
  auto call = [&](const long long* k, long long seq, const long long* s, long long ranks, long long rank,
                  xj_sequence_parallel_sizes* out) {
    return xj_sequence_parallel_plan(k, seq, 2, 1, s, ranks, rank, out, nullptr, nullptr, nullptr, nullptr, nullptr,
                                     nullptr);
  };
  EXPECT_EQ(call(keys, 4, start, 2, 1, &sizes), XJ_OK);
  EXPECT_EQ(call(nullptr, 4, start, 2, 1, &sizes), XJ_ERROR_INVALID_ARGUMENT);
  EXPECT_STREQ(xj_last_error(), "sequence_parallel_plan: keys must not be NULL");
  EXPECT_EQ(call(keys, 4, start, 2, 1, nullptr), XJ_ERROR_INVALID_ARGUMENT);
  EXPECT_STREQ(xj_last_error(), "sequence_parallel_plan: sizes must not be NULL");
  EXPECT_EQ(call(keys, 4, start, 2, 2, &sizes), XJ_ERROR_INVALID_ARGUMENT);
  EXPECT_STREQ(xj_last_error(),
               "sequence_parallel_plan: needs seq >= 1, ranks >= 1 and 0 <= rank < ranks (got seq = 4, ranks = 2, "
               "rank = 2)");
  const long long short_start[] = {0, 2, 3};
  EXPECT_EQ(call(keys, 4, short_start, 2, 0, &sizes), XJ_ERROR_INVALID_ARGUMENT);
  EXPECT_STREQ(xj_last_error(), "sequence_parallel_plan: shard_start must run from 0 to S = 4 over >= 1 ranks");
}

}  // namespace
}  // namespace exactjit
