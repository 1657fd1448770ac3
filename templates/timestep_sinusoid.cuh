// timestep_sinusoid forward: diffusers get_timestep_embedding (NUMERICS.md), step for step as
// PyTorch eager evaluates diffusers' expression:
//   e_k = mul(float(-ln(max_period)), float(k));  e_k = mul(e_k, inv)   (inv = 1/(half - shift))
//   f_k = expf(e_k);  a = mul(float(t), f_k);  a = mul(scale, a) when scale != 1
//   out = [cos a | sin a] (flip_sin_to_cos) or [sin a | cos a]; an odd C gets a zero last column
// expf/sinf/cosf are libdevice's precise versions, the same code PyTorch's kernels run.
// One thread per (timestep, frequency) computes both halves; with check_range, a t that is not
// finite or outside [0, 1] is reported (the H3 convention) and its row is still written.
namespace timestep_sinusoid {

constexpr int kChannels = spec::kChannels;
constexpr int kHalf = kChannels / 2;
constexpr int kThreads = 128;

}  // namespace timestep_sinusoid

extern "C" __global__ void __launch_bounds__(timestep_sinusoid::kThreads)
XJ_ENTRY(const float* __restrict__ t, float* __restrict__ out, long long timesteps, float neg_log_max_period,
         float inv, float scale, int flip_sin_to_cos, int check_range, xj::ErrorRecord* errors) {
  using namespace timestep_sinusoid;
  const long long item = (long long)blockIdx.x * kThreads + threadIdx.x;
  if (item >= timesteps * kHalf) return;
  const long long row = item / kHalf;
  const int k = (int)(item - row * kHalf);
  const float tv = t[row];
  if (check_range && k == 0 && !(tv >= 0.0f && tv <= 1.0f)) {
    xj::report_bad_index(errors, spec::kOpCode, row, (long long)xj::float_to_bits(tv), 1);
  }
  const float e = xj::mul(xj::mul(neg_log_max_period, (float)k), inv);
  float a = xj::mul(tv, expf(e));
  if (scale != 1.0f) a = xj::mul(scale, a);
  const float s = sinf(a);
  const float c = cosf(a);
  float* out_row = out + row * kChannels;
  out_row[k] = flip_sin_to_cos ? c : s;
  out_row[kHalf + k] = flip_sin_to_cos ? s : c;
  if (kChannels % 2 == 1 && k == 0) out_row[kChannels - 1] = 0.0f;
}
