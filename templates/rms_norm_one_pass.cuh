// rms_norm backward in one pass (modulated, bf16, sm_90+): one block per segment-plan tile
// (one table row k, up to kTilePositions rows in list order) forms each row's dx and adds the row
// into the tile's dshift/dscale/dweight partials, reading x and grad once where the dx kernel and
// the parameter tiles each read them. The bits are those two kernels' (rms_norm_backward.cuh,
// rms_norm_param_grad.cuh): the same per-element arithmetic (rms_norm_grad_math.cuh), dx's dot in
// the same 128-thread shape, the partials in list order with the same groups of kRowUnroll rows.
// Block: warps 0-3 are the row's 128 dot threads (thread t: quads t, t + 128, ..., as the dx
// kernel), the next kElementThreads own kElementQuads column quads each for the whole tile (dx,
// and the partials), the last warp issues the copies. Rows arrive by bulk copies (x,
// grad and, given residual_grad, the residual stream's gradient) into a ring of kStages stages,
// each with three mbarriers: full (the copies landed), coef (the dot threads published the row's
// coef), empty (every other warp is done with it; the producer then refills it kStages rows
// ahead).
// Not gated (kSharedWd), the element threads form wd = w * grad * m once: they lead row u + 1 (its
// partials' terms, its wd and wd_lo into two of the fp32 rows in shared memory, then the wd
// barrier) before they finish row u (dx, once the dot threads published u's coef). So the dot
// threads read wd and x alone, in their own order, and form row u + 1's dot while row u's dx is
// formed. dweight's group of rows waits in an fp32 row too: wd_lo and the group in registers spill.
// Gated (gate_residual_rms_norm's backward, kGated): dx is d_residual, and the element threads also
// form gate_residual's backward from it, with that kernel's bits (gate_residual_backward.cuh):
// d_y = rT(mul(d_residual, gate[k])) and the tile's gate partials, sum of d_residual * y in list
// order. Each stage then holds a fourth row, y. The gate's sums live in shared memory, each
// thread's own columns: in registers they would spill. There is no room left for the fp32 rows,
// so the gated kernel's dot threads form wd themselves and its element threads finish each row
// as they lead it.
// Dynamic shared memory: the stages (3 rows each, 4 gated), then the weight row, m = rT(add(1,
// scale[k])), then gated the gate row and the gate's sums, else the fp32 rows: wd and wd_lo for
// two rows, dweight's group.
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
constexpr bool kSharedWd = !kGated;
constexpr unsigned kRowBytes = spec::kHidden * sizeof(T);
constexpr unsigned kStageBytes = (kGated ? 4 : 3) * kRowBytes;

static_assert(sizeof(T) == 2, "the one-pass backward is for bf16 rows");
static_assert(kRowBytes % 16 == 0, "bulk copies move 16-byte multiples");
static_assert(kThreads % 32 == 0 && kThreads <= 1024, "whole warps, one block");
static_assert(sizeof(Sum) == sizeof(float), "the gate's sums are plain fp32 sums, kept in shared memory");

__device__ __forceinline__ void load_shared_quad(Quad& q, const T* p) { q = *reinterpret_cast<const Quad*>(p); }
__device__ __forceinline__ void load_shared_floats(float (&f)[4], const float* p) {
  const float4 v = *reinterpret_cast<const float4*>(p);
  f[0] = v.x;
  f[1] = v.y;
  f[2] = v.z;
  f[3] = v.w;
}
__device__ __forceinline__ void store_shared_floats(float* p, const float (&f)[4]) {
  *reinterpret_cast<float4*>(p) = make_float4(f[0], f[1], f[2], f[3]);
}

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
  __shared__ unsigned long long full[kStages], coef_ready[kStages], empty[kStages], wd_ready[2];

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
  // Not gated: wd of rows u % 2 = 0, 1, their wd_lo, dweight's group (in place of the gate's rows).
  float* const wd_rows = reinterpret_cast<float*>(m_row + spec::kHidden);
  float* const lo_rows = wd_rows + 2 * spec::kHidden;
  float* const group_row = wd_rows + 4 * spec::kHidden;
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
    if (kSharedWd) *reinterpret_cast<float4*>(group_row + 4 * q) = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      xj::init_barrier(xj::shared_address(&full[s]));
      xj::init_barrier(xj::shared_address(&coef_ready[s]));
      xj::init_barrier(xj::shared_address(&empty[s]), kWarps - 1);  // every warp but the producer
    }
    if (kSharedWd)
      for (int b = 0; b < 2; ++b) xj::init_barrier(xj::shared_address(&wd_ready[b]), kElementThreads / 32);
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
      xj::wait_barrier(xj::shared_address(&full[s]), (u / kStages) & 1);
      if (kSharedWd) xj::wait_barrier(xj::shared_address(&wd_ready[u % 2]), (u / 2) & 1);
      const T* x_row = stage_row(s, 0);
      const T* grad_row = stage_row(s, 1);
      const float* wd_row = wd_rows + (u % 2) * spec::kHidden;
      float dot = 0.0f;
#pragma unroll
      for (int k = 0; k < kDotQuads; ++k) {
        const int v = t + k * kDotThreads;
        if (kQuads % kDotThreads == 0 || v < kQuads) {
          Quad xq;
          load_shared_quad(xq, x_row + 4 * v);
          float xf[4], wd[4];
          xj::unpack_quad(xq, xf);
          if (kSharedWd) {
            load_shared_floats(wd, wd_row + 4 * v);
          } else {
            Quad gq, mq, wq;
            load_shared_quad(gq, grad_row + 4 * v);
            load_shared_quad(mq, m_row + 4 * v);
            if (spec::kWeighted) load_shared_quad(wq, weight_row + 4 * v);
            float gf[4], mf[4], wf[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            xj::unpack_quad(gq, gf);
            xj::unpack_quad(mq, mf);
            if (spec::kWeighted) xj::unpack_quad(wq, wf);
#pragma unroll
            for (int e = 0; e < 4; ++e) wd[e] = xj::weighted_grad<true, spec::kWeighted>(gf[e], mf[e], wf[e]);
          }
#pragma unroll
          for (int e = 0; e < 4; ++e) dot = xj::fma(wd[e], xf[e], dot);
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
  float group[kElementQuads][4];  // gated only: dweight's group of rows in registers
#pragma unroll
  for (int c = 0; c < kElementQuads; ++c)
#pragma unroll
    for (int e = 0; e < 4; ++e) group[c][e] = 0.0f;
  // Quad c of row u in stage s: its terms of the tile's partials (dweight's group in group_f), then
  // given dxf (gated) dx before its rounding from coef, else wd and wd_lo.
  auto lead_quad = [&](int c, int s, int u, float* group_f, float coef, float* dxf, float* wd_out, float* lo_out) {
    const int q = e_t + c * kElementThreads;
    Quad xq, gq, mq, wq;
    load_shared_quad(xq, stage_row(s, 0) + 4 * q);
    load_shared_quad(gq, stage_row(s, 1) + 4 * q);
    load_shared_quad(mq, m_row + 4 * q);
    if (spec::kWeighted) load_shared_quad(wq, weight_row + 4 * q);
    float xf[4], gf[4], mf[4], wf[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    xj::unpack_quad(xq, xf);
    xj::unpack_quad(gq, gf);
    xj::unpack_quad(mq, mf);
    if (spec::kWeighted) xj::unpack_quad(wq, wf);
    const float r = tile_rstd[u];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      xj::add_table_terms<T, spec::kWeighted>(gf[e], xj::mul(r, xf[e]), wf[e], mf[e], thirds, first[c][e],
                                              second[c][e], group_f[e]);
      float wd_lo;
      const float wd = xj::weighted_grad<true, spec::kWeighted, true>(gf[e], mf[e], wf[e], &wd_lo);
      if (dxf) {
        dxf[e] = xj::dx_value<false, true>(xf[e], wd, wd_lo, r, 0.0f, coef);
      } else {
        wd_out[e] = wd;
        lo_out[e] = wd_lo;
      }
    }
  };
  // After the last row of each group of kRowUnroll rows: the group into dweight's compensated sum.
  auto fold_group = [&](int c, int u, float* group_f) {
    if (!thirds || ((u + 1) % spec::kRowUnroll != 0 && u + 1 != rows)) return;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      third[c][e].add(group_f[e]);
      group_f[e] = 0.0f;
    }
  };
  // Not gated, iteration u leads row u, then finishes row u - 1; gated, it leads and finishes row u.
#pragma unroll 1
  for (int u = 0; u < rows + (kSharedWd ? 1 : 0); ++u) {
    if (kSharedWd && u < rows) {
      const int s = u % kStages;
      xj::wait_barrier(xj::shared_address(&full[s]), (u / kStages) & 1);
#pragma unroll
      for (int c = 0; c < kElementQuads; ++c) {
        const int q = e_t + c * kElementThreads;
        if (q < kQuads) {
          float wd[4], wd_lo[4], group_q[4] = {0.0f, 0.0f, 0.0f, 0.0f};
          if (thirds) load_shared_floats(group_q, group_row + 4 * q);
          lead_quad(c, s, u, group_q, 0.0f, nullptr, wd, wd_lo);
          fold_group(c, u, group_q);
          store_shared_floats(wd_rows + (u % 2) * spec::kHidden + 4 * q, wd);
          store_shared_floats(lo_rows + (u % 2) * spec::kHidden + 4 * q, wd_lo);
          if (thirds) store_shared_floats(group_row + 4 * q, group_q);
        }
      }
      __syncwarp();
      if (lane == 0) xj::arrive(xj::shared_address(&wd_ready[u % 2]));
    }
    if (kSharedWd && u == 0) continue;
    const int f = kSharedWd ? u - 1 : u;  // the row finished
    const int s = f % kStages;
    // Gated, the row is led here; its coef barrier completes after its full one.
    if (!kSharedWd) xj::wait_barrier(xj::shared_address(&full[s]), (f / kStages) & 1);
    xj::wait_barrier(xj::shared_address(&coef_ready[s]), (f / kStages) & 1);
    const float r = tile_rstd[f], coef = coefs[s];
    const long long row_at = tile_rows[f] * spec::kHidden;
#pragma unroll
    for (int c = 0; c < kElementQuads; ++c) {
      const int q = e_t + c * kElementThreads;
      if (q < kQuads) {
        Quad rq, out;
        if (residual_grad) load_shared_quad(rq, stage_row(s, 2) + 4 * q);
        float dxf[4];
        if (kSharedWd) {
          Quad xq;
          float xf[4], wd[4], wd_lo[4];
          load_shared_quad(xq, stage_row(s, 0) + 4 * q);
          xj::unpack_quad(xq, xf);
          load_shared_floats(wd, wd_rows + (f % 2) * spec::kHidden + 4 * q);
          load_shared_floats(wd_lo, lo_rows + (f % 2) * spec::kHidden + 4 * q);
#pragma unroll
          for (int e = 0; e < 4; ++e) dxf[e] = xj::dx_value<false, true>(xf[e], wd[e], wd_lo[e], r, 0.0f, coef);
        } else {
          lead_quad(c, s, f, group[c], coef, dxf, nullptr, nullptr);
          fold_group(c, f, group[c]);
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
