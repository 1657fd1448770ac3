// The cached launch path (issue 6) against the counting fake driver (tests/support/fake_cuda.cpp):
// the driver calls of one cached gate_residual call are pinned, through the C++ API and the C
// ABI, with the tensors' context already current (the usual case) and with another one or none
// current, and so is "no heap allocation"; the driver's answers are still checked on the way.
// The per-stream device error records too: a report a kernel left in a stream's host mirror fails
// the next call on that stream, without a synchronisation, and no call on another stream.
// Its own process: the driver is loaded once per process, and here it must be the fake.
#include "api/runtime.hpp"
#include "codegen/kernel_spec.hpp"
#include "codegen/op_row.hpp"
#include "exactjit/exactjit.h"
#include "kernels/adaln_row_gather.hpp"
#include "kernels/det_linear.hpp"
#include "kernels/gate_residual.hpp"
#include "runtime/device_buffer.hpp"
#include "runtime/device_errors.hpp"
#include "runtime/driver.hpp"
#include "runtime/errors.hpp"
#include "runtime/spec_list.hpp"
#include "support/fake_cuda.hpp"
#include "support/fake_tensor.hpp"
#include "support/test_support.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <map>
#include <memory>
#include <new>
#include <set>
#include <string>
#include <thread>
#include <vector>

// Counts this process's heap allocations (libexactjit.so keeps its own allocator: the C++ API's only).
// Not under AddressSanitizer, which owns operator new: a replacement would free what it allocated.
// noinline: inlined into a container, GCC pairs their malloc and free with new and delete and warns.
namespace {
std::atomic<long> g_allocations{0};
#if defined(__SANITIZE_ADDRESS__)
constexpr bool kCountsAllocations = false;
#else
constexpr bool kCountsAllocations = true;
#endif
}  // namespace
#if !defined(__SANITIZE_ADDRESS__)
__attribute__((noinline)) void* operator new(size_t bytes) {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(bytes ? bytes : 1)) return p;
  throw std::bad_alloc();
}
__attribute__((noinline)) void operator delete(void* p) noexcept { std::free(p); }
__attribute__((noinline)) void operator delete(void* p, size_t) noexcept { std::free(p); }
#endif

namespace exactjit {
namespace {

using test::FakeTensor, test::GiB, test::kBF16, test::kI64;
constexpr int64_t H = 5376;

/// Driver calls by entry point.
using DriverCalls = std::map<std::string, long>;

const test::FakeCuda& fake_cuda() {
  static const test::FakeCuda fake;  // before anything loads the driver
  return fake;
}

DriverCalls driver_calls() {
  DriverCalls calls;
#define XJ_COUNT(name) \
  if (const long n = fake_cuda().calls(#name)) calls[#name] = n;
  XJ_DRIVER_FUNCTIONS(XJ_COUNT)
#undef XJ_COUNT
  return calls;
}

/// The driver calls of `run`, a call that must succeed.
template <typename Run> DriverCalls driver_calls_of(Run run) {
  const DriverCalls before = driver_calls();
  const bool ok = run();
  DriverCalls made = driver_calls();
  EXPECT_TRUE(ok);
  for (const auto& [name, n] : before)
    if ((made[name] -= n) == 0) made.erase(name);
  return made;
}

/// With the tensors' context current: the query that finds it current, and the launch.
const DriverCalls kCachedLaunch = {{"cuCtxGetCurrent", 1}, {"cuLaunchKernel", 1}};
/// With another context (or none) current: it is switched to the tensors' and back.
const DriverCalls kCachedLaunchSwitchingContext = {
    {"cuCtxGetCurrent", 1}, {"cuCtxSetCurrent", 2}, {"cuLaunchKernel", 1}};

/// The H3 gate_residual call at S = 1 (bench_host's dispatch benchmark) on fake addresses.
struct GateResidualCall {
  FakeTensor residual{1 * GiB, {1, H}, kBF16};
  FakeTensor gate{2 * GiB, {9, H}, kBF16, {6 * H, 1}};
  FakeTensor index{3 * GiB, {1}, kI64};
  FakeTensor y{4 * GiB, {1, H}, kBF16};
  FakeTensor out{5 * GiB, {1, H}, kBF16};

  Status run(Runtime& runtime) {
    return runtime.launch(plan_gate_residual({residual.t, gate.t, index.t, y.t, out.t}), nullptr);
  }
  exactjit_status_t run(xj_runtime* runtime) {
    return xj_gate_residual(runtime, &residual.t, &gate.t, &index.t, &y.t, &out.t, nullptr);
  }
};

class DispatchTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    fake_cuda();
    cache_ = std::make_unique<test::TempDir>();  // shared: the kernel compiles once for the suite
  }
  static void TearDownTestSuite() { cache_.reset(); }

  void SetUp() override {
    auto driver = Driver::get();
    ASSERT_TRUE(static_cast<bool>(driver)) << llvm::toString(driver.takeError());
    driver_ = *driver;
    primary_ = test::expect_value(primary_context(*driver_, 0));
    make_current(primary_);
  }

  void make_current(CUcontext context) const { driver_->cuCtxSetCurrent(context); }
  CUcontext current() const {
    CUcontext context = nullptr;
    driver_->cuCtxGetCurrent(&context);
    return context;
  }

  static RuntimeOptions options() {
    RuntimeOptions options;
    options.cache_dir = cache_->path();
    return options;
  }

  static std::unique_ptr<test::TempDir> cache_;
  const Driver* driver_ = nullptr;
  CUcontext primary_ = nullptr;
  GateResidualCall call;
};

std::unique_ptr<test::TempDir> DispatchTest::cache_;

TEST_F(DispatchTest, CachedCallThroughTheCxxApi) {
  Runtime runtime(options());
  const auto cached_call = [&] { return call.run(runtime).ok(); };
  ASSERT_TRUE(cached_call());  // compiles and loads the kernel
  for (int repeat = 0; repeat < 3; ++repeat) EXPECT_EQ(driver_calls_of(cached_call), kCachedLaunch);

  if (!kCountsAllocations) GTEST_SKIP() << "AddressSanitizer build: allocations are not counted";
  const long allocations = g_allocations.load();
  ASSERT_GT(allocations, 0);  // the counter is live: loading the kernel allocated
  const bool ok = cached_call();
  EXPECT_EQ(g_allocations.load() - allocations, 0);
  EXPECT_TRUE(ok);
}

TEST_F(DispatchTest, CachedCallThroughTheCAbi) {
  const RuntimeOptions cxx = options();
  xj_runtime_options c{sizeof(xj_runtime_options), cxx.cache_dir.c_str(), nullptr, 0, nullptr, 0};
  xj_runtime* runtime = nullptr;
  ASSERT_EQ(xj_runtime_create(&c, &runtime), XJ_OK) << xj_last_error();
  ASSERT_EQ(call.run(runtime), XJ_OK) << xj_last_error();
  const auto cached_call = [&] { return call.run(runtime) == XJ_OK; };
  for (int repeat = 0; repeat < 3; ++repeat) EXPECT_EQ(driver_calls_of(cached_call), kCachedLaunch);
  EXPECT_STREQ(xj_last_error(), "");

  // A failure still leaves its message, and the next success clears it.
  call.y.t.device.device_id = 1;
  EXPECT_EQ(call.run(runtime), XJ_ERROR_INVALID_ARGUMENT);
  EXPECT_STREQ(xj_last_error(), "gate_residual: y is on CUDA device 1 but residual is on device 0");
  call.y.t.device.device_id = 0;
  EXPECT_EQ(call.run(runtime), XJ_OK);
  EXPECT_STREQ(xj_last_error(), "");
  xj_runtime_destroy(runtime);
}

// Each op's entry point (defined in its op file over c_abi::call_op) names the NULL argument.
TEST_F(DispatchTest, TheCAbiNamesTheNullArgument) {
  const RuntimeOptions cxx = options();
  xj_runtime_options c{sizeof(xj_runtime_options), cxx.cache_dir.c_str(), nullptr, 0, nullptr, 0};
  xj_runtime* runtime = nullptr;
  ASSERT_EQ(xj_runtime_create(&c, &runtime), XJ_OK) << xj_last_error();
  EXPECT_EQ(xj_gate_residual(runtime, &call.residual.t, &call.gate.t, &call.index.t, nullptr, &call.out.t, nullptr),
            XJ_ERROR_INVALID_ARGUMENT);
  EXPECT_STREQ(xj_last_error(), "gate_residual: y must not be NULL");
  EXPECT_EQ(xj_rms_norm_backward(runtime, &call.y.t, &call.residual.t, nullptr, nullptr, nullptr, nullptr, 1e-5,
                                 nullptr, nullptr, nullptr, nullptr, nullptr, nullptr),
            XJ_ERROR_INVALID_ARGUMENT);
  EXPECT_STREQ(xj_last_error(), "rms_norm_backward: rstd must not be NULL");
  EXPECT_EQ(call.run(static_cast<xj_runtime*>(nullptr)), XJ_ERROR_INVALID_ARGUMENT);
  EXPECT_STREQ(xj_last_error(), "gate_residual: runtime must not be NULL");
  xj_runtime_destroy(runtime);
}

TEST_F(DispatchTest, AnotherContextIsSwitchedToAndBack) {
  Runtime runtime(options());
  const auto cached_call = [&] { return call.run(runtime).ok(); };
  ASSERT_TRUE(cached_call());
  for (CUcontext other : {reinterpret_cast<CUcontext>(0xF00D), CUcontext{nullptr}}) {
    make_current(other);
    EXPECT_EQ(driver_calls_of(cached_call), kCachedLaunchSwitchingContext);
    EXPECT_EQ(current(), other);  // the caller's context is restored
  }
}

// The 18H AdaLN projection on the fake sm_90 device runs the bulk-copy kernel with ~211 KB of
// dynamic shared memory: the kernel is allowed it once, when first loaded, and a cached call is the
// plain launch (no attribute call per launch).
TEST_F(DispatchTest, SharedMemoryIsOptedIntoOnceAtFirstLoad) {
  using test::kF32;
  FakeTensor x{1 * GiB, {3, 2688}, kF32}, w{2 * GiB, {18 * H, 2688}, kBF16}, b{3 * GiB, {18 * H}, kBF16},
      out{4 * GiB, {3, 18 * H}, kBF16};
  Runtime runtime(options());
  const auto projection = [&] {
    return runtime.launch(plan_det_linear({x.t, w.t, &b.t, out.t, nullptr, true}, runtime.traits(x.t.device)), nullptr)
        .ok();
  };
  const DriverCalls first = driver_calls_of(projection);
  EXPECT_EQ(first.count("cuFuncSetAttribute") ? first.at("cuFuncSetAttribute") : 0, 1);
  EXPECT_EQ(first.at("cuLaunchKernel"), 1);
  for (int repeat = 0; repeat < 3; ++repeat) EXPECT_EQ(driver_calls_of(projection), kCachedLaunch);
}

TEST_F(DispatchTest, ADeviceTheDriverDoesNotHaveIsRefused) {
  Runtime runtime(options());
  for (FakeTensor* t : {&call.residual, &call.gate, &call.index, &call.y, &call.out}) t->t.device.device_id = 1;
  const Status status = call.run(runtime);
  EXPECT_EQ(status.code(), XJ_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(status.message(), "CUDA device 1 does not exist (1 device(s) visible)");
}

// A device older than a kernel needs is told the rule on the first call, before anything compiles:
// the sm_75 floor of every kernel, bf16 det_linear's sm_80 (tensor-core bf16 mma).
TEST_F(DispatchTest, ADeviceOlderThanTheKernelNeedsIsTheRuleNotACompileError) {
  RuntimeOptions volta = options();
  volta.arch = "sm_70";
  Runtime old(volta);
  Status status = call.run(old);
  EXPECT_EQ(status.code(), XJ_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(status.message().find("targets older than sm_75 are not supported"), std::string::npos) << status.message();

  using test::kF32;
  FakeTensor x{1 * GiB, {3, 256}, kF32}, w{2 * GiB, {512, 256}, kBF16}, out{4 * GiB, {3, 512}, kBF16};
  RuntimeOptions turing = options();
  turing.arch = "sm_75";
  Runtime runtime(turing);
  status =
      runtime.launch(plan_det_linear({x.t, w.t, nullptr, out.t, nullptr, false}, runtime.traits(x.t.device)), nullptr);
  EXPECT_EQ(status.code(), XJ_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(status.message().find("needs sm_80 or newer (bf16 tensor-core mma; the target is sm_75)"),
            std::string::npos)
      << status.message();
  EXPECT_TRUE(call.run(runtime).ok()) << "gate_residual runs on sm_75";
}

// EXACTJIT_RECORD_MANIFEST: threads, each with its own Runtime, launch two kernels (int64 and
// int32 indices) at once and record into one file: each spec once, a spec list prewarm reads back.
TEST_F(DispatchTest, RuntimesInSeveralThreadsRecordEachUsedSpecOnce) {
  test::TempDir dir;
  RuntimeOptions recording = options();
  recording.record_manifest = dir / "used.specs";
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 6; ++t)
    threads.emplace_back([&, t] {
      Runtime runtime(recording);
      GateResidualCall mine;
      FakeTensor index32{3 * GiB, {1}, test::kI32};
      for (int repeat = 0; repeat < 3; ++repeat) {
        const DLTensor& index = t % 2 ? index32.t : mine.index.t;
        failures +=
            !runtime.launch(plan_gate_residual({mine.residual.t, mine.gate.t, index, mine.y.t, mine.out.t}), nullptr)
                 .ok();
      }
    });
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(failures.load(), 0);
  const std::string text = test::read_text(dir / "used.specs");
  const std::vector<KernelSpec> specs = test::expect_value(parse_spec_list(text, "used.specs"));
  ASSERT_EQ(specs.size(), 2u) << text;
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 3) << text;  // header + two lines, none repeated
  std::set<std::string> described;
  for (const KernelSpec& spec : specs) described.insert(spec.describe());
  EXPECT_EQ(described, (std::set<std::string>{
                           "gate_residual dtype=bf16 hidden=5376 table_stride=32256 vec=8 index=int32 target=sm_90",
                           "gate_residual dtype=bf16 hidden=5376 table_stride=32256 vec=8 index=int64 target=sm_90"}));
}

// The deployment flow end to end (docs/deploy.md), with the fake driver as the GPU: record what a
// workload launches, pre-warm exactly that with the CLI into a fresh layer, check the layer, then
// run the workload offline against it, read-only: zero misses. A kernel it did not record is a
// miss that names the prewarm command.
TEST_F(DispatchTest, RecordPrewarmThenRunOfflineWithZeroMisses) {
  test::TempDir dir;
  const std::string list = dir / "used.specs";
  FakeTensor index32{3 * GiB, {1}, test::kI32};
  auto workload = [&](Runtime& runtime) {
    const Status first = call.run(runtime);
    if (!first.ok()) return first;
    return runtime.launch(plan_gate_residual({call.residual.t, call.gate.t, index32.t, call.y.t, call.out.t}), nullptr);
  };
  RuntimeOptions recording = options();
  recording.record_manifest = list;
  {
    Runtime runtime(recording);
    const Status status = workload(runtime);
    ASSERT_TRUE(status.ok()) << status.message();
  }
  const std::vector<std::string> build_env = {"EXACTJIT_CACHE_DIR=" + (dir / "layer"), "EXACTJIT_CACHE_PATH=",
                                              "EXACTJIT_OFFLINE="};
  const auto built = test::run_command(EXACTJIT_CLI, {"prewarm", "--manifest", list, "--quiet"}, build_env);
  ASSERT_EQ(built.exit_code, 0) << built.out << built.err;
  EXPECT_NE(built.out.find("2 kernels: 2 compiled, 0 cached, 0 failed"), std::string::npos) << built.out;
  const std::vector<std::string> shipped_env = {"EXACTJIT_CACHE_DIR=" + (dir / "empty"),
                                                "EXACTJIT_CACHE_PATH=" + (dir / "layer"), "EXACTJIT_OFFLINE=1"};
  const auto checked = test::run_command(EXACTJIT_CLI, {"prewarm", "--manifest", list}, shipped_env);
  EXPECT_EQ(checked.exit_code, 0) << checked.out << checked.err;
  EXPECT_NE(checked.out.find("check: 2 kernels: 2 present, 0 missing"), std::string::npos) << checked.out;

  RuntimeOptions production;
  production.cache_dir = dir / "empty";
  production.read_only_dirs = {dir / "layer"};
  production.offline = true;
  Runtime runtime(production);
  const Status served = workload(runtime);
  EXPECT_TRUE(served.ok()) << served.message();
  FakeTensor final_norm_gate{2 * GiB, {9, H}, kBF16, {2 * H, 1}};  // a table stride nobody recorded
  const Status miss = runtime.launch(
      plan_gate_residual({call.residual.t, final_norm_gate.t, call.index.t, call.y.t, call.out.t}), nullptr);
  EXPECT_EQ(miss.code(), XJ_ERROR_OFFLINE_MISS);
  EXPECT_NE(miss.message().find("exactjit prewarm --op gate_residual --hidden 5376 --dtype bf16 --table-stride 10752"),
            std::string::npos)
      << miss.message();
}

// A malformed boolean variable: the C ABI refuses to create a runtime, naming it; a C++ Runtime
// made from such options fails every call with the same message.
TEST_F(DispatchTest, AMalformedEnvironmentFailsRuntimeCreation) {
  ::setenv("EXACTJIT_OFFLINE", "perhaps", 1);
  const std::string expected = "EXACTJIT_OFFLINE='perhaps' is not valid: use 1/0, true/false, yes/no, on/off";
  xj_runtime* runtime = nullptr;
  EXPECT_EQ(xj_runtime_create(nullptr, &runtime), XJ_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(runtime, nullptr);
  EXPECT_EQ(std::string(xj_last_error()), "xj_runtime_create: " + expected);
  Runtime from_environment;
  const Status status = call.run(from_environment);
  EXPECT_EQ(status.code(), XJ_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(status.message(), expected);
  ::unsetenv("EXACTJIT_OFFLINE");
  ASSERT_EQ(xj_runtime_create(nullptr, &runtime), XJ_OK) << xj_last_error();
  xj_runtime_destroy(runtime);
}

/// Writes a report into a record's host mirror as templates/error_record.cuh's report_bad_index does.
void report_as_a_kernel_would(DeviceErrorRecord* mirror, OpCode op, int64_t position, int64_t value, int64_t bound) {
  mirror->op = op_code(op);
  mirror->position = position;
  mirror->value = value;
  mirror->bound = bound;
  __atomic_store_n(&mirror->claimed, 1u, __ATOMIC_RELEASE);
}

const auto kStreamA = reinterpret_cast<CUstream>(uintptr_t{0xA000});
const auto kStreamB = reinterpret_cast<CUstream>(uintptr_t{0xB000});

TEST_F(DispatchTest, EachStreamHasItsOwnRecordPointingAtItsMirror) {
  auto records = test::expect_value(StreamErrorRecords::create(*driver_, primary_));
  EXPECT_NE(records->record(kStreamA), records->record(kStreamB));
  EXPECT_EQ(records->record(kStreamA), records->record(kStreamA));
  for (CUstream stream : {kStreamA, kStreamB, CUstream{nullptr}}) {
    DeviceErrorRecord device{};
    ASSERT_EQ(driver_->cuMemcpyDtoH(&device, records->record(stream), sizeof device), CUDA_SUCCESS);
    CUdeviceptr mirror = 0;
    ASSERT_EQ(driver_->cuMemHostGetDevicePointer(&mirror, records->mirror(stream), 0), CUDA_SUCCESS);
    EXPECT_EQ(device.claimed, 0u);
    EXPECT_EQ(device.mirror, mirror);  // the kernel's report reaches this stream's mirror
  }
}

TEST_F(DispatchTest, APendingReportIsTakenWithoutASyncOnItsStreamOnly) {
  auto records = test::expect_value(StreamErrorRecords::create(*driver_, primary_));
  // The kernel claimed the device record and reported into the mirror.
  const uint32_t claimed = 1;
  ASSERT_EQ(driver_->cuMemcpyHtoD(records->record(kStreamA), &claimed, sizeof claimed), CUDA_SUCCESS);
  report_as_a_kernel_would(records->mirror(kStreamA), Op::GateResidual, 7, 12, 9);

  const long syncs = fake_cuda().calls("cuStreamSynchronize");
  EXPECT_FALSE(static_cast<bool>(records->take_pending(kStreamB)));
  const ErrorReport report = take_error(records->take_pending(kStreamA));
  EXPECT_EQ(report.code, ErrorCode::BadIndex);
  EXPECT_EQ(report.message,
            "gate_residual: index[7] = 12 is out of range [0, 9); the rows that use it were not written");
  EXPECT_EQ(fake_cuda().calls("cuStreamSynchronize"), syncs);
  EXPECT_FALSE(static_cast<bool>(records->take_pending(kStreamA)));  // taken once

  DeviceErrorRecord device{};
  ASSERT_EQ(driver_->cuMemcpyDtoH(&device, records->record(kStreamA), sizeof device), CUDA_SUCCESS);
  EXPECT_EQ(device.claimed, 0u);  // the next bad index can be claimed again
  EXPECT_NE(device.mirror, 0u);   // and still reaches the mirror
}

TEST_F(DispatchTest, StreamsBeyondTheSlabShareTheLastRecord) {
  auto records = test::expect_value(StreamErrorRecords::create(*driver_, primary_));
  std::vector<CUdeviceptr> seen;
  for (uintptr_t k = 0; k < StreamErrorRecords::kStreams + 40; ++k)
    seen.push_back(records->record(reinterpret_cast<CUstream>(0x100000 + 0x10 * k)));
  const size_t slab = StreamErrorRecords::kStreams;
  EXPECT_EQ(std::set<CUdeviceptr>(seen.begin(), seen.end()).size(), slab);
  for (size_t k = slab - 1; k < seen.size(); ++k) EXPECT_EQ(seen[k], seen[slab - 1]);
}

TEST_F(DispatchTest, AnOpCallFailsOnABadIndexPendingOnItsStreamAndLaunchesNothing) {
  Runtime runtime(options());
  auto run_on = [&](CUstream stream) {
    return runtime.launch(plan_gate_residual({call.residual.t, call.gate.t, call.index.t, call.y.t, call.out.t}),
                          stream);
  };
  ASSERT_TRUE(run_on(kStreamA).ok());  // the device's records are created: slot 0 is stream A's
  auto* mirrors = static_cast<DeviceErrorRecord*>(fake_cuda().last_host_allocation());
  ASSERT_TRUE(run_on(kStreamB).ok());
  report_as_a_kernel_would(&mirrors[0], Op::GateResidual, 3, -1, 9);

  EXPECT_EQ(driver_calls_of([&] { return run_on(kStreamB).ok(); }), kCachedLaunch);  // not B's error
  const long launches = fake_cuda().calls("cuLaunchKernel");
  const long syncs = fake_cuda().calls("cuStreamSynchronize");
  const Status failed = run_on(kStreamA);
  EXPECT_EQ(failed.code(), XJ_ERROR_BAD_INDEX);
  EXPECT_EQ(failed.message(),
            "gate_residual: index[3] = -1 is out of range [0, 9); the rows that use it were not written");
  EXPECT_EQ(fake_cuda().calls("cuLaunchKernel"), launches);  // the failing call launched nothing
  EXPECT_EQ(fake_cuda().calls("cuStreamSynchronize"), syncs);
  EXPECT_TRUE(run_on(kStreamA).ok());  // reported once; the stream is usable again

  report_as_a_kernel_would(&mirrors[1], Op::GateResidual, 0, 99, 9);  // synchronize() answers too
  EXPECT_TRUE(runtime.synchronize(0, kStreamA).ok());
  EXPECT_EQ(runtime.synchronize(0, kStreamB).code(), XJ_ERROR_BAD_INDEX);
  EXPECT_TRUE(runtime.synchronize(0, kStreamB).ok());
}

TEST_F(DispatchTest, TheCAbiReportsAPendingBadIndex) {
  const RuntimeOptions cxx = options();
  xj_runtime_options c{sizeof(xj_runtime_options), cxx.cache_dir.c_str(), nullptr, 0, nullptr, 0};
  xj_runtime* runtime = nullptr;
  ASSERT_EQ(xj_runtime_create(&c, &runtime), XJ_OK) << xj_last_error();
  ASSERT_EQ(call.run(runtime), XJ_OK) << xj_last_error();  // default stream: slot 0
  auto* mirrors = static_cast<DeviceErrorRecord*>(fake_cuda().last_host_allocation());
  report_as_a_kernel_would(&mirrors[0], Op::AdalnRowGather, 5, 40, 9);
  EXPECT_EQ(call.run(runtime), XJ_ERROR_BAD_INDEX);
  EXPECT_STREQ(xj_last_error(),
               "adaln_row_gather: timestep_indices[5] = 40 is out of range [0, 9); "
               "the rows that use it were not written");
  EXPECT_EQ(call.run(runtime), XJ_OK);
  xj_runtime_destroy(runtime);
}

}  // namespace
}  // namespace exactjit
