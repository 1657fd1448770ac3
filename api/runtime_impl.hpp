// exactjit Runtime internals, shared by the C++ API (runtime.cpp), the C ABI and the self-test.
#pragma once

#include "api/runtime.hpp"
#include "kernels/launch_plan.hpp"
#include "runtime/device_errors.hpp"
#include "runtime/driver.hpp"
#include "runtime/kernel_cache.hpp"
#include "runtime/module_table.hpp"
#include "runtime/spec_list.hpp"

#include <llvm/ADT/ArrayRef.h>
#include <llvm/Support/Error.h>

#include <array>
#include <atomic>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <unordered_map>

namespace exactjit {

/// What the runtime keeps per CUDA device: its primary context, the target its kernels are
/// compiled for, its streams' error records and the spec -> function map of the hot path.
struct DeviceState {
  CUdevice device = 0;
  CUcontext context = nullptr;
  Target target;
  int multiprocessors = 0;
  std::unique_ptr<StreamErrorRecords> errors;
  std::shared_mutex mutex;
  std::unordered_map<KernelSpec, CUfunction, KernelSpecHash> functions;
};

struct Runtime::Impl {
  static constexpr int kMaxDevices = 64;

  explicit Impl(RuntimeOptions options);
  ~Impl();

  /// A malformed environment or an unparseable arch override, reported at the first device use.
  llvm::Error check_options() const;
  /// The device's state, created (driver loaded, primary context retained) on first use.
  llvm::Expected<DeviceState*> device(int device_id);
  /// The loaded kernel for `spec` on the device (the spec's target is the device's); one that
  /// needs more than 48 KB of dynamic shared memory (`shared_bytes`, a function of the spec) is
  /// allowed it when first loaded.
  llvm::Expected<CUfunction> function(DeviceState& state, KernelSpec spec, uint32_t shared_bytes);
  /// The target and SM count of a device for the planners that need them; zeros when the device
  /// cannot be opened (the launch then reports why).
  DeviceTraits traits(const DLDevice& device);
  /// Launches validated plans in order on `stream`, each with the stream's error record appended,
  /// after taking the bad index pending on the stream (which fails the call, launching nothing);
  /// the device, its context and the check after launch are resolved once for all of them.
  llvm::Error launch(llvm::ArrayRef<LaunchPlan> steps, void* stream);
  llvm::Error launch(const LaunchPlan& plan, void* stream) { return launch(llvm::ArrayRef(plan), stream); }
  llvm::Error launch(const LaunchSequence& sequence, void* stream) {
    return launch(llvm::ArrayRef(sequence.steps, sequence.count), stream);
  }
  /// One kernel launch in the current context, reporting into `error_record` (the stream's): no
  /// context switch, no error-record check.
  llvm::Error launch_in_context(DeviceState& state, const LaunchPlan& plan, CUstream stream, CUdeviceptr error_record);

  RuntimeOptions options;
  std::optional<Target> forced_target;
  KernelCache cache;
  std::unique_ptr<SpecRecorder> recorder;  // EXACTJIT_RECORD_MANIFEST
  const Driver* driver = nullptr;  // set under devices_mutex before any device is published
  std::unique_ptr<ModuleTable> modules;
  std::mutex devices_mutex;
  std::array<std::atomic<DeviceState*>, kMaxDevices> devices{};
};

Status to_status(llvm::Error error);

}  // namespace exactjit
