// det_linear backward, bf16 weights: the AdaLN projection out = rT(add(acc, b)) with
// x = rT(silu(temb)) (kSilu) or rT(temb) (NUMERICS.md "det_linear"; docs/det_linear.md). The
// incoming gradient g (T, N) is bf16 or fp32 (kGradBf16), read exactly as fp32 (a table gradient
// that arrives in fp32 is consumed without rounding). Three kernels share this file:
// - kMode 0, input partials: block (column block, chunk c of 256 outputs n); a thread owns the 4
//   inputs k = 4v .. 4v + 3 (one 8-byte vector of each weight row). For each row t,
//   partials[c, t, k] = value() of a compensated sum (xj::CompensatedSum, from 0) that adds, for
//   the chunk's groups of 8 outputs n = 256c + 8i .. 256c + 8i + 7 (fewer in a short last chunk)
//   in ascending order, p = fma chain over the group's n ascending of g[t, n] * W[n, k] from p = 0
//   (W's bf16 value, exact in fp32).
// - kMode 2, input fold: d_x[t, k] = value() of a compensated sum from 0 of partials[c, t, k] over
//   c ascending; then through the cast (identity, as autograd treats .to()) and, with SiLU, its
//   derivative at v = temb[t, k]:
//   s = div(1, add(1, expf(-v))),  d_temb = mul(d_x, mul(s, add(1, mul(v, sub(1, s)))))
//   (the fp32 backward's expression); d_input[t, k] = d_temb (fp32).
// - kMode 1, weight and bias: d_weight[n, k] = rT(fma chain over t = 0, 1, ... of g[t, n] * x[t, k]
//   from 0), x[t, k] = rT(silu(temb[t, k])) recomputed exactly as the forward stages it;
//   d_bias[n] = rT(value() of a compensated sum over t ascending of g[t, n]).
// Row t's d_input involves no other row (batch-invariant); nothing depends on the launch geometry.
// Geometry (speed only): the partials and weight-grad kernels are compiled for R = kRowTile row
// slots (1, 2, 4 or 8: the planner picks the smallest R >= the live rows) and skip the slots past
// the live rows. Partials: kThreads threads, kGroupsAhead groups of 8 weight rows (8 bytes each)
// in flight per thread, the chunk's g staged in shared memory. Fold: a block stages the partials
// of 32 columns, kFoldStage chunks at a time, with all its warps, and its first warp adds them.
// Weight grad: each block stores a contiguous range of rows n (gridDim.y ranges), 8 inputs k per
// thread, with g staged in shared memory kWeightStage rows at a time.
namespace det_linear_grad_bf16 {

constexpr int kK = spec::kInFeatures;
constexpr long long kN = spec::kOutFeatures;
constexpr int kRows = spec::kRowTile;  // row slots R
constexpr int kThreads = spec::kThreads;
constexpr int kChunk = spec::kChunk;
constexpr int kGroup = spec::kGroup;
constexpr int kGroupsAhead = 2;
constexpr long long kChunks = (kN + kChunk - 1) / kChunk;
constexpr int kFoldColumns = spec::kFoldColumns;
constexpr int kFoldStage = 128;  // chunks staged at a time by the fold
constexpr int kWeightStage = spec::kWeightStage;
typedef xj::CompensatedSum Sum;
static_assert(kK % 8 == 0, "in_features must be a multiple of 8 (8- and 16-byte weight vectors)");
static_assert(kChunk % (kGroup * kGroupsAhead) == 0, "a chunk is whole rounds of the pipeline");
static_assert(kRows == 1 || kRows == 2 || kRows == 4 || kRows == 8, "the row slots are 1, 2, 4 or 8");
static_assert(kWeightStage <= kThreads, "a thread per staged row adds its bias");
static_assert(kFoldStage % 8 == 0, "the fold adds whole runs of 8 staged partials");

__device__ __forceinline__ float grad_at(const void* grad, long long at) {
  if (spec::kGradBf16) return xj::to_float(static_cast<const xj::bf16*>(grad)[at]);
  return static_cast<const float*>(grad)[at];
}

__device__ __forceinline__ float lo_of(xj::u32 w) { return xj::bits_to_float(w << 16); }
__device__ __forceinline__ float hi_of(xj::u32 w) { return xj::bits_to_float(w & 0xFFFF0000u); }

// Stages g[t, n0 + n] for n < rows_here as fp32, R values per n (zeros past rows_here and the
// live rows).
__device__ __forceinline__ void stage_grad(float* d_v, const void* grad, long long n0, int rows_here, int slots,
                                           int live_rows) {
  for (int i = threadIdx.x; i < slots * kRows; i += blockDim.x) {
    const int n = i / kRows, t = i % kRows;
    d_v[i] = n < rows_here && t < live_rows ? grad_at(grad, (long long)t * kN + n0 + n) : 0.0f;
  }
}

// The R staged values of g for output n, by 16-byte shared loads where R allows.
__device__ __forceinline__ void grad_row(float (&g)[kRows], const float* d_v, int n) {
  if (kRows % 4 == 0) {
#pragma unroll
    for (int q = 0; q < kRows / 4; ++q) {
      const float4 f = reinterpret_cast<const float4*>(d_v + n * kRows)[q];
      g[4 * q] = f.x, g[4 * q + 1] = f.y, g[4 * q + 2] = f.z, g[4 * q + 3] = f.w;
    }
  } else {
#pragma unroll
    for (int t = 0; t < kRows; ++t) g[t] = d_v[n * kRows + t];
  }
}

// The weight rows n0 + 8 * group + i (i < 8) of this thread's 8-byte vector; zeros past count.
__device__ __forceinline__ void load_group(uint2 (&w)[kGroup], const xj::bf16* base, int group, int count) {
#pragma unroll
  for (int i = 0; i < kGroup; ++i) {
    const int n = kGroup * group + i;
    w[i] = n < count ? xj::load_streamed_8(base + (long long)n * kK) : make_uint2(0u, 0u);
  }
}

// Adds group `group` of the chunk into the live rows' sums. Outputs past count have zero weights
// and a zero g: fma(0, 0, p) is p exactly (p is never -0: it starts at +0 and round-to-nearest
// sums are -0 only from two -0's), so a short last group needs no guard.
__device__ __forceinline__ void add_group(Sum (&sums)[kRows][4], const uint2 (&w)[kGroup], const float* d_v,
                                          int group, int live_rows) {
  float p[kRows][4];
#pragma unroll
  for (int t = 0; t < kRows; ++t)
#pragma unroll
    for (int e = 0; e < 4; ++e) p[t][e] = 0.0f;
#pragma unroll
  for (int i = 0; i < kGroup; ++i) {
    float g[kRows];
    grad_row(g, d_v, kGroup * group + i);
    const float wf[4] = {lo_of(w[i].x), hi_of(w[i].x), lo_of(w[i].y), hi_of(w[i].y)};
#pragma unroll
    for (int t = 0; t < kRows; ++t)
      if (t < live_rows)
#pragma unroll
        for (int e = 0; e < 4; ++e) p[t][e] = xj::fma(g[t], wf[e], p[t][e]);
  }
#pragma unroll
  for (int t = 0; t < kRows; ++t)
    if (t < live_rows)
#pragma unroll
      for (int e = 0; e < 4; ++e) sums[t][e].add(p[t][e]);
}

__device__ __forceinline__ void input_partials(const xj::bf16* __restrict__ weight, float* __restrict__ partials,
                                               const float* d_v, long long chunk, int count, int vec, int live_rows) {
  Sum sums[kRows][4];
  const xj::bf16* base = weight + chunk * kChunk * kK + 4 * vec;
  uint2 ring[kGroupsAhead][kGroup];
#pragma unroll
  for (int d = 0; d < kGroupsAhead; ++d) load_group(ring[d], base, d, count);
  const int groups = (count + kGroup - 1) / kGroup;
#pragma unroll 1
  for (int g0 = 0; g0 < groups; g0 += kGroupsAhead) {
#pragma unroll
    for (int d = 0; d < kGroupsAhead; ++d) {
      if (g0 + d < groups) add_group(sums, ring[d], d_v, g0 + d, live_rows);
      if (g0 + d + kGroupsAhead < groups) load_group(ring[d], base, g0 + d + kGroupsAhead, count);
    }
  }
#pragma unroll
  for (int t = 0; t < kRows; ++t) {
    if (t >= live_rows) break;
    *reinterpret_cast<float4*>(partials + (chunk * live_rows + t) * kK + 4 * vec) =
        make_float4(sums[t][0].value(), sums[t][1].value(), sums[t][2].value(), sums[t][3].value());
  }
}

// d_input of columns j = t * K + k for the block's 32 columns: the partials staged by every warp,
// added in chunk order by the first warp's lane j % 32.
__device__ __forceinline__ void input_fold(const float* __restrict__ partials, const float* __restrict__ temb,
                                           float* __restrict__ d_input, int live_rows) {
  __shared__ float tile[kFoldStage][kFoldColumns];
  const long long columns = (long long)live_rows * kK;
  const int lane = threadIdx.x % kFoldColumns, warp = threadIdx.x / kFoldColumns;
  const int warps = kThreads / kFoldColumns;
  const long long j = (long long)blockIdx.x * kFoldColumns + lane;
  const bool live = j < columns;
  Sum sum;
#pragma unroll 1
  for (long long c0 = 0; c0 < kChunks; c0 += kFoldStage) {
    const int here = kChunks - c0 < kFoldStage ? (int)(kChunks - c0) : kFoldStage;
    float v[kFoldStage / (kThreads / kFoldColumns)];
#pragma unroll
    for (int i = 0; i < kFoldStage / warps; ++i) {
      const int c = warp + i * warps;
      v[i] = live && c < here ? partials[(c0 + c) * columns + j] : 0.0f;
    }
#pragma unroll
    for (int i = 0; i < kFoldStage / warps; ++i) tile[warp + i * warps][lane] = v[i];
    __syncthreads();
    // Whole runs of 8: the zeros past `here` leave the sum exactly as it is (adding +0 changes
    // neither sum nor error, which are never -0).
    if (warp == 0)
#pragma unroll 1
      for (int c = 0; c < here; c += 8)
#pragma unroll
        for (int i = 0; i < 8; ++i) sum.add(tile[c + i][lane]);
    __syncthreads();
  }
  if (warp != 0 || !live) return;
  float d = sum.value();
  if (spec::kSilu) {
    const float v = temb[j];
    const float s = xj::div(1.0f, xj::add(1.0f, expf(-v)));
    d = xj::mul(d, xj::mul(s, xj::add(1.0f, xj::mul(v, xj::sub(1.0f, s)))));
  }
  d_input[j] = d;
}

// x[t, 8v .. 8v + 7] = rT(silu(temb)) or rT(temb), as the forward stages it, as fp32.
__device__ __forceinline__ void input_vector(float (&x)[8], const float* __restrict__ temb, int t, int vec) {
  const float4* src = reinterpret_cast<const float4*>(temb + (long long)t * kK + 8 * vec);
  const float4 f0 = src[0], f1 = src[1];
  const float a[8] = {f0.x, f0.y, f0.z, f0.w, f1.x, f1.y, f1.z, f1.w};
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    float v = a[e];
    if (spec::kSilu) v = xj::div(v, xj::add(1.0f, expf(-v)));
    x[e] = xj::to_float(xj::round_to<xj::bf16>(v));
  }
}

// d_weight rows [n0, n1) for this thread's 8 inputs (vec < 0: g staging and the bias only), and
// d_bias of those rows where asked.
__device__ __forceinline__ void weight_rows(const void* __restrict__ grad, const float* __restrict__ temb,
                                            xj::bf16* __restrict__ d_weight, xj::bf16* __restrict__ d_bias,
                                            long long n0, long long n1, int vec, int live_rows) {
  __shared__ __align__(16) float d_v[kWeightStage * kRows];
  float x[kRows][8];
#pragma unroll
  for (int t = 0; t < kRows; ++t) {
    if (t < live_rows && vec >= 0) {
      input_vector(x[t], temb, t, vec);
    } else {
#pragma unroll
      for (int e = 0; e < 8; ++e) x[t][e] = 0.0f;
    }
  }
#pragma unroll 1
  for (long long s0 = n0; s0 < n1; s0 += kWeightStage) {
    const int here = n1 - s0 < kWeightStage ? (int)(n1 - s0) : kWeightStage;
    __syncthreads();  // the previous stage's reads are done
    stage_grad(d_v, grad, s0, here, kWeightStage, live_rows);
    __syncthreads();
    if (d_bias && threadIdx.x < here) {
      Sum b;
#pragma unroll
      for (int t = 0; t < kRows; ++t)
        if (t < live_rows) b.add(d_v[threadIdx.x * kRows + t]);
      d_bias[s0 + threadIdx.x] = xj::round_to<xj::bf16>(b.value());
    }
    if (vec < 0) continue;
#pragma unroll 1
    for (int r = 0; r < here; ++r) {
      float g[kRows];
      grad_row(g, d_v, r);
      xj::u32 words[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float w0 = 0.0f, w1 = 0.0f;
#pragma unroll
        for (int t = 0; t < kRows; ++t) {
          if (t >= live_rows) break;
          w0 = xj::fma(g[t], x[t][2 * e], w0);
          w1 = xj::fma(g[t], x[t][2 * e + 1], w1);
        }
        words[e] = (xj::u32)xj::round_to<xj::bf16>(w0).bits | ((xj::u32)xj::round_to<xj::bf16>(w1).bits << 16);
      }
      *reinterpret_cast<uint4*>(d_weight + (s0 + r) * kK + 8 * vec) = make_uint4(words[0], words[1], words[2], words[3]);
    }
  }
}

}  // namespace det_linear_grad_bf16

extern "C" __global__ void __launch_bounds__(det_linear_grad_bf16::kThreads)
XJ_ENTRY(const void* __restrict__ grad, const float* __restrict__ temb, const xj::bf16* __restrict__ weight,
         float* __restrict__ partials, float* __restrict__ d_input, xj::bf16* __restrict__ d_weight,
         xj::bf16* __restrict__ d_bias, long long rows, xj::ErrorRecord* errors) {
  using namespace det_linear_grad_bf16;
  const int live_rows = rows < kRows ? (int)rows : kRows;
  if (spec::kMode == 0) {
    __shared__ __align__(16) float d_v[kChunk * kRows];
    const long long chunk = blockIdx.y;
    const long long n0 = chunk * kChunk;
    const int count = kN - n0 < kChunk ? (int)(kN - n0) : kChunk;
    stage_grad(d_v, grad, n0, count, kChunk, live_rows);
    __syncthreads();
    const int vec = blockIdx.x * kThreads + threadIdx.x;
    if (vec >= kK / 4) return;
    input_partials(weight, partials, d_v, chunk, count, vec, live_rows);
  } else if (spec::kMode == 2) {
    input_fold(partials, temb, d_input, live_rows);
  } else {
    // Rows [n0, n1): the block's share of N, in whole stages where N allows.
    const long long per = (kN + gridDim.y - 1) / gridDim.y;
    const long long n0 = blockIdx.y * per, n1 = n0 + per < kN ? n0 + per : kN;
    const int vec = blockIdx.x * kThreads + threadIdx.x;
    if (!d_weight && !d_bias) return;
    weight_rows(grad, temb, d_weight, blockIdx.x == 0 ? d_bias : nullptr, n0, n1,
                vec < kK / 8 && d_weight ? vec : -1, live_rows);
  }
}
