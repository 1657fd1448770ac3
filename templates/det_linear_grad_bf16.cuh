// det_linear backward, bf16 weights: the AdaLN projection out = rT(add(acc, b)) with
// x = rT(silu(temb)) (kSilu) or rT(temb) (NUMERICS.md "det_linear"; docs/det_linear.md). The
// incoming gradient g (T, N) is bf16 or fp32 (kGradBf16), read exactly as fp32 (a table gradient
// that arrives in fp32 is consumed without rounding). Three kernels share this file:
// - kMode 0, input partials: block (column block, chunk c of 64 outputs n); a thread owns the 8
//   inputs k = 8v .. 8v + 7 (one 16-byte vector of each weight row). For each row t,
//   partials[c, t, k] = value() of a compensated sum (xj::CompensatedSum, from 0) that adds, for
//   the chunk's groups of 4 outputs n = 64c + 4i .. 64c + 4i + 3 (fewer in a short last chunk) in
//   ascending order, p = fma chain over the group's n ascending of g[t, n] * W[n, k] from p = 0
//   (W's bf16 value, exact in fp32): the fp32 backward's order (det_linear_grad.cuh).
// - kMode 2, input fold: thread (t, k): d_x = value() of a compensated sum from 0 of
//   partials[c, t, k] over c ascending (segment_fold's order); then through the cast (identity, as
//   autograd treats .to()) and, with SiLU, its derivative at v = temb[t, k]:
//   s = div(1, add(1, expf(-v))),  d_temb = mul(d_x, mul(s, add(1, mul(v, sub(1, s)))))
//   (the fp32 backward's expression); d_input[t, k] = d_temb (fp32).
// - kMode 1, weight and bias: d_weight[n, k] = rT(fma chain over t = 0, 1, ... of g[t, n] * x[t, k]
//   from 0), x[t, k] = rT(silu(temb[t, k])) recomputed exactly as the forward stages it;
//   d_bias[n] = rT(value() of a compensated sum over t ascending of g[t, n]).
// Row t's d_input involves no other row (batch-invariant); nothing depends on the launch geometry.
// Geometry (speed only): partials and weight-grad blocks of kThreads threads, one 16-byte weight
// vector per thread and row n; the partials and weight-grad kernels are compiled for R = kRowTile
// row slots (1, 2, 4 or 8: the planner picks the smallest R >= the live rows; slots past them see
// g = 0 and are not stored); the partials keep kGroupsAhead groups of 4 weight rows (64 bytes
// each) in flight per thread; the weight-grad blocks stride over rows n by gridDim.y (one
// wave-sized grid), storing 16 bytes per thread and row; the fold keeps kFoldDepth partials in
// flight per thread.
namespace det_linear_grad_bf16 {

constexpr int kK = spec::kInFeatures;
constexpr long long kN = spec::kOutFeatures;
constexpr int kRows = spec::kRowTile;  // row slots R
constexpr int kThreads = spec::kThreads;
constexpr int kVecs = kK / 8;
constexpr int kChunk = 64;
constexpr int kGroup = 4;  // outputs per fma chain inside a chunk
constexpr int kGroupsAhead = 2;
constexpr long long kChunks = (kN + kChunk - 1) / kChunk;
constexpr int kFoldDepth = spec::kFoldDepth;
typedef xj::CompensatedSum Sum;
static_assert(kK % 8 == 0, "in_features must be a multiple of 8 (16-byte weight vectors)");
static_assert(kChunk % (kGroup * kGroupsAhead) == 0, "a chunk is whole rounds of the pipeline");
static_assert(kRows == 1 || kRows == 2 || kRows == 4 || kRows == 8, "the row slots are 1, 2, 4 or 8");

__device__ __forceinline__ float grad_at(const void* grad, long long at) {
  if (spec::kGradBf16) return xj::to_float(static_cast<const xj::bf16*>(grad)[at]);
  return static_cast<const float*>(grad)[at];
}

__device__ __forceinline__ float lo_of(xj::u32 w) { return xj::bits_to_float(w << 16); }
__device__ __forceinline__ float hi_of(xj::u32 w) { return xj::bits_to_float(w & 0xFFFF0000u); }

// Stages g[t, n0 + n] for the chunk's rows as fp32 (zeros past count and live_rows).
__device__ __forceinline__ void stage_grad(float (&d_v)[kChunk][kRows], const void* grad, long long n0, int count,
                                           int live_rows) {
  for (int i = threadIdx.x; i < kChunk * kRows; i += kThreads) {
    const int n = i / kRows, t = i % kRows;
    d_v[n][t] = n < count && t < live_rows ? grad_at(grad, (long long)t * kN + n0 + n) : 0.0f;
  }
}

// The weight rows n0 + 4 * group + i (i < 4) of this thread's vector; zeros past count.
__device__ __forceinline__ void load_group(uint4 (&w)[kGroup], const xj::bf16* base, int group, int count) {
#pragma unroll
  for (int i = 0; i < kGroup; ++i) {
    const int n = kGroup * group + i;
    w[i] = n < count ? xj::load_streamed(base + (long long)n * kK) : make_uint4(0u, 0u, 0u, 0u);
  }
}

__device__ __forceinline__ void add_group(Sum (&sums)[kRows][8], const uint4 (&w)[kGroup],
                                          const float (&d_v)[kChunk][kRows], int group, int count) {
  float wf[kGroup][8];
#pragma unroll
  for (int i = 0; i < kGroup; ++i) {
    const xj::u32 words[4] = {w[i].x, w[i].y, w[i].z, w[i].w};
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      wf[i][2 * e] = lo_of(words[e]);
      wf[i][2 * e + 1] = hi_of(words[e]);
    }
  }
#pragma unroll
  for (int t = 0; t < kRows; ++t) {
    float g[kGroup];
#pragma unroll
    for (int i = 0; i < kGroup; ++i) g[i] = d_v[kGroup * group + i][t];
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      float p = 0.0f;
#pragma unroll
      for (int i = 0; i < kGroup; ++i)
        if (kGroup * group + i < count) p = xj::fma(g[i], wf[i][e], p);
      sums[t][e].add(p);
    }
  }
}

__device__ __forceinline__ void input_partials(const xj::bf16* __restrict__ weight, float* __restrict__ partials,
                                               const float (&d_v)[kChunk][kRows], long long chunk, int count,
                                               int vec, int live_rows) {
  Sum sums[kRows][8];
  const xj::bf16* base = weight + chunk * kChunk * kK + 8 * vec;
  uint4 ring[kGroupsAhead][kGroup];
#pragma unroll
  for (int d = 0; d < kGroupsAhead; ++d) load_group(ring[d], base, d, count);
  const int groups = (count + kGroup - 1) / kGroup;
#pragma unroll 1
  for (int g0 = 0; g0 < groups; g0 += kGroupsAhead) {
#pragma unroll
    for (int d = 0; d < kGroupsAhead; ++d) {
      if (g0 + d < groups) add_group(sums, ring[d], d_v, g0 + d, count);
      if (g0 + d + kGroupsAhead < groups) load_group(ring[d], base, g0 + d + kGroupsAhead, count);
    }
  }
#pragma unroll
  for (int t = 0; t < kRows; ++t) {
    if (t >= live_rows) continue;
    float4* out = reinterpret_cast<float4*>(partials + (chunk * live_rows + t) * kK + 8 * vec);
    out[0] = make_float4(sums[t][0].value(), sums[t][1].value(), sums[t][2].value(), sums[t][3].value());
    out[1] = make_float4(sums[t][4].value(), sums[t][5].value(), sums[t][6].value(), sums[t][7].value());
  }
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

__device__ __forceinline__ void weight_rows(const void* __restrict__ grad, const float* __restrict__ temb,
                                            xj::bf16* __restrict__ d_weight, int vec, int live_rows) {
  float x[kRows][8];
#pragma unroll
  for (int t = 0; t < kRows; ++t) {
    if (t < live_rows) {
      input_vector(x[t], temb, t, vec);
    } else {
#pragma unroll
      for (int e = 0; e < 8; ++e) x[t][e] = 0.0f;
    }
  }
#pragma unroll 1
  for (long long n = blockIdx.y; n < kN; n += gridDim.y) {
    float g[kRows];
#pragma unroll
    for (int t = 0; t < kRows; ++t) g[t] = t < live_rows ? grad_at(grad, (long long)t * kN + n) : 0.0f;
    xj::u32 words[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      float w0 = 0.0f, w1 = 0.0f;
#pragma unroll
      for (int t = 0; t < kRows; ++t) {
        if (t >= live_rows) continue;
        w0 = xj::fma(g[t], x[t][2 * e], w0);
        w1 = xj::fma(g[t], x[t][2 * e + 1], w1);
      }
      words[e] = (xj::u32)xj::round_to<xj::bf16>(w0).bits | ((xj::u32)xj::round_to<xj::bf16>(w1).bits << 16);
    }
    *reinterpret_cast<uint4*>(d_weight + n * kK + 8 * vec) = make_uint4(words[0], words[1], words[2], words[3]);
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
    __shared__ float d_v[kChunk][kRows];
    const long long chunk = blockIdx.y;
    const long long n0 = chunk * kChunk;
    const int count = kN - n0 < kChunk ? (int)(kN - n0) : kChunk;
    stage_grad(d_v, grad, n0, count, live_rows);
    __syncthreads();
    const int vec = blockIdx.x * kThreads + threadIdx.x;
    if (vec >= kVecs) return;
    input_partials(weight, partials, d_v, chunk, count, vec, live_rows);
  } else if (spec::kMode == 2) {
    const int k = blockIdx.x * kThreads + threadIdx.x;
    const int t = blockIdx.y;
    if (k >= kK || t >= live_rows) return;
    const float* column = partials + (long long)t * kK + k;
    const long long stride = (long long)live_rows * kK;
    Sum sum;
#pragma unroll 1
    for (long long c0 = 0; c0 < kChunks; c0 += kFoldDepth) {
      float v[kFoldDepth];
#pragma unroll
      for (int d = 0; d < kFoldDepth; ++d) v[d] = c0 + d < kChunks ? column[(c0 + d) * stride] : 0.0f;
#pragma unroll
      for (int d = 0; d < kFoldDepth; ++d)
        if (c0 + d < kChunks) sum.add(v[d]);
    }
    float d = sum.value();
    if (spec::kSilu) {
      const float v = temb[(long long)t * kK + k];
      const float s = xj::div(1.0f, xj::add(1.0f, expf(-v)));
      d = xj::mul(d, xj::mul(s, xj::add(1.0f, xj::mul(v, xj::sub(1.0f, s)))));
    }
    d_input[(long long)t * kK + k] = d;
  } else {
    if (d_bias && blockIdx.x == 0) {
      // The block's rows n = blockIdx.y + j * gridDim.y, one per thread.
      for (long long n = blockIdx.y + (long long)threadIdx.x * gridDim.y; n < kN; n += (long long)kThreads * gridDim.y) {
        Sum b;
#pragma unroll
        for (int t = 0; t < kRows; ++t)
          if (t < live_rows) b.add(grad_at(grad, (long long)t * kN + n));
        d_bias[n] = xj::round_to<xj::bf16>(b.value());
      }
    }
    const int vec = blockIdx.x * kThreads + threadIdx.x;
    if (vec >= kVecs || !d_weight) return;
    weight_rows(grad, temb, d_weight, vec, live_rows);
  }
}
