// det_linear backward, fp32 weights (NUMERICS.md "det_linear"; docs/det_linear.md). With SiLU,
// the gradient at the pre-activation v is
//   s = div(1, add(1, expf(-v))),  d_v = mul(grad, mul(s, add(1, mul(v, sub(1, s)))))
// (without: d_v = grad). Two kernels share it:
// - kMode 0, input partials: block (128 columns k, chunk c of 64 outputs n); for each row t,
//   partials[c, t, k] = value() of a compensated sum (xj::CompensatedSum, from 0) that adds, for
//   the chunk's groups of 4 outputs n = 64c + 4i .. 64c + 4i + 3 (fewer in a short last chunk) in
//   ascending order, p = fma chain over the group's n ascending of d_v[t, n] * W[n, k] from p = 0;
//   segment_fold then adds the chunks in ascending order, compensated (one row of N/64 tiles): d_input.
// - kMode 1, weight and bias: block (128 columns k, output n): d_weight[n, k] = fma chain over
//   t = 0, 1, ... of d_v[t, n] * x[t, k] from 0 (at most 8 terms: one rounding per term, as eager's
//   GEMM over T; compensating it would cost 10 instructions per term of a write-bound kernel);
//   d_bias[n] = a compensated sum over t (block column 0).
namespace det_linear_grad {

constexpr int kK = spec::kInFeatures;
constexpr long long kN = spec::kOutFeatures;
constexpr int kRows = spec::kRowTile;
constexpr int kThreads = 128;
constexpr int kChunk = 64;
constexpr int kGroup = 4;  // outputs per fma chain inside a chunk
typedef xj::CompensatedSum Sum;

__device__ __forceinline__ float grad_at_pre_activation(const float* grad, const float* pre, long long at) {
  const float g = grad[at];
  if (!spec::kSilu) return g;
  const float v = pre[at];
  const float s = xj::div(1.0f, xj::add(1.0f, expf(-v)));
  return xj::mul(g, xj::mul(s, xj::add(1.0f, xj::mul(v, xj::sub(1.0f, s)))));
}

}  // namespace det_linear_grad

extern "C" __global__ void __launch_bounds__(det_linear_grad::kThreads)
XJ_ENTRY(const float* __restrict__ grad, const float* __restrict__ pre_activation, const float* __restrict__ x,
         const float* __restrict__ weight, float* __restrict__ input_partials, float* __restrict__ d_weight,
         float* __restrict__ d_bias, long long rows, xj::ErrorRecord* errors) {
  using namespace det_linear_grad;
  const int k = blockIdx.x * kThreads + threadIdx.x;
  const int live_rows = rows < kRows ? (int)rows : kRows;
  if (spec::kMode == 0) {
    __shared__ float d_v[kChunk][kRows];
    const long long n0 = (long long)blockIdx.y * kChunk;
    const int count = kN - n0 < kChunk ? (int)(kN - n0) : kChunk;
    for (int i = threadIdx.x; i < kChunk * kRows; i += kThreads) {
      const int n = i / kRows, t = i % kRows;
      if (n < count && t < live_rows) d_v[n][t] = grad_at_pre_activation(grad, pre_activation, t * kN + n0 + n);
    }
    __syncthreads();
    if (k >= kK) return;
    Sum partial[kRows];
#pragma unroll 1
    for (int g = 0; g < count; g += kGroup) {
      float w[kGroup];
#pragma unroll
      for (int i = 0; i < kGroup; ++i) w[i] = g + i < count ? weight[(n0 + g + i) * kK + k] : 0.0f;
#pragma unroll
      for (int t = 0; t < kRows; ++t) {
        if (t >= live_rows) continue;
        float p = 0.0f;
#pragma unroll
        for (int i = 0; i < kGroup; ++i)
          if (g + i < count) p = xj::fma(d_v[g + i][t], w[i], p);
        partial[t].add(p);
      }
    }
#pragma unroll
    for (int t = 0; t < kRows; ++t)
      if (t < live_rows) input_partials[((long long)blockIdx.y * live_rows + t) * kK + k] = partial[t].value();
  } else {
    const long long n = blockIdx.y;
    float d_v[kRows];
#pragma unroll
    for (int t = 0; t < kRows; ++t) d_v[t] = t < live_rows ? grad_at_pre_activation(grad, pre_activation, t * kN + n) : 0.0f;
    if (d_bias && blockIdx.x == 0 && threadIdx.x == 0) {
      Sum b;
#pragma unroll
      for (int t = 0; t < kRows; ++t)
        if (t < live_rows) b.add(d_v[t]);
      d_bias[n] = b.value();
    }
    if (k >= kK || !d_weight) return;
    float w = 0.0f;
#pragma unroll
    for (int t = 0; t < kRows; ++t)
      if (t < live_rows) w = xj::fma(d_v[t], x[(long long)t * kK + k], w);
    d_weight[n * kK + k] = w;
  }
}
