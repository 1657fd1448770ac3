// rms_norm backward, dx (NUMERICS.md; docs/backward.md), one row per kRowThreads threads (128, or
// one warp where H <= 128: row_sum.cuh) in the forward's reduction shape, 128-thread blocks.
// With m = rT(add(1, scale[i])) (modulated), per element:
//   d_n = grad or mul(grad, m),  wd = mul(w, d_n) (or d_n without weight)
// and wd_lo, the exact rounding error of those products (product_error), so that
// wd + wd_lo = w * grad * m up to a rounding of the tiny wd_lo terms. Per row:
//   1. thread t visits 4-element vectors v = t, t+128, ...: dot = fma(wd, x, dot) from 0
//   2. warps: dot = add(dot, shfl_down(dot, off)), off = 16..1; 3. (w0 + w2) + (w1 + w3)
//   4. bf16/fp16: rstd = the forward's, rstd_lo = 0, coef = div(mul(mul(mul(rstd, rstd), rstd), dot), H)
//      fp32 (kExactRstd): squares.add_product(x, x) (a CompensatedSum) in step 1, the same tree in
//      fp64 over the threads' double(squares.value()); in fp64 rd = div(1, sqrt_rn(add(div(
//      squares, H), eps))) with the caller's eps; rstd = to_float(rd), rstd_lo = to_float(rd -
//      rstd), coef = to_float(div(mul(mul(mul(rd, rd), rd), dot), H))
//   5. dx = rT(fma(rstd, wd, fma(rstd, wd_lo, fma(rstd_lo, wd, mul(-x, coef)))))
//      (plain, no weight: no wd_lo term; bf16/fp16: no rstd_lo term)
// Step 5 rounds rstd * w * d_n only once (the dominant term; x * coef is ~1/sqrt(H) of it). For
// fp32 the forward's rstd (rsqrtf, bitwise eager's, up to ~2 units off, an error the whole row
// shares) would then dominate dx's error, so it is recomputed; for bf16/fp16 it is 2^-16 of the
// final rounding, and recomputing it cost ~0.4 ms at S = 131072 for no measurable gain. Every operation
// is written out, so nothing is left for the compiler to contract. The row's x, grad (and scale)
// stay in registers across the barrier: one read of each.
// kResidualGrad (gate_residual_rms_norm's backward, where x is the residual stream h that also flows
// on): dx = rT(add(rT(dx), residual_grad)), the sum eager's autograd forms for h's two uses.
namespace rms_norm_backward {

typedef xj::StorageOf<spec::kDType>::type T;
typedef xj::IndexOf<spec::kIndexBytes>::type Index;
typedef xj::Quad<T> Quad;

constexpr int kRowThreads = spec::kRowThreads;
constexpr int kRowsPerBlock = 128 / kRowThreads;
constexpr int kQuads = spec::kHidden / 4;
constexpr int kQuadsPerThread = (kQuads + kRowThreads - 1) / kRowThreads;
constexpr bool kModulated = spec::kTableStride > 0;
constexpr bool kHasLo = kModulated || spec::kWeighted;  // plain d_n = grad is exact
constexpr bool kExactRstd = sizeof(T) == 4;                // fp32
// fp32 rows keep 2 x 11 quads in registers at H = 5376: allowing 3 blocks per SM (up to 170
// registers) keeps ptxas from spilling where it would cap at 128 (sm_100). 16-bit rows: no hint
// (any hint changes ptxas's choice there: 64 -> 78-102 registers on sm_90).
constexpr int kMinBlocks = sizeof(T) == 4 ? 3 : 0;

static_assert(spec::kHidden % 4 == 0, "rms_norm needs H % 4 == 0");

__device__ __forceinline__ bool in_row(int t, int k) { return kQuads % kRowThreads == 0 || t + k * kRowThreads < kQuads; }

// wd = w * d_n for element e of quad k; with `lo` (only when kHasLo), also its rounding error.
__device__ __forceinline__ float weighted_grad(const Quad& g, const Quad& sc, const Quad& w, int e, float* lo = nullptr) {
  const float m = kModulated ? xj::to_float(xj::modulation(sc.v[e])) : 0.0f;
  const float weight = spec::kWeighted ? xj::to_float(w.v[e]) : 0.0f;
  return xj::weighted_grad<kModulated, spec::kWeighted>(xj::to_float(g.v[e]), m, weight, lo);
}

// The scale row's and the weight's quad v. Loaded where they are used, once per pass (L1/L2
// hits: every row of a table row shares them), so only x and grad stay in registers.
__device__ __forceinline__ void load_parameters(const T* scale_row, const T* weight, int v, Quad& sq, Quad& wq) {
  if (kModulated) xj::load_quad(sq, scale_row + 4 * v);
  if (spec::kWeighted) xj::load_quad(wq, weight + 4 * v);
}

}  // namespace rms_norm_backward

extern "C" __global__ void __launch_bounds__(128, rms_norm_backward::kMinBlocks)
XJ_ENTRY(const rms_norm_backward::T* __restrict__ grad, const rms_norm_backward::T* __restrict__ residual_grad,
         const rms_norm_backward::T* __restrict__ x,
         const rms_norm_backward::T* __restrict__ weight, const rms_norm_backward::T* __restrict__ scale,
         const rms_norm_backward::Index* __restrict__ index, const float* __restrict__ rstd, double eps,
         rms_norm_backward::T* __restrict__ dx, long long rows, long long seq, long long table_rows,
         xj::ErrorRecord* errors) {
  using namespace rms_norm_backward;
  __shared__ float warp_sums[kRowsPerBlock][4];
  __shared__ double warp_squares[kRowsPerBlock][4];
  const xj::RowSlot slot =
      xj::row_slot<kRowThreads, kRowsPerBlock, kModulated, true>(index, rows, seq, table_rows, errors, spec::kOpCode);
  const int group = slot.group, t = slot.t;
  const long long row = slot.row, i = slot.i;
  const bool live = slot.live;
  const T* x_row = x + row * spec::kHidden;
  const T* grad_row = grad + row * spec::kHidden;
  const T* scale_row = scale + i * spec::kTableStride;
  Quad xq[kQuadsPerThread], gq[kQuadsPerThread];
  float dot = 0.0f;
  xj::CompensatedSum squares;
#pragma unroll
  for (int k = 0; k < kQuadsPerThread; ++k) {
    const int v = t + k * kRowThreads;
    if (live && in_row(t, k)) {
      xj::load_quad(xq[k], x_row + 4 * v);
      xj::load_quad(gq[k], grad_row + 4 * v);
    }
  }
#pragma unroll
  for (int k = 0; k < kQuadsPerThread; ++k) {
    if (live && in_row(t, k)) {
      Quad sq, wq;
      load_parameters(scale_row, weight, t + k * kRowThreads, sq, wq);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float xv = xj::to_float(xq[k].v[e]);
        dot = xj::fma(weighted_grad(gq[k], sq, wq, e), xv, dot);
        if (kExactRstd) squares.add_product(xv, xv);
      }
    }
  }
  const float total = xj::row_sum<kRowThreads>(dot, warp_sums[group]);
  const double sum_squares = kExactRstd ? xj::row_sum<kRowThreads>((double)squares.value(), warp_squares[group]) : 0.0;
  if (!live) return;
  float r, r_lo = 0.0f, coef;
  if (kExactRstd) {
    const double h = (double)spec::kHidden;
    const double rd = xj::div(1.0, xj::sqrt_rn(xj::add(xj::div(sum_squares, h), eps)));
    r = xj::to_float(rd);
    r_lo = xj::to_float(xj::add(rd, -(double)r));
    coef = xj::to_float(xj::div(xj::mul(xj::mul(xj::mul(rd, rd), rd), (double)total), h));
  } else {
    r = rstd[row];
    coef = xj::div(xj::mul(xj::mul(xj::mul(r, r), r), total), (float)spec::kHidden);
  }
  T* dx_row = dx + row * spec::kHidden;
#pragma unroll
  for (int k = 0; k < kQuadsPerThread; ++k) {
    if (in_row(t, k)) {
      Quad sq, wq, out;
      load_parameters(scale_row, weight, t + k * kRowThreads, sq, wq);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float wd_lo = 0.0f;
        const float wd = weighted_grad(gq[k], sq, wq, e, kHasLo ? &wd_lo : nullptr);
        out.v[e] = xj::round_to<T>(xj::dx_value<kExactRstd, kHasLo>(xj::to_float(xq[k].v[e]), wd, wd_lo, r, r_lo, coef));
      }
      if (spec::kResidualGrad) {
        Quad rq;
        xj::load_quad(rq, residual_grad + row * spec::kHidden + 4 * (t + k * kRowThreads));
#pragma unroll
        for (int e = 0; e < 4; ++e) out.v[e] = xj::round_to<T>(xj::add(xj::to_float(out.v[e]), xj::to_float(rq.v[e])));
      }
      xj::store_quad(dx_row + 4 * (t + k * kRowThreads), out);
    }
  }
}
