// Segment sums, last step: out[k, J] = rT(sum over row k's tiles t, ascending, of
// partials[t, J]), summed from zero, compensated; a row without positions gets 0. Without a
// tile table (weight gradients: contiguous tiles of rows) there is one row of `tiles` tiles.
// With row_span R (rms_norm's modulated dweight) one output row folds the tiles of R table rows,
// in order.
// Each column is one chain of adds, so a long fold (qk-norm's dweight: M / 256 tiles) is bound by
// load latency unless loads run ahead: a thread loads kDepth partials while it adds the previous
// kDepth, in the same order.
namespace segment_fold {
typedef xj::StorageOf<spec::kDType>::type T;
constexpr int kThreads = 256;
constexpr int kDepth = 16;
}  // namespace segment_fold

extern "C" __global__ void __launch_bounds__(segment_fold::kThreads)
XJ_ENTRY(const float* __restrict__ partials, const int* __restrict__ row_tile_start, long long tiles,
         long long row_span, long long width, segment_fold::T* __restrict__ out, xj::ErrorRecord* errors) {
  using namespace segment_fold;
  const long long column = (long long)blockIdx.x * kThreads + threadIdx.x;
  const long long row = blockIdx.y;
  if (column >= width) return;
  const long long first = row_tile_start ? row_tile_start[row] : 0;
  const long long last = row_tile_start ? row_tile_start[row + row_span] : tiles;
  xj::CompensatedSum sum;
  const float* at = partials + column;
  float ahead[kDepth];
  long long t = first;
  if (t + kDepth <= last) {
#pragma unroll
    for (int d = 0; d < kDepth; ++d) ahead[d] = at[(t + d) * width];
  }
  for (; t + kDepth <= last; t += kDepth) {
    float batch[kDepth];
#pragma unroll
    for (int d = 0; d < kDepth; ++d) batch[d] = ahead[d];
    if (t + 2 * kDepth <= last) {
#pragma unroll
      for (int d = 0; d < kDepth; ++d) ahead[d] = at[(t + kDepth + d) * width];
    }
#pragma unroll
    for (int d = 0; d < kDepth; ++d) sum.add(batch[d]);
  }
  for (; t < last; ++t) sum.add(at[t * width]);
  out[row * width + column] = xj::round_to<T>(sum.value());
}
