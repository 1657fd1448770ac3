// Segment plan, step 3 of 3: one block per chunk writes the chunk's positions into the sorted
// list, stable: rounds of 256 positions in order; inside a round, warps in order (a barrier
// between them); inside a warp, the lanes of one key (__match_any_sync) take consecutive slots
// in lane order. So each row's positions come out in ascending order whatever the schedule.
namespace segment_scatter {
constexpr int kThreads = 256;
}  // namespace segment_scatter

extern "C" __global__ void __launch_bounds__(segment_scatter::kThreads)
XJ_ENTRY(const int* __restrict__ keys, long long seq, long long table_rows, const int* __restrict__ chunk_base,
         const int* __restrict__ row_start, int* __restrict__ sorted, xj::ErrorRecord* errors) {
  using namespace segment_scatter;
  __shared__ int next[spec::kMaxTableRows];
  for (long long k = threadIdx.x; k < table_rows; k += kThreads)
    next[k] = row_start[k] + chunk_base[(long long)blockIdx.x * table_rows + k];
  __syncthreads();
  const int warp = threadIdx.x / 32;
  const unsigned lane = threadIdx.x % 32;
  const long long begin = (long long)blockIdx.x * spec::kChunkPositions;
  const long long end = begin + spec::kChunkPositions < seq ? begin + spec::kChunkPositions : seq;
  for (long long round = begin; round < end; round += kThreads) {
    const long long s = round + threadIdx.x;
    const int key = s < end ? keys[s] : -1;
    const unsigned peers = __match_any_sync(0xFFFFFFFFu, key);
    const int leader = __ffs(peers) - 1;
    const int rank = __popc(peers & ((1u << lane) - 1u));
    for (int w = 0; w < kThreads / 32; ++w) {
      if (warp == w) {
        const int base = __shfl_sync(peers, lane == (unsigned)leader && key >= 0 ? next[key] : 0, leader);
        if (key >= 0) {
          sorted[base + rank] = (int)s;
          if (lane == (unsigned)leader) next[key] = base + __popc(peers);
        }
      }
      __syncthreads();
    }
  }
}
