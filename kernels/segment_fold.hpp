// exactjit segment_fold: the last step of every segment sum, and that step as an entry point of its own. Given
// fp32 tile partials computed elsewhere (another rank's tiles, in sequence parallelism: docs/
// sequence-parallel.md), it folds each table row's tiles of the index's single-GPU plan in order,
// compensated, with one rounding: the bits the op's own backward would give for those partials.
#pragma once

#include "codegen/op_row.hpp"
#include "kernels/launch_plan.hpp"

#include <dlpack/dlpack.h>
#include <llvm/Support/Error.h>

namespace exactjit {

struct SegmentFoldArgs {
  const DLTensor& partials;  ///< (P, W) float32 contiguous, P >= segment_fold_tiles: tile t's in row t
  const DLTensor& index;     ///< (S,) int32/int64: the keys the tiles were cut from, in [0, R)
  int64_t rows;              ///< M = B * S, the rows the plan covers (B batch copies)
  const DLTensor& out;       ///< (R, W) contiguous, float32/bf16/fp16
  const DLTensor* workspace; ///< uint8, segment_fold_workspace bytes
};

/// The partials' least row count for M rows, index length S and R table rows: the plan's bound
/// on its tiles (-1: invalid sizes).
int64_t segment_fold_tiles(int64_t rows, int64_t seq, int64_t table_rows);

/// Workspace bytes (the plan's arrays) for M rows, index length S, R table rows (-1: invalid).
int64_t segment_fold_workspace(int64_t rows, int64_t seq, int64_t table_rows);

llvm::Expected<LaunchSequence> plan_segment_fold(const SegmentFoldArgs& args);

/// segment_fold's row of the op table: the kernel every segment sum ends with, and this entry point.
extern const OpRow kSegmentFoldRow;

}  // namespace exactjit
