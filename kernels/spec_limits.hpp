// exactjit spec limits: the largest value of each size field of a spec that exactjit generates a
// kernel for, written once here and checked by the planners, by the catalog's validate_spec and so
// by the CLI and prewarm manifests. Every real model fits with a wide margin: MiniMax-H3 has
// H = 5376 (qk-norm H = 128) and an AdaLN projection of 2688 -> 18H = 96768 features; the widest
// dense transformers have H <= 20480. Past the caps a spec only fails: the templates hold H and K
// in `int` constants, and rms_norm keeps a row in registers, so its backward compiles in time
// growing with H (bf16 ~15 s, fp32 ~50 s per kernel at H = 65536 on one CPU core, against
// ~1 s at H3's; at H near 2^31 NVRTC gives up or runs for minutes).
#pragma once

#include "codegen/kernel_spec.hpp"
#include "codegen/op_row.hpp"

#include <fmt/format.h>

#include <cstdint>
#include <string>
#include <string_view>

namespace exactjit {

/// A size field and its cap; its floor is 1 (ops add their own minimums and multiples).
struct SizeCap {
  std::string_view field;  ///< as messages name it
  int64_t max;
};

/// H of the row ops (gate_residual, adaln_row_gather, rms_norm and their backward).
inline constexpr SizeCap kHiddenCap{"hidden size H", 65536};
/// timestep_sinusoid's channels C (H3: 256).
inline constexpr SizeCap kChannelsCap{"channels C", 65536};
/// det_linear's in_features K: a hidden or embedding width (H3: 256, 2688, 5376).
inline constexpr SizeCap kInFeaturesCap{"in_features K", 65536};
/// det_linear's out_features N: up to 18H at the H cap (H3: 96768); keeps the 64-output d_input
/// chunks within one grid dimension (65535).
inline constexpr SizeCap kOutFeaturesCap{"out_features N", int64_t{1} << 21};
/// det_linear's rows T (the timesteps of a batch; H3: 3): its backward keeps up to T rows of
/// partials per block, in kernels compiled per row tile.
inline constexpr SizeCap kLinearRowsCap{"rows T", 8};
/// The row stride of a table view, in elements (H3: 6H and 2H views of an 18H table).
inline constexpr SizeCap kTableStrideCap{"table stride", 2147483647};

/// Empty when 1 <= value <= cap.max, else the rule broken, naming the field and the cap:
/// "hidden size H must be in [1, 65536] (got 70000)".
inline std::string cap_rule(const SizeCap& cap, int64_t value) {
  if (value >= 1 && value <= cap.max) return {};
  return fmt::format("{} must be in [1, {}] (got {})", cap.field, cap.max, value);
}

/// The oldest architecture exactjit generates kernels for.
inline constexpr int kMinTargetSm = 75;

/// The first cap a spec's size fields break, "" if none: the fields of its op's shape (the plan
/// kernels' key count has its own rule in their row).
inline std::string size_caps_rule(const KernelSpec& spec) {
  switch (op_row(spec.op).shape) {
    case SpecShape::Rows:
      if (std::string rule = cap_rule(kHiddenCap, spec.hidden); !rule.empty()) return rule;
      return spec.table_stride == 0 ? "" : cap_rule(kTableStrideCap, spec.table_stride);
    case SpecShape::Channels: return cap_rule(kChannelsCap, spec.channels);
    case SpecShape::Linear:
      if (std::string rule = cap_rule(kInFeaturesCap, spec.in_features); !rule.empty()) return rule;
      return cap_rule(kOutFeaturesCap, spec.out_features);
    case SpecShape::Plan: break;
  }
  return {};
}

}  // namespace exactjit
