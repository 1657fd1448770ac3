// exactjit's internal C++ API, over the static core: the C ABI, the CLI and the tests use it; users
// get include/exactjit/exactjit.h and its C++ wrapper exactjit.hpp instead. A Runtime owns the
// kernel caches and the per-device state, and runs the ops.
//
// Tensors are DLPack DLTensors (dlpack/dlpack.h). Every op validates its arguments on the host,
// launches on the caller's stream and returns at once; a bad index found by a kernel is reported,
// naming the op, by the next call on the same stream (it fails without launching; no
// synchronisation is involved, so a report still in flight shows at a later call), by
// synchronize() for a definite answer, or at once when RuntimeOptions::check_after_launch is set.
// Records are per stream (per device, for the first 255 streams a device sees; later streams share
// one), so one stream's bad index is never reported to a call on another.
// A Runtime is thread-safe.
#pragma once

#include "kernels/launch_plan.hpp"

#include <dlpack/dlpack.h>
#include <llvm/Support/Error.h>

#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace exactjit {

/// The outcome of a call: ok, or a code (exactjit_status_t in exactjit.h) and a message that
/// names the argument, path or spec involved.
class Status {
 public:
  Status() = default;
  Status(int code, std::string message) : code_(code), message_(std::move(message)) {}
  bool ok() const { return code_ == 0; }
  int code() const { return code_; }
  const std::string& message() const { return message_; }

 private:
  int code_ = 0;
  std::string message_;
};

struct RuntimeOptions {
  std::string cache_dir;                    ///< writable cache; empty: no writable layer
  std::vector<std::string> read_only_dirs;  ///< searched before cache_dir, in order
  bool offline = false;                     ///< never compile: a miss is an error
  std::string arch;                         ///< "" = the device's; else "sm_90" or "compute_90"
  bool check_after_launch = false;          ///< synchronize and check device errors after each op
  std::string record_manifest;              ///< append every spec used to this spec list; "" = none
  /// Set by from_environment() when a variable is malformed (EXACTJIT_OFFLINE=maybe): names it and
  /// the accepted values. A Runtime made from such options fails every call with it
  /// (InvalidArgument); xj_runtime_create refuses to create one.
  std::string environment_error;

  /// EXACTJIT_CACHE_DIR, EXACTJIT_CACHE_PATH, EXACTJIT_OFFLINE, EXACTJIT_ARCH,
  /// EXACTJIT_CHECK_AFTER_LAUNCH, EXACTJIT_RECORD_MANIFEST (see README.md).
  static RuntimeOptions from_environment();
};

class Runtime {
 public:
  /// Creating a runtime loads nothing: NVRTC is loaded on the first compile, libcuda on the first
  /// launch.
  explicit Runtime(RuntimeOptions options = RuntimeOptions::from_environment());
  ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  /// Launches what an op's planner made of its arguments (kernels/<op>.hpp: plan_<op>) on
  /// `stream`, a CUstream of the tensors' device (nullptr: the legacy default stream), or returns
  /// the planner's error. Every op call takes this path; each op's C entry point (xj_<op>,
  /// exactjit.h, where each contract is documented) is defined in its op's file over it.
  Status launch(llvm::Expected<LaunchPlan>&& plan, void* stream);
  Status launch(llvm::Expected<LaunchSequence>&& sequence, void* stream);

  /// The target and SM count of a tensor's device, for planners that choose kernels by them
  /// (det_linear); zeros when the device cannot be opened (the launch then reports why).
  DeviceTraits traits(const DLDevice& device);

  /// Gets the kernel whose canonical spec text (KernelSpec::describe) is `spec` into the caches
  /// without launching it, so no GPU is needed: from a layer, else compiled (an offline miss when
  /// offline).
  Status prewarm(std::string_view spec);

  /// The resolved options, one "name: value" line each.
  std::string info() const;

  /// Waits for `stream` on `device_id` and reports any bad index a kernel on that stream found
  /// since the last check (then clears it).
  Status synchronize(int device_id, void* stream);

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace exactjit
