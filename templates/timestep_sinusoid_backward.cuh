// timestep_sinusoid backward: d_t = sum over channels of grad times d out / d t. With the
// forward's a_k = t * f_k (* scale) and g = f_k (or mul(scale, f_k)), frequency k contributes
//   term_k = mul(g, sub(mul(grad_sin_k, cos a_k), mul(grad_cos_k, sin a_k)))
// One block of 128 threads per timestep: thread t adds its frequencies k = t, t+128, ... in
// order from 0; then the warps' shuffle tree (off = 16..1) and (w0 + w2) + (w1 + w3). The
// zero column of an odd C has no gradient.
namespace timestep_sinusoid_backward {
constexpr int kChannels = spec::kChannels;
constexpr int kHalf = kChannels / 2;
constexpr int kThreads = 128;
}  // namespace timestep_sinusoid_backward

extern "C" __global__ void __launch_bounds__(timestep_sinusoid_backward::kThreads)
XJ_ENTRY(const float* __restrict__ t, const float* __restrict__ grad, float* __restrict__ d_t,
         float neg_log_max_period, float inv, float scale, int flip_sin_to_cos, xj::ErrorRecord* errors) {
  using namespace timestep_sinusoid_backward;
  __shared__ float warp_sums[4];
  const long long row = blockIdx.x;
  const float tv = t[row];
  const float* grad_row = grad + row * kChannels;
  float sum = 0.0f;
  for (int k = threadIdx.x; k < kHalf; k += kThreads) {
    const float f = expf(xj::mul(xj::mul(neg_log_max_period, (float)k), inv));
    float a = xj::mul(tv, f);
    float g = f;
    if (scale != 1.0f) {
      a = xj::mul(scale, a);
      g = xj::mul(scale, f);
    }
    const float grad_cos = grad_row[flip_sin_to_cos ? k : kHalf + k];
    const float grad_sin = grad_row[flip_sin_to_cos ? kHalf + k : k];
    const float term = xj::mul(g, xj::sub(xj::mul(grad_sin, cosf(a)), xj::mul(grad_cos, sinf(a))));
    sum = xj::add(sum, term);
  }
#pragma unroll
  const float total = xj::row_sum_128(sum, warp_sums);
  if (threadIdx.x == 0) d_t[row] = total;
}
