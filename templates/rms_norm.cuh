// rms_norm forward, plain or with AdaLN modulation (NUMERICS.md), replaying PyTorch's
// vectorized_layer_norm_kernel<T, float, rms_norm=true> row by row:
//   1. thread t (of 128, in 4 warps) visits 4-element vectors v = t, t+128, ...; s = fma(x, x, s)
//   2. warps: s = add(s, shfl_down(s, off)) for off = 16, 8, 4, 2, 1
//   3. across warps: (w0 + w2) + (w1 + w3)
//   4. ms = div(s, H); rstd = rsqrtf(add(ms, eps))        (the hardware reciprocal square root)
//   5. n = rT(mul(w, mul(rstd, x)))   (or rT(mul(rstd, x)) without weight)
// modulated: out = rT(add(rT(mul(n, rT(add(1, scale[i])))), shift[i])), i = index[r mod S].
//
// Geometry: each row has its own 128 threads (kRowsPerBlock rows per block) and stays in
// registers between the reduction and the output (one read of x). Every thread reaches the
// barrier, including those of rows past the end or with a bad index, which only skip stores.
// The per-element parameters (weight, shift, scale; L1/L2 hits) are loaded after the barrier,
// up to kParamBatch quads at a time: all of a thread's at H = 5376 (11), 0.85 -> 0.72 ms for the
// modulated form. (Loading them before the barrier measured 1.6x slower: registers, occupancy.)
namespace rms_norm {

typedef xj::StorageOf<spec::kDType>::type T;
typedef xj::IndexOf<spec::kIndexBytes>::type Index;
typedef xj::Quad<T> Quad;

constexpr int kRowThreads = 128;
constexpr int kWarps = kRowThreads / 32;
constexpr int kQuads = spec::kHidden / 4;
constexpr int kQuadsPerThread = (kQuads + kRowThreads - 1) / kRowThreads;
constexpr int kThreads = kRowThreads * spec::kRowsPerBlock;
constexpr int kBatch = spec::kParamBatch < kQuadsPerThread ? spec::kParamBatch : kQuadsPerThread;

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
  const int group = threadIdx.x / kRowThreads;
  const int t = threadIdx.x % kRowThreads;
  const long long row = (long long)blockIdx.x * spec::kRowsPerBlock + group;
  bool live = row < rows;

  long long i = 0;
  if (spec::kModulated && live) {
    i = xj::checked_index(index, row % seq, table_rows, errors, spec::kOpCode, t == 0);
    live = i >= 0;
    if (!live) i = 0;
  }

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
  const float total = xj::row_sum_128(s, warp_sums[group]);
  if (!live) return;
  // 4. Mean square and the reciprocal square root.
  const float ms = __fdiv_rn(total, (float)spec::kHidden);
  const float rstd = rsqrtf(xj::add(ms, eps));
  if (rstd_out && t == 0) rstd_out[row] = rstd;

  // 5. Normalise (and modulate) from the registers, kBatch quads at a time: the batch's
  //    parameter loads are issued together, then its outputs computed and stored.
  T* out_row = out + row * spec::kHidden;
#pragma unroll
  for (int k0 = 0; k0 < kQuadsPerThread; k0 += kBatch) {
    Quad wq[kBatch], shq[kBatch], scq[kBatch];
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      const int v = t + (k0 + j) * kRowThreads;
      if (k0 + j < kQuadsPerThread && (kQuads % kRowThreads == 0 || v < kQuads)) {
        if (spec::kWeighted) xj::load_quad(wq[j], weight + 4 * v);
        if (spec::kModulated) {
          xj::load_quad(shq[j], shift_row + 4 * v);
          xj::load_quad(scq[j], scale_row + 4 * v);
        }
      }
    }
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      const int k = k0 + j;
      const int v = t + k * kRowThreads;
      if (k < kQuadsPerThread && (kQuads % kRowThreads == 0 || v < kQuads)) {
        Quad result;
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          float n = xj::mul(rstd, xj::to_float(quads[k].v[e]));
          if (spec::kWeighted) n = xj::mul(xj::to_float(wq[j].v[e]), n);
          T rounded = xj::round_to<T>(n);
          if (spec::kModulated) {
            const float one_plus_scale = xj::to_float(xj::round_to<T>(xj::add(1.0f, xj::to_float(scq[j].v[e]))));
            const float scaled = xj::to_float(xj::round_to<T>(xj::mul(xj::to_float(rounded), one_plus_scale)));
            rounded = xj::round_to<T>(xj::add(scaled, xj::to_float(shq[j].v[e])));
          }
          result.v[e] = rounded;
        }
        xj::store_quad(out_row + 4 * v, result);
      }
    }
  }
}
