// exactjit cache: list, summarise, verify, prune and clear the cache layers.
#include "cli/commands.hpp"
#include "cli/options.hpp"

#include "runtime/disk_cache.hpp"

#include <fmt/format.h>

namespace exactjit::cli {

int run_cache() {
  const DiskCache cache(cache_config());
  const std::string action = cache_action;
  if (action == "ls" || action == "verify") {
    const bool verify = action == "verify";
    const std::vector<EntryStatus> entries = cache.scan(verify);
    size_t bad = 0;
    for (const EntryStatus& e : entries) {
      const bool ok = e.problem.empty();
      bad += ok ? 0 : 1;
      fmt::print("{}{:>8} {} {}  {}\n", verify ? (ok ? "ok   " : "BAD  ") : "", e.bytes, e.read_only ? "ro" : "rw",
                 e.spec, e.directory);
      if (!ok) fmt::print("       {}\n", e.problem);
    }
    if (verify) {
      fmt::print("verify: {} entries, {} bad\n", entries.size(), bad);
      return bad ? kExitFailed : kExitOk;
    }
    return kExitOk;
  }
  if (action == "stat") {
    const std::vector<EntryStatus> entries = cache.scan(false);
    uint64_t rw_bytes = 0, ro_bytes = 0;
    size_t rw = 0, ro = 0;
    for (const EntryStatus& e : entries) {
      (e.read_only ? ro_bytes : rw_bytes) += e.bytes;
      ++(e.read_only ? ro : rw);
    }
    fmt::print("writable:  {} ({} entries, {} bytes)\n", cache.config().writable_dir.empty() ? "(none)" : cache.config().writable_dir, rw, rw_bytes);
    for (const std::string& dir : cache.config().read_only_dirs) fmt::print("read-only: {}\n", dir);
    fmt::print("read-only entries: {} ({} bytes)\noffline: {}\n", ro, ro_bytes, cache.config().offline ? "yes" : "no");
    return kExitOk;
  }
  if (action == "prune") {
    auto result = cache.prune(policy_flag);
    if (!result) return report_error(result.takeError());
    fmt::print("prune: removed {} entries ({} bytes); {} bytes remain\n", result->removed_entries, result->freed_bytes,
               result->remaining_bytes);
    return kExitOk;
  }
  if (action == "clear") {
    if (auto err = cache.clear()) return report_error(std::move(err));
    fmt::print("clear: removed {}/{}\n", cache.config().writable_dir, kCacheFormatDir);
    return kExitOk;
  }
  fmt::print(stderr, "exactjit: error: cache action must be ls, stat, verify, prune or clear (got '{}')\n", action);
  return kExitUsage;
}

}  // namespace exactjit::cli
