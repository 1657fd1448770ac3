// adaln_row_gather forward (NUMERICS.md): a byte copy, no arithmetic on the values.
//   out[c, s, :] = rows[ti[s] * 3 + tag[s], c*H : (c+1)*H]   for the six chunks c = 0..5
// rows: (3T, 6H) view with row stride kTableStride; out: (6, S, H) contiguous.
//
// Geometry: kThreadsPerRow threads copy the 6H elements of one position's source row in packs of
// kVec. Both indices are range-checked before they are combined, so a huge timestep cannot wrap
// t * 3 + tag onto a valid row; a bad position is reported and its outputs are not written.
namespace adaln_row_gather {

typedef xj::StorageOf<spec::kDType>::type T;
typedef xj::IndexOf<spec::kIndexBytes>::type Index;
typedef xj::Pack<T, spec::kVec> Pack;

constexpr int kChunks = 6;
constexpr int kModalities = 3;
constexpr int kPacksPerChunk = spec::kHidden / spec::kVec;
constexpr int kPacksPerRow = kChunks * kPacksPerChunk;
constexpr int kSteps = (kPacksPerRow + spec::kThreadsPerRow - 1) / spec::kThreadsPerRow;
constexpr int kThreads = spec::kThreadsPerRow * spec::kRowsPerBlock;
constexpr unsigned kTagArgument = 1u << 16;  // error-record argument 1: token_tags

static_assert(spec::kHidden % spec::kVec == 0, "hidden size must be a whole number of packs");
static_assert(spec::kTableStride % spec::kVec == 0, "table rows must start on a pack");
static_assert(spec::kTableStride >= kChunks * spec::kHidden, "table rows must hold six chunks");
static_assert(kSteps % spec::kUnroll == 0 || kSteps < spec::kUnroll, "unroll must tile the row");

}  // namespace adaln_row_gather

extern "C" __global__ void __launch_bounds__(adaln_row_gather::kThreads)
XJ_ENTRY(const adaln_row_gather::T* __restrict__ rows, const adaln_row_gather::Index* __restrict__ timestep_indices,
         const adaln_row_gather::Index* __restrict__ token_tags, adaln_row_gather::T* __restrict__ out,
         long long seq, long long timesteps, xj::ErrorRecord* errors) {
  using namespace adaln_row_gather;
  const long long position = (long long)blockIdx.x * spec::kRowsPerBlock + threadIdx.x / spec::kThreadsPerRow;
  const int lane = threadIdx.x % spec::kThreadsPerRow;
  if (position >= seq) return;

  const long long t = (long long)timestep_indices[position];
  if (t < 0 || t >= timesteps) {
    xj::report_bad_index(errors, spec::kOpCode, position, t, timesteps);
    return;
  }
  const long long tag = (long long)token_tags[position];
  if (tag < 0 || tag >= kModalities) {
    xj::report_bad_index(errors, spec::kOpCode | kTagArgument, position, tag, kModalities);
    return;
  }
  const T* source = rows + (t * kModalities + tag) * spec::kTableStride;

  constexpr int kBatch = kSteps < spec::kUnroll ? kSteps : spec::kUnroll;
#pragma unroll
  for (int first = 0; first < kSteps; first += kBatch) {
    Pack packs[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int p = lane + (first + u) * spec::kThreadsPerRow;
      if (kPacksPerRow % spec::kThreadsPerRow == 0 || p < kPacksPerRow) xj::load_pack(packs[u], source + p * spec::kVec);
    }
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int p = lane + (first + u) * spec::kThreadsPerRow;
      if (kPacksPerRow % spec::kThreadsPerRow == 0 || p < kPacksPerRow) {
        const int chunk = p / kPacksPerChunk;
        const int column = (p - chunk * kPacksPerChunk) * spec::kVec;
        xj::store_pack(out + ((long long)chunk * seq + position) * spec::kHidden + column, packs[u]);
      }
    }
  }
}
