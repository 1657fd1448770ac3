// exactjit module table: a cached kernel image loaded as a CUmodule once per CUDA context, and
// its entry point resolved once. Modules live as long as the table (the Runtime).
#pragma once

#include "runtime/driver.hpp"
#include "runtime/kernel_cache.hpp"

#include <llvm/Support/Error.h>

#include <map>
#include <mutex>
#include <string>
#include <utility>

namespace exactjit {

class ModuleTable {
 public:
  explicit ModuleTable(const Driver& driver) : driver_(driver) {}
  ~ModuleTable();
  ModuleTable(const ModuleTable&) = delete;
  ModuleTable& operator=(const ModuleTable&) = delete;

  /// The kernel's entry point in `context`, loading the module on first use.
  llvm::Expected<CUfunction> function(CUcontext context, const CachedKernel& kernel);
  size_t size() const;

 private:
  struct Loaded {
    CUmodule module = nullptr;
    CUfunction function = nullptr;
  };
  const Driver& driver_;
  mutable std::mutex mutex_;
  std::map<std::pair<CUcontext, std::string>, Loaded> modules_;  // by (context, source key)
};

}  // namespace exactjit
