// exactjit row slot: which row a thread of a row-per-group kernel serves (rms_norm forward and
// backward, gate_residual_rms_norm), and the checked table row its index names.
#ifndef EXACTJIT_ROW_SLOT_CUH
#define EXACTJIT_ROW_SLOT_CUH

namespace xj {

#if defined(__CUDA_ARCH__)
struct RowSlot {
  int group;      // the block's row this thread works on, 0 .. rows per block - 1
  int t;          // the thread's place in its row, 0 .. row threads - 1
  long long row;  // the global row
  long long i;    // index[row mod seq] (kIndexed), else 0; 0 on a dead row, so pointers stay in the table
  bool live;      // the row exists and its index is in range: only a live row stores
};

// A block holds kRowsPerBlock rows of kRowThreads threads. kGridIsRows: the caller trusts a grid of
// one-row blocks to be exactly the rows, so no thread checks its row (the backward); the forwards
// keep the check because ptxas allocates their registers worse without it (docs/perf-notes.md). A
// bad index is reported once per row (by its thread 0) and kills only that row: its threads still
// reach the row's barriers.
template <int kRowThreads, int kRowsPerBlock, bool kIndexed, bool kGridIsRows, typename Index>
XJ_DEVICE RowSlot row_slot(const Index* index, long long rows, long long seq, long long table_rows,
                           ErrorRecord* errors, u32 op) {
  RowSlot slot;
  constexpr bool kOneRowBlocks = kGridIsRows && kRowsPerBlock == 1;
  slot.group = kOneRowBlocks ? 0 : (int)(threadIdx.x / kRowThreads);
  slot.t = kOneRowBlocks ? (int)threadIdx.x : (int)(threadIdx.x % kRowThreads);
  slot.row = (long long)blockIdx.x * kRowsPerBlock + slot.group;
  slot.live = kOneRowBlocks || slot.row < rows;
  slot.i = 0;
  if (kIndexed && slot.live) {
    slot.i = checked_index(index, slot.row % seq, table_rows, errors, op, slot.t == 0);
    slot.live = slot.i >= 0;
    if (!slot.live) slot.i = 0;
  }
  return slot;
}
#endif

}  // namespace xj

#endif  // EXACTJIT_ROW_SLOT_CUH
