// det_linear, fp32 weights (NUMERICS.md "det_linear"; docs/det_linear.md):
//   out[t, n] = act(add(dot[t, n], b[n])),  act = SiLU: div(v, add(1, expf(-v))), or none
// with dot[t, n] in one fixed order that involves no other row (batch-invariant, repeatable):
//   1. lane l of the column's warp visits 4-element chunks c = l, l+32, l+64, ... (< K/4) in order:
//      d = fma(W[n, 4c+e], x[t, 4c+e], d) for e = 0..3, from d = 0;
//   2. xor butterfly over the lanes: d = add(d, shfl_xor(d, off)) for off = 16, 8, 4, 2, 1;
//      lane 0's value is dot[t, n].
// Geometry: a block of kWarps warps owns kWarps * kColumnsPerWarp consecutive columns and up to
// kRows rows; x is staged through shared memory kTileK columns at a time (the chains continue
// across tiles in the same order). No TF32: fma.rn.f32 only.
namespace det_linear {

constexpr int kK = spec::kInFeatures;
constexpr long long kN = spec::kOutFeatures;
constexpr int kRows = spec::kRowTile;
constexpr int kWarps = 8;
constexpr int kColumnsPerWarp = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kTileK = 512;
constexpr int kChunksPerTile = kTileK / 4;

static_assert(kK % 4 == 0, "in_features must be a multiple of 4");

}  // namespace det_linear

extern "C" __global__ void __launch_bounds__(det_linear::kThreads)
XJ_ENTRY(const float* __restrict__ x, const float* __restrict__ weight, const float* __restrict__ bias,
         float* __restrict__ out, float* __restrict__ pre_activation, long long rows, xj::ErrorRecord* errors) {
  using namespace det_linear;
  __shared__ float4 tile[kRows][kChunksPerTile];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const long long row0 = (long long)blockIdx.y * kRows;
  const int live_rows = rows - row0 < kRows ? (int)(rows - row0) : kRows;
  const long long column0 = ((long long)blockIdx.x * kWarps + warp) * kColumnsPerWarp;
  float dot[kColumnsPerWarp][kRows];
#pragma unroll
  for (int c = 0; c < kColumnsPerWarp; ++c)
#pragma unroll
    for (int t = 0; t < kRows; ++t) dot[c][t] = 0.0f;

  for (int k0 = 0; k0 < kK; k0 += kTileK) {
    const int chunks = (kK - k0) / 4 < kChunksPerTile ? (kK - k0) / 4 : kChunksPerTile;
    __syncthreads();
    for (int i = threadIdx.x; i < kRows * kChunksPerTile; i += kThreads) {
      const int t = i / kChunksPerTile, c = i % kChunksPerTile;
      if (t < live_rows && c < chunks) tile[t][c] = *reinterpret_cast<const float4*>(x + (row0 + t) * kK + k0 + 4 * c);
    }
    __syncthreads();
    for (int c = lane; c < chunks; c += 32) {
#pragma unroll
      for (int col = 0; col < kColumnsPerWarp; ++col) {
        if (column0 + col >= kN) continue;
        const float4 w = __ldg(reinterpret_cast<const float4*>(weight + (column0 + col) * kK + k0) + c);
#pragma unroll
        for (int t = 0; t < kRows; ++t) {
          if (t >= live_rows) continue;
          const float4 v = tile[t][c];
          float d = dot[col][t];
          d = fmaf(w.x, v.x, d);
          d = fmaf(w.y, v.y, d);
          d = fmaf(w.z, v.z, d);
          d = fmaf(w.w, v.w, d);
          dot[col][t] = d;
        }
      }
    }
  }
#pragma unroll
  for (int col = 0; col < kColumnsPerWarp; ++col) {
#pragma unroll
    for (int t = 0; t < kRows; ++t) {
      float d = dot[col][t];
#pragma unroll
      for (int offset = 16; offset > 0; offset /= 2) d = xj::add(d, __shfl_xor_sync(0xFFFFFFFFu, d, offset));
      const long long n = column0 + col;
      if (lane == 0 && t < live_rows && n < kN) {
        const float v = bias ? xj::add(d, bias[n]) : d;
        if (pre_activation) pre_activation[(row0 + t) * kN + n] = v;
        out[(row0 + t) * kN + n] = spec::kSilu ? xj::div(v, xj::add(1.0f, expf(-v))) : v;
      }
    }
  }
}
