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
//   partials. The accumulators live in dynamic shared memory, each thread's own slots; window w
//   (blockIdx.y) owns quad steps [w * window_steps, ...) so a row whose slots do not fit one
//   block's shared memory is split by columns (same sums, same order; only window 0 forms dx).
// Every operation is written out, so nothing is left for the compiler to contract.
namespace rms_norm_backward {

typedef xj::StorageOf<spec::kDType>::type T;
typedef xj::IndexOf<spec::kIndexBytes>::type Index;
typedef xj::Quad<T> Quad;
typedef xj::SegmentSumFor<T>::type TableSum;
typedef xj::CompensatedSum WeightSum;

constexpr int kRowThreads = 128;
constexpr int kQuads = spec::kHidden / 4;
constexpr int kQuadsPerThread = (kQuads + kRowThreads - 1) / kRowThreads;
constexpr bool kModulated = spec::kTableStride > 0;
constexpr bool kHasLo = kModulated || spec::kWeighted;  // plain d_n = grad is exact
constexpr bool kExactRstd = sizeof(T) == 4;                // fp32
constexpr int kTableFloats = kModulated ? (int)(sizeof(TableSum) / 4) : 0;
constexpr int kWeightFloats = spec::kWeighted ? (int)(sizeof(WeightSum) / 4) : 0;
// The next row is loaded while this one is reduced where two rows fit the registers (H <= 8192);
// beyond, the copies would spill.
constexpr bool kPrefetch = kQuadsPerThread <= 16;

static_assert(spec::kHidden % 4 == 0, "rms_norm needs H % 4 == 0");
static_assert(2 * kTableFloats + kWeightFloats == spec::kSumFloats, "the planner sizes the accumulators");

__device__ __forceinline__ bool in_row(int k) {
  return kQuads % kRowThreads == 0 || (int)threadIdx.x + k * kRowThreads < kQuads;
}

// wd = w * d_n for element e of quad k; with `lo` (only when kHasLo), also its rounding error.
__device__ __forceinline__ float weighted_grad(const Quad& g, const Quad& sc, const Quad& w, int e, float* lo = nullptr) {
  const float grad = xj::to_float(g.v[e]);
  float d = grad, d_lo = 0.0f;
  if (kModulated) {
    const float m = xj::to_float(xj::round_to<T>(xj::add(1.0f, xj::to_float(sc.v[e]))));
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

// The scale row's and the weight's quad v. Loaded where they are used, once per pass (L1/L2
// hits: every row of a table row shares them), so only x and grad stay in registers.
__device__ __forceinline__ void load_parameters(const T* scale_row, const T* weight, int v, Quad& sq, Quad& wq) {
  if (kModulated) xj::load_quad(sq, scale_row + 4 * v);
  if (spec::kWeighted) xj::load_quad(wq, weight + 4 * v);
}

// A sum's floats in shared memory: float f of the accumulator of column c (of this thread's
// window) sits at slot (f * columns + c) * 128 + t, so a warp's accesses never share a bank.
template <typename Sum> struct SharedSum {
  static constexpr int kFloats = (int)(sizeof(Sum) / 4);
  __device__ __forceinline__ static Sum load(const float* base, int stride) {
    Sum s;
    float* f = reinterpret_cast<float*>(&s);
#pragma unroll
    for (int i = 0; i < kFloats; ++i) f[i] = base[i * stride];
    return s;
  }
  __device__ __forceinline__ static void store(float* base, int stride, const Sum& s) {
    const float* f = reinterpret_cast<const float*>(&s);
#pragma unroll
    for (int i = 0; i < kFloats; ++i) base[i * stride] = f[i];
  }
};

}  // namespace rms_norm_backward

extern "C" __global__ void __launch_bounds__(rms_norm_backward::kRowThreads)
XJ_ENTRY(const rms_norm_backward::T* __restrict__ grad, const rms_norm_backward::T* __restrict__ residual_grad,
         const rms_norm_backward::T* __restrict__ x,
         const rms_norm_backward::T* __restrict__ weight, const rms_norm_backward::T* __restrict__ scale,
         const rms_norm_backward::Index* __restrict__ index, const float* __restrict__ rstd, double eps,
         rms_norm_backward::T* __restrict__ dx, float* __restrict__ shift_partials, float* __restrict__ scale_partials,
         float* __restrict__ weight_partials, long long rows, long long table_rows, long long tile_rows,
         long long window_steps, XJ_SEGMENT_PLAN_PARAMS, xj::ErrorRecord* errors) {
  using namespace rms_norm_backward;
  extern __shared__ float accumulators[];
  __shared__ float warp_sums[2][4];
  __shared__ double warp_squares[2][4];
  const xj::SegmentPlan plan = XJ_SEGMENT_PLAN;
  const int t = threadIdx.x;
  const bool sums = shift_partials || scale_partials || weight_partials;
  const bool forms_dx = dx && blockIdx.y == 0;
  const int k_first = (int)(blockIdx.y * window_steps);
  const int k_end = k_first + (int)window_steps < kQuadsPerThread ? k_first + (int)window_steps : kQuadsPerThread;
  const int columns = 4 * (k_end - k_first);  // this thread's accumulated columns

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

  if (sums)
    for (int f = 0; f < spec::kSumFloats; ++f)
      for (int c = 0; c < columns; ++c) accumulators[(f * columns + c) * kRowThreads + t] = 0.0f;

  auto needed = [&](int k) { return in_row(k) && (forms_dx || (k >= k_first && k < k_end)); };
  Quad xq[kQuadsPerThread], gq[kQuadsPerThread];
  auto load_row = [&](long long row, Quad* xs, Quad* gs) {
#pragma unroll
    for (int k = 0; k < kQuadsPerThread; ++k) {
      if (!needed(k)) continue;
      xj::load_quad(xs[k], x + row * spec::kHidden + 4 * (t + k * kRowThreads));
      xj::load_quad(gs[k], grad + row * spec::kHidden + 4 * (t + k * kRowThreads));
    }
  };
  if (kPrefetch && first < end) load_row(row_at(first), xq, gq);

  for (long long j = first; j < end; ++j) {
    const long long row = row_at(j);
    long long i = segmented ? tile.row : 0;
    bool live = true;
    if (kModulated && !segmented) {
      i = xj::checked_index(index, row % plan.seq, table_rows, errors, spec::kOpCode, t == 0);
      live = i >= 0;
      if (!live) i = 0;
    }
    const T* scale_row = scale + i * spec::kTableStride;
    Quad xn[kQuadsPerThread], gn[kQuadsPerThread];
    if (!kPrefetch) load_row(row, xq, gq);
    else if (j + 1 < end) load_row(row_at(j + 1), xn, gn);

    if (forms_dx) {
      float dot = 0.0f;
      xj::CompensatedSum squares;
#pragma unroll
      for (int k = 0; k < kQuadsPerThread; ++k) {
        if (live && in_row(k)) {
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
      const float total = xj::row_sum_128(dot, warp_sums[j & 1]);
      const double sum_squares = kExactRstd ? xj::row_sum_128((double)squares.value(), warp_squares[j & 1]) : 0.0;
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
            Quad sq, wq, out;
            load_parameters(scale_row, weight, t + k * kRowThreads, sq, wq);
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              float wd_lo = 0.0f;
              const float wd = weighted_grad(gq[k], sq, wq, e, kHasLo ? &wd_lo : nullptr);
              float small = xj::mul(-xj::to_float(xq[k].v[e]), coef);
              if (kExactRstd) small = xj::fma(r_lo, wd, small);
              if (kHasLo) small = xj::fma(r, wd_lo, small);
              out.v[e] = xj::round_to<T>(xj::fma(r, wd, small));
            }
            if (spec::kResidualGrad) {
              Quad rq;
              xj::load_quad(rq, residual_grad + row * spec::kHidden + 4 * (t + k * kRowThreads));
#pragma unroll
              for (int e = 0; e < 4; ++e)
                out.v[e] = xj::round_to<T>(xj::add(xj::to_float(out.v[e]), xj::to_float(rq.v[e])));
            }
            xj::store_quad(dx_row + 4 * (t + k * kRowThreads), out);
          }
        }
      }
    }

    if (sums) {
      const float r = rstd[row];
#pragma unroll
      for (int k = 0; k < kQuadsPerThread; ++k) {
        if (k < k_first || k >= k_end || !in_row(k)) continue;
        Quad sq, wq;
        load_parameters(scale_row, weight, t + k * kRowThreads, sq, wq);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int c = 4 * (k - k_first) + e;
          float* slot = accumulators + c * kRowThreads + t;
          const int stride = columns * kRowThreads;
          const float gv = xj::to_float(gq[k].v[e]);
          const float xhat = xj::mul(r, xj::to_float(xq[k].v[e]));
          if (kModulated) {
            float n = xhat;
            if (spec::kWeighted) n = xj::mul(xj::to_float(wq.v[e]), n);
            TableSum shift = SharedSum<TableSum>::load(slot, stride);
            shift.add(gv);
            SharedSum<TableSum>::store(slot, stride, shift);
            TableSum scaled = SharedSum<TableSum>::load(slot + kTableFloats * stride, stride);
            scaled.add_product(gv, xj::to_float(xj::round_to<T>(n)));
            SharedSum<TableSum>::store(slot + kTableFloats * stride, stride, scaled);
          }
          if (spec::kWeighted) {
            float d = gv;
            if (kModulated) d = xj::mul(d, xj::to_float(xj::round_to<T>(xj::add(1.0f, xj::to_float(sq.v[e])))));
            WeightSum w = SharedSum<WeightSum>::load(slot + 2 * kTableFloats * stride, stride);
            w.add_product(d, xhat);
            SharedSum<WeightSum>::store(slot + 2 * kTableFloats * stride, stride, w);
          }
        }
      }
    }
    if (kPrefetch)
#pragma unroll
      for (int k = 0; k < kQuadsPerThread; ++k) {
        xq[k] = xn[k];
        gq[k] = gn[k];
      }
  }

  if (!sums) return;
  const long long at = (long long)blockIdx.x * spec::kHidden;
#pragma unroll
  for (int k = 0; k < kQuadsPerThread; ++k) {
    if (k < k_first || k >= k_end || !in_row(k)) continue;
    const int col = 4 * (t + k * kRowThreads);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float* slot = accumulators + (4 * (k - k_first) + e) * kRowThreads + t;
      const int stride = columns * kRowThreads;
      if (kModulated && shift_partials) shift_partials[at + col + e] = SharedSum<TableSum>::load(slot, stride).value();
      if (kModulated && scale_partials)
        scale_partials[at + col + e] = SharedSum<TableSum>::load(slot + kTableFloats * stride, stride).value();
      if (spec::kWeighted && weight_partials)
        weight_partials[at + col + e] = SharedSum<WeightSum>::load(slot + 2 * kTableFloats * stride, stride).value();
    }
  }
}
