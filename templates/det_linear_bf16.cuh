// det_linear, bf16 weights on tensor cores (NUMERICS.md "det_linear"; docs/det_linear.md):
//   out[t, n] = rT(add(acc[t, n], b[n])),  x[t, k] = rT(silu(temb[t, k])) (kSilu) or rT(temb[t, k])
// acc[t, n]: K is cut into 32-wide chunks j = 0, 1, ... (the last one 16 wide when K % 32 == 16;
// its missing half contributes zeros); chunk j holds two permuted 16-wide groups
//   G(j, h) = { 32j + 8q + 4h + r : q = 0..3, r = 0..3 },  h = 0, 1
// (the first and the second half of each 8-wide run), and for j ascending, h = 0 then 1:
//   c = mma.m16n8k16(W[n, G(j, h)], x[t, G(j, h)]) started from zero, then acc = add(acc, c)
// in fp32. Inside the mma, slot 2q + i (i = 0, 1) holds k = 32j + 8q + 4h + i and slot 2q + 8 + i
// holds k = 32j + 8q + 4h + 2 + i, for both the weights (A) and x (B). A row's result depends on
// its own x only (the mma's columns are independent), so it does not change with how many rows
// run with it, and it repeats bit for bit.
// Geometry (launch only, not the order): a warp task is 8 output features (rows 0..7 of the mma's
// M; rows 8..15 of A are zero and loaded from nowhere) for up to 8 rows (the mma's N), over the
// whole of K. Lane (g = lane / 4, q = lane % 4) loads the 16 bytes W[f, 32j + 8q .. 8q + 7] of
// feature f = 8 * task + g with one load (no L1 allocation). Warps take tasks in a fixed static
// order, warp w of block b the tasks w + kWarps * b + kWarps * gridDim.x * i, i = 0, 1, ... (the
// grid, det_linear_geometry's tasks_per_warp, makes the 18H projection one resident wave on an
// H200), and stream them as one sequence of chunks with kDepth chunks in flight: the refill after
// a task's last chunks already loads the next task's first ones. x is cast once per block into
// shared memory (the whole of K when it fits, else kTileChunks chunks at a time, and then every
// warp of a block walks the same number of tasks so the barriers match), after the block's first
// weight loads are in flight; each lane reads its 16 bytes of x per chunk with one conflict-free
// shared load.
namespace det_linear {

constexpr int kK = spec::kInFeatures;
constexpr long long kN = spec::kOutFeatures;
constexpr int kRows = 8;  // the mma's N
constexpr int kFeatures = 8;  // per warp task: rows 0..7 of the mma's M
constexpr int kWarps = spec::kWarps;
constexpr int kDepth = spec::kDepth;
constexpr int kThreads = 32 * kWarps;
constexpr int kChunks = (kK + 31) / 32;
constexpr bool kHalfChunk = kK % 32 != 0;  // the last chunk is 16 wide
constexpr long long kTasks = (kN + kFeatures - 1) / kFeatures;
// x staged per block (det_linear_geometry): all chunks when 8 rows of them fit in 44 KB of shared
// memory, else tiles of 64 chunks.
constexpr int kTileChunks = spec::kTileChunks;
constexpr int kTiles = (kChunks + kTileChunks - 1) / kTileChunks;
// A staged row: 4 16-byte vectors per chunk, padded to 4 (mod 8) vectors, so the rows g and g + 1
// a quarter warp reads fall in opposite halves of the 32 banks.
constexpr int kRowVecs = 4 * kTileChunks + ((4 * kTileChunks) % 8 == 0 ? 4 : 0);
constexpr int kMinBlocks = 4;  // per SM: 8 warps at <= 64 registers, 4 warps at <= 128

static_assert(kK % 16 == 0, "in_features must be a multiple of 16 (the mma's K)");
static_assert(spec::kRowTile == kRows, "the row tile is the mma's N");
static_assert(spec::kColumnsPerWarp == kFeatures, "a warp task is 8 features");

__device__ __forceinline__ xj::u32 pack2(xj::bf16 lo, xj::bf16 hi) { return (xj::u32)lo.bits | ((xj::u32)hi.bits << 16); }

// Weights are read once: 16-byte loads that do not allocate in L1.
__device__ __forceinline__ uint4 load_weight(const xj::bf16* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// The refill cursor: the next chunk j of task `task` a lane loads, W[f, 32j + 8q .. 8q + 7] with
// f = 8 * task + g (the last feature for a task past N's end). Past K (the half chunk's lanes
// q = 2, 3) it loads the row's first 16 bytes, which add_chunk replaces by zeros when it uses them.
struct Cursor {
  long long task;
  int j;
  const xj::bf16* row;  // &W[f, 8q]
  __device__ __forceinline__ void seek(const xj::bf16* __restrict__ weight, long long t, int group, int quad) {
    task = t;
    j = 0;
    const long long f = kFeatures * t + group < kN ? kFeatures * t + group : kN - 1;
    row = weight + f * kK + 8 * quad;
  }
  __device__ __forceinline__ uint4 load(int quad) const {
    if (!kHalfChunk) return load_weight(row + 32 * j);
    return load_weight(j != kChunks - 1 || quad < 2 ? row + 32 * j : row);
  }
  __device__ __forceinline__ void next(const xj::bf16* __restrict__ weight, long long stride, int group, int quad) {
    if (++j == kChunks) seek(weight, task + stride, group, quad);
  }
};

// c = mma(A, B) from zero; only c0, c1 (A's rows 0..7) are features, c2, c3 (zero rows) are dropped.
__device__ __forceinline__ void mma_add(float (&acc)[2], xj::u32 a0, xj::u32 a2, xj::u32 b0, xj::u32 b1) {
  float c[4];
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%10, %10, %10, %10};"
      : "=f"(c[0]), "=f"(c[1]), "=f"(c[2]), "=f"(c[3])
      : "r"(a0), "r"(0u), "r"(a2), "r"(0u), "r"(b0), "r"(b1), "f"(0.0f));
  acc[0] = xj::add(acc[0], c[0]);
  acc[1] = xj::add(acc[1], c[1]);
}

// The two mma's of a chunk, G(j, 0) then G(j, 1); w is W[f, 32j + 8q .. 8q + 7], xv is
// x[g, 32j + 8q .. 8q + 7].
__device__ __forceinline__ void add_chunk(float (&acc)[2], uint4 w, uint4 xv, int j, int quad) {
  if (kHalfChunk && j == kChunks - 1 && quad >= 2) w = make_uint4(0u, 0u, 0u, 0u);  // k >= K: zero products
  mma_add(acc, w.x, w.y, xv.x, xv.y);
  mma_add(acc, w.z, w.w, xv.z, xv.w);
}

// Casts x[:, chunks of tile `tile`] into shared memory: vector v of row t holds
// x[t, 32 * kTileChunks * tile + 8v .. 8v + 7]; rows past live_rows and k >= K are zeros.
__device__ __forceinline__ void stage(uint4 (&xs)[kRows][kRowVecs], const float* __restrict__ temb, int live_rows,
                                      int tile) {
  const int k0 = 32 * kTileChunks * tile;
  for (int i = threadIdx.x; i < kRows * 4 * kTileChunks; i += kThreads) {
    const int t = i / (4 * kTileChunks), v = i % (4 * kTileChunks);
    const int k = k0 + 8 * v;
    xj::u32 word[4] = {0u, 0u, 0u, 0u};
    if (t < live_rows && k < kK) {
      const float4* src = reinterpret_cast<const float4*>(temb + (long long)t * kK + k);
      const float4 f0 = src[0], f1 = src[1];
      float a[8] = {f0.x, f0.y, f0.z, f0.w, f1.x, f1.y, f1.z, f1.w};
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        if (spec::kSilu) a[e] = xj::div(a[e], xj::add(1.0f, expf(-a[e])));
      }
#pragma unroll
      for (int e = 0; e < 4; ++e) word[e] = pack2(xj::round_to<xj::bf16>(a[2 * e]), xj::round_to<xj::bf16>(a[2 * e + 1]));
    }
    xs[t][v] = make_uint4(word[0], word[1], word[2], word[3]);
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
  const float* x = temb + row0 * kK;
  // This warp's tasks: first, first + stride, ... below kTasks. With tiles, every warp of the
  // block walks as many tasks as warp 0 (the most), a task past the end loading the last feature
  // and storing nothing, so all reach the same barriers.
  const long long stride = (long long)gridDim.x * kWarps;
  const long long first = (long long)blockIdx.x * kWarps + warp;
  const long long lead = kTiles > 1 ? (long long)blockIdx.x * kWarps : first;
  const int tasks = lead < kTasks ? (int)((kTasks - 1 - lead) / stride + 1) : 0;
  const int steps = tasks * kChunks;  // chunks this warp streams, task after task

  // The refill cursor runs kDepth chunks ahead of the compute cursor (task ct, chunk j).
  Cursor refill;
  refill.seek(weight, first, group, quad);
  uint4 buf[kDepth];
  // The first kDepth chunks' weights go out before x is staged, so they arrive during it.
#pragma unroll
  for (int d = 0; d < kDepth; ++d) {
    if (d < steps) buf[d] = refill.load(quad);
    refill.next(weight, stride, group, quad);
  }
  stage(xs, x, live_rows, 0);
  __syncthreads();

  long long ct = first;
  int j = 0;
  float acc[2] = {0.0f, 0.0f};
#pragma unroll 1
  for (int s0 = 0; s0 < steps; s0 += kDepth) {
#pragma unroll
    for (int d = 0; d < kDepth; ++d) {
      if (s0 + d < steps) {
        if (kTiles > 1 && j % kTileChunks == 0 && (j > 0 || ct != first)) {
          __syncthreads();
          stage(xs, x, live_rows, j / kTileChunks);
          __syncthreads();
        }
        add_chunk(acc, buf[d], xs[group][4 * (kTiles == 1 ? j : j % kTileChunks) + quad], j, quad);
        if (s0 + d + kDepth < steps) buf[d] = refill.load(quad);
        refill.next(weight, stride, group, quad);
        if (++j == kChunks) {
          // c0, c1: feature 8 * ct + g, rows 2 * quad + {0, 1}.
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const long long n = kFeatures * ct + group;
            const int t = 2 * quad + e;
            if (n < kN && t < live_rows) {
              const float v = bias ? xj::add(acc[e], xj::to_float(bias[n])) : acc[e];
              if (pre_activation) pre_activation[(row0 + t) * kN + n] = v;
              out[(row0 + t) * kN + n] = xj::round_to<xj::bf16>(v);
            }
          }
          acc[0] = acc[1] = 0.0f;
          j = 0;
          ct += stride;
        }
      }
    }
  }
}
