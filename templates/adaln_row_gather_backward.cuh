// adaln_row_gather backward: d_rows[k, cH + j] = segment sum over the positions s that gathered
// table row k of grad[c, s, j]. One block per (segment tile, chunk c): partials[tile, cH + j] =
// sum over the tile's positions in list order, from 0, with single adds; segment_fold folds them.
namespace adaln_row_gather_backward {

typedef xj::StorageOf<spec::kDType>::type T;
typedef xj::Pack<T, spec::kVec> Pack;

constexpr int kPacksPerRow = spec::kHidden / spec::kVec;
constexpr int kSteps = (kPacksPerRow + spec::kThreads - 1) / spec::kThreads;
constexpr int kChunks = 6;

static_assert(spec::kHidden % spec::kVec == 0, "hidden size must be a whole number of packs");

}  // namespace adaln_row_gather_backward

extern "C" __global__ void __launch_bounds__(spec::kThreads)
XJ_ENTRY(const adaln_row_gather_backward::T* __restrict__ grad, float* __restrict__ partials, XJ_SEGMENT_PLAN_PARAMS,
         xj::ErrorRecord* errors) {
  using namespace adaln_row_gather_backward;
  const xj::SegmentPlan plan = XJ_SEGMENT_PLAN;
  xj::SegmentTile tile;
  if (!xj::segment_tile(plan, blockIdx.x, tile)) return;
  const long long chunk = blockIdx.y;
  float sum[kSteps][spec::kVec];
#pragma unroll
  for (int u = 0; u < kSteps; ++u)
#pragma unroll
    for (int e = 0; e < spec::kVec; ++e) sum[u][e] = 0.0f;
  for (long long j = tile.first; j < tile.end; ++j) {
    const T* source = grad + (chunk * plan.seq + xj::segment_row(plan, tile, j)) * spec::kHidden;
    Pack g[kSteps];
#pragma unroll
    for (int u = 0; u < kSteps; ++u) {
      const int p = threadIdx.x + u * spec::kThreads;
      if (kPacksPerRow % spec::kThreads == 0 || p < kPacksPerRow) xj::load_pack(g[u], source + p * spec::kVec);
    }
#pragma unroll
    for (int u = 0; u < kSteps; ++u) {
      if (kPacksPerRow % spec::kThreads == 0 || (int)threadIdx.x + u * spec::kThreads < kPacksPerRow)
#pragma unroll
        for (int e = 0; e < spec::kVec; ++e) sum[u][e] = xj::add(sum[u][e], xj::to_float(g[u].v[e]));
    }
  }
  float* partial_row = partials + ((long long)blockIdx.x * kChunks + chunk) * spec::kHidden;
#pragma unroll
  for (int u = 0; u < kSteps; ++u) {
    const int p = threadIdx.x + u * spec::kThreads;
    if (kPacksPerRow % spec::kThreads == 0 || p < kPacksPerRow)
#pragma unroll
      for (int e = 0; e < spec::kVec; ++e) partial_row[p * spec::kVec + e] = sum[u][e];
  }
}
