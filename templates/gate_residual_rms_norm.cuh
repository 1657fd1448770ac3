// gate_residual_rms_norm forward (NUMERICS.md): the gated residual feeding the next RMSNorm, in one
// pass over residual and y. Per row r, with i = index[r mod S]:
//   h = rT(add(residual, rT(mul(gate[i], y))))         (gate_residual_math.cuh), stored
//   out = rms_norm(h) [modulated by shift[i], scale[i]] (rms_norm.cuh's steps 1-5 on h)
// so h and out are bitwise equal to eager's `residual + gate.index_select(0, idx) * y` and its
// RMSNorm (+ modulation, kModulated). The gate, shift and scale rows share one index and one row
// stride.
//
// Geometry: rms_norm's: each row has its own kRowThreads threads (128, or one warp where H <= 128),
// kRowsPerBlock rows to a 128-thread block (the launch is rms_norm's plan); a thread
// loads its residual, y and gate quads, then forms h quad by quad in the registers rms_norm keeps
// x in, stores it and sums its squares in PyTorch's order. The modulation is a spec constant, not
// a run-time flag: compiling both paths took 100 registers instead of 64.
namespace gate_residual_rms_norm {

typedef xj::StorageOf<spec::kDType>::type T;
typedef xj::IndexOf<spec::kIndexBytes>::type Index;
typedef xj::Quad<T> Quad;

constexpr int kRowThreads = spec::kRowThreads;
constexpr int kWarps = kRowThreads / 32;
constexpr int kQuads = spec::kHidden / 4;
constexpr int kQuadsPerThread = (kQuads + kRowThreads - 1) / kRowThreads;
constexpr int kThreads = kRowThreads * spec::kRowsPerBlock;

static_assert(spec::kHidden % 4 == 0, "PyTorch's vectorized RMSNorm path needs H % 4 == 0");
static_assert(spec::kTableStride >= spec::kHidden && spec::kTableStride % 4 == 0,
              "table rows must not overlap and must start on a quad");

__device__ __forceinline__ bool in_row(int v) { return kQuads % kRowThreads == 0 || v < kQuads; }

}  // namespace gate_residual_rms_norm

extern "C" __global__ void __launch_bounds__(gate_residual_rms_norm::kThreads)
XJ_ENTRY(const gate_residual_rms_norm::T* __restrict__ residual, const gate_residual_rms_norm::T* __restrict__ gate,
         const gate_residual_rms_norm::Index* __restrict__ index, const gate_residual_rms_norm::T* __restrict__ y,
         const gate_residual_rms_norm::T* __restrict__ weight, const gate_residual_rms_norm::T* __restrict__ shift,
         const gate_residual_rms_norm::T* __restrict__ scale, gate_residual_rms_norm::T* h,
         gate_residual_rms_norm::T* __restrict__ out, float* __restrict__ rstd_out, long long rows, long long seq,
         long long table_rows, float eps, xj::ErrorRecord* errors) {
  using namespace gate_residual_rms_norm;
  __shared__ float warp_sums[spec::kRowsPerBlock][kWarps];
  const xj::RowSlot slot = xj::row_slot<kRowThreads, spec::kRowsPerBlock, true, false>(
      index, rows, seq, table_rows, errors, spec::kOpCode);
  const int group = slot.group, t = slot.t;
  const long long row = slot.row, i = slot.i;
  const bool live = slot.live;

  // 1. The row's residual, y and gate quads, then h = residual + gate * y into the registers,
  //    stored, and its sum of squares in PyTorch's order.
  const long long base = row * spec::kHidden;
  const T* gate_row = gate + i * spec::kTableStride;
  // Every load before the first h store: the gate's quads are L1/L2 hits (every row of a table row
  // shares them), but loaded one by one between the stores, each waited out its own round trip.
  Quad quads[kQuadsPerThread], ys[kQuadsPerThread], gates[kQuadsPerThread];
#pragma unroll
  for (int k = 0; k < kQuadsPerThread; ++k) {
    const int v = t + k * kRowThreads;
    if (live && in_row(v)) {
      xj::load_quad(quads[k], residual + base + 4 * v);
      xj::load_quad(ys[k], y + base + 4 * v);
      xj::load_quad(gates[k], gate_row + 4 * v);
    }
  }
  float s = 0.0f;
#pragma unroll
  for (int k = 0; k < kQuadsPerThread; ++k) {
    const int v = t + k * kRowThreads;
    if (live && in_row(v)) {
#pragma unroll
      for (int e = 0; e < 4; ++e) quads[k].v[e] = xj::gate_residual_element(quads[k].v[e], gates[k].v[e], ys[k].v[e]);
      xj::store_quad(h + base + 4 * v, quads[k]);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float hv = xj::to_float(quads[k].v[e]);
        s = fmaf(hv, hv, s);
      }
    }
  }
  // 2. Within each warp, 3. across warps (row_sum.cuh).
  const float total = xj::row_sum<kRowThreads>(s, warp_sums[group]);
  if (!live) return;
  // 4-5. rms_norm_output.cuh.
  xj::rms_norm_output<T, spec::kHidden, kRowThreads, spec::kParamBatch, spec::kWeighted, spec::kModulated>(
      quads, total, eps, weight, shift + i * spec::kTableStride, scale + i * spec::kTableStride, out + base, rstd_out,
      row, t);
}
