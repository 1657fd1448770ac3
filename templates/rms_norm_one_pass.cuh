// rms_norm backward in one pass (modulated, bf16, sm_90+): one block per segment-plan tile
// (one table row k, up to kTilePositions rows in list order) forms each row's dx and adds the row
// into the tile's dshift/dscale/dweight partials, reading x and grad once where the dx kernel and
// the parameter tiles each read them. The bits are those two kernels' (rms_norm_backward.cuh,
// rms_norm_param_grad.cuh): the same per-element arithmetic (rms_norm_grad_math.cuh), dx's dot in
// the same 128-thread shape, the partials in list order with the same groups of kRowUnroll rows.
// Block: warps 0-3 are the row's 128 dot threads (thread t: quads t, t + 128, ..., as the dx
// kernel), the next kElementThreads own kElementQuads column quads each for the whole tile (dx,
// and the partials in registers), the last warp issues the copies. Rows arrive by bulk copies (x,
// grad and, given residual_grad, the residual stream's gradient) into a ring of kStages stages,
// each with three mbarriers: full (the copies landed), coef (the dot threads published the row's
// coef), empty (every other warp is done with it; the producer then refills it kStages rows
// ahead). Nothing but the ring holds the dot threads back, so they run ahead of the element
// threads, which read each element once for its partials and its dx.
// Gated (gate_residual_rms_norm's backward, kGated): dx is d_residual, and the element threads also
// form gate_residual's backward from it, with that kernel's bits (gate_residual_backward.cuh):
// d_y = rT(mul(d_residual, gate[k])) and the tile's gate partials, sum of d_residual * y in list
// order. Each stage then holds a fourth row, y. The gate's sums live in shared memory, each
// thread's own columns: in registers they would spill (72 a thread for 26 warps).
// Dynamic shared memory: the stages (3 rows each, 4 gated), then the weight row, m = rT(add(1,
// scale[k])) and, gated, the gate row and the gate's sums (fp32).
namespace rms_norm_one_pass {

typedef xj::StorageOf<spec::kDType>::type T;
typedef xj::Quad<T> Quad;
typedef xj::SegmentSumFor<T>::type Sum;

constexpr int kQuads = spec::kHidden / 4;
constexpr int kDotThreads = 128;
constexpr int kDotQuads = (kQuads + kDotThreads - 1) / kDotThreads;
constexpr int kElementThreads = spec::kElementThreads;
constexpr int kElementQuads = (kQuads + kElementThreads - 1) / kElementThreads;
constexpr int kProducer = kDotThreads + kElementThreads;  // the last warp issues the copies
constexpr int kThreads = kProducer + 32;
constexpr int kWarps = kThreads / 32;
constexpr int kStages = spec::kStages;
constexpr bool kGated = spec::kGated;
constexpr unsigned kRowBytes = spec::kHidden * sizeof(T);
constexpr unsigned kStageBytes = (kGated ? 4 : 3) * kRowBytes;

static_assert(sizeof(T) == 2, "the one-pass backward is for bf16 rows");
static_assert(kRowBytes % 16 == 0, "bulk copies move 16-byte multiples");
static_assert(kThreads % 32 == 0 && kThreads <= 1024, "whole warps, one block");
static_assert(sizeof(Sum) == sizeof(float), "the gate's sums are plain fp32 sums, kept in shared memory");

__device__ __forceinline__ void load_shared_quad(Quad& q, const T* p) { q = *reinterpret_cast<const Quad*>(p); }

}  // namespace rms_norm_one_pass

extern "C" __global__ void __launch_bounds__(rms_norm_one_pass::kThreads, 1)
XJ_ENTRY(const rms_norm_one_pass::T* __restrict__ grad, const rms_norm_one_pass::T* __restrict__ residual_grad,
         const rms_norm_one_pass::T* __restrict__ x, const rms_norm_one_pass::T* __restrict__ weight,
         const rms_norm_one_pass::T* __restrict__ scale, const float* __restrict__ rstd,
         rms_norm_one_pass::T* __restrict__ dx, float* __restrict__ first_partials, float* __restrict__ second_partials,
         float* __restrict__ third_partials, const rms_norm_one_pass::T* __restrict__ y,
         const rms_norm_one_pass::T* __restrict__ gate, rms_norm_one_pass::T* __restrict__ d_y,
         float* __restrict__ gate_partials, long long scale_stride, long long gate_stride, XJ_SEGMENT_PLAN_PARAMS,
         xj::ErrorRecord* errors) {
  using namespace rms_norm_one_pass;
  extern __shared__ uint4 shared[];
  __shared__ long long tile_rows[spec::kTilePositions];
  __shared__ float tile_rstd[spec::kTilePositions];
  __shared__ float coefs[kStages];
  __shared__ float warp_sums[2][4];
  __shared__ unsigned long long full[kStages], coef_ready[kStages], empty[kStages];

  const xj::SegmentPlan plan = XJ_SEGMENT_PLAN;
  xj::SegmentTile tile;
  if (!xj::segment_tile(plan, blockIdx.x, tile)) return;
  xj::stage_segment_rows(plan, tile, tile_rows, rstd, tile_rstd);
  char* const stages = reinterpret_cast<char*>(shared);
  // Row k of stage s: x, grad, residual_grad, y.
  auto stage_row = [stages](int s, int k) { return reinterpret_cast<T*>(stages + s * kStageBytes + k * kRowBytes); };
  T* const weight_row = reinterpret_cast<T*>(stages + kStages * kStageBytes);
  T* const m_row = weight_row + spec::kHidden;
  T* const gate_row = m_row + spec::kHidden;
  float* const gate_sums = reinterpret_cast<float*>(gate_row + spec::kHidden);
  for (int q = threadIdx.x; q < kQuads; q += kThreads) {
    Quad sq, mq;
    xj::load_quad(sq, scale + (long long)tile.row * scale_stride + 4 * q);
#pragma unroll
    for (int e = 0; e < 4; ++e) mq.v[e] = xj::modulation(sq.v[e]);
    *reinterpret_cast<Quad*>(m_row + 4 * q) = mq;
    if (spec::kWeighted) {
      Quad wq;
      xj::load_quad(wq, weight + 4 * q);
      *reinterpret_cast<Quad*>(weight_row + 4 * q) = wq;
    }
    if (kGated) {
      Quad gq;
      xj::load_quad(gq, gate + (long long)tile.row * gate_stride + 4 * q);
      *reinterpret_cast<Quad*>(gate_row + 4 * q) = gq;
      *reinterpret_cast<float4*>(gate_sums + 4 * q) = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
  }
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      xj::init_barrier(xj::shared_address(&full[s]));
      xj::init_barrier(xj::shared_address(&coef_ready[s]));
      xj::init_barrier(xj::shared_address(&empty[s]), kWarps - 1);  // every warp but the producer
    }
    xj::fence_barrier_init();
  }
  __syncthreads();

  const int rows = (int)(tile.end - tile.first);
  const int lane = threadIdx.x % 32;
  if (threadIdx.x >= kProducer) {
    // Row u's copies into stage u % kStages, once every warp is done with row u - kStages.
    if (lane == 0) {
#pragma unroll 1
      for (int u = 0; u < rows; ++u) {
        const int s = u % kStages;
        if (u >= kStages) xj::wait_barrier(xj::shared_address(&empty[s]), ((u - kStages) / kStages) & 1);
        const xj::u32 barrier = xj::shared_address(&full[s]);
        const xj::u32 stage = xj::shared_address(stages + s * kStageBytes);
        const long long row = tile_rows[u];
        xj::expect_bytes(barrier, ((residual_grad ? 3 : 2) + (kGated ? 1 : 0)) * kRowBytes);
        xj::bulk_copy(stage, x + row * spec::kHidden, kRowBytes, barrier);
        xj::bulk_copy(stage + kRowBytes, grad + row * spec::kHidden, kRowBytes, barrier);
        if (residual_grad)
          xj::bulk_copy(stage + 2 * kRowBytes, residual_grad + row * spec::kHidden, kRowBytes, barrier);
        if (kGated) xj::bulk_copy(stage + 3 * kRowBytes, y + row * spec::kHidden, kRowBytes, barrier);
      }
    }
    return;
  }

  if (threadIdx.x < kDotThreads) {
    const int t = threadIdx.x;
#pragma unroll 1
    for (int u = 0; u < rows; ++u) {
      const int s = u % kStages;
      const xj::u32 parity = (u / kStages) & 1;
      xj::wait_barrier(xj::shared_address(&full[s]), parity);
      const T* x_row = reinterpret_cast<const T*>(stages + s * kStageBytes);
      const T* grad_row = x_row + spec::kHidden;
      float dot = 0.0f;
#pragma unroll
      for (int k = 0; k < kDotQuads; ++k) {
        const int v = t + k * kDotThreads;
        if (kQuads % kDotThreads == 0 || v < kQuads) {
          Quad xq, gq, mq, wq;
          load_shared_quad(xq, x_row + 4 * v);
          load_shared_quad(gq, grad_row + 4 * v);
          load_shared_quad(mq, m_row + 4 * v);
          if (spec::kWeighted) load_shared_quad(wq, weight_row + 4 * v);
          float xf[4], gf[4], mf[4], wf[4] = {0.0f, 0.0f, 0.0f, 0.0f};
          xj::unpack_quad(xq, xf);
          xj::unpack_quad(gq, gf);
          xj::unpack_quad(mq, mf);
          if (spec::kWeighted) xj::unpack_quad(wq, wf);
#pragma unroll
          for (int e = 0; e < 4; ++e)
            dot = xj::fma(xj::weighted_grad<true, spec::kWeighted>(gf[e], mf[e], wf[e]), xf[e], dot);
        }
      }
      const float total = xj::row_sum_128<1>(dot, warp_sums[u & 1]);
      __syncwarp();
      if (lane == 0) xj::arrive(xj::shared_address(&empty[s]));
      if (t == 0) {
        const float r = tile_rstd[u];
        coefs[s] = xj::div(xj::mul(xj::mul(xj::mul(r, r), r), total), (float)spec::kHidden);
        xj::arrive(xj::shared_address(&coef_ready[s]));
      }
    }
    return;
  }

  // Element threads: quads q = e_t + c * kElementThreads.
  const int e_t = threadIdx.x - kDotThreads;
  const bool thirds = spec::kWeighted && third_partials;
  Sum first[kElementQuads][4], second[kElementQuads][4];
  xj::CompensatedSum third[kElementQuads][4];
  float group[kElementQuads][4];
#pragma unroll
  for (int c = 0; c < kElementQuads; ++c)
#pragma unroll
    for (int e = 0; e < 4; ++e) group[c][e] = 0.0f;
#pragma unroll 1
  for (int u = 0; u < rows; ++u) {
    const int s = u % kStages;
    const xj::u32 parity = (u / kStages) & 1;
    // The coef barrier completes after the full one (the dot threads waited for the copies).
    xj::wait_barrier(xj::shared_address(&full[s]), parity);
    xj::wait_barrier(xj::shared_address(&coef_ready[s]), parity);
    const T* x_row = reinterpret_cast<const T*>(stages + s * kStageBytes);
    const T* grad_row = x_row + spec::kHidden;
    const T* residual_row = grad_row + spec::kHidden;
    const float r = tile_rstd[u], coef = coefs[s];
    const long long row_at = tile_rows[u] * spec::kHidden;
#pragma unroll
    for (int c = 0; c < kElementQuads; ++c) {
      const int q = e_t + c * kElementThreads;
      if (q < kQuads) {
        Quad xq, gq, mq, wq, rq, out;
        load_shared_quad(xq, x_row + 4 * q);
        load_shared_quad(gq, grad_row + 4 * q);
        load_shared_quad(mq, m_row + 4 * q);
        if (spec::kWeighted) load_shared_quad(wq, weight_row + 4 * q);
        if (residual_grad) load_shared_quad(rq, residual_row + 4 * q);
        float xf[4], gf[4], mf[4], wf[4] = {0.0f, 0.0f, 0.0f, 0.0f}, dxf[4];
        xj::unpack_quad(xq, xf);
        xj::unpack_quad(gq, gf);
        xj::unpack_quad(mq, mf);
        if (spec::kWeighted) xj::unpack_quad(wq, wf);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          xj::add_table_terms<T, spec::kWeighted>(gf[e], xj::mul(r, xf[e]), wf[e], mf[e], thirds, first[c][e],
                                                  second[c][e], group[c][e]);
          float wd_lo = 0.0f;
          const float wd = xj::weighted_grad<true, spec::kWeighted, true>(gf[e], mf[e], wf[e], &wd_lo);
          dxf[e] = xj::dx_value<false, true>(xf[e], wd, wd_lo, r, 0.0f, coef);
        }
        xj::round_quad(dxf, out);
        if (residual_grad) {  // dx = rT(add(rT(dx), residual_grad))
          float rf[4];
          xj::unpack_quad(out, dxf);
          xj::unpack_quad(rq, rf);
#pragma unroll
          for (int e = 0; e < 4; ++e) dxf[e] = xj::add(dxf[e], rf[e]);
          xj::round_quad(dxf, out);
        }
        xj::store_quad(dx + row_at + 4 * q, out);
        // Gated: d_residual waits in the grad row's own columns (the dot threads are done with the
        // row) for the loop below, so the gate's work does not add to this loop's registers.
        if (kGated) *reinterpret_cast<Quad*>(stage_row(s, 1) + 4 * q) = out;
      }
    }
    if (kGated) {
#pragma unroll 1
      for (int c = 0; c < kElementQuads; ++c) {
        const int q = e_t + c * kElementThreads;
        if (q < kQuads) {
          Quad dq, yq, gate_q, dyq;
          float df[4], yf[4], gatef[4], dyf[4];
          load_shared_quad(dq, stage_row(s, 1) + 4 * q);
          load_shared_quad(yq, stage_row(s, 3) + 4 * q);
          load_shared_quad(gate_q, gate_row + 4 * q);
          float4 sums = *reinterpret_cast<const float4*>(gate_sums + 4 * q);
          xj::unpack_quad(dq, df);
          xj::unpack_quad(yq, yf);
          xj::unpack_quad(gate_q, gatef);
          float* const sum = &sums.x;
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            Sum partial;
            partial.sum = sum[e];
            partial.add_product(df[e], yf[e]);
            sum[e] = partial.value();
            dyf[e] = xj::mul(df[e], gatef[e]);
          }
          *reinterpret_cast<float4*>(gate_sums + 4 * q) = sums;
          xj::round_quad(dyf, dyq);
          xj::store_quad(d_y + row_at + 4 * q, dyq);
        }
      }
    }
    if (thirds && ((u + 1) % spec::kRowUnroll == 0 || u + 1 == rows)) {
#pragma unroll
      for (int c = 0; c < kElementQuads; ++c)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          third[c][e].add(group[c][e]);
          group[c][e] = 0.0f;
        }
    }
    __syncwarp();
    if (lane == 0) xj::arrive(xj::shared_address(&empty[s]));
  }
#pragma unroll
  for (int c = 0; c < kElementQuads; ++c) {
    const int q = e_t + c * kElementThreads;
    if (q >= kQuads) continue;
    const long long at = (long long)blockIdx.x * spec::kHidden + 4 * q;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      if (first_partials) first_partials[at + e] = first[c][e].value();
      if (second_partials) second_partials[at + e] = second[c][e].value();
      if (thirds) third_partials[at + e] = third[c][e].value();
      if (kGated) gate_partials[at + e] = gate_sums[4 * q + e];
    }
  }
}
