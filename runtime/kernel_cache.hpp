// exactjit kernel cache: the memory level over the disk cache, with single flight.
//
// get() returns the compiled image of a KernelSource: from memory, else from disk (verified),
// else compiled with NVRTC and published. Threads asking for the same missing kernel wait for one
// build; processes are kept from compiling the same key twice by the disk cache's build lock.
// Offline mode never compiles: a miss is an error naming the spec and the prewarm command.
#pragma once

#include "codegen/kernel_source.hpp"
#include "runtime/disk_cache.hpp"

#include <llvm/Support/Error.h>

#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace exactjit {

enum class Origin { Memory, Disk, Compiled };

struct CachedKernel {
  std::string source_key;
  std::string content_key;  ///< empty when the compiled image could not be published
  std::string entry;
  std::string image;
  bool is_ptx = false;
  std::string directory;  ///< where it lives on disk (empty if not published)
};

struct CacheLookup {
  std::shared_ptr<const CachedKernel> kernel;
  Origin origin = Origin::Memory;
  std::vector<std::string> problems;  ///< bad entries met and publish failures, already reported
};

class KernelCache {
 public:
  /// `report` receives every problem (corrupt entry, failed publish); default: stderr.
  explicit KernelCache(CacheConfig config, std::function<void(const std::string&)> report = {});

  llvm::Expected<CacheLookup> get(const KernelSource& source);

 private:
  struct Slot;
  llvm::Expected<CacheLookup> build(const KernelSource& source, const std::string& key);

  DiskCache disk_;
  std::function<void(const std::string&)> report_;
  std::mutex mutex_;
  std::unordered_map<std::string, std::shared_ptr<Slot>> slots_;  // by source key
};

/// The command that pre-warms the kernel family of a spec, for offline-miss messages.
std::string prewarm_command(const KernelSpec& spec);

}  // namespace exactjit
