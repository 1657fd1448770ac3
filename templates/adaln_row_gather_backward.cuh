// adaln_row_gather backward: d_rows[k, cH + j] = segment sum over the positions s that gathered
// table row k of grad[c, s, j]. Block (segment tile, chunk c x column slice); each thread owns one
// pack of kVec columns: partials[tile, cH + j] = sum over the tile's positions in list order, from
// 0 (SegmentSumFor<T>: compensated for fp32; kRowUnroll rows loaded at a time); segment_fold
// folds them.
namespace adaln_row_gather_backward {

typedef xj::StorageOf<spec::kDType>::type T;
typedef xj::Pack<T, spec::kVec> Pack;
typedef xj::SegmentSumFor<T>::type Sum;

constexpr int kPacksPerRow = spec::kHidden / spec::kVec;
constexpr int kSlices = (kPacksPerRow + spec::kThreads - 1) / spec::kThreads;
constexpr int kChunks = 6;

static_assert(spec::kHidden % spec::kVec == 0, "hidden size must be a whole number of packs");

}  // namespace adaln_row_gather_backward

extern "C" __global__ void __launch_bounds__(spec::kThreads)
XJ_ENTRY(const adaln_row_gather_backward::T* __restrict__ grad, float* __restrict__ partials, XJ_SEGMENT_PLAN_PARAMS,
         xj::ErrorRecord* errors) {
  using namespace adaln_row_gather_backward;
  __shared__ long long tile_rows[spec::kTilePositions];  // xj::stage_segment_rows
  const xj::SegmentPlan plan = XJ_SEGMENT_PLAN;
  xj::SegmentTile tile;
  if (!xj::segment_tile(plan, blockIdx.x, tile)) return;
  xj::stage_segment_rows(plan, tile, tile_rows);
  __syncthreads();
  const long long chunk = blockIdx.y / kSlices;
  const int pack = (blockIdx.y % kSlices) * spec::kThreads + threadIdx.x;
  if (pack >= kPacksPerRow) return;
  const int col = pack * spec::kVec;
  Sum sum[spec::kVec];
  for (long long j0 = tile.first; j0 < tile.end; j0 += spec::kRowUnroll) {
    Pack g[spec::kRowUnroll];
#pragma unroll
    for (int u = 0; u < spec::kRowUnroll; ++u)
      if (j0 + u < tile.end)
        xj::load_pack(g[u], grad + (chunk * plan.seq + tile_rows[j0 + u - tile.first]) * spec::kHidden + col);
#pragma unroll
    for (int u = 0; u < spec::kRowUnroll; ++u)
      if (j0 + u < tile.end)
#pragma unroll
        for (int e = 0; e < spec::kVec; ++e) sum[e].add(xj::to_float(g[u].v[e]));
  }
  float* partial = partials + ((long long)blockIdx.x * kChunks + chunk) * spec::kHidden + col;
#pragma unroll
  for (int e = 0; e < spec::kVec; ++e) partial[e] = sum[e].value();
}
