// exactjit launch geometry of row-wise kernels (see geometry.hpp).
#include "codegen/geometry.hpp"

#include "codegen/op_row.hpp"

namespace exactjit::codegen {

int64_t packs_per_row(const KernelSpec& spec) { return op_row(spec.op).row_chunks * spec.hidden / spec.vec; }

namespace {

// Threads for one wide row of `packs` packs (>= 128): a multiple of 32 in [128, 256] that leaves
// the fewest idle lanes on the last step; ties go to more threads.
int wide_row_threads(int64_t packs) {
  int best = 256;
  int64_t best_waste = -1;
  for (int threads = 256; threads >= 128; threads -= 32) {
    const int64_t steps = (packs + threads - 1) / threads;
    const int64_t waste = steps * threads - packs;
    if (best_waste < 0 || waste < best_waste) {
      best = threads;
      best_waste = waste;
    }
  }
  return best;
}

}  // namespace

int column_slices(const KernelSpec& spec) {
  const int64_t packs = spec.hidden / spec.vec;
  return static_cast<int>((packs + backward_threads(spec) - 1) / backward_threads(spec));
}

int backward_threads(const KernelSpec& spec) { return op_row(spec.op).threads; }

int rms_norm_row_threads(int64_t hidden) { return hidden / 4 <= 32 ? 32 : 128; }

int rms_norm_rows_per_block(int64_t hidden) { return 128 / rms_norm_row_threads(hidden); }

int backward_row_unroll(const KernelSpec& spec) { return op_row(spec.op).row_unroll; }

RowGeometry row_geometry(const KernelSpec& spec) {
  const int64_t packs = packs_per_row(spec);
  RowGeometry g;
  if (packs >= 128) {
    g.threads_per_row = wide_row_threads(packs);
    g.rows_per_block = 1;
  } else {
    int width = 1;
    while (width < packs) width *= 2;
    g.threads_per_row = width;
    g.rows_per_block = 128 / width;
  }
  const int64_t steps = (packs + g.threads_per_row - 1) / g.threads_per_row;
  g.unroll = 1;
  for (int unroll : {4, 3, 2}) {
    if (steps % unroll == 0) {
      g.unroll = unroll;
      break;
    }
  }
  return g;
}

}  // namespace exactjit::codegen
