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
// Geometry (launch only, not the order): a warp owns 16 output features (the mma's M) for up to 8
// rows (its N); lane (g = lane / 4, q = lane % 4) loads the 16 bytes W[f, 32j + 8q .. 8q + 7] of
// features f = g and g + 8 with one load each (no L1 allocation), kDepth chunks ahead. x is cast
// once per block into shared memory (the whole of K when it fits, else kTileChunks chunks at a
// time), after the block's first weight loads are in flight; each lane reads its 16 bytes of x
// per chunk with one conflict-free shared load.
namespace det_linear {

constexpr int kK = spec::kInFeatures;
constexpr long long kN = spec::kOutFeatures;
constexpr int kRows = 8;  // the mma's N
constexpr int kWarps = spec::kWarps;
constexpr int kDepth = spec::kDepth;
constexpr int kThreads = 32 * kWarps;
constexpr int kChunks = (kK + 31) / 32;
constexpr bool kHalfChunk = kK % 32 != 0;  // the last chunk is 16 wide
// x staged per block (det_linear_geometry): all chunks when 8 rows of them fit in 44 KB of shared
// memory, else tiles of 64 chunks (then a multiple of kDepth: a tile starts a round of the pipeline).
constexpr int kTileChunks = spec::kTileChunks;
constexpr int kTiles = (kChunks + kTileChunks - 1) / kTileChunks;
// A staged row: 4 16-byte vectors per chunk, padded to 4 (mod 8) vectors, so the rows g and g + 1
// a quarter warp reads fall in opposite halves of the 32 banks.
constexpr int kRowVecs = 4 * kTileChunks + ((4 * kTileChunks) % 8 == 0 ? 4 : 0);
constexpr int kMinBlocks = 4;  // per SM: 8 warps at <= 64 registers, 4 warps at <= 128
constexpr int kRounds = kChunks / kDepth;
constexpr int kLeftover = kChunks % kDepth;

static_assert(kK % 16 == 0, "in_features must be a multiple of 16 (the mma's K)");
static_assert(spec::kRowTile == kRows, "the row tile is the mma's N");
static_assert(kTiles == 1 || kTileChunks % kDepth == 0, "a tile starts a round of the pipeline");

__device__ __forceinline__ xj::u32 pack2(xj::bf16 lo, xj::bf16 hi) { return (xj::u32)lo.bits | ((xj::u32)hi.bits << 16); }

// Weights are read once: 16-byte loads that do not allocate in L1.
__device__ __forceinline__ uint4 load_weight(const xj::bf16* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// A lane's weights of chunk j: features g (lo) and g + 8 (hi), k = 32j + 8q .. 8q + 7.
struct Chunk {
  uint4 lo, hi;
};

__device__ __forceinline__ void load_chunk(Chunk& c, const xj::bf16* w_lo, const xj::bf16* w_hi, int j, int quad) {
  const int k = 32 * j + 8 * quad;
  if (!kHalfChunk || k < kK) {
    c.lo = load_weight(w_lo + k);
    c.hi = load_weight(w_hi + k);
  } else {
    c.lo = c.hi = make_uint4(0u, 0u, 0u, 0u);
  }
}

__device__ __forceinline__ void mma_add(float (&acc)[4], xj::u32 a0, xj::u32 a1, xj::u32 a2, xj::u32 a3, xj::u32 b0,
                                        xj::u32 b1) {
  float c[4];
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%10, %10, %10, %10};"
      : "=f"(c[0]), "=f"(c[1]), "=f"(c[2]), "=f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "f"(0.0f));
#pragma unroll
  for (int e = 0; e < 4; ++e) acc[e] = xj::add(acc[e], c[e]);
}

// The two mma's of a chunk, G(j, 0) then G(j, 1); xv is x[g, 32j + 8q .. 8q + 7].
__device__ __forceinline__ void add_chunk(float (&acc)[4], const Chunk& c, uint4 xv) {
  mma_add(acc, c.lo.x, c.hi.x, c.lo.y, c.hi.y, xv.x, xv.y);
  mma_add(acc, c.lo.z, c.hi.z, c.lo.w, c.hi.w, xv.z, xv.w);
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
  stage(xs, x, live_rows, 0);
  __syncthreads();

  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll 1
  for (int j0 = 0; j0 < kRounds * kDepth; j0 += kDepth) {
    if (kTiles > 1 && j0 > 0 && j0 % kTileChunks == 0) {
      __syncthreads();
      stage(xs, x, live_rows, j0 / kTileChunks);
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
      stage(xs, x, live_rows, (kRounds * kDepth) / kTileChunks);
      __syncthreads();
    }
#pragma unroll
    for (int d = 0; d < kLeftover; ++d) {
      const int j = kRounds * kDepth + d;
      add_chunk(acc, buf[d], xs[group][4 * (kTiles == 1 ? j : j % kTileChunks) + quad]);
    }
  }
  if (feature0 >= kN) return;
  // c0, c1: feature f_lo, rows 2 * quad + {0, 1}; c2, c3: feature f_hi, the same rows.
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const long long n = feature0 + group + (e >= 2 ? 8 : 0);
    const int t = 2 * quad + (e & 1);
    if (n >= kN || t >= live_rows) continue;
    const float v = bias ? xj::add(acc[e], xj::to_float(bias[n])) : acc[e];
    if (pre_activation) pre_activation[(row0 + t) * kN + n] = v;
    out[(row0 + t) * kN + n] = xj::round_to<xj::bf16>(v);
  }
}
