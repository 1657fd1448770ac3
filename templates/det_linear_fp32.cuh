// det_linear, fp32 weights (NUMERICS.md "det_linear"; docs/det_linear.md):
//   out[t, n] = act(v),  v = add(dot[t, n], b[n]),  act = SiLU: div(v, add(1, expf(-v))), or none
// with dot[t, n] in one fixed order that involves no other row (batch-invariant, repeatable):
//   1. lane l of the column's warp owns the 16-byte chunks c = l, l+32, l+64, ... (< K/4) of W[n]
//      and x[t], taken in groups of two: group m = chunks l+64m and l+64m+32 (the last group of a
//      lane may hold one chunk or none). Per group, p = fma(W, x, p) over the group's products in
//      order (first chunk e = 0..3, then the second), from p = 0; the lane's compensated sum
//      (xj::CompensatedSum, from 0) then adds p, groups in ascending m;
//   2. the 32 lanes' sums meet in the xor-butterfly tree (lanes l and l^16, then ^8, ^4, ^2, ^1)
//      through combine(a, b): error = add(a.error, b.error), then add(b.sum) with TwoSum. combine
//      is symmetric, so the tree's value does not depend on which lane computes it;
//   3. dot = value(): add(sum, error) (sum when it is inf or NaN).
// Geometry (launch only, not the order): kWarps warps per block, kColumnsPerWarp consecutive
// columns per warp, up to kRowTile rows per block (grid.y); the kernel is specialised for the
// live row count (1..kRowTile) so no row does work for another. Weights: 16-byte loads that skip
// L1, kDepth groups in flight per lane; x: 16-byte loads through the read-only cache (no shared
// memory, no barrier). The butterfly is done as a reduce-scatter (each step halves the values a
// lane carries), the same tree with fewer shuffles. No TF32: fma.rn.f32 and add/sub only.
namespace det_linear {

constexpr int kK = spec::kInFeatures;
constexpr long long kN = spec::kOutFeatures;
constexpr int kRows = spec::kRowTile;
constexpr int kWarps = spec::kWarps;
constexpr int kColumns = spec::kColumnsPerWarp;
constexpr int kDepth = spec::kDepth;
constexpr int kThreads = 32 * kWarps;
constexpr int kChunks = kK / 4;            // 16-byte chunks of a row
constexpr int kFullGroups = kChunks / 64;  // groups in which every lane has both chunks
constexpr int kTailChunks = kChunks % 64;  // chunks of the last, partial group
constexpr int kRounds = kFullGroups / kDepth;
constexpr int kLeftover = kFullGroups % kDepth;

static_assert(kK % 4 == 0, "in_features must be a multiple of 4");
static_assert(kRows >= 1 && (kRows & (kRows - 1)) == 0, "the row tile is a power of two");
static_assert(kDepth >= 1 && (kFullGroups == 0 || kDepth <= kFullGroups), "depth is at most the full groups");

typedef xj::CompensatedSum Sum;

// Weights are read once: 16-byte loads that do not allocate in L1, which keeps x there.
__device__ __forceinline__ float4 load_weight(const float* p) {
  float4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.f32 {%0, %1, %2, %3}, [%4];"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
               : "l"(p));
  return v;
}

__device__ __forceinline__ float4 load_x(const float* row, int chunk) {
  return __ldg(reinterpret_cast<const float4*>(row) + chunk);
}

__device__ __forceinline__ float chunk_fma(float4 w, float4 v, float p) {
  p = xj::fma(w.x, v.x, p);
  p = xj::fma(w.y, v.y, p);
  p = xj::fma(w.z, v.z, p);
  return xj::fma(w.w, v.w, p);
}

// a + b in the butterfly: symmetric in a and b (TwoSum's error is exact).
__device__ __forceinline__ Sum combine(Sum a, const Sum& b) {
  a.error = xj::add(a.error, b.error);
  a.add(b.sum);
  return a;
}

// first ? a : b, field by field (a select of whole structs would go through local memory).
__device__ __forceinline__ Sum pick(bool first, Sum a, Sum b) {
  Sum r;
  r.sum = first ? a.sum : b.sum;
  r.error = first ? a.error : b.error;
  return r;
}

__device__ __forceinline__ Sum shfl_xor(const Sum& s, int offset) {
  Sum r;
  r.sum = __shfl_xor_sync(0xFFFFFFFFu, s.sum, offset);
  r.error = __shfl_xor_sync(0xFFFFFFFFu, s.error, offset);
  return r;
}

typedef float4 Group[kColumns][2];  // a group's weights: per column, the first and second chunk

// Loads the group whose first chunk is `chunk` (the second is chunk + 32 when `kSecond`).
template <bool kSecond>
__device__ __forceinline__ void load_group(Group& g, const float* const (&w)[kColumns], int chunk) {
#pragma unroll
  for (int col = 0; col < kColumns; ++col) {
    g[col][0] = load_weight(w[col] + 4 * chunk);
    if (kSecond) g[col][1] = load_weight(w[col] + 4 * (chunk + 32));
  }
}

// Step 1 for one group and every (column, row): p = the group's fma chain from 0, then sum.add(p).
template <int R, bool kSecond>
__device__ __forceinline__ void add_group(const Group& g, const float* const (&x)[R], int chunk,
                                          Sum (&acc)[kColumns][R]) {
#pragma unroll
  for (int t = 0; t < R; ++t) {
    const float4 v0 = load_x(x[t], chunk);
    const float4 v1 = kSecond ? load_x(x[t], chunk + 32) : v0;
#pragma unroll
    for (int col = 0; col < kColumns; ++col) {
      float p = chunk_fma(g[col][0], v0, 0.0f);
      if (kSecond) p = chunk_fma(g[col][1], v1, p);
      acc[col][t].add(p);
    }
  }
}

// Steps 1-3 for the warp's columns and R row slots (live_rows <= R of them live; a slot past them
// repeats the last live row and is not stored), then bias, activation and the stores.
template <int R>
__device__ __forceinline__ void run(int live_rows, const float* __restrict__ rows_x, const float* const (&w)[kColumns],
                                    int lane, long long column0, const float* __restrict__ bias,
                                    float* __restrict__ out, float* __restrict__ pre_activation, long long row0) {
  const float* x[R];
#pragma unroll
  for (int t = 0; t < R; ++t) x[t] = rows_x + (long long)(t < live_rows ? t : live_rows - 1) * kK;
  Sum acc[kColumns][R];
  if (kFullGroups > 0) {
    Group buf[kDepth];
#pragma unroll
    for (int d = 0; d < kDepth; ++d) load_group<true>(buf[d], w, lane + 64 * d);
#pragma unroll 1
    for (int m0 = 0; m0 < kRounds * kDepth; m0 += kDepth) {
#pragma unroll
      for (int d = 0; d < kDepth; ++d) {
        add_group<R, true>(buf[d], x, lane + 64 * (m0 + d), acc);
        if (m0 + d + kDepth < kFullGroups) load_group<true>(buf[d], w, lane + 64 * (m0 + d + kDepth));
      }
    }
#pragma unroll
    for (int d = 0; d < kLeftover; ++d) add_group<R, true>(buf[d], x, lane + 64 * (kRounds * kDepth + d), acc);
  }
  if (kTailChunks > 0) {
    Group g;
    const int chunk = 64 * kFullGroups + lane;
    if (lane + 32 < kTailChunks) {
      load_group<true>(g, w, chunk);
      add_group<R, true>(g, x, chunk, acc);
    } else if (lane < kTailChunks) {
      load_group<false>(g, w, chunk);
      add_group<R, false>(g, x, chunk, acc);
    }
  }

  // Step 2 as a reduce-scatter: value slot i = column i / R, row i % R, padded with zero slots to
  // a power of two kSlots; each step hands half of a lane's slots to its partner, so after it the
  // lane carries half as many, each a sum over twice as many lanes.
  constexpr int kValues = kColumns * R;
  constexpr int kSlots = kValues <= 1 ? 1 : kValues <= 2 ? 2 : kValues <= 4 ? 4 : kValues <= 8 ? 8 : kValues <= 16 ? 16 : 32;
  static_assert(kValues <= 32, "a warp reduces at most 32 values at once");
  Sum s[kSlots];
#pragma unroll
  for (int i = 0; i < kValues; ++i) s[i] = acc[i / R][i % R];
  constexpr int kLanesPerSlot = 32 / kSlots;
  constexpr int kHalvings = kSlots == 32 ? 5 : kSlots == 16 ? 4 : kSlots == 8 ? 3 : kSlots == 4 ? 2 : kSlots == 2 ? 1 : 0;
#pragma unroll
  for (int step = 0; step < kHalvings; ++step) {  // offsets 16, 8, ..., kLanesPerSlot
    const int half = kSlots >> (step + 1), offset = 16 >> step;
    const bool upper = (lane & offset) != 0;
#pragma unroll
    for (int j = 0; j < kSlots / 2; ++j) {  // a constant trip count, so both loops unroll
      if (j >= half) break;
      const Sum lower_slot = s[j], upper_slot = s[j + half];
      s[j] = combine(pick(upper, upper_slot, lower_slot), shfl_xor(pick(upper, lower_slot, upper_slot), offset));
    }
  }
#pragma unroll
  for (int step = kHalvings; step < 5; ++step) s[0] = combine(s[0], shfl_xor(s[0], 16 >> step));  // ..., 2, 1
  const int slot = lane / kLanesPerSlot;
  if (lane % kLanesPerSlot != 0 || slot >= kValues) return;
  const long long n = column0 + slot / R;
  const int t = slot % R;
  if (n >= kN || t >= live_rows) return;
  const float dot = s[0].value();
  const float v = bias ? xj::add(dot, bias[n]) : dot;
  if (pre_activation) pre_activation[(row0 + t) * kN + n] = v;
  out[(row0 + t) * kN + n] = spec::kSilu ? xj::div(v, xj::add(1.0f, expf(-v))) : v;
}

// Runs the smallest specialisation R in {kRows, kRows / 2, ..., 1} with live_rows <= R.
template <int R>
__device__ __forceinline__ void dispatch(int live_rows, const float* __restrict__ x, const float* const (&w)[kColumns],
                                         int lane, long long column0, const float* __restrict__ bias,
                                         float* __restrict__ out, float* __restrict__ pre_activation, long long row0) {
  if constexpr (R > 1) {
    if (live_rows <= R / 2) {
      dispatch<R / 2>(live_rows, x, w, lane, column0, bias, out, pre_activation, row0);
      return;
    }
  }
  run<R>(live_rows, x, w, lane, column0, bias, out, pre_activation, row0);
}

}  // namespace det_linear

extern "C" __global__ void __launch_bounds__(det_linear::kThreads)
XJ_ENTRY(const float* __restrict__ x, const float* __restrict__ weight, const float* __restrict__ bias,
         float* __restrict__ out, float* __restrict__ pre_activation, long long rows, xj::ErrorRecord* errors) {
  using namespace det_linear;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const long long row0 = (long long)blockIdx.y * kRows;
  const int live_rows = rows - row0 < kRows ? (int)(rows - row0) : kRows;
  const long long column0 = ((long long)blockIdx.x * kWarps + warp) * kColumns;
  if (column0 >= kN) return;  // a whole warp past the last column (no barrier in this kernel)
  const float* w[kColumns];
#pragma unroll
  for (int col = 0; col < kColumns; ++col) w[col] = weight + (column0 + col < kN ? column0 + col : kN - 1) * kK;
  dispatch<kRows>(live_rows, x + row0 * kK, w, lane, column0, bias, out, pre_activation, row0);
}
