// exactjit cache: list, summarise, verify, prune and clear the cache layers.
#include "cli/commands.hpp"
#include "cli/json_output.hpp"
#include "cli/options.hpp"

#include "runtime/disk_cache.hpp"

#include <fmt/format.h>
#include <llvm/Support/Path.h>
#include <llvm/Support/raw_ostream.h>

namespace exactjit::cli {
namespace {

// verify --rebuild: an entry's image must be what its kernel.cu compiles to with its recorded
// options. NVRTC output is deterministic for one compiler build, so a byte difference means the
// image did not come from that source (docs/cache-format.md, "What a reader does not trust").
// Returns "" when it matches, else what differs; entries of another NVRTC build cannot be checked.
std::string rebuild_problem(const std::string& directory, const Nvrtc& nvrtc) {
  auto entry = read_entry(directory, std::string(llvm::sys::path::filename(llvm::sys::path::parent_path(directory))));
  if (!entry) return llvm::toString(entry.takeError());
  if (entry->compiler_tag != nvrtc.identity().tag())
    return fmt::format("compiled by {}, this NVRTC is {}: cannot rebuild here", entry->compiler_tag,
                       nvrtc.identity().tag());
  KernelSource source;
  source.spec.target.ptx = entry->is_ptx;
  source.entry = entry->entry;
  source.text = entry->source;
  source.options = entry->options;
  auto output = nvrtc.compile(source);
  if (!output) return llvm::toString(output.takeError());
  if (output->image != entry->image)
    return fmt::format("rebuilt image differs from the stored one ({} vs {} bytes): not what its kernel.cu "
                       "compiles to", output->image.size(), entry->image.size());
  return "";
}

llvm::json::Object entry_json(const EntryStatus& e, bool verify) {
  llvm::json::Object entry{{"directory", e.directory},
                           {"spec", e.spec},
                           {"compiler_tag", e.compiler_tag},
                           {"bytes", static_cast<int64_t>(e.bytes)},
                           {"layer", e.read_only ? "read-only" : "writable"}};
  if (verify) {
    entry["ok"] = e.problem.empty();
    if (!e.problem.empty()) entry["problem"] = e.problem;
    if (!e.image_sha256.empty()) entry["image_sha256"] = e.image_sha256;
  }
  return entry;
}

}  // namespace

int run_cache() {
  const DiskCache cache(cache_config());
  const std::string action = cache_action;
  if (action == "ls" || action == "verify") {
    const bool verify = action == "verify";
    if (rebuild_flag && !verify) {
      fmt::print(stderr, "exactjit: error: --rebuild is for cache verify\n");
      return kExitUsage;
    }
    const Nvrtc* nvrtc = nullptr;
    if (rebuild_flag) {
      auto loaded = Nvrtc::get();
      if (!loaded) return report_error(loaded.takeError());
      nvrtc = *loaded;
    }
    std::vector<EntryStatus> entries = cache.scan(verify);
    size_t bad = 0;
    for (EntryStatus& e : entries) {
      if (nvrtc && e.problem.empty()) e.problem = rebuild_problem(e.directory, *nvrtc);
      bad += e.problem.empty() ? 0 : 1;
    }
    const int exit_code = verify && bad ? kExitFailed : kExitOk;
    if (json_flag) {
      llvm::json::Array listed;
      for (const EntryStatus& e : entries) listed.push_back(entry_json(e, verify));
      llvm::json::Object fields{{"entries", std::move(listed)}};
      if (verify) {
        fields["rebuild"] = nvrtc != nullptr;
        fields["counts"] = llvm::json::Object{{"entries", static_cast<int64_t>(entries.size())},
                                              {"bad", static_cast<int64_t>(bad)}};
      }
      return print_json(exit_code, std::move(fields));
    }
    for (const EntryStatus& e : entries) {
      const bool ok = e.problem.empty();
      fmt::print("{}{:>8} {} {}  {}\n", verify ? (ok ? "ok   " : "BAD  ") : "", e.bytes, e.read_only ? "ro" : "rw",
                 e.spec, e.directory);
      if (!ok) fmt::print("       {}\n", e.problem);
    }
    if (verify) fmt::print("verify{}: {} entries, {} bad\n", nvrtc ? " --rebuild" : "", entries.size(), bad);
    return exit_code;
  }
  if (action == "index") {
    if (json_flag) {
      fmt::print(stderr, "exactjit: error: cache index writes an index file, not JSON (drop --json)\n");
      return kExitUsage;
    }
    // Pins the writable layer as it stands, the one a deployment is about to ship: every entry,
    // verified, with its image's SHA-256 (runtime/layer_index.hpp). Run with EXACTJIT_CACHE_INDEX.
    std::vector<std::pair<std::string, std::string>> listed;
    size_t bad = 0;
    for (const EntryStatus& e : cache.scan(/*verify=*/true)) {
      if (e.read_only) continue;
      if (!e.problem.empty()) {
        ++bad;
        fmt::print(stderr, "exactjit: error: bad entry {}: {}\n", e.directory, e.problem);
        continue;
      }
      const llvm::StringRef folder = llvm::sys::path::filename(e.directory);
      const llvm::StringRef key = llvm::sys::path::filename(llvm::sys::path::parent_path(e.directory));
      listed.emplace_back((key + "/" + folder).str(), e.image_sha256);
    }
    if (bad) {
      fmt::print(stderr, "exactjit: error: {} bad entries; no index written (fix or prune them first)\n", bad);
      return kExitFailed;
    }
    const size_t count = listed.size();
    const std::string text = format_layer_index(std::move(listed));
    if (index_out_flag.empty()) {
      fmt::print("{}", text);
      return kExitOk;
    }
    std::error_code ec;
    llvm::raw_fd_ostream out(index_out_flag, ec);
    if (!ec) out << text;
    if (ec || (out.close(), out.has_error())) {
      fmt::print(stderr, "exactjit: error: cannot write {}: {}\n", index_out_flag.getValue(),
                 (ec ? ec : out.error()).message());
      return kExitFailed;
    }
    fmt::print(stderr, "index: {} entries into {}\n", count, index_out_flag.getValue());
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
    if (json_flag) {
      llvm::json::Array read_only(cache.config().read_only_dirs);
      return print_json(
          kExitOk,
          llvm::json::Object{{"writable", llvm::json::Object{{"directory", path_or_null(cache.config().writable_dir)},
                                           {"entries", static_cast<int64_t>(rw)},
                                           {"bytes", static_cast<int64_t>(rw_bytes)}}},
           {"read_only", llvm::json::Object{{"directories", std::move(read_only)},
                                            {"entries", static_cast<int64_t>(ro)},
                                            {"bytes", static_cast<int64_t>(ro_bytes)}}},
           {"offline", cache.config().offline}});
    }
    fmt::print("writable:  {} ({} entries, {} bytes)\n",
               cache.config().writable_dir.empty() ? "(none)" : cache.config().writable_dir, rw, rw_bytes);
    for (const std::string& dir : cache.config().read_only_dirs) fmt::print("read-only: {}\n", dir);
    fmt::print("read-only entries: {} ({} bytes)\noffline: {}\n", ro, ro_bytes, cache.config().offline ? "yes" : "no");
    return kExitOk;
  }
  if (action == "prune") {
    auto result = cache.prune(policy_flag);
    if (!result) return report_error(result.takeError());
    if (json_flag)
      return print_json(kExitOk, llvm::json::Object{{"policy", policy_flag.getValue()},
                                  {"removed_entries", static_cast<int64_t>(result->removed_entries)},
                                  {"freed_bytes", static_cast<int64_t>(result->freed_bytes)},
                                  {"remaining_bytes", static_cast<int64_t>(result->remaining_bytes)}});
    fmt::print("prune: removed {} entries ({} bytes); {} bytes remain\n", result->removed_entries, result->freed_bytes,
               result->remaining_bytes);
    return kExitOk;
  }
  if (action == "clear") {
    if (auto err = cache.clear()) return report_error(std::move(err));
    if (json_flag)
      return print_json(kExitOk, llvm::json::Object{{"removed", cache.config().writable_dir + "/" + kCacheFormatDir}});
    fmt::print("clear: removed {}/{}\n", cache.config().writable_dir, kCacheFormatDir);
    return kExitOk;
  }
  fmt::print(stderr, "exactjit: error: cache action must be ls, stat, verify, index, prune or clear (got '{}')\n",
             action);
  return kExitUsage;
}

}  // namespace exactjit::cli
