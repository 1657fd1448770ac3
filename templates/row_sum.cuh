// exactjit 128-thread row sum in PyTorch's RMSNorm order (NUMERICS.md), shared by the rms_norm
// forward and backward and the sinusoid backward: within each warp
// s = add(s, shfl_down(s, off)) for off = 16, 8, 4, 2, 1 (lane 0 keeps it), then across the four
// warps (w0 + w2) + (w1 + w3), in fp32 or fp64 (V). Every thread of the 128 must call it (it holds
// a barrier).
#ifndef EXACTJIT_ROW_SUM_CUH
#define EXACTJIT_ROW_SUM_CUH

namespace xj {

#if defined(__CUDA_ARCH__)
// warp_sums: four V of shared memory owned by this group of 128 threads.
template <typename V> XJ_DEVICE V row_sum_128(V s, V* warp_sums) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) s = add(s, __shfl_down_sync(0xFFFFFFFFu, s, offset));
  if (threadIdx.x % 32 == 0) warp_sums[(threadIdx.x % 128) / 32] = s;
  __syncthreads();
  return add(add(warp_sums[0], warp_sums[2]), add(warp_sums[1], warp_sums[3]));
}
#endif

}  // namespace xj

#endif  // EXACTJIT_ROW_SUM_CUH
