// exactjit info: versions, NVRTC and its architectures, the driver and GPUs, the cache layers.
#include "cli/commands.hpp"
#include "cli/options.hpp"

#include "codegen/render.hpp"
#include "runtime/driver.hpp"
#include "runtime/nvrtc.hpp"

#include <fmt/format.h>

namespace exactjit::cli {

int run_info() {
  fmt::print("exactjit {} ({})\n", EXACTJIT_VERSION, codegen::kGeneratorVersion);
  if (auto nvrtc = Nvrtc::get()) {
    const CompilerIdentity& id = (*nvrtc)->identity();
    std::string archs;
    for (int arch : (*nvrtc)->supported_archs()) archs += fmt::format(" sm_{}", arch);
    fmt::print("nvrtc:     {}.{} ({}, {} bytes, tag {})\n           archs:{}\n", id.major, id.minor, id.library_path,
               id.library_size, id.tag(), archs);
  } else {
    fmt::print("nvrtc:     not available: {}\n", llvm::toString(nvrtc.takeError()));
  }
  if (auto driver = Driver::get()) {
    int count = 0;
    (*driver)->cuDeviceGetCount(&count);
    fmt::print("driver:    CUDA {}.{}, {} device(s)\n", (*driver)->version / 1000, (*driver)->version % 1000 / 10, count);
    for (int d = 0; d < count; ++d) {
      CUdevice device = 0;
      char name[256] = {};
      int major = 0, minor = 0;
      (*driver)->cuDeviceGet(&device, d);
      (*driver)->cuDeviceGetName(name, sizeof name, device);
      (*driver)->cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, device);
      (*driver)->cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, device);
      fmt::print("  gpu {}:   {} (sm_{}{})\n", d, name, major, minor);
    }
  } else {
    fmt::print("driver:    none ({})\n", llvm::toString(driver.takeError()));
  }
  const CacheConfig config = cache_config();
  fmt::print("cache:     {} (writable)\n", config.writable_dir.empty() ? "(none)" : config.writable_dir);
  for (const std::string& dir : config.read_only_dirs) fmt::print("           {} (read-only)\n", dir);
  fmt::print("offline:   {}\n", config.offline ? "yes (EXACTJIT_OFFLINE)" : "no");
  return kExitOk;
}

}  // namespace exactjit::cli
