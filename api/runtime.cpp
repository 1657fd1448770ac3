// exactjit Runtime: the internal C++ API over the pipeline (api/runtime.hpp).
//
// Hot path of an op call: validate (kernels/) -> per-device spec->CUfunction map under a shared
// lock -> cuLaunchKernel on the caller's stream. Nothing is rendered, hashed or allocated there.
// The first call of a spec on a device takes the slow path: render the source, get the image from
// the kernel cache (memory, disk or NVRTC), load the module in the device's primary context.
#include "api/runtime_impl.hpp"

#include "codegen/render.hpp"
#include "kernels/catalog.hpp"
#include "runtime/device_errors.hpp"
#include "runtime/errors.hpp"
#include "runtime/environment.hpp"
#include "runtime/nvrtc.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>

namespace exactjit {

RuntimeOptions RuntimeOptions::from_environment() {
  RuntimeOptions options;
  if (llvm::Error error = check_environment()) {
    options.environment_error = take_error(std::move(error)).message;
    return options;
  }
  const CacheConfig config = llvm::cantFail(cache_config_from_environment());  // checked above
  options.cache_dir = config.writable_dir;
  options.read_only_dirs = config.read_only_dirs;
  options.offline = config.offline;
  options.arch = environment_text("EXACTJIT_ARCH");
  options.check_after_launch = llvm::cantFail(environment_boolean("EXACTJIT_CHECK_AFTER_LAUNCH"));
  options.record_manifest = environment_text("EXACTJIT_RECORD_MANIFEST");
  return options;
}

Status to_status(llvm::Error error) {
  if (!error) return Status();
  ErrorReport report = take_error(std::move(error));
  return Status(static_cast<int>(report.code), std::move(report.message));
}

namespace {

// The layers, offline mode from the options; the pinned index and the layer check are the
// deployment's policy, always from the environment (a runtime given its own folders stays pinned).
// A malformed policy fails the runtime like any malformed variable.
CacheConfig cache_config_of(RuntimeOptions& options) {
  CacheConfig config;
  if (auto environment = cache_config_from_environment()) config = *environment;
  else if (options.environment_error.empty()) options.environment_error = take_error(environment.takeError()).message;
  else llvm::consumeError(environment.takeError());
  config.writable_dir = options.cache_dir;
  config.read_only_dirs = options.read_only_dirs;
  config.offline = options.offline;
  return config;
}

}  // namespace

Runtime::Impl::Impl(RuntimeOptions runtime_options)
    : options(std::move(runtime_options)), cache(cache_config_of(options)) {
  if (!options.arch.empty()) forced_target = parse_target(options.arch);
  if (!options.record_manifest.empty()) recorder = std::make_unique<SpecRecorder>(options.record_manifest);
}

llvm::Error Runtime::Impl::check_options() const {
  if (!options.environment_error.empty()) return make_error(ErrorCode::InvalidArgument, options.environment_error);
  if (!options.arch.empty() && !forced_target)
    return make_error(ErrorCode::InvalidArgument,
                      fmt::format("arch '{}' (EXACTJIT_ARCH) must look like sm_90 or compute_90", options.arch));
  return llvm::Error::success();
}

Runtime::Impl::~Impl() {
  modules.reset();  // unload before the contexts go
  for (auto& slot : devices) {
    DeviceState* state = slot.load();
    if (!state) continue;
    state->errors.reset();  // frees in the context, before it is released
    driver->cuDevicePrimaryCtxRelease(state->device);
    delete state;
  }
}

llvm::Expected<DeviceState*> Runtime::Impl::device(int device_id) {
  if (device_id < 0 || device_id >= kMaxDevices)
    return make_error(ErrorCode::InvalidArgument, fmt::format("CUDA device id {} is out of range", device_id));
  if (DeviceState* state = devices[device_id].load(std::memory_order_acquire)) return state;
  if (auto err = check_options()) return err;

  std::lock_guard<std::mutex> lock(devices_mutex);
  if (DeviceState* state = devices[device_id].load()) return state;
  if (!driver) {
    auto loaded = Driver::get();
    if (!loaded) return loaded.takeError();
    driver = *loaded;
    modules = std::make_unique<ModuleTable>(*driver);
  }
  int count = 0;
  if (auto err = driver->check(driver->cuDeviceGetCount(&count), "cuDeviceGetCount")) return err;
  if (device_id >= count)
    return make_error(ErrorCode::InvalidArgument,
                      fmt::format("CUDA device {} does not exist ({} device(s) visible)", device_id, count));
  auto state = std::make_unique<DeviceState>();
  if (auto err = driver->check(driver->cuDeviceGet(&state->device, device_id), "cuDeviceGet")) return err;
  int major = 0, minor = 0;
  driver->cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, state->device);
  driver->cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, state->device);
  state->target = forced_target.value_or(Target{major * 10 + minor, false});
  driver->cuDeviceGetAttribute(&state->multiprocessors, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, state->device);
  if (auto err = driver->check(driver->cuDevicePrimaryCtxRetain(&state->context, state->device),
                               "cuDevicePrimaryCtxRetain"))
    return err;
  auto errors = StreamErrorRecords::create(*driver, state->context);
  if (!errors) {
    driver->cuDevicePrimaryCtxRelease(state->device);
    return errors.takeError();
  }
  state->errors = std::move(*errors);
  devices[device_id].store(state.get(), std::memory_order_release);
  return state.release();
}

DeviceTraits Runtime::Impl::traits(const DLDevice& device) {
  if (device.device_type != kDLCUDA) return {};
  auto state = this->device(device.device_id);
  if (!state) {
    llvm::consumeError(state.takeError());
    return {};
  }
  return {(*state)->target.sm, (*state)->multiprocessors};
}

llvm::Expected<CUfunction> Runtime::Impl::function(DeviceState& state, KernelSpec spec, uint32_t shared_bytes) {
  {
    std::shared_lock<std::shared_mutex> lock(state.mutex);  // the target can move to PTX once
    spec.target = state.target;
    if (auto it = state.functions.find(spec); it != state.functions.end()) return it->second;
  }
  // The cold path: the op's rules on this device's target first (the sm_75 floor, bf16
  // det_linear's sm_80), so that an older GPU is told the rule, not an NVRTC error.
  if (llvm::Error err = validate_spec(spec)) return err;
  const KernelSpec requested = spec;
  auto lookup = cache.get(codegen::render(spec));
  if (!lookup && !options.offline) {
    // A device newer than NVRTC knows: compile PTX for the newest architecture NVRTC supports
    // and let the driver finish it.
    auto nvrtc = Nvrtc::get();
    const std::vector<int>* archs = nvrtc ? &(*nvrtc)->supported_archs() : nullptr;
    if (!nvrtc) llvm::consumeError(nvrtc.takeError());
    if (archs && !archs->empty() && !spec.target.ptx &&
        std::find(archs->begin(), archs->end(), spec.target.sm) == archs->end() && spec.target.sm > archs->back()) {
      llvm::consumeError(lookup.takeError());
      fmt::print(stderr, "exactjit: device sm_{} is newer than NVRTC {}.{} supports; compiling PTX for compute_{}\n",
                 spec.target.sm, (*nvrtc)->identity().major, (*nvrtc)->identity().minor, archs->back());
      spec.target = Target{archs->back(), true};
      {
        std::lock_guard<std::shared_mutex> lock(state.mutex);
        state.target = spec.target;
      }
      lookup = cache.get(codegen::render(spec));
    }
  }
  // The kernel this device runs (the PTX one after a fallback), a miss too: a deployment needs it.
  if (recorder) recorder->record(spec);
  if (!lookup) return lookup.takeError();
  auto function = modules->function(state.context, *lookup->kernel);
  if (!function) return function.takeError();
  if (shared_bytes > 48 * 1024)
    if (auto err = driver->check(driver->cuFuncSetAttribute(*function, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                                            static_cast<int>(shared_bytes)),
                                 "cuFuncSetAttribute"))
      return make_error(ErrorCode::Cuda, fmt::format("{} needs {} bytes of shared memory per block: {}",
                                                     op_name(spec.op), shared_bytes, llvm::toString(std::move(err))));
  std::lock_guard<std::shared_mutex> lock(state.mutex);
  state.functions.emplace(requested, *function);
  state.functions.emplace(spec, *function);
  return *function;
}

llvm::Error Runtime::Impl::launch_in_context(DeviceState& state, const LaunchPlan& plan, CUstream stream,
                                             CUdeviceptr error_record) {
  if (plan.grid == 0) return llvm::Error::success();
  auto function = this->function(state, plan.spec, plan.shared_bytes);
  if (!function) return function.takeError();
  uint64_t params[LaunchPlan::kMaxParams + 1];
  void* args[LaunchPlan::kMaxParams + 1];
  for (int i = 0; i < plan.param_count; ++i) {
    params[i] = plan.params[i];
    args[i] = &params[i];
  }
  params[plan.param_count] = error_record;
  args[plan.param_count] = &params[plan.param_count];
  if (auto err = driver->check(driver->cuLaunchKernel(*function, plan.grid, plan.grid_y, 1, plan.threads, 1, 1,
                                                      plan.shared_bytes, stream, args, nullptr),
                               "cuLaunchKernel"))
    return make_error(ErrorCode::Cuda, fmt::format("{}: {}", op_name(plan.spec.op), llvm::toString(std::move(err))));
  return llvm::Error::success();
}

llvm::Error Runtime::Impl::launch(llvm::ArrayRef<LaunchPlan> steps, void* stream) {
  if (steps.empty() || (steps.size() == 1 && steps[0].grid == 0)) return llvm::Error::success();
  auto state = device(steps[0].device_id);  // planners put every step on one device
  if (!state) return state.takeError();
  ScopedContext scope(*driver, (*state)->context);
  const auto cu_stream = static_cast<CUstream>(stream);
  StreamErrorRecords& errors = *(*state)->errors;
  // A bad index an earlier kernel on this stream reported fails this call, before it launches.
  auto record = errors.launch_record(cu_stream);
  if (!record) return record.takeError();
  for (const LaunchPlan& step : steps)
    if (auto err = launch_in_context(**state, step, cu_stream, *record)) return err;
  if (options.check_after_launch) return errors.synchronize(cu_stream);
  return llvm::Error::success();
}

Runtime::Runtime(RuntimeOptions options) : impl_(std::make_unique<Impl>(std::move(options))) {}
Runtime::~Runtime() = default;

Status Runtime::launch(llvm::Expected<LaunchPlan>&& plan, void* stream) {
  if (!plan) return to_status(plan.takeError());
  return to_status(impl_->launch(*plan, stream));
}

Status Runtime::launch(llvm::Expected<LaunchSequence>&& sequence, void* stream) {
  if (!sequence) return to_status(sequence.takeError());
  return to_status(impl_->launch(*sequence, stream));
}

DeviceTraits Runtime::traits(const DLDevice& device) { return impl_->traits(device); }

Status Runtime::synchronize(int device_id, void* stream) {
  auto state = impl_->device(device_id);
  if (!state) return to_status(state.takeError());
  return to_status((*state)->errors->synchronize(static_cast<CUstream>(stream)));
}

Status Runtime::prewarm(std::string_view text) {
  const std::optional<KernelSpec> spec = parse_spec(text);
  if (!spec)
    return Status(static_cast<int>(ErrorCode::InvalidArgument),
                  fmt::format("prewarm: '{}' is not a kernel's canonical spec text", text));
  if (llvm::Error err = validate_spec(*spec)) return to_status(std::move(err));
  auto lookup = impl_->cache.get(codegen::render(*spec));
  return to_status(lookup ? llvm::Error::success() : lookup.takeError());
}

std::string Runtime::info() const {
  const RuntimeOptions& options = impl_->options;
  std::string layers;
  for (const std::string& dir : options.read_only_dirs) layers += (layers.empty() ? "" : ":") + dir;
  return fmt::format("cache: {}\nread-only layers: {}\noffline: {}\narch: {}\ncheck after launch: {}\n",
                     options.cache_dir.empty() ? "(none)" : options.cache_dir, layers.empty() ? "(none)" : layers,
                     options.offline ? "yes" : "no", options.arch.empty() ? "(the device's)" : options.arch,
                     options.check_after_launch ? "yes" : "no");
}

}  // namespace exactjit
