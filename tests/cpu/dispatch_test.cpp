// The cached launch path (issue 6) against the counting fake driver (tests/support/fake_cuda.cpp):
// the driver calls of one cached gate_residual call are pinned, through the C++ API and the C
// ABI, with the tensors' context already current (the usual case) and with another one or none
// current, and so is "no heap allocation"; the driver's answers are still checked on the way.
// Its own process: the driver is loaded once per process, and here it must be the fake.
#include "exactjit/exactjit.h"
#include "exactjit/exactjit.hpp"
#include "runtime/device_buffer.hpp"
#include "runtime/driver.hpp"
#include "support/fake_cuda.hpp"
#include "support/fake_tensor.hpp"
#include "support/test_support.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <map>
#include <memory>
#include <new>
#include <string>

// Counts this process's heap allocations (libexactjit.so keeps its own allocator: the C++ API's only).
namespace {
std::atomic<long> g_allocations{0};
}  // namespace
void* operator new(size_t bytes) {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(bytes ? bytes : 1)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }

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

  Status run(Runtime& runtime) { return runtime.gate_residual(residual.t, gate.t, index.t, y.t, out.t, nullptr); }
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
  const auto projection = [&] { return runtime.det_linear(x.t, w.t, &b.t, out.t, nullptr, true, nullptr).ok(); };
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

}  // namespace
}  // namespace exactjit
