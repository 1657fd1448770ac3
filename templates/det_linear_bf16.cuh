// det_linear, bf16 weights on tensor cores (NUMERICS.md "det_linear"; docs/det_linear.md):
//   out[t, n] = rT(add(acc[t, n], b[n])),  x[t, k] = rT(silu(temb[t, k])) (kSilu) or rT(temb[t, k])
// acc[t, n]: for each 16-wide K group g = 0, 1, ... in ascending order,
//   c = mma.m16n8k16(W[n, 16g:16g+16], x[t, 16g:16g+16]) started from zero, then acc = add(acc, c)
// in fp32. A row's result depends on its own x only (the mma's columns are independent), so it
// does not change with how many rows run with it, and it repeats bit for bit.
// Geometry: a warp owns 16 output features (the mma's M) for up to 8 rows (its N); x is cast and
// staged in shared memory kTileK columns at a time; W fragments come straight from global memory,
// kGroupUnroll groups loaded ahead of their mma's.
namespace det_linear {

constexpr int kK = spec::kInFeatures;
constexpr long long kN = spec::kOutFeatures;
constexpr int kRows = 8;                      // the mma's N
constexpr int kWarps = 8;
constexpr int kThreads = 32 * kWarps;
constexpr int kTileK = 2048;
constexpr int kGroupUnroll = 4;

static_assert(kK % 16 == 0, "in_features must be a multiple of 16 (the mma's K)");
static_assert(spec::kRowTile == kRows, "the row tile is the mma's N");

__device__ __forceinline__ xj::u32 pack2(xj::bf16 lo, xj::bf16 hi) { return (xj::u32)lo.bits | ((xj::u32)hi.bits << 16); }

}  // namespace det_linear

extern "C" __global__ void __launch_bounds__(det_linear::kThreads)
XJ_ENTRY(const float* __restrict__ temb, const xj::bf16* __restrict__ weight, const xj::bf16* __restrict__ bias,
         xj::bf16* __restrict__ out, float* __restrict__ pre_activation, long long rows, xj::ErrorRecord* errors) {
  using namespace det_linear;
  __shared__ xj::u32 tile[kRows][kTileK / 2];  // bf16 pairs
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int group = lane / 4, quad = lane % 4;
  const long long row0 = (long long)blockIdx.y * kRows;
  const int live_rows = rows - row0 < kRows ? (int)(rows - row0) : kRows;
  const long long feature0 = ((long long)blockIdx.x * kWarps + warp) * 16;
  const bool live = feature0 < kN;  // every warp still helps stage x
  const long long f_lo = feature0 + group < kN ? feature0 + group : kN - 1;
  const long long f_hi = feature0 + group + 8 < kN ? feature0 + group + 8 : kN - 1;
  const xj::u32* w_lo = reinterpret_cast<const xj::u32*>(weight + f_lo * kK);
  const xj::u32* w_hi = reinterpret_cast<const xj::u32*>(weight + f_hi * kK);
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};

  for (int k0 = 0; k0 < kK; k0 += kTileK) {
    const int width = kK - k0 < kTileK ? kK - k0 : kTileK;
    __syncthreads();
    for (int i = threadIdx.x; i < kRows * (kTileK / 2); i += kThreads) {
      const int t = i / (kTileK / 2), p = i % (kTileK / 2);
      if (2 * p >= width) continue;
      xj::bf16 lo = xj::round_to<xj::bf16>(0.0f), hi = lo;
      if (t < live_rows) {
        float a = temb[(row0 + t) * kK + k0 + 2 * p], b = temb[(row0 + t) * kK + k0 + 2 * p + 1];
        if (spec::kSilu) {
          a = xj::div(a, xj::add(1.0f, expf(-a)));
          b = xj::div(b, xj::add(1.0f, expf(-b)));
        }
        lo = xj::round_to<xj::bf16>(a);
        hi = xj::round_to<xj::bf16>(b);
      }
      tile[t][p] = pack2(lo, hi);
    }
    __syncthreads();
    if (!live) continue;
    for (int g0 = 0; g0 < width / 16; g0 += kGroupUnroll) {
      xj::u32 a[kGroupUnroll][4];
#pragma unroll
      for (int u = 0; u < kGroupUnroll; ++u) {
        if (g0 + u < width / 16) {
          const int word = (k0 + 16 * (g0 + u)) / 2 + quad;  // k = 16g + 2 * quad (+8)
          a[u][0] = __ldg(w_lo + word);
          a[u][1] = __ldg(w_hi + word);
          a[u][2] = __ldg(w_lo + word + 4);
          a[u][3] = __ldg(w_hi + word + 4);
        }
      }
#pragma unroll
      for (int u = 0; u < kGroupUnroll; ++u) {
        if (g0 + u >= width / 16) continue;
        const int word = 8 * (g0 + u) + quad;
        const xj::u32 b0 = tile[group][word], b1 = tile[group][word + 4];
        float c[4];
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
            "{%10, %10, %10, %10};"
            : "=f"(c[0]), "=f"(c[1]), "=f"(c[2]), "=f"(c[3])
            : "r"(a[u][0]), "r"(a[u][1]), "r"(a[u][2]), "r"(a[u][3]), "r"(b0), "r"(b1), "f"(0.0f));
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[e] = xj::add(acc[e], c[e]);
      }
    }
  }
  if (!live) return;
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
