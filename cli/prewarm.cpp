// exactjit prewarm: compile a set of kernels into the writable cache, in parallel, with progress
// and a summary. Needs no GPU. With --check, or under EXACTJIT_OFFLINE, it compiles nothing and
// answers "do the cache layers hold every kernel?": each missing one is named, exit 1 if any.
#include "cli/commands.hpp"
#include "cli/json_output.hpp"
#include "cli/options.hpp"

#include "codegen/render.hpp"
#include "runtime/errors.hpp"
#include "runtime/kernel_cache.hpp"

#include <fmt/format.h>
#include <llvm/Support/ThreadPool.h>
#include <llvm/Support/Threading.h>

#include <chrono>
#include <map>
#include <mutex>

namespace exactjit::cli {
namespace {

// What became of one kernel. Building: compiled, cached or failed; checking: present, missing
// or failed (a layer could not be read).
struct Outcome {
  std::string status;
  std::string error;
  std::string directory;
  double milliseconds = 0;
};

Outcome build_or_check(KernelCache& cache, const KernelSpec& spec, bool check) {
  Outcome outcome;
  const auto begin = std::chrono::steady_clock::now();
  auto lookup = cache.get(codegen::render(spec));
  outcome.milliseconds =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - begin).count();
  if (!lookup) {
    ErrorReport report = take_error(lookup.takeError());
    outcome.status = check && report.code == ErrorCode::OfflineMiss ? "missing" : "failed";
    outcome.error = std::move(report.message);
  } else if (lookup->kernel->directory.empty()) {  // compiled, but the cache refused it
    outcome.status = "failed";
    outcome.error = "compiled but not stored (see the warning above); nothing was pre-warmed";
  } else {
    outcome.status = check ? "present" : lookup->origin == Origin::Compiled ? "compiled" : "cached";
    outcome.directory = lookup->kernel->directory;
  }
  return outcome;
}

}  // namespace

int run_prewarm() {
  auto specs = specs_from_flags(/*single=*/false);
  if (!specs) return report_error(specs.takeError());
  CacheConfig config = cache_config();
  const bool check = check_flag || config.offline;
  config.offline = check;  // a check never compiles: a kernel in no layer is an offline miss
  std::mutex print_mutex;
  KernelCache cache(config, [&](const std::string& problem) {
    std::lock_guard<std::mutex> lock(print_mutex);
    fmt::print(stderr, "exactjit: warning: {}\n", problem);
  });

  const unsigned jobs = jobs_flag ? jobs_flag.getValue() : llvm::hardware_concurrency().compute_thread_count();
  const size_t total = specs->size();
  std::vector<Outcome> outcomes(total);
  size_t done = 0;
  const auto start = std::chrono::steady_clock::now();
  {
    llvm::ThreadPool pool(llvm::hardware_concurrency(jobs));
    for (size_t k = 0; k < total; ++k) {
      pool.async([&, k] {
        Outcome outcome = build_or_check(cache, (*specs)[k], check);
        std::lock_guard<std::mutex> lock(print_mutex);
        ++done;
        // Progress while building; a check lists its missing kernels on standard output instead.
        if (!json_flag && (outcome.status == "failed" || (!check && !quiet_flag))) {
          fmt::print(stderr, "[{}/{}] {:<8} {} ({:.0f} ms)\n", done, total, outcome.status, (*specs)[k].describe(),
                     outcome.milliseconds);
          if (outcome.status == "failed") fmt::print(stderr, "{}\n", outcome.error);
        }
        outcomes[k] = std::move(outcome);
      });
    }
    pool.wait();
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::map<std::string, size_t> counts;
  for (const char* status : {"compiled", "cached", "present", "missing", "failed"}) counts[status] = 0;
  for (const Outcome& outcome : outcomes) ++counts[outcome.status];
  const int exit_code = counts["failed"] || counts["missing"] ? kExitFailed : kExitOk;

  if (json_flag) {
    llvm::json::Array kernels;
    for (size_t k = 0; k < total; ++k) {
      const Outcome& outcome = outcomes[k];
      llvm::json::Object kernel{{"spec", (*specs)[k].describe()},
                                {"status", outcome.status},
                                {"milliseconds", outcome.milliseconds}};
      if (!outcome.directory.empty()) kernel["directory"] = outcome.directory;
      if (!outcome.error.empty()) kernel["error"] = outcome.error;
      if (outcome.status == "missing") kernel["prewarm_command"] = exactjit::prewarm_command((*specs)[k]);
      kernels.push_back(std::move(kernel));
    }
    llvm::json::Object summary;
    for (const auto& [status, count] : counts) summary[status] = static_cast<int64_t>(count);
    summary["total"] = static_cast<int64_t>(total);
    llvm::json::Array read_only(config.read_only_dirs);
    return print_json(exit_code, llvm::json::Object{{"mode", check ? "check" : "build"},
                                                    {"jobs", static_cast<int64_t>(jobs)},
                                                    {"seconds", seconds},
                                                    {"writable", path_or_null(config.writable_dir)},
                                                    {"read_only", std::move(read_only)},
                                                    {"counts", std::move(summary)},
                                                    {"kernels", std::move(kernels)}});
  }
  if (check) {
    for (size_t k = 0; k < total; ++k)
      if (outcomes[k].status == "missing") fmt::print("missing {}\n", (*specs)[k].describe());
    std::string layers;
    for (const std::string& dir : config.read_only_dirs) layers += " " + dir;
    if (!config.writable_dir.empty()) layers += " " + config.writable_dir;
    fmt::print("check: {} kernels: {} present, {} missing, {} failed (layers:{}){}\n", total, counts["present"],
               counts["missing"], counts["failed"], layers,
               counts["missing"] ? "; build the missing ones without EXACTJIT_OFFLINE and --check" : "");
    return exit_code;
  }
  fmt::print("prewarm: {} kernels: {} compiled, {} cached, {} failed in {:.2f} s (-j {}) into {}\n", total,
             counts["compiled"], counts["cached"], counts["failed"], seconds, jobs, config.writable_dir);
  return exit_code;
}

}  // namespace exactjit::cli
