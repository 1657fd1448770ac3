// gate_residual forward (NUMERICS.md):
//   out[r, j] = rT(add(residual[r, j], rT(mul(gate[i, j], y[r, j])))),  i = index[r mod S]
// residual, y, out: (M, H) contiguous; gate: (R, H) view with row stride kTableStride.
//
// Geometry: kThreadsPerRow threads own one row and walk it in packs of kVec elements,
// kRowsPerBlock rows per block. A thread issues the loads of kUnroll packs before it
// computes any of them, so several 16-byte loads per input are in flight. The index of a row
// is read and range-checked once per thread; a bad index is reported and the row is skipped,
// so nothing outside the table is read.
namespace gate_residual {

typedef xj::StorageOf<spec::kDType>::type T;
typedef xj::IndexOf<spec::kIndexBytes>::type Index;
typedef xj::Pack<T, spec::kVec> Pack;

constexpr int kPacksPerRow = spec::kHidden / spec::kVec;
constexpr int kSteps = (kPacksPerRow + spec::kThreadsPerRow - 1) / spec::kThreadsPerRow;
constexpr int kThreads = spec::kThreadsPerRow * spec::kRowsPerBlock;

static_assert(spec::kHidden % spec::kVec == 0, "hidden size must be a whole number of packs");
static_assert(spec::kTableStride % spec::kVec == 0, "table rows must start on a pack");
static_assert(spec::kTableStride >= spec::kHidden, "table rows must not overlap");
static_assert(kSteps % spec::kUnroll == 0 || kSteps < spec::kUnroll, "unroll must tile the row");

// One output pack, element by element (gate_residual_math.cuh).
__device__ __forceinline__ Pack combine(const Pack& residual, const Pack& gate, const Pack& y) {
  Pack out;
#pragma unroll
  for (int k = 0; k < spec::kVec; ++k) out.v[k] = xj::gate_residual_element(residual.v[k], gate.v[k], y.v[k]);
  return out;
}

}  // namespace gate_residual

extern "C" __global__ void __launch_bounds__(gate_residual::kThreads)
XJ_ENTRY(const gate_residual::T* __restrict__ residual, const gate_residual::T* __restrict__ gate,
         const gate_residual::Index* __restrict__ index, const gate_residual::T* __restrict__ y,
         gate_residual::T* out, long long rows, long long seq, long long table_rows,
         xj::ErrorRecord* errors) {
  using namespace gate_residual;
  const long long row = (long long)blockIdx.x * spec::kRowsPerBlock + threadIdx.x / spec::kThreadsPerRow;
  const int lane = threadIdx.x % spec::kThreadsPerRow;
  if (row >= rows) return;

  const long long position = row % seq;
  const long long i = (long long)index[position];
  if (i < 0 || i >= table_rows) {
    xj::report_bad_index(errors, spec::kOpCode, position, i, table_rows);
    return;
  }
  const T* gate_row = gate + i * spec::kTableStride;
  const long long base = row * spec::kHidden;

  constexpr int kBatch = kSteps < spec::kUnroll ? kSteps : spec::kUnroll;
#pragma unroll
  for (int first = 0; first < kSteps; first += kBatch) {
    Pack r[kBatch], g[kBatch], yv[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int col = (lane + (first + u) * spec::kThreadsPerRow) * spec::kVec;
      if (kPacksPerRow % spec::kThreadsPerRow == 0 || col < spec::kHidden) {
        xj::load_pack(r[u], residual + base + col);
        xj::load_pack(yv[u], y + base + col);
        xj::load_pack(g[u], gate_row + col);
      }
    }
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int col = (lane + (first + u) * spec::kThreadsPerRow) * spec::kVec;
      if (kPacksPerRow % spec::kThreadsPerRow == 0 || col < spec::kHidden) {
        xj::store_pack(out + base + col, combine(r[u], g[u], yv[u]));
      }
    }
  }
}
