// exactjit bench: every catalog op against its references on this machine's GPU, in one command:
// bench/bench_forward.py (eager, torch.compile with and without emulate_precision_casts, copy
// bandwidth), bench/bench_backward.py (forward + backward against eager and deterministic eager),
// bench/bench_det_linear.py (the det_linear family against cuBLAS), then bench/plot_report.py (PNG
// plots). Each writes markdown + JSON under --out; the commit is in
// every report. Needs a GPU, python3 and torch (and matplotlib for the plots).
#include "cli/commands.hpp"
#include "cli/options.hpp"

#include "runtime/driver.hpp"

#include <fmt/format.h>
#include <llvm/Support/FileSystem.h>
#include <llvm/Support/Path.h>
#include <llvm/Support/Program.h>

#include <string>
#include <vector>

namespace exactjit::cli {

int run_bench() {
  if (!Driver::available()) {
    fmt::print(stderr, "exactjit bench: no CUDA driver or GPU here; run it on the GPU machine\n");
    return kExitFailed;
  }
  auto python = llvm::sys::findProgramByName("python3");
  if (!python) {
    fmt::print(stderr, "exactjit bench: python3 is not on PATH (the benchmarks need it and torch)\n");
    return kExitFailed;
  }
  const std::string scripts = bench_dir_flag.empty() ? std::string(EXACTJIT_BENCH_DIR) : bench_dir_flag.getValue();
  const std::string out = bench_out_flag;
  if (std::error_code ec = llvm::sys::fs::create_directories(out)) {
    fmt::print(stderr, "exactjit bench: cannot create {}: {}\n", out, ec.message());
    return kExitFailed;
  }
  auto script = [&](const char* name) { return (llvm::Twine(scripts) + "/" + name).str(); };
  auto in_out = [&](const char* name) { return (llvm::Twine(out) + "/" + name).str(); };
  std::vector<std::pair<std::string, std::vector<std::string>>> steps = {
      {"forward",
       {script("bench_forward.py"), "--report", in_out("bench_forward.md"), "--json", in_out("bench_forward.json")}},
      {"forward + backward",
       {script("bench_backward.py"), "--report", in_out("bench_backward.md"), "--json", in_out("bench_backward.json")}},
      {"det_linear (cuBLAS)",
       {script("bench_det_linear.py"), "--report", in_out("bench_det_linear.md"), "--json",
        in_out("bench_det_linear.json")}},
      {"plots",
       {script("plot_report.py"), "--forward", in_out("bench_forward.json"), "--backward",
        in_out("bench_backward.json"), "--out", in_out("plots")}},
  };
  if (!bench_sizes_flag.empty())
    for (int k = 0; k < 2; ++k) steps[k].second.insert(steps[k].second.end(), {"--sizes", bench_sizes_flag.getValue()});
  for (const auto& [name, args] : steps)
    if (!llvm::sys::fs::exists(args.front())) {
      fmt::print(stderr, "exactjit bench: {} is missing (--bench-dir points at the checkout's bench/)\n", args.front());
      return kExitUsage;
    }
  int failed = 0;
  for (size_t k = 0; k < steps.size(); ++k) {
    const auto& [name, args] = steps[k];
    fmt::print(stderr, "[{}/{}] {}: python3 {}\n", k + 1, steps.size(), name, args.front());
    std::vector<llvm::StringRef> argv = {*python};
    for (const std::string& a : args) argv.push_back(a);
    std::string error;
    const int rc = llvm::sys::ExecuteAndWait(*python, argv, llvm::None, {}, 0, 0, &error);
    if (rc != 0) {
      fmt::print(stderr, "exactjit bench: {} failed (exit {}{}{})\n", name, rc, error.empty() ? "" : ": ", error);
      ++failed;
    }
  }
  fmt::print("bench: {} of {} steps succeeded; reports in {}\n", steps.size() - failed, steps.size(), out);
  return failed ? kExitFailed : kExitOk;
}

}  // namespace exactjit::cli
