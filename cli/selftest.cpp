// exactjit selftest: every catalog op on the GPU against the host model, bit for bit.
#include "cli/commands.hpp"
#include "cli/options.hpp"

#include "selftest/selftest.hpp"
#include "runtime/driver.hpp"

#include <fmt/format.h>

namespace exactjit::cli {

int run_selftest() {
  if (!Driver::available()) {
    fmt::print(stderr, "exactjit: error: selftest needs a CUDA driver and a GPU; none found\n");
    return kExitFailed;
  }
  RuntimeOptions options = RuntimeOptions::from_environment();
  if (!cache_dir_flag.empty()) options.cache_dir = cache_dir_flag;
  Runtime runtime(options);
  size_t failed = 0, total = 0;
  auto lines = run_selftest(runtime, device_flag, [&](const SelftestLine& line) {
    ++total;
    failed += line.passed ? 0 : 1;
    fmt::print("{} {}{}{}\n", line.passed ? "PASS" : "FAIL", line.name, line.detail.empty() ? "" : ": ", line.detail);
  });
  if (!lines) return report_error(lines.takeError());
  fmt::print("selftest: {} cases, {} passed, {} failed\n", total, total - failed, failed);
  return failed ? kExitFailed : kExitOk;
}

}  // namespace exactjit::cli
