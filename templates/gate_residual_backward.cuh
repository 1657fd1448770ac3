// gate_residual backward (NUMERICS.md), one pass over grad and y:
//   d_y[r, j] = rT(mul(grad[r, j], gate[k, j]))          (bitwise equal to eager's VJP)
//   partials[tile, j] = sum over the tile's rows r, in list order, from 0, of grad * y
//                       (SegmentSumFor<T>: compensated with exact products for fp32, plain
//                       for bf16/fp16; fixed_order_sum.cuh)
// segment_fold then folds each row's tiles into d_gate (fp32 until its one rounding).
// Geometry: block (tile, column slice); each thread owns one pack of kVec columns and keeps its
// partial sums in registers for the whole tile. Rows are loaded kRowUnroll at a time (more loads
// in flight) and added strictly in list order.
namespace gate_residual_backward {

typedef xj::StorageOf<spec::kDType>::type T;
typedef xj::Pack<T, spec::kVec> Pack;
typedef xj::SegmentSumFor<T>::type Sum;

constexpr int kPacksPerRow = spec::kHidden / spec::kVec;

static_assert(spec::kHidden % spec::kVec == 0, "hidden size must be a whole number of packs");
static_assert(spec::kTableStride % spec::kVec == 0, "table rows must start on a pack");

}  // namespace gate_residual_backward

extern "C" __global__ void __launch_bounds__(spec::kThreads)
XJ_ENTRY(const gate_residual_backward::T* __restrict__ grad, const gate_residual_backward::T* __restrict__ gate,
         const gate_residual_backward::T* __restrict__ y, gate_residual_backward::T* __restrict__ d_y,
         float* __restrict__ partials, XJ_SEGMENT_PLAN_PARAMS, xj::ErrorRecord* errors) {
  using namespace gate_residual_backward;
  __shared__ long long tile_rows[spec::kTilePositions];  // xj::stage_segment_rows
  const xj::SegmentPlan plan = XJ_SEGMENT_PLAN;
  xj::SegmentTile tile;
  if (!xj::segment_tile(plan, blockIdx.x, tile)) return;
  xj::stage_segment_rows(plan, tile, tile_rows);
  __syncthreads();
  const int pack = blockIdx.y * spec::kThreads + threadIdx.x;
  if (pack >= kPacksPerRow) return;
  const int col = pack * spec::kVec;
  Pack g;
  if (d_y) xj::load_pack(g, gate + tile.row * spec::kTableStride + col);
  Sum sum[spec::kVec];
  for (long long j0 = tile.first; j0 < tile.end; j0 += spec::kRowUnroll) {
    long long base[spec::kRowUnroll];
    Pack gr[spec::kRowUnroll], yv[spec::kRowUnroll];
#pragma unroll
    for (int u = 0; u < spec::kRowUnroll; ++u) {
      if (j0 + u < tile.end) {
        base[u] = tile_rows[j0 + u - tile.first] * spec::kHidden + col;
        xj::load_pack(gr[u], grad + base[u]);
        if (partials) xj::load_pack(yv[u], y + base[u]);
      }
    }
#pragma unroll
    for (int u = 0; u < spec::kRowUnroll; ++u) {
      if (j0 + u < tile.end) {
        Pack out;
#pragma unroll
        for (int e = 0; e < spec::kVec; ++e) {
          const float gv = xj::to_float(gr[u].v[e]);
          if (partials) sum[e].add_product(gv, xj::to_float(yv[u].v[e]));
          if (d_y) out.v[e] = xj::round_to<T>(xj::mul(gv, xj::to_float(g.v[e])));
        }
        if (d_y) xj::store_pack(d_y + base[u], out);
      }
    }
  }
  if (!partials) return;
  float* partial = partials + (long long)blockIdx.x * spec::kHidden + col;
#pragma unroll
  for (int e = 0; e < spec::kVec; ++e) partial[e] = sum[e].value();
}
