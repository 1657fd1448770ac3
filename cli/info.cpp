// exactjit info: versions, NVRTC and its architectures, the driver and GPUs, the cache layers.
#include "cli/commands.hpp"
#include "cli/json_output.hpp"
#include "cli/options.hpp"

#include "codegen/render.hpp"
#include "runtime/driver.hpp"
#include "runtime/nvrtc.hpp"

#include <fmt/format.h>

namespace exactjit::cli {
namespace {

struct Gpu {
  std::string name;
  int sm = 0;
};

llvm::json::Object nvrtc_json(llvm::Expected<const Nvrtc*>& nvrtc) {
  if (!nvrtc) return llvm::json::Object{{"available", false}, {"error", llvm::toString(nvrtc.takeError())}};
  const CompilerIdentity& id = (*nvrtc)->identity();
  llvm::json::Array archs;
  for (int arch : (*nvrtc)->supported_archs()) archs.push_back(fmt::format("sm_{}", arch));
  return llvm::json::Object{{"available", true},
          {"version", fmt::format("{}.{}", id.major, id.minor)},
          {"library", id.library_path},
          {"library_bytes", static_cast<int64_t>(id.library_size)},
          {"tag", id.tag()},
          {"archs", std::move(archs)}};
}

}  // namespace

int run_info() {
  auto nvrtc = Nvrtc::get();
  auto driver = Driver::get();
  std::vector<Gpu> gpus;
  if (driver) {
    int count = 0;
    (*driver)->cuDeviceGetCount(&count);
    for (int d = 0; d < count; ++d) {
      CUdevice device = 0;
      char name[256] = {};
      int major = 0, minor = 0;
      (*driver)->cuDeviceGet(&device, d);
      (*driver)->cuDeviceGetName(name, sizeof name, device);
      (*driver)->cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, device);
      (*driver)->cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, device);
      gpus.push_back({name, major * 10 + minor});
    }
  }
  const CacheConfig config = cache_config();

  if (json_flag) {
    llvm::json::Object driver_fields;
    if (driver) {
      llvm::json::Array devices;
      for (size_t d = 0; d < gpus.size(); ++d)
        devices.push_back(llvm::json::Object{{"ordinal", static_cast<int64_t>(d)},
                                             {"name", gpus[d].name},
                                             {"arch", fmt::format("sm_{}", gpus[d].sm)}});
      driver_fields = llvm::json::Object{{"available", true},
                       {"version", fmt::format("{}.{}", (*driver)->version / 1000, (*driver)->version % 1000 / 10)},
                       {"devices", std::move(devices)}};
    } else {
      driver_fields = llvm::json::Object{{"available", false}, {"error", llvm::toString(driver.takeError())}};
    }
    llvm::json::Array read_only(config.read_only_dirs);
    return print_json(kExitOk, llvm::json::Object{{"version", EXACTJIT_VERSION},
                                {"generator", std::string(codegen::kGeneratorVersion)},
                                {"nvrtc", nvrtc_json(nvrtc)},
                                {"driver", std::move(driver_fields)},
                                {"cache", llvm::json::Object{{"writable", path_or_null(config.writable_dir)},
                                                             {"read_only", std::move(read_only)},
                                                             {"offline", config.offline},
                                                             {"pinned_index", path_or_null(config.pinned_index)}}}});
  }

  fmt::print("exactjit {} ({})\n", EXACTJIT_VERSION, codegen::kGeneratorVersion);
  if (nvrtc) {
    const CompilerIdentity& id = (*nvrtc)->identity();
    std::string archs;
    for (int arch : (*nvrtc)->supported_archs()) archs += fmt::format(" sm_{}", arch);
    fmt::print("nvrtc:     {}.{} ({}, {} bytes, tag {})\n           archs:{}\n", id.major, id.minor, id.library_path,
               id.library_size, id.tag(), archs);
  } else {
    fmt::print("nvrtc:     not available: {}\n", llvm::toString(nvrtc.takeError()));
  }
  if (driver) {
    fmt::print("driver:    CUDA {}.{}, {} device(s)\n", (*driver)->version / 1000, (*driver)->version % 1000 / 10,
               gpus.size());
    for (size_t d = 0; d < gpus.size(); ++d) fmt::print("  gpu {}:   {} (sm_{})\n", d, gpus[d].name, gpus[d].sm);
  } else {
    fmt::print("driver:    none ({})\n", llvm::toString(driver.takeError()));
  }
  fmt::print("cache:     {} (writable)\n", config.writable_dir.empty() ? "(none)" : config.writable_dir);
  for (const std::string& dir : config.read_only_dirs) fmt::print("           {} (read-only)\n", dir);
  fmt::print("offline:   {}\n", config.offline ? "yes (EXACTJIT_OFFLINE)" : "no");
  return kExitOk;
}

}  // namespace exactjit::cli
