// rms_norm forward, plain or with AdaLN modulation (NUMERICS.md), replaying PyTorch's
// vectorized_layer_norm_kernel<T, float, rms_norm=true> row by row:
//   1. thread t (of 128, in 4 warps) visits 4-element vectors v = t, t+128, ...; s = fma(x, x, s)
//   2. warps: s = add(s, shfl_down(s, off)) for off = 16, 8, 4, 2, 1
//   3. across warps: (w0 + w2) + (w1 + w3)
//   4-5. rstd and the (modulated) output: rms_norm_output.cuh, i = index[r mod S].
//
// Geometry: each row has its own kRowThreads threads (128, or one warp where H <= 128: the same
// sums, row_sum.cuh) in a 128-thread block, and stays in registers between the reduction and the
// output (one read of x). Every thread reaches the barrier, including those of rows past the end
// or with a bad index, which only skip stores.
namespace rms_norm {

typedef xj::StorageOf<spec::kDType>::type T;
typedef xj::IndexOf<spec::kIndexBytes>::type Index;
typedef xj::Quad<T> Quad;

constexpr int kRowThreads = spec::kRowThreads;
constexpr int kWarps = kRowThreads / 32;
constexpr int kQuads = spec::kHidden / 4;
constexpr int kQuadsPerThread = (kQuads + kRowThreads - 1) / kRowThreads;
constexpr int kThreads = kRowThreads * spec::kRowsPerBlock;

static_assert(spec::kHidden % 4 == 0, "PyTorch's vectorized RMSNorm path needs H % 4 == 0");
static_assert(!spec::kModulated || spec::kTableStride >= spec::kHidden, "table rows must not overlap");

}  // namespace rms_norm

extern "C" __global__ void __launch_bounds__(rms_norm::kThreads)
XJ_ENTRY(const rms_norm::T* __restrict__ x, const rms_norm::T* __restrict__ weight,
         const rms_norm::T* __restrict__ shift, const rms_norm::T* __restrict__ scale,
         const rms_norm::Index* __restrict__ index, rms_norm::T* __restrict__ out, float* __restrict__ rstd_out,
         long long rows, long long seq, long long table_rows, float eps, xj::ErrorRecord* errors) {
  using namespace rms_norm;
  __shared__ float warp_sums[spec::kRowsPerBlock][kWarps];
  const xj::RowSlot slot = xj::row_slot<kRowThreads, spec::kRowsPerBlock, spec::kModulated, false>(
      index, rows, seq, table_rows, errors, spec::kOpCode);
  const int group = slot.group, t = slot.t;
  const long long row = slot.row, i = slot.i;
  const bool live = slot.live;

  // 1. One read of the row into registers, then the sum of squares in PyTorch's order.
  const T* x_row = x + row * spec::kHidden;
  const T* shift_row = shift + i * spec::kTableStride;
  const T* scale_row = scale + i * spec::kTableStride;
  Quad quads[kQuadsPerThread];
  float s = 0.0f;
#pragma unroll
  for (int k = 0; k < kQuadsPerThread; ++k) {
    const int v = t + k * kRowThreads;
    if (live && (kQuads % kRowThreads == 0 || v < kQuads)) {
      xj::load_quad(quads[k], x_row + 4 * v);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float xv = xj::to_float(quads[k].v[e]);
        s = fmaf(xv, xv, s);
      }
    }
  }
  // 2. Within each warp, 3. across warps (row_sum.cuh).
  const float total = xj::row_sum<kRowThreads>(s, warp_sums[group]);
  if (!live) return;
  // 4-5. rms_norm_output.cuh.
  xj::rms_norm_output<T, spec::kHidden, kRowThreads, spec::kParamBatch, spec::kWeighted, spec::kModulated>(
      quads, total, eps, weight, shift_row, scale_row, out + row * spec::kHidden, rstd_out, row, t);
}
