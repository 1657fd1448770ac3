// rms_norm backward, parameter gradients as tile partials (folded by segment_fold), with
// n = rT(mul(w, mul(rstd, x))) recomputed exactly as in the forward (no w: rT(mul(rstd, x))):
// - kSegmented (modulated form): one block per segment tile of table row k; over the tile's rows
//   in list order, from 0: shift_partials += grad, scale_partials += mul(grad, n).
// - otherwise (dweight): one block per tile of kTilePositions consecutive rows of the M rows, in
//   order, from 0: weight_partials += mul(d_n, mul(rstd, x)), d_n = grad or, modulated,
//   mul(grad, rT(add(1, scale[i]))) (rows with a bad index are skipped; the dx kernel and the
//   plan report it).
// Each thread owns kSteps 4-element quads of the row and keeps their sums in registers.
namespace rms_norm_param_grad {

typedef xj::StorageOf<spec::kDType>::type T;
typedef xj::IndexOf<spec::kIndexBytes>::type Index;
typedef xj::Quad<T> Quad;

constexpr int kQuads = spec::kHidden / 4;
constexpr int kSteps = (kQuads + spec::kThreads - 1) / spec::kThreads;
constexpr bool kModulated = spec::kTableStride > 0;

static_assert(spec::kHidden % 4 == 0, "rms_norm needs H % 4 == 0");

__device__ __forceinline__ bool in_row(int u) {
  return kQuads % spec::kThreads == 0 || (int)threadIdx.x + u * spec::kThreads < kQuads;
}

}  // namespace rms_norm_param_grad

extern "C" __global__ void __launch_bounds__(spec::kThreads)
XJ_ENTRY(const rms_norm_param_grad::T* __restrict__ grad, const rms_norm_param_grad::T* __restrict__ x,
         const rms_norm_param_grad::T* __restrict__ weight, const rms_norm_param_grad::T* __restrict__ scale,
         const rms_norm_param_grad::Index* __restrict__ index, const float* __restrict__ rstd,
         float* __restrict__ first_partials, float* __restrict__ second_partials, long long rows,
         long long table_rows, XJ_SEGMENT_PLAN_PARAMS, xj::ErrorRecord* errors) {
  using namespace rms_norm_param_grad;
  const xj::SegmentPlan plan = XJ_SEGMENT_PLAN;
  float first[kSteps][4], second[kSteps][4];
#pragma unroll
  for (int u = 0; u < kSteps; ++u)
#pragma unroll
    for (int e = 0; e < 4; ++e) first[u][e] = second[u][e] = 0.0f;
  Quad w[kSteps];
  if (spec::kWeighted)
#pragma unroll
    for (int u = 0; u < kSteps; ++u)
      if (in_row(u)) xj::load_quad(w[u], weight + 4 * (threadIdx.x + u * spec::kThreads));

  long long first_j = 0, end_j = 0;
  xj::SegmentTile tile;
  if (spec::kSegmented) {
    if (!xj::segment_tile(plan, blockIdx.x, tile)) return;
    first_j = tile.first;
    end_j = tile.end;
  } else {
    first_j = (long long)blockIdx.x * spec::kTilePositions;
    end_j = first_j + spec::kTilePositions < rows ? first_j + spec::kTilePositions : rows;
  }
  for (long long j = first_j; j < end_j; ++j) {
    const long long row = spec::kSegmented ? xj::segment_row(plan, tile, j) : j;
    long long i = 0;
    if (!spec::kSegmented && kModulated) {
      i = (long long)index[row % plan.seq];
      if (i < 0 || i >= table_rows) continue;
    }
    const float r = rstd[row];
    const long long base = row * spec::kHidden;
#pragma unroll
    for (int u = 0; u < kSteps; ++u) {
      if (!in_row(u)) continue;
      const int col = 4 * (threadIdx.x + u * spec::kThreads);
      Quad g, xv, sc;
      xj::load_quad(g, grad + base + col);
      xj::load_quad(xv, x + base + col);
      if (!spec::kSegmented && kModulated) xj::load_quad(sc, scale + i * spec::kTableStride + col);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float gv = xj::to_float(g.v[e]);
        const float xhat = xj::mul(r, xj::to_float(xv.v[e]));
        if (spec::kSegmented) {
          float n = xhat;
          if (spec::kWeighted) n = xj::mul(xj::to_float(w[u].v[e]), n);
          first[u][e] = xj::add(first[u][e], gv);
          second[u][e] = xj::add(second[u][e], xj::mul(gv, xj::to_float(xj::round_to<T>(n))));
        } else {
          float d = gv;
          if (kModulated) d = xj::mul(d, xj::to_float(xj::round_to<T>(xj::add(1.0f, xj::to_float(sc.v[e])))));
          first[u][e] = xj::add(first[u][e], xj::mul(d, xhat));
        }
      }
    }
  }
#pragma unroll
  for (int u = 0; u < kSteps; ++u) {
    if (!in_row(u)) continue;
    const long long at = (long long)blockIdx.x * spec::kHidden + 4 * (threadIdx.x + u * spec::kThreads);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      if (first_partials) first_partials[at + e] = first[u][e];
      if (spec::kSegmented && second_partials) second_partials[at + e] = second[u][e];
    }
  }
}
