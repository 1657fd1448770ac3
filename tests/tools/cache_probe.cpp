// exactjit cache probe: a fresh process that renders one spec, looks it up through the kernel
// cache and reports where it came from, how long that took and whether NVRTC was loaded (both by
// the library's own flag and by /proc/self/maps). Used by the tests and the cold-start benchmark.
//
//   exactjit_cache_probe <dtype> <table_stride>    (gate_residual, H = 5376, int64, widest, sm_90)
#include "codegen/render.hpp"
#include "kernels/catalog.hpp"
#include "kernels/gate_residual.hpp"
#include "runtime/environment.hpp"
#include "runtime/kernel_cache.hpp"
#include "runtime/nvrtc.hpp"

#include <fmt/format.h>

#include <chrono>
#include <fstream>
#include <string>

int main(int argc, char** argv) {
  using namespace exactjit;
  if (argc != 3) {
    fmt::print(stderr, "usage: exactjit_cache_probe <dtype> <table_stride>\n");
    return 2;
  }
  const auto start = std::chrono::steady_clock::now();
  const std::optional<DType> dtype = parse_dtype(argv[1]);
  if (!dtype) return 2;
  const KernelSpec spec =
      spec_family(Op::GateResidual, rows_sizes(*dtype, kDefaultHidden, std::stoll(argv[2])), Target{90, false}).front();
  KernelCache cache(llvm::cantFail(cache_config_from_environment()));
  auto lookup = cache.get(codegen::render(spec));
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  if (!lookup) {
    fmt::print("error {}\n", llvm::toString(lookup.takeError()));
    return 1;
  }
  std::ifstream maps("/proc/self/maps");
  bool mapped = false;
  for (std::string line; std::getline(maps, line);) mapped = mapped || line.find("libnvrtc") != std::string::npos;
  const char* origin =
      lookup->origin == Origin::Compiled ? "compiled" : lookup->origin == Origin::Disk ? "disk" : "memory";
  fmt::print("origin {} nvrtc_loaded {} nvrtc_mapped {} ms {:.3f} problems {}\n", origin, Nvrtc::loaded() ? 1 : 0,
             mapped ? 1 : 0, ms, lookup->problems.size());
  return 0;
}
