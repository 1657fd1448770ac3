// exactjit launch geometry of row-wise kernels (see geometry.hpp).
#include "codegen/geometry.hpp"

namespace exactjit::codegen {

int64_t packs_per_row(const KernelSpec& spec) {
  const int64_t elements = spec.op == Op::AdalnRowGather ? 6 * spec.hidden : spec.hidden;
  return elements / spec.vec;
}

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
  const int64_t packs = spec.op == Op::RmsNormTableGrad || spec.op == Op::RmsNormWeightGrad ? spec.hidden / 4
                                                                                             : spec.hidden / spec.vec;
  return static_cast<int>((packs + backward_threads(spec) - 1) / backward_threads(spec));
}

int backward_threads(const KernelSpec& spec) {
  switch (spec.op) {
    case Op::GateResidualBackward:
    case Op::AdalnRowGatherBackward:
    case Op::RmsNormTableGrad:
    case Op::RmsNormWeightGrad: return 128;  // one pack per thread; column slices on grid.y
    case Op::RmsNormBackward:
    case Op::TimestepSinusoidBackward: return 128;
    default: return 256;  // segment plan and fold
  }
}

int backward_row_unroll(const KernelSpec& spec) {
  // A tile is one block's serial walk over up to kTilePositions rows; at small S there are few
  // tiles. 8 rows of 16-byte packs help there and cost nothing at large S; 16 rows in the rms_norm
  // parameter tiles cost more at large S (160 registers, fewer blocks per SM) than they gained
  // at small S, so those keep 4 (docs/perf-notes.md, backward v3).
  switch (spec.op) {
    case Op::GateResidualBackward:
    case Op::AdalnRowGatherBackward: return 8;
    case Op::RmsNormTableGrad:
    case Op::RmsNormWeightGrad: return 4;
    default: return 1;
  }
}

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
