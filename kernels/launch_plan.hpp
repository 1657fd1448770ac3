// exactjit launch plan: what an op hands to the runtime after validating a call — the kernel spec
// (without a target; the runtime picks it per device), the grid and the kernel parameters.
// Fixed-size storage, so planning a launch allocates nothing.
#pragma once

#include "codegen/kernel_spec.hpp"

#include <cstdint>
#include <cstdlib>
#include <cstring>

namespace exactjit {

/// What a planner may need to know of the device a launch goes to (det_linear's kernel choice and
/// persistent grid): the architecture the runtime compiles for and the SM count; zero when unknown.
struct DeviceTraits {
  int sm = 0;
  int multiprocessors = 0;
};

struct LaunchPlan {
  static constexpr int kMaxParams = 24;  // plus the error record the runtime appends

  KernelSpec spec;
  int device_id = 0;
  uint32_t grid = 0;     ///< blocks (x); zero means there is nothing to launch
  uint32_t grid_y = 1;   ///< blocks (y)
  uint32_t threads = 0;  ///< threads per block
  uint32_t shared_bytes = 0;  ///< dynamic shared memory per block
  uint64_t params[kMaxParams + 1] = {};  ///< pointers and 64-bit integers, in kernel order
  int param_count = 0;

  void push(uint64_t value) {
    if (param_count == kMaxParams) std::abort();  // a planner pushing too much is a bug in this library
    params[param_count++] = value;
  }
  /// A 32-bit float parameter: the driver reads its 4 bytes from the start of the slot.
  void push_float(float value) {
    uint32_t bits;
    std::memcpy(&bits, &value, sizeof bits);
    push(bits);
  }
  /// A 64-bit float parameter.
  void push_double(double value) {
    uint64_t bits;
    std::memcpy(&bits, &value, sizeof bits);
    push(bits);
  }
};

/// The launches of one multi-kernel op (a backward: plan, tiles, folds), run in order on one
/// stream. Fixed-size, like LaunchPlan.
struct LaunchSequence {
  static constexpr int kMaxSteps = 16;

  LaunchPlan steps[kMaxSteps];
  int count = 0;

  LaunchPlan& add(const KernelSpec& spec, int device_id, uint32_t grid, uint32_t threads) {
    if (count == kMaxSteps) std::abort();  // as push(): a bug in this library, not bad input
    LaunchPlan& plan = steps[count++];
    plan.spec = spec;
    plan.device_id = device_id;
    plan.grid = grid;
    plan.threads = threads;
    return plan;
  }
};

}  // namespace exactjit
