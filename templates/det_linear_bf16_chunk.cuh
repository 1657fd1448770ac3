// det_linear, bf16 weights: what both forward kernels share (docs/det_linear.md, "bf16 weights"):
// the chunk step that defines the order of operations, the cast of x into shared memory and the
// output store. det_linear_bf16.cuh streams the weights through registers (sm_80 and newer),
// det_linear_bf16_bulk.cuh through shared memory by bulk copies (sm_90, sm_100); they differ in
// how the bytes arrive, never in the arithmetic.
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
// A warp owns 16 output features (the mma's M) for up to 8 rows (its N): lane (g = lane / 4,
// q = lane % 4) holds the 16 bytes W[f, 32j + 8q .. 8q + 7] of features f = g and g + 8 and reads
// x[g, 32j + 8q .. 8q + 7] from shared memory.
namespace det_linear {

constexpr int kK = spec::kInFeatures;
constexpr long long kN = spec::kOutFeatures;
constexpr int kRows = 8;  // the mma's N
constexpr int kChunks = (kK + 31) / 32;
constexpr bool kHalfChunk = kK % 32 != 0;  // the last chunk is 16 wide

static_assert(kK % 16 == 0, "in_features must be a multiple of 16 (the mma's K)");
static_assert(spec::kRowTile == kRows, "the row tile is the mma's N");

__device__ __forceinline__ xj::u32 pack2(xj::bf16 lo, xj::bf16 hi) { return (xj::u32)lo.bits | ((xj::u32)hi.bits << 16); }

// A lane's weights of one chunk: features g (lo) and g + 8 (hi), k = 32j + 8q .. 8q + 7.
struct Chunk {
  uint4 lo, hi;
};

// The lanes of a 16-wide last chunk whose k lie past K hold zeros (their x is zero too).
__device__ __forceinline__ bool chunk_in_range(int j, int quad) { return !kHalfChunk || 32 * j + 8 * quad < kK; }

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

// A staged row of x: 4 16-byte vectors per chunk, padded to 4 (mod 8) vectors, so the rows g and
// g + 1 a quarter warp reads fall in opposite halves of the 32 banks.
template <int kTileChunks>
constexpr int kRowVecsFor = 4 * kTileChunks + ((4 * kTileChunks) % 8 == 0 ? 4 : 0);

// Casts x[:, chunks of tile `tile`] into shared memory with all the block's threads: vector v of
// row t holds x[t, 32 * kTileChunks * tile + 8v .. 8v + 7]; rows past live_rows and k >= K are zeros.
// A thread takes its vectors kBatch at a time, every load of a batch issued before any of its
// SiLUs, so the cast waits for one L2 round trip per batch instead of one per vector.
template <int kTileChunks, int kBatch>
__device__ __forceinline__ void stage(uint4 (*xs)[kRowVecsFor<kTileChunks>], const float* __restrict__ temb,
                                      int live_rows, int tile) {
  constexpr int kVectors = kRows * 4 * kTileChunks;
  const int k0 = 32 * kTileChunks * tile;
  // Vector i's source, or null for a vector of zeros (a row past live_rows, k >= K, i past the end).
  auto source = [&](int i) -> const float4* {
    const int t = i / (4 * kTileChunks), k = k0 + 8 * (i % (4 * kTileChunks));
    return i < kVectors && t < live_rows && k < kK ? reinterpret_cast<const float4*>(temb + (long long)t * kK + k)
                                                   : nullptr;
  };
  for (int first = threadIdx.x; first < kVectors; first += kBatch * blockDim.x) {
    float4 f[kBatch][2];
    if (kBatch > 1)
#pragma unroll
      for (int b = 0; b < kBatch; ++b)
        if (const float4* src = source(first + b * blockDim.x)) f[b][0] = src[0], f[b][1] = src[1];
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int i = first + b * blockDim.x;
      if (i >= kVectors) break;
      xj::u32 word[4] = {0u, 0u, 0u, 0u};
      if (const float4* src = source(i)) {
        if (kBatch == 1) f[b][0] = src[0], f[b][1] = src[1];  // no batch: load where it is used
        float a[8] = {f[b][0].x, f[b][0].y, f[b][0].z, f[b][0].w, f[b][1].x, f[b][1].y, f[b][1].z, f[b][1].w};
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          if (spec::kSilu) a[e] = xj::div(a[e], xj::add(1.0f, expf(-a[e])));
        }
#pragma unroll
        for (int e = 0; e < 4; ++e)
          word[e] = pack2(xj::round_to<xj::bf16>(a[2 * e]), xj::round_to<xj::bf16>(a[2 * e + 1]));
      }
      xs[i / (4 * kTileChunks)][i % (4 * kTileChunks)] = make_uint4(word[0], word[1], word[2], word[3]);
    }
  }
}

// The warp's results for features feature0 .. feature0 + 15: c0, c1 are feature g, rows 2q and
// 2q + 1; c2, c3 feature g + 8, the same rows. Features >= N and rows >= live_rows are not stored.
__device__ __forceinline__ void store(const float (&acc)[4], long long feature0, int group, int quad, long long row0,
                                      int live_rows, const xj::bf16* __restrict__ bias, xj::bf16* __restrict__ out,
                                      float* __restrict__ pre_activation) {
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

}  // namespace det_linear
