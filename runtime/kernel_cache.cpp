// exactjit kernel cache (see kernel_cache.hpp).
#include "runtime/kernel_cache.hpp"

#include "codegen/op_row.hpp"
#include "runtime/content_key.hpp"
#include "runtime/driver.hpp"
#include "runtime/errors.hpp"
#include "runtime/nvrtc.hpp"

#include <fmt/format.h>

namespace exactjit {

struct KernelCache::Slot {
  bool done = false;
  std::shared_ptr<const CachedKernel> kernel;  // null after a failed build
  ErrorReport failure;                         // the failed build's error, handed to its waiters
  std::condition_variable ready;
};

std::string prewarm_command(const KernelSpec& spec) {
  const OpRow& row = op_row(spec.op);
  switch (row.shape) {
    case SpecShape::Linear:  // the forward builds one activation, the backward both
      return fmt::format("exactjit prewarm --op {} --dtype {} --in-features {} --out-features {}{} --arch {}", row.name,
                         dtype_name(spec.dtype), spec.in_features, spec.out_features,
                         row.role != OpRole::Forward ? "" : spec.silu ? " --activation silu" : " --activation none",
                         spec.target.name());
    case SpecShape::Channels:
      return fmt::format("exactjit prewarm --op {} --channels {} --arch {}", row.name, spec.channels,
                         spec.target.name());
    case SpecShape::Plan:  // not sized by the call: every key count and index type
      return fmt::format("exactjit prewarm --op {} --dtype {} --arch {}", row.name, dtype_name(spec.dtype),
                         spec.target.name());
    case SpecShape::Rows: break;
  }
  return fmt::format("exactjit prewarm --op {} --hidden {} --dtype {} --table-stride {} --arch {}", row.name,
                     spec.hidden, dtype_name(spec.dtype), spec.table_stride, spec.target.name());
}

KernelCache::KernelCache(CacheConfig config, std::function<void(const std::string&)> report)
    : disk_(std::move(config)), report_(std::move(report)) {
  if (!report_) report_ = [](const std::string& problem) { fmt::print(stderr, "exactjit: {}\n", problem); };
}

llvm::Expected<CacheLookup> KernelCache::get(const KernelSource& source) {
  const std::string key = source_key(source);
  std::shared_ptr<Slot> slot;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    auto it = slots_.find(key);
    if (it != slots_.end()) {
      slot = it->second;
      slot->ready.wait(lock, [&] { return slot->done; });
      if (slot->kernel) return CacheLookup{slot->kernel, Origin::Memory, {}};
      // The build we waited for failed: its error, not a rebuild per waiter (the next call retries).
      return make_error(slot->failure.code, slot->failure.message);
    }
    slot = std::make_shared<Slot>();
    slots_[key] = slot;
  }
  auto result = build(source, key);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    slot->done = true;
    if (result) {
      slot->kernel = result->kernel;
    } else {
      slot->failure = take_error(result.takeError());
      result = make_error(slot->failure.code, slot->failure.message);
      if (auto it = slots_.find(key); it != slots_.end() && it->second == slot) slots_.erase(it);
    }
  }
  slot->ready.notify_all();
  return result;
}

llvm::Expected<CacheLookup> KernelCache::build(const KernelSource& source, const std::string& key) {
  CacheLookup lookup;
  auto finish_from_disk = [&](DiskEntry entry) {
    auto kernel = std::make_shared<CachedKernel>();
    kernel->source_key = key;
    kernel->content_key = entry.content_key;
    kernel->entry = entry.entry;
    kernel->image = std::move(entry.image);
    kernel->is_ptx = entry.is_ptx;
    kernel->directory = entry.directory;
    lookup.kernel = std::move(kernel);
  };
  auto note = [&](std::vector<std::string>& problems) {
    for (std::string& problem : problems) {
      report_(problem);
      lookup.problems.push_back(std::move(problem));
    }
  };
  auto disk_lookup = [&]() -> llvm::Expected<bool> {
    std::vector<std::string> problems;
    auto found = disk_.lookup(source, key, problems);
    note(problems);
    if (!found) return found.takeError();
    if (!*found) return false;
    finish_from_disk(std::move(**found));
    return true;
  };

  auto hit = disk_lookup();
  if (!hit) return hit.takeError();
  if (*hit) {
    lookup.origin = Origin::Disk;
    return lookup;
  }
  if (disk_.config().offline) {
    std::string searched;
    for (const std::string& dir : disk_.config().read_only_dirs) searched += " " + dir;
    searched += " " + disk_.config().writable_dir;
    return make_error(ErrorCode::OfflineMiss,
                      fmt::format("{} is not in the kernel cache and EXACTJIT_OFFLINE forbids compiling "
                                  "(searched:{}). Pre-warm it with: {}",
                                  source.spec.describe(), searched, prewarm_command(source.spec)));
  }
  auto nvrtc = Nvrtc::get();
  if (!nvrtc) return nvrtc.takeError();

  // Another process may be compiling the same kernel: wait for it, then look again.
  std::vector<std::string> lock_problems;
  auto lock = disk_.build_lock(key, lock_problems);
  note(lock_problems);
  if (lock && lock->getState() == llvm::LockFileManager::LFS_Shared) {
    lock->waitForUnlock(120);
    hit = disk_lookup();
    if (!hit) return hit.takeError();
    if (*hit) {
      lookup.origin = Origin::Disk;
      return lookup;
    }
  }
  auto output = (*nvrtc)->compile(source);
  if (!output) return output.takeError();
  lookup.origin = Origin::Compiled;

  std::string driver_seen = "none";
  if (Driver::available()) driver_seen = fmt::format("{}", (*Driver::get())->version);
  auto published = disk_.publish(source, key, (*nvrtc)->identity(), *output, driver_seen);
  if (published) {
    finish_from_disk(std::move(*published));
    return lookup;
  }
  // The kernel is good even if the disk refused it: use it, say why it was not cached.
  std::string problem = fmt::format("could not cache {}: {}", source.spec.describe(),
                                    llvm::toString(published.takeError()));
  report_(problem);
  lookup.problems.push_back(std::move(problem));
  auto kernel = std::make_shared<CachedKernel>();
  kernel->source_key = key;
  kernel->entry = source.entry;
  kernel->image = std::move(output->image);
  kernel->is_ptx = output->is_ptx;
  lookup.kernel = std::move(kernel);
  return lookup;
}

}  // namespace exactjit
