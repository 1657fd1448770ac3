// Segment plan, step 2 of 3: one block. Per table row, the chunk counts become exclusive
// prefix sums over the chunks (where the chunk's positions of that row start); then the row
// totals, where each row starts in the sorted list, its tiles (ceil(B * count / kTilePositions))
// and the row of every tile (-1 for the unused tail of the launch's tile bound).
namespace segment_scan {
constexpr int kThreads = 256;
}  // namespace segment_scan

extern "C" __global__ void __launch_bounds__(segment_scan::kThreads)
XJ_ENTRY(int* __restrict__ chunk_counts, long long chunks, long long table_rows, long long batch,
         int* __restrict__ row_count, int* __restrict__ row_start, int* __restrict__ row_tile_start,
         int* __restrict__ tile_row, long long max_tiles, xj::ErrorRecord* errors) {
  using namespace segment_scan;
  __shared__ int counts[spec::kMaxTableRows];
  __shared__ int tile_starts[spec::kMaxTableRows + 1];
  for (long long k = threadIdx.x; k < table_rows; k += kThreads) {
    int running = 0;
    for (long long c = 0; c < chunks; ++c) {
      const int v = chunk_counts[c * table_rows + k];
      chunk_counts[c * table_rows + k] = running;
      running += v;
    }
    counts[k] = running;
    row_count[k] = running;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    long long start = 0, tiles = 0;
    for (long long k = 0; k < table_rows; ++k) {
      row_start[k] = (int)start;
      tile_starts[k] = (int)tiles;
      start += counts[k];
      tiles += (batch * counts[k] + spec::kTilePositions - 1) / spec::kTilePositions;
    }
    row_start[table_rows] = (int)start;
    tile_starts[table_rows] = (int)tiles;
  }
  __syncthreads();
  for (long long k = threadIdx.x; k <= table_rows; k += kThreads) row_tile_start[k] = tile_starts[k];
  for (long long k = threadIdx.x; k < table_rows; k += kThreads)
    for (int t = tile_starts[k]; t < tile_starts[k + 1]; ++t) tile_row[t] = (int)k;
  for (long long t = tile_starts[table_rows] + threadIdx.x; t < max_tiles; t += kThreads) tile_row[t] = -1;
}
