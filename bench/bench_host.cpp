// exactjit host-side costs (Google Benchmark): what a call costs before and around its kernel.
//   - codegen::render and the source key (first use of a spec in a process)
//   - planning the H3 gate_residual call and its backward, and rms_norm's modulated backward
//     (validation + parameters: every call)
//   - the spec -> function lookup (every call; the hot path's map)
//   - a kernel-cache memory hit, alone and under contention (single flight)
//   - a disk hit: a fresh KernelCache finding the compiled kernel on disk (NVRTC not loaded)
//   - with a GPU: a cached gate_residual call (S = 1) through the C++ API and through the C ABI
//     against a bare cuLaunchKernel of the same cubin (the difference is exactjit's dispatch),
//     and the cuCtxGetCurrent that the dispatch adds to the bare launch
//   - with --fake_driver (no GPU needed): the same against tests/support's counting fake driver,
//     which also reports the driver calls per launch (driver_calls)
//
//   bench_host [--fake_driver] [--benchmark_filter=...] [--benchmark_format=json]
#include "selftest/support.hpp"
#include "codegen/render.hpp"
#include "kernels/catalog.hpp"
#include "kernels/gate_residual.hpp"
#include "kernels/gate_residual_backward.hpp"
#include "kernels/rms_norm_backward.hpp"
#include "runtime/content_key.hpp"
#include "exactjit/exactjit.h"
#include "api/runtime.hpp"
#include "runtime/device_buffer.hpp"
#include "runtime/device_errors.hpp"
#include "runtime/driver.hpp"
#include "runtime/kernel_cache.hpp"
#include "runtime/module_table.hpp"
#include "tests/support/fake_cuda.hpp"
#include "tests/support/fake_tensor.hpp"

#include <benchmark/benchmark.h>
#include <dlpack/dlpack.h>
#include <fmt/format.h>
#include <llvm/Support/FileSystem.h>
#include <llvm/Support/Path.h>

#include <cstdlib>
#include <cstring>
#include <optional>
#include <unordered_map>

namespace exactjit {
namespace {

/// A cache over `dir` alone, with every other setting at its default.
CacheConfig cache_over(std::string dir, bool offline) {
  CacheConfig config;
  config.writable_dir = std::move(dir);
  config.offline = offline;
  return config;
}

KernelSpec h3_gate_spec() {
  return spec_family(Op::GateResidual, rows_sizes(DType::BF16, kDefaultHidden, 6 * kDefaultHidden), Target{90, false})
      .front();
}

void BM_Render(benchmark::State& state) {
  const KernelSpec spec = h3_gate_spec();
  for (auto _ : state) benchmark::DoNotOptimize(codegen::render(spec));
}
BENCHMARK(BM_Render);

void BM_RenderAndSourceKey(benchmark::State& state) {
  const KernelSpec spec = h3_gate_spec();
  for (auto _ : state) benchmark::DoNotOptimize(source_key(codegen::render(spec)));
}
BENCHMARK(BM_RenderAndSourceKey);

// Times plan(); a planner that refuses its call would time the error path, so that skips instead.
template <typename Plan> void time_planner(benchmark::State& state, Plan plan) {
  if (auto first = plan(); !first) {
    state.SkipWithError(llvm::toString(first.takeError()).c_str());
    return;
  }
  for (auto _ : state) benchmark::DoNotOptimize(plan());
}

void BM_PlanGateResidual(benchmark::State& state) {
  using test::FakeTensor, test::GiB, test::kBF16, test::kI64;  // planning touches no memory
  const int64_t h = kDefaultHidden, s = 131072;
  // Rows of 1.3 GiB each: 2 GiB apart, so out overlaps no input (the planner refuses that).
  FakeTensor residual(2 * GiB, {1, s, h}, kBF16), y(4 * GiB, {1, s, h}, kBF16), out(6 * GiB, {1, s, h}, kBF16);
  FakeTensor gate(8 * GiB + 2 * h * 2, {9, h}, kBF16, {6 * h, 1}), index(10 * GiB, {s}, kI64);
  time_planner(state, [&] { return plan_gate_residual({residual.t, gate.t, index.t, y.t, out.t}); });
}
BENCHMARK(BM_PlanGateResidual);

// The backward planners at the S = 4097 step of issue 13's host targets: validation, the segment
// plan's geometry and every step's parameters (every call pays this before its launches).
void BM_PlanGateResidualBackward(benchmark::State& state) {
  using test::FakeTensor, test::GiB, test::kBF16, test::kI64, test::kU8;
  const int64_t h = kDefaultHidden, s = 4097;
  FakeTensor grad(1 * GiB, {1, s, h}, kBF16), y(2 * GiB, {1, s, h}, kBF16), d_y(3 * GiB, {1, s, h}, kBF16);
  FakeTensor gate(4 * GiB + 2 * h * 2, {9, h}, kBF16, {6 * h, 1}), index(5 * GiB, {s}, kI64);
  FakeTensor d_gate(6 * GiB, {9, h}, kBF16), workspace(7 * GiB, {gate_residual_backward_workspace(s, s, 9, h)}, kU8);
  time_planner(state, [&] {
    return plan_gate_residual_backward({grad.t, gate.t, index.t, y.t, &d_y.t, &d_gate.t, &workspace.t});
  });
}
BENCHMARK(BM_PlanGateResidualBackward);

void BM_PlanRmsNormBackwardModulated(benchmark::State& state) {
  using test::FakeTensor, test::GiB, test::kBF16, test::kF32, test::kI64, test::kU8;
  const int64_t h = kDefaultHidden, s = 4097;
  FakeTensor grad(1 * GiB, {s, h}, kBF16), x(2 * GiB, {s, h}, kBF16), weight(3 * GiB, {h}, kBF16);
  FakeTensor scale(4 * GiB + h * 2, {9, h}, kBF16, {6 * h, 1}), index(5 * GiB, {s}, kI64), rstd(6 * GiB, {s}, kF32);
  FakeTensor dx(7 * GiB, {s, h}, kBF16), dweight(8 * GiB, {h}, kBF16), dshift(9 * GiB, {9, h}, kBF16);
  FakeTensor dscale(10 * GiB, {9, h}, kBF16), workspace(11 * GiB, {rms_norm_backward_workspace(s, s, 9, h, true)}, kU8);
  time_planner(state, [&] {
    return plan_rms_norm_backward({grad.t, x.t, &weight.t, &scale.t, &index.t, rstd.t, 1e-5, &dx.t, &dweight.t,
                                   &dshift.t, &dscale.t, &workspace.t},
                                  DeviceTraits{90, 132});
  });
}
BENCHMARK(BM_PlanRmsNormBackwardModulated);

void BM_SpecLookup(benchmark::State& state) {
  std::unordered_map<KernelSpec, void*, KernelSpecHash> functions;
  for (const KernelSpec& spec : default_catalog(Target{90, false})) functions.emplace(spec, nullptr);
  const KernelSpec wanted = h3_gate_spec();
  for (auto _ : state) benchmark::DoNotOptimize(functions.find(wanted));
}
BENCHMARK(BM_SpecLookup);

// A writable cache in a fresh temp directory, holding the H3 gate_residual kernel.
std::string prepared_cache() {
  static std::string dir = [] {
    llvm::SmallString<128> path;
    llvm::sys::fs::createUniqueDirectory("exactjit-bench-host", path);
    KernelCache cache(cache_over(std::string(path), false), [](const std::string&) {});
    auto compiled = cache.get(codegen::render(h3_gate_spec()));
    if (!compiled) {
      fmt::print(stderr, "bench_host: {}\n", llvm::toString(compiled.takeError()));
      std::exit(1);
    }
    return std::string(path);
  }();
  return dir;
}

void BM_KernelCacheMemoryHit(benchmark::State& state) {
  static KernelCache* cache = nullptr;
  static KernelSource source;
  if (state.thread_index() == 0) {
    cache = new KernelCache(cache_over(prepared_cache(), false), [](const std::string&) {});
    source = codegen::render(h3_gate_spec());
    (void)cache->get(source);
  }
  for (auto _ : state) {
    auto hit = cache->get(source);
    benchmark::DoNotOptimize(hit);
  }
  if (state.thread_index() == 0) {
    delete cache;
    cache = nullptr;
  }
}
BENCHMARK(BM_KernelCacheMemoryHit)->ThreadRange(1, 8)->UseRealTime();

void BM_DiskHitFreshCache(benchmark::State& state) {
  const std::string dir = prepared_cache();
  const KernelSource source = codegen::render(h3_gate_spec());
  for (auto _ : state) {
    KernelCache cache(cache_over(dir, true), [](const std::string&) {});  // offline: a miss would fail
    auto hit = cache.get(source);
    if (!hit || hit->origin != Origin::Disk) state.SkipWithError("not a disk hit");
    benchmark::DoNotOptimize(hit);
  }
}
BENCHMARK(BM_DiskHitFreshCache)->Unit(benchmark::kMicrosecond);

// --- dispatch on a GPU or the fake driver: the same S = 1 gate_residual launch three ways ------

std::optional<test::FakeCuda> g_fake_driver;  // set by --fake_driver

struct DispatchSetup {
  const Driver* cu = nullptr;
  CUcontext context = nullptr;
  std::vector<DeviceBuffer> buffers;  // residual, y, out, table, index
  int64_t act_shape[2] = {1, kDefaultHidden}, table_shape[2] = {9, kDefaultHidden};
  int64_t table_strides[2] = {6 * kDefaultHidden, 1}, index_shape[1] = {1};
  DLTensor residual{}, y{}, out{}, gate{}, index{};
  Runtime runtime;
  xj_runtime* c_runtime = nullptr;
  LaunchPlan plan;
  CUfunction function = nullptr;
  std::unique_ptr<StreamErrorRecords> errors;
  CUdeviceptr error_record = 0;  // the default stream's
  std::unique_ptr<ModuleTable> modules;
};

DispatchSetup& dispatch_setup() {
  static DispatchSetup* setup = [] {
    auto* d = new DispatchSetup;
    auto fail = [](llvm::Error err) {
      fmt::print(stderr, "bench_host: {}\n", llvm::toString(std::move(err)));
      std::exit(1);
    };
    d->cu = *Driver::get();
    auto context = primary_context(*d->cu, 0);
    if (!context) fail(context.takeError());
    d->context = *context;
    const size_t act = kDefaultHidden * 2, table = 9 * 6 * kDefaultHidden * 2;
    for (size_t bytes : {act, act, act, table, size_t{8}}) {
      auto buffer = DeviceBuffer::allocate(*d->cu, d->context, bytes);
      if (!buffer) fail(buffer.takeError());
      if (auto err = buffer->fill(0)) fail(std::move(err));
      d->buffers.push_back(std::move(*buffer));
    }
    using selftest::device_tensor;
    d->residual = device_tensor(d->buffers[0], 0, 0, 2, d->act_shape, nullptr, test::kBF16);
    d->y = device_tensor(d->buffers[1], 0, 0, 2, d->act_shape, nullptr, test::kBF16);
    d->out = device_tensor(d->buffers[2], 0, 0, 2, d->act_shape, nullptr, test::kBF16);
    d->gate = device_tensor(d->buffers[3], 0, 0, 2, d->table_shape, d->table_strides, test::kBF16);
    d->index = device_tensor(d->buffers[4], 0, 0, 1, d->index_shape, nullptr, test::kI64);
    if (xj_runtime_create(nullptr, &d->c_runtime) != XJ_OK)
      fail(llvm::createStringError(llvm::inconvertibleErrorCode(), xj_last_error()));
    // The bare launch: the same cubin, module and parameters, without validation or lookup.
    auto plan = plan_gate_residual({d->residual, d->gate, d->index, d->y, d->out});
    if (!plan) fail(plan.takeError());
    d->plan = *plan;
    int major = 0, minor = 0;
    CUdevice device = 0;
    d->cu->cuDeviceGet(&device, 0);
    d->cu->cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, device);
    d->cu->cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, device);
    KernelSpec spec = d->plan.spec;
    spec.target = Target{major * 10 + minor, false};
    static KernelCache cache(cache_over(prepared_cache(), false), [](const std::string&) {});
    auto kernel = cache.get(codegen::render(spec));
    if (!kernel) fail(kernel.takeError());
    d->modules = std::make_unique<ModuleTable>(*d->cu);
    auto function = d->modules->function(d->context, *kernel->kernel);
    if (!function) fail(function.takeError());
    d->function = *function;
    auto errors = StreamErrorRecords::create(*d->cu, d->context);
    if (!errors) fail(errors.takeError());
    d->errors = std::move(*errors);
    d->error_record = d->errors->record(nullptr);
    // The first call of each API loads its kernel: made here, so no timed iteration compiles.
    const Status first = d->runtime.launch(plan_gate_residual({d->residual, d->gate, d->index, d->y, d->out}), nullptr);
    if (!first.ok()) fail(llvm::createStringError(llvm::inconvertibleErrorCode(), first.message()));
    if (xj_gate_residual(d->c_runtime, &d->residual, &d->gate, &d->index, &d->y, &d->out, nullptr) != XJ_OK)
      fail(llvm::createStringError(llvm::inconvertibleErrorCode(), xj_last_error()));
    return d;
  }();
  return *setup;
}

// Launches `count` calls, waiting for the stream every 256 so the launch queue never fills.
// With the fake driver, also counts the driver calls per launch (the synchronisations are the loop's).
template <typename Launch> void dispatch_loop(benchmark::State& state, Launch launch) {
  DispatchSetup& d = dispatch_setup();
  ScopedContext scope(*d.cu, d.context);
  const auto launch_driver_calls = [] {
    return g_fake_driver->calls() - g_fake_driver->calls("cuStreamSynchronize");
  };
  const long driver_calls_before = g_fake_driver ? launch_driver_calls() : 0;
  int64_t calls = 0;
  for (auto _ : state) {
    if (!launch(d)) state.SkipWithError("launch failed");
    if (++calls % 256 == 0) d.cu->cuStreamSynchronize(nullptr);
  }
  d.cu->cuStreamSynchronize(nullptr);
  if (g_fake_driver)
    state.counters["driver_calls"] = benchmark::Counter(
        static_cast<double>(launch_driver_calls() - driver_calls_before), benchmark::Counter::kAvgIterations);
}

void BM_DispatchCxxApi(benchmark::State& state) {
  dispatch_loop(state, [](DispatchSetup& d) {
    return d.runtime.launch(plan_gate_residual({d.residual, d.gate, d.index, d.y, d.out}), nullptr).ok();
  });
}

void BM_DispatchCAbi(benchmark::State& state) {
  dispatch_loop(state, [](DispatchSetup& d) {
    return xj_gate_residual(d.c_runtime, &d.residual, &d.gate, &d.index, &d.y, &d.out, nullptr) == XJ_OK;
  });
}

void BM_DispatchBareLaunch(benchmark::State& state) {
  dispatch_loop(state, [](DispatchSetup& d) {
    uint64_t params[LaunchPlan::kMaxParams + 1];
    void* args[LaunchPlan::kMaxParams + 1];
    for (int i = 0; i < d.plan.param_count; ++i) {
      params[i] = d.plan.params[i];
      args[i] = &params[i];
    }
    params[d.plan.param_count] = d.error_record;
    args[d.plan.param_count] = &params[d.plan.param_count];
    return d.cu->cuLaunchKernel(d.function, d.plan.grid, d.plan.grid_y, 1, d.plan.threads, 1, 1, 0, nullptr, args,
                                nullptr) == CUDA_SUCCESS;
  });
}

// The one driver call the dispatch adds to the bare launch when the context is already current:
// what it costs decides whether that check is worth avoiding on this machine's driver.
void BM_DispatchContextQuery(benchmark::State& state) {
  dispatch_loop(state, [](DispatchSetup& d) {
    CUcontext current = nullptr;
    return d.cu->cuCtxGetCurrent(&current) == CUDA_SUCCESS && current == d.context;
  });
}

}  // namespace
}  // namespace exactjit

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  for (int i = 1; i < argc; ++i)  // Initialize left the flags it does not know
    if (std::strcmp(argv[i], "--fake_driver") == 0) exactjit::g_fake_driver.emplace();  // before any driver use
  if (exactjit::Driver::available()) {  // the dispatch comparison needs a GPU or the fake
    benchmark::RegisterBenchmark("BM_DispatchBareLaunch", exactjit::BM_DispatchBareLaunch)->UseRealTime();
    benchmark::RegisterBenchmark("BM_DispatchContextQuery", exactjit::BM_DispatchContextQuery)->UseRealTime();
    benchmark::RegisterBenchmark("BM_DispatchCxxApi", exactjit::BM_DispatchCxxApi)->UseRealTime();
    benchmark::RegisterBenchmark("BM_DispatchCAbi", exactjit::BM_DispatchCAbi)->UseRealTime();
  } else {
    fmt::print(stderr, "bench_host: no GPU: the dispatch benchmarks are not registered (--fake_driver runs them)\n");
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
