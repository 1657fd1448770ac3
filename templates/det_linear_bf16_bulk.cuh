// det_linear, bf16 weights through shared memory by bulk copies (cp.async.bulk, the Tensor Memory
// Accelerator; sm_90 and sm_100). The order is det_linear_bf16_chunk.cuh's, so the results are the
// bits of det_linear_bf16.cuh; only the way the weights arrive differs.
// Geometry (launch only, not the order; docs/det_linear.md): persistent blocks, one per SM, of
// blockDim.x / 32 warps. The 16-feature tasks t = 0, 1, ... go to warps round robin, warp id
// w = warp * gridDim.x + block first, so the last round of tasks spreads over every SM. A warp
// streams its tasks' weights as one sequence of stages, each kStageChunks chunks of its 16 feature
// rows (16 bulk copies of up to 64 * kStageChunks contiguous bytes, one per lane 0..15), through a
// ring of kStages slots with one mbarrier each: the refill of a slot goes out as soon as the warp
// has read it, so it runs on into the next task. x is cast once per block, while the first stages
// are in flight. Dynamic shared memory: x (8 rows x kRowVecs 16-byte vectors), then each warp's
// ring, then the ring barriers.
namespace det_linear {

constexpr int kStageChunks = spec::kStageChunks;
constexpr int kStages = spec::kStages;
constexpr int kTaskStages = (kChunks + kStageChunks - 1) / kStageChunks;
constexpr long long kTasks = (kN + 15) / 16;
constexpr int kRowVecs = kRowVecsFor<kChunks>;
// x's vectors cast 8 at a time per thread (64 registers of loads; the kernel may use 255): a
// block's cast of 8 rows is then two L2 round trips, hidden behind the ring's first stages.
constexpr int kStageBatch = 8;
constexpr int kXBytes = kRows * kRowVecs * 16;
// A feature's bytes in a slot: 64 * kStageChunks with kStageChunks odd, so 64 (mod 128): the rows
// g and g + 1 a quarter warp reads fall in opposite halves of the 32 banks.
constexpr int kFeatureBytes = 64 * kStageChunks;
constexpr int kSlotBytes = 16 * kFeatureBytes;
static_assert(kStageChunks % 2 == 1, "a feature's slot bytes are 64 (mod 128)");

// The first feature of the task that stage i of warp warp_id's sequence belongs to.
__device__ __forceinline__ long long task_feature0(int i, long long warp_id, long long warp_count) {
  return 16 * (warp_id + (long long)(i / kTaskStages) * warp_count);
}

// Issues stage i of the warp's sequence into slot i % kStages: task i / kTaskStages of the warp,
// chunks kStageChunks * (i % kTaskStages) on. Features past N repeat row N - 1 (never stored).
__device__ __forceinline__ void issue(int i, long long warp_id, long long warp_count, const xj::bf16* weight,
                                      xj::u32 ring, xj::u32 barriers, int lane) {
  const long long feature0 = task_feature0(i, warp_id, warp_count);
  const int k0 = 32 * kStageChunks * (i % kTaskStages);
  const int bytes = 2 * (kK - k0 < 32 * kStageChunks ? kK - k0 : 32 * kStageChunks);
  const xj::u32 barrier = barriers + 8 * (i % kStages);
  if (lane == 0) xj::expect_bytes(barrier, 16 * bytes);
  __syncwarp();
  if (lane < 16) {
    const long long f = feature0 + lane < kN ? feature0 + lane : kN - 1;
    xj::bulk_copy(ring + (i % kStages) * kSlotBytes + lane * kFeatureBytes, weight + f * kK + k0, bytes, barrier);
  }
}

}  // namespace det_linear

extern "C" __global__ void __launch_bounds__(256, 1)
XJ_ENTRY(const float* __restrict__ temb, const xj::bf16* __restrict__ weight, const xj::bf16* __restrict__ bias,
         xj::bf16* __restrict__ out, float* __restrict__ pre_activation, long long rows, xj::ErrorRecord* errors) {
  using namespace det_linear;
  extern __shared__ uint4 shared[];
  const int warps = blockDim.x / 32, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int group = lane / 4, quad = lane % 4;
  const long long row0 = (long long)blockIdx.y * kRows;
  const int live_rows = rows - row0 < kRows ? (int)(rows - row0) : kRows;
  const long long warp_id = (long long)warp * gridDim.x + blockIdx.x, warp_count = (long long)warps * gridDim.x;
  const int stages = warp_id < kTasks ? (int)((kTasks - 1 - warp_id) / warp_count + 1) * kTaskStages : 0;

  auto xs = reinterpret_cast<uint4 (*)[kRowVecs]>(shared);
  const char* ring_of_warp = reinterpret_cast<const char*>(shared) + kXBytes + warp * kStages * kSlotBytes;
  const xj::u32 ring = xj::shared_address(ring_of_warp);
  const xj::u32 barriers = xj::shared_address(reinterpret_cast<const char*>(shared) + kXBytes +
                                          warps * kStages * kSlotBytes) + 8 * kStages * warp;
  if (lane == 0) {
    for (int s = 0; s < kStages; ++s) xj::init_barrier(barriers + 8 * s);
    xj::fence_barrier_init();
  }
  __syncwarp();
  for (int i = 0; i < kStages && i < stages; ++i) issue(i, warp_id, warp_count, weight, ring, barriers, lane);
  stage<kChunks, kStageBatch>(xs, temb + row0 * kK, live_rows, 0);
  __syncthreads();

  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll 1
  for (int i = 0; i < stages; ++i) {
    const int s = i % kTaskStages;
    xj::wait_barrier(barriers + 8 * (i % kStages), (i / kStages) & 1);
    const char* slot = ring_of_warp + (i % kStages) * kSlotBytes;
    const uint4* lo = reinterpret_cast<const uint4*>(slot + group * kFeatureBytes) + quad;
    const uint4* hi = reinterpret_cast<const uint4*>(slot + (group + 8) * kFeatureBytes) + quad;
#pragma unroll
    for (int c = 0; c < kStageChunks; ++c) {
      const int j = kStageChunks * s + c;
      if (j < kChunks) {
        Chunk chunk;
        const bool in_range = chunk_in_range(j, quad);
        chunk.lo = in_range ? lo[4 * c] : make_uint4(0u, 0u, 0u, 0u);
        chunk.hi = in_range ? hi[4 * c] : make_uint4(0u, 0u, 0u, 0u);
        add_chunk(acc, chunk, xs[group][4 * j + quad]);
      }
    }
    __syncwarp();  // every lane has read the slot: it can be refilled
    if (i + kStages < stages) issue(i + kStages, warp_id, warp_count, weight, ring, barriers, lane);
    if (s == kTaskStages - 1) {
      store(acc, task_feature0(i, warp_id, warp_count), group, quad, row0, live_rows, bias, out, pre_activation);
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[e] = 0.0f;
    }
  }
}
