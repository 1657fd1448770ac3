// rms_norm backward, parameter gradients as tile partials (folded by segment_fold), with
// n = rT(mul(w, mul(rstd, x))) recomputed exactly as in the forward (no w: rT(mul(rstd, x))):
// - kSegmented (modulated form): one block per (segment tile of table row k, column slice); over
//   the tile's rows in list order, from 0: first += grad (dshift), second += mul(grad, n) (dscale),
//   third += group (dweight: group = 0, then group = add(group, mul(d_n, mul(rstd, x))) over the
//   tile's next kRowUnroll rows; d_n = mul(grad, rT(add(1, scale[k]))), the scale row of the tile's
//   table row, `scale_stride` apart). Any of the three may be absent.
// - otherwise (plain dweight): one block per (tile of kTilePositions consecutive rows, column
//   slice), in row order, from 0: first += mul(grad, mul(rstd, x)).
// Each thread owns kVec columns (a 4-element quad, or one column where a small M leaves too few
// tiles to fill the GPU with quads); rows are loaded kRowUnroll at a time and added strictly in
// order: dshift/dscale with SegmentSumFor<T> (compensated for fp32, plain for bf16/fp16), dweight
// compensated for every dtype (it sums all M rows: with plain fp32 tiles, bf16/fp16 dweight lost
// to eager in 8 of 32 cases at the 5th digit); fixed_order_sum.cuh. The modulated dweight
// compensates per group of kRowUnroll rows, not per row: the compensated add is most of the
// kernel's instructions, and a 4-term plain sum is ~2 fp32 roundings off.
namespace rms_norm_param_grad {

typedef xj::StorageOf<spec::kDType>::type T;
typedef xj::Quad<T> Quad;
struct Single {
  T v[1];
};
// One thread's columns of one row as loaded (unpacked where they are used).
template <int kCols> struct ColumnsOf { typedef Quad type; };
template <> struct ColumnsOf<1> { typedef Single type; };
typedef ColumnsOf<spec::kVec>::type Columns;
template <bool kCompensated> struct SumOf { typedef xj::CompensatedSum type; };
template <> struct SumOf<false> { typedef xj::SegmentSumFor<T>::type type; };
typedef SumOf<!spec::kSegmented>::type Sum;

constexpr int kThreadsPerRow = spec::kHidden / spec::kVec;

static_assert(spec::kHidden % 4 == 0, "rms_norm needs H % 4 == 0");
static_assert(spec::kVec == 4 || spec::kVec == 1, "a thread owns a quad or one column");

XJ_DEVICE void load_columns(Quad& c, const T* src) { xj::load_quad(c, src); }
XJ_DEVICE void load_columns(Single& c, const T* src) { c.v[0] = src[0]; }

}  // namespace rms_norm_param_grad

extern "C" __global__ void __launch_bounds__(spec::kThreads)
XJ_ENTRY(const rms_norm_param_grad::T* __restrict__ grad, const rms_norm_param_grad::T* __restrict__ x,
         const rms_norm_param_grad::T* __restrict__ weight, const rms_norm_param_grad::T* __restrict__ scale,
         const float* __restrict__ rstd, float* __restrict__ first_partials, float* __restrict__ second_partials,
         float* __restrict__ third_partials, long long scale_stride, XJ_SEGMENT_PLAN_PARAMS,
         xj::ErrorRecord* errors) {
  using namespace rms_norm_param_grad;
  // A segment tile's flattened rows and their rstd (xj::stage_segment_rows).
  __shared__ long long tile_rows[spec::kSegmented ? spec::kTilePositions : 1];
  __shared__ float tile_rstd[spec::kSegmented ? spec::kTilePositions : 1];
  const xj::SegmentPlan plan = XJ_SEGMENT_PLAN;
  const int thread_col = blockIdx.y * spec::kThreads + threadIdx.x;
  long long first_j = 0, end_j = 0;
  xj::SegmentTile tile;
  if (spec::kSegmented) {
    if (!xj::segment_tile(plan, blockIdx.x, tile)) return;
    first_j = tile.first;
    end_j = tile.end;
    xj::stage_segment_rows(plan, tile, tile_rows, rstd, tile_rstd);
    __syncthreads();
  } else {
    first_j = (long long)blockIdx.x * spec::kTilePositions;
    const long long rows = plan.seq * plan.batch;
    end_j = first_j + spec::kTilePositions < rows ? first_j + spec::kTilePositions : rows;
  }
  if (thread_col >= kThreadsPerRow) return;
  const int col = spec::kVec * thread_col;
  Columns w;
  if (spec::kSegmented && spec::kWeighted) load_columns(w, weight + col);
  // dweight's modulation factors, one table row per tile: m = rT(add(1, scale[k])).
  float m[spec::kVec];
  const bool thirds = spec::kSegmented && spec::kWeighted && third_partials;
  if (thirds) {
    Columns sc;
    load_columns(sc, scale + (long long)tile.row * scale_stride + col);
#pragma unroll
    for (int e = 0; e < spec::kVec; ++e) m[e] = xj::to_float(xj::modulation(sc.v[e]));
  }
  Sum first[spec::kVec], second[spec::kVec];
  xj::CompensatedSum third[spec::kVec];
  for (long long j0 = first_j; j0 < end_j; j0 += spec::kRowUnroll) {
    float group[spec::kVec];  // dweight's terms of these kRowUnroll rows
#pragma unroll
    for (int e = 0; e < spec::kVec; ++e) group[e] = 0.0f;
    Columns g[spec::kRowUnroll], xv[spec::kRowUnroll];
    float r[spec::kRowUnroll];
    bool use[spec::kRowUnroll];
#pragma unroll
    for (int u = 0; u < spec::kRowUnroll; ++u) {
      use[u] = j0 + u < end_j;
      if (!use[u]) continue;
      const long long row = spec::kSegmented ? tile_rows[j0 + u - first_j] : j0 + u;
      r[u] = spec::kSegmented ? tile_rstd[j0 + u - first_j] : rstd[row];
      load_columns(g[u], grad + row * spec::kHidden + col);
      load_columns(xv[u], x + row * spec::kHidden + col);
    }
#pragma unroll
    for (int u = 0; u < spec::kRowUnroll; ++u) {
      if (!use[u]) continue;
#pragma unroll
      for (int e = 0; e < spec::kVec; ++e) {
        const float gv = xj::to_float(g[u].v[e]);
        const float xhat = xj::mul(r[u], xj::to_float(xv[u].v[e]));
        if (spec::kSegmented) {
          xj::add_table_terms<T, spec::kWeighted>(gv, xhat, spec::kWeighted ? xj::to_float(w.v[e]) : 0.0f, m[e], thirds,
                                                  first[e], second[e], group[e]);
        } else {
          first[e].add_product(gv, xhat);
        }
      }
    }
    if (thirds) {
#pragma unroll
      for (int e = 0; e < spec::kVec; ++e) third[e].add(group[e]);
    }
  }
  const long long at = (long long)blockIdx.x * spec::kHidden + col;
#pragma unroll
  for (int e = 0; e < spec::kVec; ++e) {
    if (first_partials) first_partials[at + e] = first[e].value();
    if (spec::kSegmented && second_partials) second_partials[at + e] = second[e].value();
    if (thirds) third_partials[at + e] = third[e].value();
  }
}
