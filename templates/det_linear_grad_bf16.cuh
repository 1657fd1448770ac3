// det_linear backward, bf16 weights: the AdaLN projection out = rT(add(acc, b)) with
// x = rT(silu(temb)) (kSilu) or rT(temb) (NUMERICS.md "det_linear"; docs/det_linear.md). The
// incoming gradient g (T, N) is bf16 or fp32 (kGradBf16), read exactly as fp32 (a table gradient
// that arrives in fp32 is consumed without rounding). The gradients' order:
// - d_input partials: for each chunk c of 256 outputs n and row t, partials[c, t, k] = value() of a
//   compensated sum (xj::CompensatedSum, from 0) that adds, for the chunk's groups of 8 outputs
//   n = 256c + 8i .. 256c + 8i + 7 (fewer in a short last chunk) in ascending order, p = fma chain
//   over the group's n ascending of g[t, n] * W[n, k] from p = 0 (W's bf16 value, exact in fp32);
// - d_input: d_x[t, k] = value() of a compensated sum from 0 of partials[c, t, k] over c
//   ascending; then through the cast (identity, as autograd treats .to()) and, with SiLU, its
//   derivative at v = temb[t, k]:
//   s = div(1, add(1, expf(-v))),  d_temb = mul(d_x, mul(s, add(1, mul(v, sub(1, s)))))
//   (the fp32 backward's expression); d_input[t, k] = d_temb (fp32);
// - d_weight[n, k] = rT(fma chain over t = 0, 1, ... of g[t, n] * x[t, k] from 0), x[t, k] =
//   rT(silu(temb[t, k])) recomputed exactly as the forward stages it;
// - d_bias[n] = rT(value() of a compensated sum over t ascending of g[t, n]).
// Row t's d_input involves no other row (batch-invariant); nothing depends on the launch geometry.
// Three kernels (speed only):
// - kMode 0, the input pass: block (column block, chunk c); a thread owns the 4 inputs
//   k = 4v .. 4v + 3 (one 8-byte vector of each weight row), streams the chunk's weight rows
//   through a shared-memory ring (async copies, kStages - 1 groups of 8 rows in flight) and adds
//   them into its partials; where d_weight is asked for, it stores the same rows' d_weight, so the
//   backward reads W and writes d_W in one pass; column block 0 stores d_bias;
// - kMode 2, the fold: a block stages the partials of kFoldColumns (16) columns j = t * K + k,
//   kFoldStage chunks at a time, with all its threads, and its first 16 threads add them;
// - kMode 1, d_weight and d_bias alone (no d_input asked for): each block stores a contiguous
//   range of rows n (gridDim.y ranges), 8 inputs k per thread, g staged kWeightStage rows at a time.
// The input pass is compiled for R = kRowTile row slots (1, 2, 3, 4 or 8) and computes every
// slot; the weight grad for 1, 2, 4 or 8 and skips the slots past the live rows. The planner picks
// the smallest R >= the live rows.
namespace det_linear_grad_bf16 {

constexpr int kK = spec::kInFeatures;
constexpr long long kN = spec::kOutFeatures;
constexpr int kRows = spec::kRowTile;  // row slots R
constexpr int kThreads = spec::kThreads;
constexpr int kChunk = spec::kChunk;
constexpr int kGroup = spec::kGroup;
constexpr int kStages = 3;  // the input pass's ring: groups of weight rows in flight + 1
constexpr long long kChunks = (kN + kChunk - 1) / kChunk;
constexpr int kFoldColumns = spec::kFoldColumns;
constexpr int kFoldStage = 384;  // chunks staged at a time by the fold (18H: all 378)
constexpr int kWeightStage = spec::kWeightStage;
typedef xj::CompensatedSum Sum;
static_assert(kK % 8 == 0, "in_features must be a multiple of 8 (8- and 16-byte weight vectors)");
static_assert(kRows >= 1 && kRows <= 8, "the row slots are 1 to 8");
static_assert(kFoldStage % 8 == 0, "the fold adds whole runs of 8 staged partials");

__device__ __forceinline__ float grad_at(const void* grad, long long at) {
  if (spec::kGradBf16) return xj::to_float(static_cast<const xj::bf16*>(grad)[at]);
  return static_cast<const float*>(grad)[at];
}

__device__ __forceinline__ float lo_of(xj::u32 w) { return xj::bits_to_float(w << 16); }
__device__ __forceinline__ float hi_of(xj::u32 w) { return xj::bits_to_float(w & 0xFFFF0000u); }

// Stages g[t, n0 + n] for n < rows_here as fp32, R values per n (zeros past rows_here and the
// live rows).
__device__ __forceinline__ void stage_grad(float* d_v, const void* grad, long long n0, int rows_here, int slots,
                                           int live_rows) {
  for (int i = threadIdx.x; i < slots * kRows; i += blockDim.x) {
    const int n = i / kRows, t = i % kRows;
    d_v[i] = n < rows_here && t < live_rows ? grad_at(grad, (long long)t * kN + n0 + n) : 0.0f;
  }
}

// The R staged values of g for output n, by 16-byte shared loads where R allows.
__device__ __forceinline__ void grad_row(float (&g)[kRows], const float* d_v, int n) {
  if (kRows % 4 == 0) {
#pragma unroll
    for (int q = 0; q < kRows / 4; ++q) {
      const float4 f = reinterpret_cast<const float4*>(d_v + n * kRows)[q];
      g[4 * q] = f.x, g[4 * q + 1] = f.y, g[4 * q + 2] = f.z, g[4 * q + 3] = f.w;
    }
  } else {
#pragma unroll
    for (int t = 0; t < kRows; ++t) g[t] = d_v[n * kRows + t];
  }
}

// x[t, k0 .. k0 + kN - 1] = rT(silu(temb)) or rT(temb), as the forward stages it, as fp32.
template <int kCount>
__device__ __forceinline__ void input_values(float (&x)[kCount], const float* __restrict__ temb, int t, int k0) {
  const float4* src = reinterpret_cast<const float4*>(temb + (long long)t * kK + k0);
#pragma unroll
  for (int q = 0; q < kCount / 4; ++q) {
    const float4 f = src[q];
    const float a[4] = {f.x, f.y, f.z, f.w};
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      float v = a[e];
      if (spec::kSilu) v = xj::div(v, xj::add(1.0f, expf(-v)));
      x[4 * q + e] = xj::to_float(xj::round_to<xj::bf16>(v));
    }
  }
}

// d_weight[n, k] for this thread's inputs: rT(fma chain over the live t of g[t, n] * x[t, k]),
// two bf16 per word.
template <int kCount>
__device__ __forceinline__ void weight_words(xj::u32 (&words)[kCount / 2], const float (&g)[kRows],
                                             const float (&x)[kRows][kCount], int live_rows) {
#pragma unroll
  for (int e = 0; e < kCount / 2; ++e) {
    float w0 = 0.0f, w1 = 0.0f;
#pragma unroll
    for (int t = 0; t < kRows; ++t)
      if (t < live_rows) {
        w0 = xj::fma(g[t], x[t][2 * e], w0);
        w1 = xj::fma(g[t], x[t][2 * e + 1], w1);
      }
    words[e] = xj::round_pair_to_bf16(w0, w1);
  }
}

// d_bias[n0 + n] = rT(compensated sum over the live t of the staged g), a thread per row.
__device__ __forceinline__ void bias_rows(xj::bf16* __restrict__ d_bias, const float* d_v, long long n0, int count,
                                          int live_rows) {
  for (int n = threadIdx.x; n < count; n += blockDim.x) {
    Sum b;
#pragma unroll
    for (int t = 0; t < kRows; ++t)
      if (t < live_rows) b.add(d_v[n * kRows + t]);
    d_bias[n0 + n] = xj::round_to<xj::bf16>(b.value());
  }
}

// One pass over the chunk's weight rows for this thread's 4 inputs k = 4 vec .. + 3: the d_input
// partials and, where d_weight is asked for, the same rows of d_weight. The rows stream through a
// shared-memory ring of kStages groups by async copies, each thread reading back only its own.
// Every slot is computed: a slot past the live rows has g = 0 and x = 0, so its partials are zeros
// (not stored) and its fma(0, 0, w) leaves the live rows' d_weight chains exactly as they are (a
// chain is never -0: it starts at +0 and round-to-nearest sums are -0 only from two -0's).
// The block's g (and, in column block 0, d_bias) is staged while the first groups are in flight.
__device__ __forceinline__ void input_pass(const void* __restrict__ grad, const xj::bf16* __restrict__ weight,
                                           const float* __restrict__ temb, float* __restrict__ partials,
                                           xj::bf16* __restrict__ d_weight, xj::bf16* __restrict__ d_bias,
                                           float* d_v, uint2 (*ring)[kGroup][kThreads], long long chunk, int count,
                                           int vec, int live_rows) {
  const long long n0 = chunk * kChunk;
  const xj::bf16* base = weight + n0 * kK + 4 * vec;
  const int groups = vec < kK / 4 ? (count + kGroup - 1) / kGroup : 0;  // threads past K only stage
  auto issue = [&](int group) {
    if (group < groups)
#pragma unroll
      for (int i = 0; i < kGroup; ++i) {
        const int n = kGroup * group + i;
        if (n < count) xj::async_copy_8(&ring[group % kStages][i][threadIdx.x], base + (long long)n * kK);
      }
    xj::async_commit();
  };
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) issue(s);
  stage_grad(d_v, grad, n0, count, kChunk, live_rows);
  __syncthreads();
  if (d_bias && blockIdx.x == 0) bias_rows(d_bias, d_v, n0, count, live_rows);
  if (groups == 0) return;
  float x[kRows][4];
#pragma unroll
  for (int t = 0; t < kRows; ++t) {
    if (t < live_rows && d_weight) {
      input_values(x[t], temb, t, 4 * vec);
    } else {
#pragma unroll
      for (int e = 0; e < 4; ++e) x[t][e] = 0.0f;
    }
  }
  Sum sums[kRows][4];
#pragma unroll 1
  for (int group = 0; group < groups; ++group) {
    issue(group + kStages - 1);
    xj::async_wait<kStages - 1>();
    float p[kRows][4];
#pragma unroll
    for (int t = 0; t < kRows; ++t)
#pragma unroll
      for (int e = 0; e < 4; ++e) p[t][e] = 0.0f;
#pragma unroll
    for (int i = 0; i < kGroup; ++i) {
      // Rows past count: zero weights and a zero g, so fma(0, 0, p) leaves p exactly.
      const int n = kGroup * group + i;
      const uint2 w = n < count ? ring[group % kStages][i][threadIdx.x] : make_uint2(0u, 0u);
      float g[kRows];
      grad_row(g, d_v, n);
      const float wf[4] = {lo_of(w.x), hi_of(w.x), lo_of(w.y), hi_of(w.y)};
#pragma unroll
      for (int t = 0; t < kRows; ++t)
#pragma unroll
        for (int e = 0; e < 4; ++e) p[t][e] = xj::fma(g[t], wf[e], p[t][e]);
      if (d_weight && n < count) {
        xj::u32 words[2];
        weight_words(words, g, x, kRows);
        *reinterpret_cast<uint2*>(d_weight + (n0 + n) * kK + 4 * vec) = make_uint2(words[0], words[1]);
      }
    }
#pragma unroll
    for (int t = 0; t < kRows; ++t)
#pragma unroll
      for (int e = 0; e < 4; ++e) sums[t][e].add(p[t][e]);
  }
#pragma unroll
  for (int t = 0; t < kRows; ++t) {
    if (t >= live_rows) break;
    *reinterpret_cast<float4*>(partials + (chunk * live_rows + t) * kK + 4 * vec) =
        make_float4(sums[t][0].value(), sums[t][1].value(), sums[t][2].value(), sums[t][3].value());
  }
}

// d_input of columns j = t * K + k for the block's kFoldColumns columns: the partials staged by
// every thread (all of a stage's loads in flight at once), added in chunk order by thread j % 16.
__device__ __forceinline__ void input_fold(const float* __restrict__ partials, const float* __restrict__ temb,
                                           float* __restrict__ d_input, int live_rows) {
  __shared__ float tile[kFoldStage][kFoldColumns];
  const long long columns = (long long)live_rows * kK;
  const int lane = threadIdx.x % kFoldColumns, warp = threadIdx.x / kFoldColumns;
  const int warps = kThreads / kFoldColumns;
  const long long j = (long long)blockIdx.x * kFoldColumns + lane;
  const bool live = j < columns;
  Sum sum;
#pragma unroll 1
  for (long long c0 = 0; c0 < kChunks; c0 += kFoldStage) {
    const int here = kChunks - c0 < kFoldStage ? (int)(kChunks - c0) : kFoldStage;
    float v[kFoldStage / (kThreads / kFoldColumns)];
#pragma unroll
    for (int i = 0; i < kFoldStage / warps; ++i) {
      const int c = warp + i * warps;
      v[i] = live && c < here ? partials[(c0 + c) * columns + j] : 0.0f;
    }
#pragma unroll
    for (int i = 0; i < kFoldStage / warps; ++i) tile[warp + i * warps][lane] = v[i];
    __syncthreads();
    // Whole runs of 8: the zeros past `here` leave the sum exactly as it is (adding +0 changes
    // neither sum nor error, which are never -0).
    if (warp == 0)
#pragma unroll 1
      for (int c = 0; c < here; c += 8)
#pragma unroll
        for (int i = 0; i < 8; ++i) sum.add(tile[c + i][lane]);
    __syncthreads();
  }
  if (warp != 0 || !live) return;
  float d = sum.value();
  if (spec::kSilu) {
    const float v = temb[j];
    const float s = xj::div(1.0f, xj::add(1.0f, expf(-v)));
    d = xj::mul(d, xj::mul(s, xj::add(1.0f, xj::mul(v, xj::sub(1.0f, s)))));
  }
  d_input[j] = d;
}

// d_weight rows [n0, n1) for this thread's 8 inputs (vec < 0: g staging and the bias only), and
// d_bias of those rows where asked.
__device__ __forceinline__ void weight_rows(const void* __restrict__ grad, const float* __restrict__ temb,
                                            xj::bf16* __restrict__ d_weight, xj::bf16* __restrict__ d_bias,
                                            long long n0, long long n1, int vec, int live_rows) {
  __shared__ __align__(16) float d_v[kWeightStage * kRows];
  float x[kRows][8];
#pragma unroll
  for (int t = 0; t < kRows; ++t) {
    if (t < live_rows && vec >= 0) {
      input_values(x[t], temb, t, 8 * vec);
    } else {
#pragma unroll
      for (int e = 0; e < 8; ++e) x[t][e] = 0.0f;
    }
  }
#pragma unroll 1
  for (long long s0 = n0; s0 < n1; s0 += kWeightStage) {
    const int here = n1 - s0 < kWeightStage ? (int)(n1 - s0) : kWeightStage;
    __syncthreads();  // the previous stage's reads are done
    stage_grad(d_v, grad, s0, here, kWeightStage, live_rows);
    __syncthreads();
    if (d_bias) bias_rows(d_bias, d_v, s0, here, live_rows);
    if (vec < 0) continue;
#pragma unroll 1
    for (int r = 0; r < here; ++r) {
      float g[kRows];
      grad_row(g, d_v, r);
      xj::u32 words[4];
      weight_words(words, g, x, live_rows);
      *reinterpret_cast<uint4*>(d_weight + (s0 + r) * kK + 8 * vec) =
          make_uint4(words[0], words[1], words[2], words[3]);
    }
  }
}

}  // namespace det_linear_grad_bf16

extern "C" __global__ void __launch_bounds__(det_linear_grad_bf16::kThreads)
XJ_ENTRY(const void* __restrict__ grad, const float* __restrict__ temb, const xj::bf16* __restrict__ weight,
         float* __restrict__ partials, float* __restrict__ d_input, xj::bf16* __restrict__ d_weight,
         xj::bf16* __restrict__ d_bias, long long rows, xj::ErrorRecord* errors) {
  using namespace det_linear_grad_bf16;
  const int live_rows = rows < kRows ? (int)rows : kRows;
  if (spec::kMode == 0) {
    // The input pass, with d_weight and d_bias where asked for (d_bias by column block 0).
    __shared__ __align__(16) float d_v[kChunk * kRows];
    __shared__ uint2 ring[kStages][kGroup][kThreads];
    const long long chunk = blockIdx.y;
    const int count = kN - chunk * kChunk < kChunk ? (int)(kN - chunk * kChunk) : kChunk;
    input_pass(grad, weight, temb, partials, d_weight, d_bias, d_v, ring, chunk, count,
               blockIdx.x * kThreads + threadIdx.x, live_rows);
  } else if (spec::kMode == 2) {
    input_fold(partials, temb, d_input, live_rows);
  } else {
    // Rows [n0, n1): the block's share of N, in whole stages where N allows.
    const long long per = (kN + gridDim.y - 1) / gridDim.y;
    const long long n0 = blockIdx.y * per, n1 = n0 + per < kN ? n0 + per : kN;
    const int vec = blockIdx.x * kThreads + threadIdx.x;
    if (!d_weight && !d_bias) return;
    weight_rows(grad, temb, d_weight, blockIdx.x == 0 ? d_bias : nullptr, n0, n1,
                vec < kK / 8 && d_weight ? vec : -1, live_rows);
  }
}
