// Kernel cache concurrency and cold start: threads asking for one missing kernel compile it once;
// processes racing on one empty directory all succeed and leave one valid entry per kernel; a
// fresh process that finds its kernel on disk never loads NVRTC.
#include "codegen/render.hpp"
#include "kernels/catalog.hpp"
#include "kernels/gate_residual.hpp"
#include "runtime/disk_cache.hpp"
#include "runtime/errors.hpp"
#include "runtime/kernel_cache.hpp"
#include "support/test_support.hpp"

#include <llvm/Support/FileSystem.h>
#include <llvm/Support/Program.h>

#include <atomic>
#include <chrono>
#include <thread>

namespace exactjit {
namespace {

CacheConfig writable(const std::string& dir) {
  CacheConfig config;
  config.writable_dir = dir;
  return config;
}

TEST(KernelCache, ThreadsShareOneCompile) {
  test::TempDir dir;
  KernelCache cache(writable(dir.path()));
  const KernelSource source =
      codegen::render(spec_family(Op::GateResidual, rows_sizes(DType::F16, 1024, 6 * 1024), Target{90, false}).front());
  std::atomic<int> compiled{0}, memory{0}, failed{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      auto lookup = cache.get(source);
      if (!lookup) {
        llvm::consumeError(lookup.takeError());
        failed++;
      } else if (lookup->origin == Origin::Compiled) {
        compiled++;
      } else if (lookup->origin == Origin::Memory) {
        memory++;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(failed.load(), 0);
  EXPECT_EQ(compiled.load(), 1);
  EXPECT_EQ(memory.load(), 7);
}

// A build that fails is not run again by each of its waiters: they get its error. The source fails
// in ptxas, after a whole compile (a few hundred ms); 8 threads that each compiled it again would
// take several times one compile (about 4 on 2 cores), one shared failure about once.
TEST(KernelCache, WaitersOfAFailedBuildGetItsErrorWithoutRebuilding) {
  test::TempDir dir;
  KernelCache cache(writable(dir.path()));
  KernelSource source =
      codegen::render(spec_family(Op::GateResidual, rows_sizes(DType::F16, 1024, 6 * 1024), Target{90, false}).front());
  // ptxas rejects it, after the whole front end has run (a failure as slow as a compile).
  source.text += "\nextern \"C\" __global__ void xj_test_broken() { asm volatile(\"not_an_instruction;\"); }\n";
  auto time_threads = [&](int count, std::atomic<int>& failed) {
    const auto start = std::chrono::steady_clock::now();
    std::vector<std::thread> threads;
    for (int t = 0; t < count; ++t)
      threads.emplace_back([&] {
        auto lookup = cache.get(source);
        if (!lookup && take_error(lookup.takeError()).code == ErrorCode::CompileFailed) failed++;
      });
    for (std::thread& t : threads) t.join();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  std::atomic<int> failed_warm_up{0}, failed_alone{0}, failed_together{0};
  time_threads(1, failed_warm_up);  // NVRTC loaded and initialised
  const double alone = time_threads(1, failed_alone);
  const double together = time_threads(8, failed_together);
  EXPECT_EQ(failed_alone.load(), 1);
  EXPECT_EQ(failed_together.load(), 8);  // every caller sees the compile error ...
  EXPECT_LT(together, 2.5 * alone) << "1 thread: " << alone << " s, 8 threads: " << together << " s";  // ... once
}

TEST(KernelCache, RacingProcessesLeaveOneValidEntryEach) {
  test::TempDir dir;
  std::vector<llvm::sys::ProcessInfo> processes;
  const std::string cli = EXACTJIT_CLI;
  const std::string cache_dir = dir.path();
  const llvm::StringRef argv[] = {cli, "prewarm", "--op", "gate_residual", "--dtype", "bf16", "--hidden", "2048",
                                  "--arch", "sm_90", "-j", "2", "--quiet", "--cache-dir", cache_dir};
  for (int p = 0; p < 4; ++p) processes.push_back(llvm::sys::ExecuteNoWait(cli, argv, llvm::None));
  for (llvm::sys::ProcessInfo& info : processes) {
    const llvm::sys::ProcessInfo done = llvm::sys::Wait(info, /*SecondsToWait=*/0, /*WaitUntilChildTerminates=*/true);
    EXPECT_EQ(done.ReturnCode, 0);
  }
  const std::vector<EntryStatus> entries = DiskCache(writable(dir.path())).scan(true);
  EXPECT_EQ(entries.size(), 4u);  // int64/int32 x 16-byte/scalar
  for (const EntryStatus& e : entries) EXPECT_TRUE(e.problem.empty()) << e.directory << ": " << e.problem;
  // No temporary folders left behind.
  std::error_code ec;
  for (llvm::sys::fs::recursive_directory_iterator it(dir.path(), ec), end; it != end && !ec; it.increment(ec))
    EXPECT_EQ(it->path().find("/.tmp-"), std::string::npos) << it->path();
}

TEST(KernelCache, DiskHitInAFreshProcessNeverLoadsNvrtc) {
  test::TempDir dir;
  const test::CommandResult prewarm = test::run_command(
      EXACTJIT_CLI, {"prewarm", "--op", "gate_residual", "--dtype", "bf16", "--arch", "sm_90", "--quiet"},
      {"EXACTJIT_CACHE_DIR=" + dir.path()});
  ASSERT_EQ(prewarm.exit_code, 0) << prewarm.err;
  const std::string stride = std::to_string(6 * kDefaultHidden);
  const test::CommandResult probe =
      test::run_command(EXACTJIT_CACHE_PROBE, {"bf16", stride}, {"EXACTJIT_CACHE_DIR=" + dir.path()});
  ASSERT_EQ(probe.exit_code, 0) << probe.out << probe.err;
  EXPECT_NE(probe.out.find("origin disk nvrtc_loaded 0 nvrtc_mapped 0"), std::string::npos) << probe.out;
  // And a miss does load it (the probe can tell the difference).
  test::TempDir empty;
  const test::CommandResult miss =
      test::run_command(EXACTJIT_CACHE_PROBE, {"bf16", stride}, {"EXACTJIT_CACHE_DIR=" + empty.path()});
  EXPECT_NE(miss.out.find("origin compiled nvrtc_loaded 1 nvrtc_mapped 1"), std::string::npos) << miss.out;
}

}  // namespace
}  // namespace exactjit
