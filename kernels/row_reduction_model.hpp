// exactjit host model of the rms_norm kernels' row reduction (NUMERICS.md), shared by the forward
// (sum of squares) and backward (dot of w * d_n with x; compensated squares summed in fp64) models:
// 128 threads over 4-element vectors v = t, t+128, ... with one chain each, the warps' shfl_down
// tree, then (w0 + w2) + (w1 + w3).
#pragma once

#include "templates/numerics.cuh"

#include <cstdint>
#include <cstring>

namespace exactjit {

/// The block's total over the row: each thread's Chain (from its default) fed element j by
/// `step(j, chain)`, turned into a V by `finish`, then reduced with xj::add of V.
template <typename V, typename Chain, typename Step, typename Finish>
V block_reduce_model(int64_t hidden, Step step, Finish finish) {
  constexpr int kThreads = 128, kLanes = 32;
  V warp_totals[kThreads / kLanes];
  for (int w = 0; w < kThreads / kLanes; ++w) {
    V lanes[kLanes];
    for (int lane = 0; lane < kLanes; ++lane) {  // each thread's chain
      Chain chain{};
      for (int64_t v = w * kLanes + lane; v < hidden / 4; v += kThreads)
        for (int e = 0; e < 4; ++e) step(4 * v + e, chain);
      lanes[lane] = finish(chain);
    }
    for (int offset = 16; offset > 0; offset /= 2) {  // shfl_down tree (lanes past 31 read themselves)
      V next[kLanes];
      for (int lane = 0; lane < kLanes; ++lane)
        next[lane] = xj::add(lanes[lane], lanes[lane + offset < kLanes ? lane + offset : lane]);
      std::memcpy(lanes, next, sizeof lanes);
    }
    warp_totals[w] = lanes[0];
  }
  return xj::add(xj::add(warp_totals[0], warp_totals[2]), xj::add(warp_totals[1], warp_totals[3]));
}

/// The block's total of fma(a_j, b_j, s) over the row, `pair(j, a, b)` giving element j's factors.
template <typename Pair> float block_fma_reduce_model(int64_t hidden, Pair pair) {
  return block_reduce_model<float, float>(
      hidden,
      [&](int64_t j, float& s) {
        float a = 0, b = 0;
        pair(j, a, b);
        s = xj::fma(a, b, s);
      },
      [](float s) { return s; });
}

}  // namespace exactjit
