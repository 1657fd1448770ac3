// Segment plan, step 1 of 3 (kernels/segment_plan.hpp): one block per chunk of kChunkPositions
// positions. Each position's key (its table row) is checked and written to keys[s] (-1 when
// bad, which is reported and leaves the position out of every sum); the chunk's keys are counted
// per table row. kKeyTensors is the number of index tensors: 1 (key = index[s]) or 2 (key =
// timestep[s] * 3 + tag[s], adaln_row_gather; each is checked before they are combined, so a huge
// timestep cannot wrap to a valid row). Integer counts: the order of the shared atomics does not
// change them.
namespace segment_count {
typedef xj::IndexOf<spec::kIndexBytes>::type Index;
constexpr int kThreads = 256;
constexpr unsigned kSecondArgument = 1u << 16;  // error record: the op's second index argument
}  // namespace segment_count

extern "C" __global__ void __launch_bounds__(segment_count::kThreads)
XJ_ENTRY(const segment_count::Index* __restrict__ first, const segment_count::Index* __restrict__ second,
         long long seq, long long table_rows, long long first_bound, unsigned report_op, int* __restrict__ keys,
         int* __restrict__ chunk_counts, xj::ErrorRecord* errors) {
  using namespace segment_count;
  __shared__ int counts[spec::kMaxTableRows];
  for (int k = threadIdx.x; k < table_rows; k += kThreads) counts[k] = 0;
  __syncthreads();
  const long long begin = (long long)blockIdx.x * spec::kChunkPositions;
  const long long end = begin + spec::kChunkPositions < seq ? begin + spec::kChunkPositions : seq;
  for (long long s = begin + threadIdx.x; s < end; s += kThreads) {
    long long key = -1;
    const long long a = (long long)first[s];
    if (a < 0 || a >= first_bound) {
      xj::report_bad_index(errors, report_op, s, a, first_bound);
    } else if (spec::kKeyTensors == 1) {
      key = a;
    } else {
      const long long tag = (long long)second[s];
      if (tag < 0 || tag >= 3) {
        xj::report_bad_index(errors, report_op | kSecondArgument, s, tag, 3);
      } else {
        key = a * 3 + tag;
      }
    }
    keys[s] = (int)key;
    if (key >= 0) atomicAdd(&counts[key], 1);
  }
  __syncthreads();
  for (int k = threadIdx.x; k < table_rows; k += kThreads) chunk_counts[(long long)blockIdx.x * table_rows + k] = counts[k];
}
