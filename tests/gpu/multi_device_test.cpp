// GPU tests of one process using several devices, contexts and threads (issue 7): the runtime
// keeps one module per (context, kernel), makes the tensors' device's primary context current for
// a call and restores the caller's context, and one cache entry serves every device of the same
// arch. The two-device cases skip (and say so) on a machine with one GPU.
#include "selftest/selftest.hpp"
#include "runtime/device_buffer.hpp"
#include "runtime/driver.hpp"

#include <gtest/gtest.h>
#include <llvm/Support/FileSystem.h>
#include <llvm/Support/Path.h>

#include <atomic>
#include <thread>

namespace exactjit {
namespace {

int device_count() {
  auto driver = Driver::get();
  if (!driver) {
    llvm::consumeError(driver.takeError());
    return 0;
  }
  int count = 0;
  return (*driver)->cuDeviceGetCount(&count) == CUDA_SUCCESS ? count : 0;
}

CUcontext current_context() {
  CUcontext context = nullptr;
  EXPECT_EQ((*Driver::get())->cuCtxGetCurrent(&context), CUDA_SUCCESS);
  return context;
}

CUcontext primary(int device_id) {
  auto context = primary_context(**Driver::get(), device_id);
  EXPECT_TRUE(static_cast<bool>(context)) << llvm::toString(context.takeError());
  return context ? *context : nullptr;
}

// Kernel images (kernel.cubin / kernel.ptx) below a cache layer: one per compiled entry.
int cached_images(const std::string& dir) {
  int images = 0;
  std::error_code ec;
  for (llvm::sys::fs::recursive_directory_iterator it(dir, ec), end; it != end && !ec; it.increment(ec)) {
    const llvm::StringRef name = llvm::sys::path::filename(it->path());
    images += name == "kernel.cubin" || name == "kernel.ptx";
  }
  return images;
}

std::string fresh_cache_dir() {
  llvm::SmallString<128> dir;
  EXPECT_FALSE(llvm::sys::fs::createUniqueDirectory("exactjit-multi-device", dir));
  return std::string(dir);
}

// A few cases of every forward and backward family (no bad indices: the error record is per
// device, so a deliberately bad launch would be reported to whichever thread checks next).
void run_cases(Runtime& runtime, int device_id, uint64_t seed, std::atomic<int>& failures) {
  auto note = [&](llvm::Expected<CaseOutcome> outcome, const std::string& name) {
    if (!outcome) {
      ADD_FAILURE() << name << ": " << llvm::toString(outcome.takeError());
      ++failures;
    } else if (!outcome->passed) {
      ADD_FAILURE() << "device " << device_id << " " << name << ": " << outcome->detail;
      ++failures;
    }
  };
  for (DType dtype : {DType::BF16, DType::F32}) {
    GateResidualCase gate;
    gate.dtype = dtype;
    gate.seed = seed++;
    note(run_gate_residual_case(runtime, device_id, gate), gate.name());
    note(run_gate_residual_backward_case(runtime, device_id, gate), gate.name() + " backward");
    AdalnRowGatherCase gather;
    gather.dtype = dtype;
    gather.seed = seed++;
    note(run_adaln_row_gather_case(runtime, device_id, gather), gather.name());
    RmsNormCase norm;
    norm.dtype = dtype;
    norm.seed = seed++;
    note(run_rms_norm_case(runtime, device_id, norm), norm.name());
    note(run_rms_norm_backward_case(runtime, device_id, norm), norm.name() + " backward");
  }
}

class MultiDevice : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!Driver::available()) GTEST_SKIP() << "no CUDA driver or GPU";
  }
};

// A call from a thread with no current context, or with another device's context current,
// leaves that context current afterwards.
TEST_F(MultiDevice, CallerContextIsRestored) {
  Runtime runtime;
  std::atomic<int> failures{0};
  std::thread bare([&] {
    run_cases(runtime, 0, 1, failures);
    EXPECT_EQ(current_context(), nullptr) << "a thread without a context got one";
  });
  bare.join();
  EXPECT_EQ(failures.load(), 0);
  if (device_count() < 2) GTEST_SKIP() << "the other-device half needs a second GPU (" << device_count() << " here)";
  const CUcontext zero = primary(0);
  ScopedContext scope(**Driver::get(), zero);
  run_cases(runtime, 1, 100, failures);
  EXPECT_EQ(current_context(), zero) << "a call on device 1 left device 1's context current";
  EXPECT_EQ(failures.load(), 0);
}

// Every catalog family through the self-test on the last device while device 0's context is
// current: the bytes equal the host model's (hence device 0's); the entries device 0 compiled
// serve it (no new image in the cache).
TEST_F(MultiDevice, EveryOpOnAnotherDeviceFromOneCacheEntry) {
  const int devices = device_count();
  if (devices < 2) GTEST_SKIP() << "needs a second GPU (" << devices << " here)";
  RuntimeOptions options;
  options.cache_dir = fresh_cache_dir();
  Runtime runtime(options);
  auto first = run_selftest(runtime, 0, {});
  ASSERT_TRUE(static_cast<bool>(first)) << llvm::toString(first.takeError());
  for (const SelftestLine& line : *first) EXPECT_TRUE(line.passed) << "device 0 " << line.name << ": " << line.detail;
  const int images = cached_images(options.cache_dir);
  EXPECT_GT(images, 0);
  const CUcontext zero = primary(0);
  ScopedContext scope(**Driver::get(), zero);
  auto other = run_selftest(runtime, devices - 1, {});
  ASSERT_TRUE(static_cast<bool>(other)) << llvm::toString(other.takeError());
  for (const SelftestLine& line : *other)
    EXPECT_TRUE(line.passed) << "device " << devices - 1 << " " << line.name << ": " << line.detail;
  EXPECT_EQ(current_context(), zero);
  EXPECT_EQ(cached_images(options.cache_dir), images) << "the second device compiled its own entries";
  llvm::sys::fs::remove_directories(options.cache_dir);
}

// Two threads per device share one runtime concurrently (first use included: both threads may
// miss the cache for the same kernel at once; single-flight compiles it once).
TEST_F(MultiDevice, ThreadsShareOneRuntimeAcrossDevices) {
  RuntimeOptions options;
  options.cache_dir = fresh_cache_dir();
  Runtime runtime(options);
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  const int devices = device_count();
  for (int device = 0; device < devices; ++device)
    for (uint64_t t = 0; t < 2; ++t)
      threads.emplace_back([&, device, t] { run_cases(runtime, device, 1000 * (device + 1) + 100 * t, failures); });
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(failures.load(), 0) << threads.size() << " threads on " << devices << " device(s)";
  llvm::sys::fs::remove_directories(options.cache_dir);
}

}  // namespace
}  // namespace exactjit
