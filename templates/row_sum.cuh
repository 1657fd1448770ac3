// exactjit 128-thread row sum in PyTorch's RMSNorm order (NUMERICS.md), shared by the rms_norm
// forward and backward and the sinusoid backward: within each warp
// s = add(s, shfl_down(s, off)) for off = 16, 8, 4, 2, 1 (lane 0 keeps it), then across the four
// warps (w0 + w2) + (w1 + w3), in fp32 or fp64 (V). Every thread of the 128 must call it (it holds
// a barrier).
#ifndef EXACTJIT_ROW_SUM_CUH
#define EXACTJIT_ROW_SUM_CUH

namespace xj {

#if defined(__CUDA_ARCH__)
// warp_sums: four V of shared memory owned by this group of 128 threads. kBarrier 0: the group is
// the whole block (__syncthreads); otherwise named barrier kBarrier, which only threads 0..127
// of a larger block meet (the caller alternates warp_sums between rows it sums back to back).
template <int kBarrier = 0, typename V> XJ_DEVICE V row_sum_128(V s, V* warp_sums) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) s = add(s, __shfl_down_sync(0xFFFFFFFFu, s, offset));
  if (threadIdx.x % 32 == 0) warp_sums[(threadIdx.x % 128) / 32] = s;
  if (kBarrier == 0)
    __syncthreads();
  else
    asm volatile("bar.sync %0, 128;" ::"n"(kBarrier) : "memory");
  return add(add(warp_sums[0], warp_sums[2]), add(warp_sums[1], warp_sums[3]));
}

// The same sum for a row of kRowThreads = 128 threads or of one warp (a row of at most 32 quads):
// there PyTorch's warps 1-3 hold +0, so (w0 + w2) + (w1 + w3) is add(w0, +0), which only turns
// -0 into +0. The one-warp form holds no barrier; every lane gets the sum.
template <int kRowThreads, typename V> XJ_DEVICE V row_sum(V s, V* warp_sums) {
  static_assert(kRowThreads == 128 || kRowThreads == 32, "a row is 128 threads or one warp");
  if (kRowThreads == 128) return row_sum_128(s, warp_sums);
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) s = add(s, __shfl_down_sync(0xFFFFFFFFu, s, offset));
  return add(__shfl_sync(0xFFFFFFFFu, s, 0), V(0));
}
#endif

}  // namespace xj

#endif  // EXACTJIT_ROW_SUM_CUH
