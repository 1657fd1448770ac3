// exactjit device error record: how a kernel reports a bad index without a trap.
//
// A trap (or assert) would poison the CUDA context for every later call; instead the first
// offending thread claims the record with a compare-and-swap and fills in what it saw, and the
// host reads the record at the next synchronisation point and reports it with the op's name.
// The layout is shared with runtime/device_errors.cpp (host side): keep the two in step.
#ifndef EXACTJIT_ERROR_RECORD_CUH
#define EXACTJIT_ERROR_RECORD_CUH

namespace xj {

struct ErrorRecord {
  u32 claimed;      // 0 = no error; set to 1 by the first reporter
  u32 op;           // which op (kernels/catalog op code)
  long long position;  // the position of the bad index in the index tensor
  long long value;     // the index value read
  long long bound;     // valid range is [0, bound)
};

#if defined(__CUDA_ARCH__)
XJ_DEVICE void report_bad_index(ErrorRecord* record, u32 op, long long position, long long value,
                                long long bound) {
  u32 previous;
  asm volatile("atom.global.cas.b32 %0, [%1], 0, 1;" : "=r"(previous) : "l"(&record->claimed) : "memory");
  if (previous == 0u) {
    record->op = op;
    record->position = position;
    record->value = value;
    record->bound = bound;
  }
}

// index[position] when it lies in [0, bound); otherwise -1, reported when `report` (one thread
// of the group that shares the index reports it).
template <typename Index>
XJ_DEVICE long long checked_index(const Index* index, long long position, long long bound, ErrorRecord* errors, u32 op,
                                  bool report) {
  const long long i = (long long)index[position];
  if (i >= 0 && i < bound) return i;
  if (report) report_bad_index(errors, op, position, i, bound);
  return -1;
}
#endif

}  // namespace xj

#endif  // EXACTJIT_ERROR_RECORD_CUH
