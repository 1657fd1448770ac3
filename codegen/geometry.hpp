// exactjit launch geometry of row-wise kernels. It is a pure function of the spec and is baked into
// the generated source as constants, so the host launcher and the kernel always agree.
#pragma once

#include "codegen/kernel_spec.hpp"

namespace exactjit::codegen {

struct RowGeometry {
  int threads_per_row = 0;  ///< threads that share one row
  int rows_per_block = 0;   ///< rows handled by one block
  int unroll = 0;           ///< packs whose loads a thread issues before computing any of them
  int threads() const { return threads_per_row * rows_per_block; }
};

/// Packs one block row moves: H / vec (gate_residual) or 6H / vec (adaln_row_gather).
int64_t packs_per_row(const KernelSpec& spec);

/// Threads per block of a backward or segment-plan kernel (the renderer bakes the same number in).
int backward_threads(const KernelSpec& spec);
/// Column slices (grid.y) of a backward tile kernel: each thread owns one pack of a row.
int column_slices(const KernelSpec& spec);
/// Rows whose loads a thread of a backward tile kernel issues before adding any of them (added in
/// list order whatever the number, so it changes speed, never bits).
int backward_row_unroll(const KernelSpec& spec);

/// Threads that share one row of rms_norm's forward and dx: PyTorch's 128, or one warp where the
/// row has at most 32 quads (H <= 128, qk-norm's head dim), whose three other warps would only
/// add zeros (row_sum.cuh reproduces them: same bits, a quarter of the idle lanes).
int rms_norm_row_threads(int64_t hidden);
/// Rows of rms_norm's forward and dx in one 128-thread block: 128 / rms_norm_row_threads.
int rms_norm_rows_per_block(int64_t hidden);

/// One row of packs_per_row packs: wide rows get 128..256 threads chosen to leave the fewest idle
/// lanes; narrow rows share a 128-thread block.
RowGeometry row_geometry(const KernelSpec& spec);

}  // namespace exactjit::codegen
