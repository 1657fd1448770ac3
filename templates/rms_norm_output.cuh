// rms_norm's steps 4 and 5 (NUMERICS.md), shared by rms_norm.cuh and gate_residual_rms_norm.cuh:
// from a row's reduced sum of squares and its quads held in registers,
//   4. ms = div(s, H); rstd = rsqrtf(add(ms, eps))        (the hardware reciprocal square root)
//   5. n = rT(mul(w, mul(rstd, x)))   (or rT(mul(rstd, x)) without weight)
// modulated: out = rT(add(rT(mul(n, rT(add(1, scale[i])))), shift[i])).
// The per-element parameters (weight, shift, scale; L1/L2 hits) are loaded kBatch quads at a
// time, the batch's loads issued together, then its outputs computed and stored: all of a
// thread's at H = 5376 (11), 0.85 -> 0.72 ms for the modulated form. (Loading them before the
// row's barrier measured 1.6x slower: registers, occupancy.)
#ifndef EXACTJIT_RMS_NORM_OUTPUT_CUH
#define EXACTJIT_RMS_NORM_OUTPUT_CUH

namespace xj {

template <typename T, int kHidden, int kRowThreads, int kParamBatch, bool kWeighted, bool kModulated, int kQuadsPerThread>
XJ_DEVICE void rms_norm_output(const Quad<T> (&quads)[kQuadsPerThread], float total, float eps, const T* weight,
                               const T* shift_row, const T* scale_row, T* out_row, float* rstd_out, long long row,
                               int t) {
  constexpr int kQuads = kHidden / 4;
  constexpr int kBatch = kParamBatch < kQuadsPerThread ? kParamBatch : kQuadsPerThread;
  // 4. Mean square and the reciprocal square root.
  const float ms = __fdiv_rn(total, (float)kHidden);
  const float rstd = rsqrtf(add(ms, eps));
  if (rstd_out && t == 0) rstd_out[row] = rstd;

  // 5. Normalise (and modulate) from the registers, kBatch quads at a time.
#pragma unroll
  for (int k0 = 0; k0 < kQuadsPerThread; k0 += kBatch) {
    Quad<T> wq[kBatch], shq[kBatch], scq[kBatch];
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      const int v = t + (k0 + j) * kRowThreads;
      if (k0 + j < kQuadsPerThread && (kQuads % kRowThreads == 0 || v < kQuads)) {
        if (kWeighted) load_quad(wq[j], weight + 4 * v);
        if (kModulated) {
          load_quad(shq[j], shift_row + 4 * v);
          load_quad(scq[j], scale_row + 4 * v);
        }
      }
    }
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      const int k = k0 + j;
      const int v = t + k * kRowThreads;
      if (k < kQuadsPerThread && (kQuads % kRowThreads == 0 || v < kQuads)) {
        Quad<T> result;
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          float n = mul(rstd, to_float(quads[k].v[e]));
          if (kWeighted) n = mul(to_float(wq[j].v[e]), n);
          T rounded = round_to<T>(n);
          if (kModulated) {
            const float one_plus_scale = to_float(round_to<T>(add(1.0f, to_float(scq[j].v[e]))));
            const float scaled = to_float(round_to<T>(mul(to_float(rounded), one_plus_scale)));
            rounded = round_to<T>(add(scaled, to_float(shq[j].v[e])));
          }
          result.v[e] = rounded;
        }
        store_quad(out_row + 4 * v, result);
      }
    }
  }
}

}  // namespace xj

#endif  // EXACTJIT_RMS_NORM_OUTPUT_CUH
