// rms_norm backward (NUMERICS.md; docs/backward.md): dx and the parameter gradients' tile partials
// in one pass over the rows. A 128-thread block walks a tile of rows in list order, each row in
// the forward's reduction shape (thread t owns 4-element quads v = t, t+128, ...):
// - dx (window 0 only). With m = rT(add(1, scale[i])) (modulated), per element:
//     d_n = grad or mul(grad, m),  wd = mul(w, d_n) (or d_n without weight)
//   and wd_lo, the exact rounding error of those products (product_error), so that
//   wd + wd_lo = w * grad * m up to a rounding of the tiny wd_lo terms. Per row:
//   1. thread t visits its quads in order: dot = fma(wd, x, dot) from 0
//   2. warps: dot = add(dot, shfl_down(dot, off)), off = 16..1; 3. (w0 + w2) + (w1 + w3)
//   4. bf16/fp16: rstd = the forward's, rstd_lo = 0, coef = div(mul(mul(mul(rstd, rstd), rstd), dot), H)
//      fp32 (kExactRstd): squares.add_product(x, x) (a CompensatedSum) in step 1, the same tree in
//      fp64 over the threads' double(squares.value()); in fp64 rd = div(1, sqrt_rn(add(div(
//      squares, H), eps))) with the caller's eps; rstd = to_float(rd), rstd_lo = to_float(rd -
//      rstd), coef = to_float(div(mul(mul(mul(rd, rd), rd), dot), H))
//   5. dx = rT(fma(rstd, wd, fma(rstd, wd_lo, fma(rstd_lo, wd, mul(-x, coef)))))
//      (plain, no weight: no wd_lo term; bf16/fp16: no rstd_lo term)
//   Step 5 rounds rstd * w * d_n only once (the dominant term; x * coef is ~1/sqrt(H) of it). For
//   fp32 the forward's rstd (rsqrtf, bitwise eager's, up to ~2 units off, an error the whole row
//   shares) would then dominate dx's error, so it is recomputed; for bf16/fp16 it is 2^-16 of the
//   final rounding. kResidualGrad (gate_residual_rms_norm's backward, where x is the residual
//   stream h that also flows on): dx = rT(add(rT(dx), residual_grad)), eager's sum for h's two uses.
// - The tile partials (when any partials pointer is given), with xhat = mul(rstd, x) (the forward's
//   rstd) and n = rT(mul(w, xhat)) (no w: rT(xhat)) as the forward rounds it, each column from 0 over
//   the tile's rows in list order: dshift += grad, dscale += mul(grad, n) (SegmentSumFor<T>),
//   dweight += mul(d_n, xhat) (compensated: it sums all M rows). A tile is kSumTilePositions
//   positions: of a table row's list (sub-tile q of segment tile t is block t * kSubTiles + q;
//   segment_tiles.cuh) where modulated, of consecutive rows otherwise. segment_fold adds the
//   partials.
// The block is kGroups groups of 128 threads: group g forms dx of the round's row g, then all
// kThreads threads add the round's rows, in order, into their columns' accumulators (registers:
// thread t owns quads t + s * kThreads of its column window, s < kSumSteps). The second read of a
// row hits L1/L2 (the group just loaded it). Window w (blockIdx.y) owns quads [w * kWindowQuads,
// ...), so wide rows are split by columns (same sums, same order; only window 0 forms dx).
// Every operation is written out, so nothing is left for the compiler to contract.
namespace rms_norm_backward {

typedef xj::StorageOf<spec::kDType>::type T;
typedef xj::IndexOf<spec::kIndexBytes>::type Index;
typedef xj::Quad<T> Quad;
typedef xj::SegmentSumFor<T>::type TableSum;
typedef xj::CompensatedSum WeightSum;

constexpr int kRowThreads = 128;  // dx: one row per group, the forward's reduction shape
constexpr int kGroups = spec::kGroups;
constexpr int kThreads = kRowThreads * kGroups;
constexpr int kQuads = spec::kHidden / 4;
constexpr int kQuadsPerThread = (kQuads + kRowThreads - 1) / kRowThreads;
constexpr int kSumSteps = spec::kSumSteps;
constexpr int kWindowQuads = kSumSteps * kThreads;
constexpr bool kModulated = spec::kTableStride > 0;
constexpr bool kHasLo = kModulated || spec::kWeighted;  // plain d_n = grad is exact
constexpr bool kExactRstd = sizeof(T) == 4;                // fp32

static_assert(spec::kHidden % 4 == 0, "rms_norm needs H % 4 == 0");

// Quad k of this thread's group row (dx mapping).
__device__ __forceinline__ int row_quad(int k) { return (int)(threadIdx.x % kRowThreads) + k * kRowThreads; }
__device__ __forceinline__ bool in_row(int k) { return kQuads % kRowThreads == 0 || row_quad(k) < kQuads; }

// m = rT(add(1, scale)), the modulation factor of element e.
__device__ __forceinline__ float modulation(const Quad& sc, int e) {
  return xj::to_float(xj::round_to<T>(xj::add(1.0f, xj::to_float(sc.v[e]))));
}

// wd = w * d_n for element e of a quad; with `lo` (only when kHasLo), also its rounding error.
__device__ __forceinline__ float weighted_grad(const Quad& g, const Quad& sc, const Quad& w, int e, float* lo = nullptr) {
  const float grad = xj::to_float(g.v[e]);
  float d = grad, d_lo = 0.0f;
  if (kModulated) {
    const float m = modulation(sc, e);
    d = xj::mul(grad, m);
    if (lo) d_lo = xj::product_error(grad, m, d);
  }
  if (!spec::kWeighted) {
    if (lo) *lo = d_lo;
    return d;
  }
  const float weight = xj::to_float(w.v[e]);
  const float wd = xj::mul(weight, d);
  if (lo) *lo = kModulated ? xj::fma(weight, d_lo, xj::product_error(weight, d, wd)) : xj::product_error(weight, d, wd);
  return wd;
}

// The scale row's and the weight's quad v, loaded where they are used (L1/L2 hits: every row of
// a table row shares them).
__device__ __forceinline__ void load_parameters(const T* scale_row, const T* weight, int v, Quad& sq, Quad& wq) {
  if (kModulated) xj::load_quad(sq, scale_row + 4 * v);
  if (spec::kWeighted) xj::load_quad(wq, weight + 4 * v);
}

}  // namespace rms_norm_backward

extern "C" __global__ void __launch_bounds__(rms_norm_backward::kThreads)
XJ_ENTRY(const rms_norm_backward::T* __restrict__ grad, const rms_norm_backward::T* __restrict__ residual_grad,
         const rms_norm_backward::T* __restrict__ x,
         const rms_norm_backward::T* __restrict__ weight, const rms_norm_backward::T* __restrict__ scale,
         const rms_norm_backward::Index* __restrict__ index, const float* __restrict__ rstd, double eps,
         rms_norm_backward::T* __restrict__ dx, float* __restrict__ shift_partials, float* __restrict__ scale_partials,
         float* __restrict__ weight_partials, long long rows, long long table_rows, long long tile_rows,
         XJ_SEGMENT_PLAN_PARAMS, xj::ErrorRecord* errors) {
  using namespace rms_norm_backward;
  __shared__ float warp_sums[2][kGroups][4];
  __shared__ double warp_squares[2][kGroups][4];
  const xj::SegmentPlan plan = XJ_SEGMENT_PLAN;
  const int t = threadIdx.x, group = t / kRowThreads;
  const bool sums = shift_partials || scale_partials || weight_partials;
  const bool forms_dx = dx && blockIdx.y == 0;
  const int window = (int)blockIdx.y * kWindowQuads;  // this block's first accumulated quad

  // The tile: list positions [first, end) and how a position becomes a row.
  const bool segmented = sums && kModulated;
  xj::SegmentTile tile;
  long long first, end;
  if (segmented) {
    if (!xj::segment_tile(plan, (int)(blockIdx.x / spec::kSubTiles), tile)) return;  // past the last tile
    first = tile.first + (long long)(blockIdx.x % spec::kSubTiles) * spec::kSumTilePositions;
    end = first + spec::kSumTilePositions < tile.end ? first + spec::kSumTilePositions : tile.end;
  } else {
    first = (long long)blockIdx.x * tile_rows;
    end = first + tile_rows < rows ? first + tile_rows : rows;
  }
  auto row_at = [&](long long j) { return segmented ? xj::segment_row(plan, tile, j) : j; };

  TableSum shift[kSumSteps][4], scaled[kSumSteps][4];
  WeightSum weighted[kSumSteps][4];

  for (long long j0 = first; j0 < end; j0 += kGroups) {
    const int parity = (int)((j0 - first) / kGroups) & 1;
    if (forms_dx) {  // group g: the row at list position j0 + g (every group reaches the barriers)
      const long long j = j0 + group;
      const bool has = j < end;
      const long long row = has ? row_at(j) : 0;
      long long i = segmented ? tile.row : 0;
      bool live = has;
      if (kModulated && !segmented && has) {
        i = xj::checked_index(index, row % plan.seq, table_rows, errors, spec::kOpCode, t % kRowThreads == 0);
        live = i >= 0;
        if (!live) i = 0;
      }
      const T* scale_row = scale + i * spec::kTableStride;
      const T* x_row = x + row * spec::kHidden;
      const T* g_row = grad + row * spec::kHidden;
      float dot = 0.0f;
      xj::CompensatedSum squares;
#pragma unroll
      for (int k = 0; k < kQuadsPerThread; ++k) {
        if (live && in_row(k)) {
          Quad xq, gq, sq, wq;
          xj::load_quad(xq, x_row + 4 * row_quad(k));
          xj::load_quad(gq, g_row + 4 * row_quad(k));
          load_parameters(scale_row, weight, row_quad(k), sq, wq);
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const float xv = xj::to_float(xq.v[e]);
            dot = xj::fma(weighted_grad(gq, sq, wq, e), xv, dot);
            if (kExactRstd) squares.add_product(xv, xv);
          }
        }
      }
      const float total = xj::row_sum_128(dot, warp_sums[parity][group]);
      const double sum_squares = kExactRstd ? xj::row_sum_128((double)squares.value(), warp_squares[parity][group]) : 0.0;
      if (live) {
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
          if (in_row(k)) {
            Quad xq, gq, sq, wq, out;
            xj::load_quad(xq, x_row + 4 * row_quad(k));  // L1 hits: loaded above
            xj::load_quad(gq, g_row + 4 * row_quad(k));
            load_parameters(scale_row, weight, row_quad(k), sq, wq);
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              float wd_lo = 0.0f;
              const float wd = weighted_grad(gq, sq, wq, e, kHasLo ? &wd_lo : nullptr);
              float small = xj::mul(-xj::to_float(xq.v[e]), coef);
              if (kExactRstd) small = xj::fma(r_lo, wd, small);
              if (kHasLo) small = xj::fma(r, wd_lo, small);
              out.v[e] = xj::round_to<T>(xj::fma(r, wd, small));
            }
            if (spec::kResidualGrad) {
              Quad rq;
              xj::load_quad(rq, residual_grad + row * spec::kHidden + 4 * row_quad(k));
#pragma unroll
              for (int e = 0; e < 4; ++e)
                out.v[e] = xj::round_to<T>(xj::add(xj::to_float(out.v[e]), xj::to_float(rq.v[e])));
            }
            xj::store_quad(dx_row + 4 * row_quad(k), out);
          }
        }
      }
    }

    if (sums) {  // the round's rows in list order, every thread its own columns
#pragma unroll 1
      for (int u = 0; u < kGroups && j0 + u < end; ++u) {
        const long long row = row_at(j0 + u);
        const float r = rstd[row];
        const T* scale_row = scale + (segmented ? (long long)tile.row : 0) * spec::kTableStride;
#pragma unroll
        for (int s = 0; s < kSumSteps; ++s) {
          const int v = window + t + s * kThreads;
          if (v >= kQuads) continue;
          Quad xq, gq, sq, wq;
          xj::load_quad(xq, x + row * spec::kHidden + 4 * v);
          xj::load_quad(gq, grad + row * spec::kHidden + 4 * v);
          load_parameters(scale_row, weight, v, sq, wq);
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const float gv = xj::to_float(gq.v[e]);
            const float xhat = xj::mul(r, xj::to_float(xq.v[e]));
            if (kModulated) {
              float n = xhat;
              if (spec::kWeighted) n = xj::mul(xj::to_float(wq.v[e]), n);
              shift[s][e].add(gv);
              scaled[s][e].add_product(gv, xj::to_float(xj::round_to<T>(n)));
            }
            if (spec::kWeighted) weighted[s][e].add_product(kModulated ? xj::mul(gv, modulation(sq, e)) : gv, xhat);
          }
        }
      }
    }
  }

  if (!sums) return;
  const long long at = (long long)blockIdx.x * spec::kHidden;
#pragma unroll
  for (int s = 0; s < kSumSteps; ++s) {
    const int v = window + t + s * kThreads;
    if (v >= kQuads) continue;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const long long column = at + 4 * v + e;
      if (kModulated && shift_partials) shift_partials[column] = shift[s][e].value();
      if (kModulated && scale_partials) scale_partials[column] = scaled[s][e].value();
      if (spec::kWeighted && weight_partials) weight_partials[column] = weighted[s][e].value();
    }
  }
}
