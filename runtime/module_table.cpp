// exactjit module table (see module_table.hpp).
#include "runtime/module_table.hpp"

#include "runtime/errors.hpp"

#include <fmt/format.h>

namespace exactjit {

ModuleTable::~ModuleTable() {
  for (auto& [key, loaded] : modules_) {
    ScopedContext scope(driver_, key.first);
    driver_.cuModuleUnload(loaded.module);
  }
}

size_t ModuleTable::size() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return modules_.size();
}

llvm::Expected<CUfunction> ModuleTable::function(CUcontext context, const CachedKernel& kernel) {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto key = std::make_pair(context, kernel.source_key);
  if (auto it = modules_.find(key); it != modules_.end()) return it->second.function;
  ScopedContext scope(driver_, context);
  Loaded loaded;
  // A PTX image must be NUL-terminated for the driver's JIT; std::string guarantees it.
  if (auto err = driver_.check(driver_.cuModuleLoadData(&loaded.module, kernel.image.c_str()),
                               kernel.is_ptx ? "cuModuleLoadData (PTX, JIT by the driver)" : "cuModuleLoadData"))
    return err;
  if (auto err = driver_.check(driver_.cuModuleGetFunction(&loaded.function, loaded.module, kernel.entry.c_str()),
                               "cuModuleGetFunction")) {
    driver_.cuModuleUnload(loaded.module);
    return make_error(ErrorCode::Cuda, fmt::format("kernel {}: {}", kernel.entry, llvm::toString(std::move(err))));
  }
  modules_.emplace(key, loaded);
  return loaded.function;
}

}  // namespace exactjit
