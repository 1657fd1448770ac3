// det_linear, bf16 weights through registers (sm_80 and newer; the order: det_linear_bf16_chunk.cuh).
// Geometry (launch only, not the order): a warp owns 16 output features; each lane loads its two
// 16-byte pieces of a chunk with one load each (no L1 allocation), kDepth chunks ahead. x is cast
// once per block into shared memory (the whole of K when it fits, else kTileChunks chunks at a
// time), after the block's first weight loads are in flight; each lane reads its 16 bytes of x
// per chunk with one conflict-free shared load.
namespace det_linear {

constexpr int kWarps = spec::kWarps;
constexpr int kDepth = spec::kDepth;
constexpr int kThreads = 32 * kWarps;
// x staged per block (det_linear_geometry): all chunks when 8 rows of them fit in 44 KB of shared
// memory, else tiles of 64 chunks (then a multiple of kDepth: a tile starts a round of the pipeline).
constexpr int kTileChunks = spec::kTileChunks;
constexpr int kTiles = (kChunks + kTileChunks - 1) / kTileChunks;
constexpr int kRowVecs = kRowVecsFor<kTileChunks>;
constexpr int kMinBlocks = 4;  // per SM: 8 warps at <= 64 registers, 4 warps at <= 128
// x's vectors cast one at a time: the first kDepth chunks' weights hold the registers meanwhile.
constexpr int kStageBatch = 1;
constexpr int kRounds = kChunks / kDepth;
constexpr int kLeftover = kChunks % kDepth;

static_assert(kTiles == 1 || kTileChunks % kDepth == 0, "a tile starts a round of the pipeline");

__device__ __forceinline__ void load_chunk(Chunk& c, const xj::bf16* w_lo, const xj::bf16* w_hi, int j, int quad) {
  const int k = 32 * j + 8 * quad;
  if (chunk_in_range(j, quad)) {
    c.lo = xj::load_streamed(w_lo + k);
    c.hi = xj::load_streamed(w_hi + k);
  } else {
    c.lo = c.hi = make_uint4(0u, 0u, 0u, 0u);
  }
}

}  // namespace det_linear

extern "C" __global__ void __launch_bounds__(det_linear::kThreads, det_linear::kMinBlocks)
XJ_ENTRY(const float* __restrict__ temb, const xj::bf16* __restrict__ weight, const xj::bf16* __restrict__ bias,
         xj::bf16* __restrict__ out, float* __restrict__ pre_activation, long long rows, xj::ErrorRecord* errors) {
  using namespace det_linear;
  __shared__ uint4 xs[kRows][kRowVecs];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int group = lane / 4, quad = lane % 4;
  const long long row0 = (long long)blockIdx.y * kRows;
  const int live_rows = rows - row0 < kRows ? (int)(rows - row0) : kRows;
  const long long feature0 = ((long long)blockIdx.x * kWarps + warp) * 16;
  // A warp past the last feature (only in the last block) reads row N - 1 and stores nothing: it
  // still takes part in staging x and in the barriers.
  const long long f_lo = feature0 + group < kN ? feature0 + group : kN - 1;
  const long long f_hi = feature0 + group + 8 < kN ? feature0 + group + 8 : kN - 1;
  const xj::bf16* w_lo = weight + f_lo * kK;
  const xj::bf16* w_hi = weight + f_hi * kK;
  const float* x = temb + row0 * kK;

  // The first kDepth chunks' weights go out before x is staged, so they arrive during it.
  Chunk buf[kDepth];
#pragma unroll
  for (int d = 0; d < kDepth; ++d)
    if (d < kChunks) load_chunk(buf[d], w_lo, w_hi, d, quad);
  stage<kTileChunks, kStageBatch>(xs, x, live_rows, 0);
  __syncthreads();

  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll 1
  for (int j0 = 0; j0 < kRounds * kDepth; j0 += kDepth) {
    if (kTiles > 1 && j0 > 0 && j0 % kTileChunks == 0) {
      __syncthreads();
      stage<kTileChunks, kStageBatch>(xs, x, live_rows, j0 / kTileChunks);
      __syncthreads();
    }
#pragma unroll
    for (int d = 0; d < kDepth; ++d) {
      const int j = j0 + d;
      add_chunk(acc, buf[d], xs[group][4 * (kTiles == 1 ? j : j % kTileChunks) + quad]);
      if (j + kDepth < kChunks) load_chunk(buf[d], w_lo, w_hi, j + kDepth, quad);
    }
  }
  if (kLeftover > 0) {
    if (kTiles > 1 && (kRounds * kDepth) % kTileChunks == 0) {
      __syncthreads();
      stage<kTileChunks, kStageBatch>(xs, x, live_rows, (kRounds * kDepth) / kTileChunks);
      __syncthreads();
    }
#pragma unroll
    for (int d = 0; d < kLeftover; ++d) {
      const int j = kRounds * kDepth + d;
      add_chunk(acc, buf[d], xs[group][4 * (kTiles == 1 ? j : j % kTileChunks) + quad]);
    }
  }
  if (feature0 >= kN) return;
  store(acc, feature0, group, quad, row0, live_rows, bias, out, pre_activation);
}
