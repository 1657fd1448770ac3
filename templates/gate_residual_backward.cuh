// gate_residual backward (NUMERICS.md), one block per segment tile, one pass over grad and y:
//   d_y[r, j] = rT(mul(grad[r, j], gate[k, j]))          (bitwise equal to eager's VJP)
//   partials[tile, j] = sum over the tile's rows r, in list order, from 0: add(p, mul(grad, y))
// segment_fold then folds each row's tiles into d_gate (fp32 until its one rounding).
// Geometry: kThreads threads walk a row in packs of kVec elements, kSteps packs each, and keep
// their kSteps * kVec partial sums in registers for the whole tile.
namespace gate_residual_backward {

typedef xj::StorageOf<spec::kDType>::type T;
typedef xj::Pack<T, spec::kVec> Pack;

constexpr int kPacksPerRow = spec::kHidden / spec::kVec;
constexpr int kSteps = (kPacksPerRow + spec::kThreads - 1) / spec::kThreads;

static_assert(spec::kHidden % spec::kVec == 0, "hidden size must be a whole number of packs");
static_assert(spec::kTableStride % spec::kVec == 0, "table rows must start on a pack");

__device__ __forceinline__ bool in_row(int step) {
  return kPacksPerRow % spec::kThreads == 0 || (int)threadIdx.x + step * spec::kThreads < kPacksPerRow;
}

}  // namespace gate_residual_backward

extern "C" __global__ void __launch_bounds__(spec::kThreads)
XJ_ENTRY(const gate_residual_backward::T* __restrict__ grad, const gate_residual_backward::T* __restrict__ gate,
         const gate_residual_backward::T* __restrict__ y, gate_residual_backward::T* __restrict__ d_y,
         float* __restrict__ partials, XJ_SEGMENT_PLAN_PARAMS, xj::ErrorRecord* errors) {
  using namespace gate_residual_backward;
  const xj::SegmentPlan plan = XJ_SEGMENT_PLAN;
  xj::SegmentTile tile;
  if (!xj::segment_tile(plan, blockIdx.x, tile)) return;
  const T* gate_row = gate + tile.row * spec::kTableStride;
  Pack g[kSteps];
  float sum[kSteps][spec::kVec];
#pragma unroll
  for (int u = 0; u < kSteps; ++u) {
    if (d_y && in_row(u)) xj::load_pack(g[u], gate_row + (threadIdx.x + u * spec::kThreads) * spec::kVec);
#pragma unroll
    for (int e = 0; e < spec::kVec; ++e) sum[u][e] = 0.0f;
  }
  for (long long j = tile.first; j < tile.end; ++j) {
    const long long base = xj::segment_row(plan, tile, j) * spec::kHidden;
    Pack gr[kSteps], yv[kSteps];
#pragma unroll
    for (int u = 0; u < kSteps; ++u) {
      if (in_row(u)) {
        const int col = (threadIdx.x + u * spec::kThreads) * spec::kVec;
        xj::load_pack(gr[u], grad + base + col);
        if (partials) xj::load_pack(yv[u], y + base + col);
      }
    }
#pragma unroll
    for (int u = 0; u < kSteps; ++u) {
      if (in_row(u)) {
        const int col = (threadIdx.x + u * spec::kThreads) * spec::kVec;
        Pack out;
#pragma unroll
        for (int e = 0; e < spec::kVec; ++e) {
          const float gv = xj::to_float(gr[u].v[e]);
          if (partials) sum[u][e] = xj::add(sum[u][e], xj::mul(gv, xj::to_float(yv[u].v[e])));
          if (d_y) out.v[e] = xj::round_to<T>(xj::mul(gv, xj::to_float(g[u].v[e])));
        }
        if (d_y) xj::store_pack(d_y + base + col, out);
      }
    }
  }
  if (!partials) return;
  float* partial_row = partials + (long long)blockIdx.x * spec::kHidden;
#pragma unroll
  for (int u = 0; u < kSteps; ++u) {
    if (in_row(u)) {
      const int col = (threadIdx.x + u * spec::kThreads) * spec::kVec;
#pragma unroll
      for (int e = 0; e < spec::kVec; ++e) partial_row[col + e] = sum[u][e];
    }
  }
}
