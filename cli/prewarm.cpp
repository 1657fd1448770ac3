// exactjit prewarm: compile a set of kernels into the writable cache, in parallel, with progress
// and a summary. Needs no GPU.
#include "cli/commands.hpp"
#include "cli/options.hpp"

#include "codegen/render.hpp"
#include "runtime/kernel_cache.hpp"

#include <fmt/format.h>
#include <llvm/Support/ThreadPool.h>
#include <llvm/Support/Threading.h>

#include <atomic>
#include <chrono>
#include <mutex>

namespace exactjit::cli {

int run_prewarm() {
  auto specs = specs_from_flags(/*single=*/false);
  if (!specs) return report_error(specs.takeError());
  const CacheConfig config = cache_config();
  if (config.offline) {
    fmt::print(stderr, "exactjit: error: prewarm compiles kernels, but EXACTJIT_OFFLINE is set\n");
    return kExitUsage;
  }
  std::mutex print_mutex;
  KernelCache cache(config, [&](const std::string& problem) {
    std::lock_guard<std::mutex> lock(print_mutex);
    fmt::print(stderr, "exactjit: warning: {}\n", problem);
  });

  const unsigned jobs = jobs_flag ? jobs_flag.getValue() : llvm::hardware_concurrency().compute_thread_count();
  const size_t total = specs->size();
  std::atomic<size_t> done{0}, compiled{0}, cached{0}, failed{0};
  const auto start = std::chrono::steady_clock::now();
  {
    llvm::ThreadPool pool(llvm::hardware_concurrency(jobs));
    for (const KernelSpec& spec : *specs) {
      pool.async([&, spec] {
        const auto begin = std::chrono::steady_clock::now();
        auto lookup = cache.get(codegen::render(spec));
        const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - begin).count();
        std::string what;
        if (!lookup) {
          failed++;
          what = "FAILED  " + llvm::toString(lookup.takeError());
        } else if (lookup->kernel->directory.empty()) {  // compiled, but the cache refused it
          failed++;
          what = "FAILED  compiled but not stored (see the warning above); nothing was pre-warmed";
        } else if (lookup->origin == Origin::Compiled) {
          compiled++;
          what = "compiled";
        } else {
          cached++;
          what = "cached  ";
        }
        const size_t n = ++done;
        if (!quiet_flag || what[0] == 'F') {
          std::lock_guard<std::mutex> lock(print_mutex);
          fmt::print(stderr, "[{}/{}] {} {} ({:.0f} ms)\n", n, total, what.substr(0, 8), spec.describe(), ms);
          if (what[0] == 'F') fmt::print(stderr, "{}\n", what.substr(8));
        }
      });
    }
    pool.wait();
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  fmt::print("prewarm: {} kernels: {} compiled, {} cached, {} failed in {:.2f} s (-j {}) into {}\n", total,
             compiled.load(), cached.load(), failed.load(), seconds, jobs, config.writable_dir);
  return failed ? kExitFailed : kExitOk;
}

}  // namespace exactjit::cli
