// exactjit device error record: how a kernel reports a bad index without a trap.
//
// A trap (or assert) would poison the CUDA context for every later call; instead the first
// offending thread claims the record (in device memory, one per stream) with a compare-and-swap,
// fills in what it saw and copies it to the record's host-mapped mirror, `claimed` last behind a
// system-scope fence, so the host sees a complete report without synchronising and names the op
// at the next exactjit call on the stream. The layout is shared with runtime/device_errors.hpp
// (host side): keep the two in step.
#ifndef EXACTJIT_ERROR_RECORD_CUH
#define EXACTJIT_ERROR_RECORD_CUH

namespace xj {

struct ErrorRecord {
  u32 claimed;      // 0 = no error; set to 1 by the first reporter
  u32 op;           // which op (kernels/catalog op code)
  long long position;  // the position of the bad index in the index tensor
  long long value;     // the index value read
  long long bound;     // valid range is [0, bound)
  ErrorRecord* mirror;  // the host-mapped copy the report goes to (device address), or null
};

#if defined(__CUDA_ARCH__)
XJ_DEVICE void report_bad_index(ErrorRecord* record, u32 op, long long position, long long value,
                                long long bound) {
  u32 previous;
  asm volatile("atom.global.cas.b32 %0, [%1], 0, 1;" : "=r"(previous) : "l"(&record->claimed) : "memory");
  ErrorRecord* mirror = record->mirror;
  if (previous == 0u && mirror != nullptr) {  // the device record only holds the claim
    mirror->op = op;
    mirror->position = position;
    mirror->value = value;
    mirror->bound = bound;
    asm volatile("membar.sys;" ::: "memory");  // the fields reach the host before `claimed`
    asm volatile("st.volatile.global.u32 [%0], 1;" ::"l"(&mirror->claimed) : "memory");
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
