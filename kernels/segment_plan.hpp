// exactjit segment plan: how every backward that sums over positions groups them (NUMERICS.md
// "Segment sums"), built on the device with no host synchronisation.
//
// Positions s of the index (S,) are grouped by key (their table row) in ascending order; with B
// batch copies, row k's list is b = 0..B-1, each with its positions in order (the flattened rows
// b * S + s ascending). Lists are cut into tiles of kTilePositions; partial sums run per tile,
// and each row folds its tiles in order. Three kernels build it: segment_count (check and count
// keys per chunk of kChunkPositions), segment_scan (one block: prefix sums, tile tables) and
// segment_scatter (stable placement). All of it lives in the caller's workspace.
#pragma once

#include "codegen/op_row.hpp"
#include "kernels/checked_size.hpp"
#include "kernels/launch_plan.hpp"

#include <cstdint>

namespace exactjit {

/// Stable op codes (OpCode, codegen/kernel_spec.hpp).
namespace Op {
inline constexpr OpCode SegmentCount{14};
inline constexpr OpCode SegmentScan{15};
inline constexpr OpCode SegmentScatter{16};
inline constexpr OpCode SegmentFold{17};
}  // namespace Op

inline constexpr int64_t kTilePositions = 256;
inline constexpr int64_t kChunkPositions = 1024;
inline constexpr int64_t kMaxPlanTableRows = 4096;  // the per-row counters live in shared memory

/// Byte offsets of the plan's arrays (int32) inside a workspace, then of the float partials.
struct SegmentLayout {
  int64_t seq = 0, batch = 0, table_rows = 0;
  int64_t chunks = 0, max_tiles = 0;
  int64_t keys = 0, chunk_counts = 0, row_count = 0, row_start = 0, row_tile_start = 0, tile_row = 0,
          sorted = 0;
  int64_t end = 0;  ///< bytes used by the plan; partials follow, 256-byte aligned; -1: beyond 64 bits
};

/// The layout for S positions (S >= 1), B = rows / S batch copies and R table rows. A size beyond
/// 64 bits (possible only for shapes the planners refuse) makes `end` -1 and the offsets unusable.
SegmentLayout segment_layout(int64_t rows, int64_t seq, int64_t table_rows);

/// Rounds a workspace offset up to 256 bytes.
inline CheckedSize align_workspace(CheckedSize bytes) { return bytes.round_up(256); }

/// Appends the three plan launches. `first` (and `second`, for two index tensors combined as
/// first * 3 + second) are the index tensors' addresses; `first_bound` is the range of `first`
/// (R, or T for timestep indices); bad indices are reported under `report_op`.
void add_plan_launches(LaunchSequence& sequence, const SegmentLayout& layout, uint64_t workspace, int device_id,
                       IndexType index_type, uint64_t first, uint64_t second, int64_t first_bound, OpCode report_op);
/// The parameter of segment_count's launch that holds the reporting op's code.
inline constexpr int kSegmentCountReportCode = 5;

/// Pushes the seven plan parameters of a tile kernel (templates/segment_tiles.cuh).
void push_plan_params(LaunchPlan& plan, const SegmentLayout& layout, uint64_t workspace);

/// Appends the fold of `partials` (tiles x width floats) into out (R x width, dtype), one row per
/// table row of the plan (with whole_table, one row over every table row's tiles in order), or a
/// single row of `tiles` tiles when layout is null.
void add_fold_launch(LaunchSequence& sequence, const SegmentLayout* layout, uint64_t workspace, int device_id,
                     DType dtype, uint64_t partials, int64_t tiles, int64_t width, uint64_t out,
                     bool whole_table = false);

/// The rows of the segment plan's kernels (the fold's: kernels/segment_fold.hpp).
extern const OpRow kSegmentCountRow;
extern const OpRow kSegmentScanRow;
extern const OpRow kSegmentScatterRow;
/// The constant block the backward, segment-plan and fold kernels share (each template reads
/// the constants it needs).
std::string render_backward_constants(const KernelSpec& spec);
/// The same block for rms_norm's table gradients, whose tiles are segments of table rows.
std::string render_table_grad_constants(const KernelSpec& spec);

}  // namespace exactjit
