// exactjit tuning bench for gate_residual: times geometry and cache-hint variants of the generated
// kernel at one shape (bf16, H = 5376, (3T, 6H) table view), against a device-to-device copy of the
// same bytes, with CUDA events (median over rotating input sets larger than L2). Variants are the
// generated source with its geometry constants rewritten, so the kernel body is the product's.
//
//   tune_gate_residual [S=131072] [reps=30]
#include "codegen/render.hpp"
#include "kernels/catalog.hpp"
#include "kernels/gate_residual.hpp"
#include "runtime/device_buffer.hpp"
#include "runtime/driver.hpp"
#include "runtime/nvrtc.hpp"
#include "bench/tune_support.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

using namespace exactjit;
using tune::die_on;

struct Variant {
  std::string name;
  int threads_per_row;
  int rows_per_block;
  int unroll;
  bool load_hint = false;   // ld.global.nc.L1::no_allocate for every load (generated: none)
  bool store_hint = false;  // st.global.cs for every store (generated: none)
};

}  // namespace

int main(int argc, char** argv) {
  const int64_t seq = argc > 1 ? std::atoll(argv[1]) : 131072;
  const int reps = argc > 2 ? std::atoi(argv[2]) : 30;
  const int64_t hidden = kDefaultHidden, table_rows = 9, stride = 6 * hidden;
  const Driver& cu = *die_on(Driver::get());
  const Nvrtc& nvrtc = *die_on(Nvrtc::get());
  CUcontext ctx = die_on(primary_context(cu, 0));
  ScopedContext scope(cu, ctx);

  const size_t act_bytes = static_cast<size_t>(seq * hidden * 2);
  constexpr int kSets = 2;  // 2 x 3 x act_bytes >> L2
  std::vector<DeviceBuffer> residual, y, out;
  uint64_t seed = 12345;
  auto filled = [&](size_t bytes) { return tune::random_buffer(cu, ctx, bytes, seed++); };
  for (int s = 0; s < kSets; ++s) {
    residual.push_back(filled(act_bytes));
    y.push_back(filled(act_bytes));
    out.push_back(filled(act_bytes));
  }
  DeviceBuffer table = filled(static_cast<size_t>(table_rows * stride * 2));
  DeviceBuffer d_index = tune::index_buffer(cu, ctx, seq, table_rows, 7);
  DeviceBuffer errors = tune::error_record(cu, ctx);

  tune::EventTimer timer(cu, reps, kSets);

  // Copy ceiling: read act_bytes + write act_bytes.
  const double copy_gbs = timer.copy_gbs(residual, out, act_bytes);
  const double copy_ms = 2.0 * act_bytes / copy_gbs / 1e6;
  const double bytes = 3.0 * act_bytes + static_cast<double>(table_rows * hidden * 2);
  fmt::print("S={} H={} bf16: copy {:.3f} ms = {:.0f} GB/s; gate_residual bytes {:.3f} GB, "
             "floor at copy rate {:.3f} ms\n",
             seq, hidden, copy_ms, copy_gbs, bytes / 1e9, bytes / copy_gbs / 1e6);

  const KernelSpec spec =
      spec_family(Op::GateResidual, rows_sizes(DType::BF16, hidden, stride), Target{90, false}).front();
  const std::vector<Variant> variants = {
      {"generated (224x1, unroll 3)", 224, 1, 3},
      {"224 threads, unroll 1", 224, 1, 1},
      {"L1::no_allocate loads", 224, 1, 3, true, false},
      {".cs stores", 224, 1, 3, false, true},
      {"both hints (de27e39)", 224, 1, 3, true, true},
      {"2 rows/block (448)", 224, 2, 3},
      {"4 rows/block (896)", 224, 4, 3},
      {"112/row, 2 rows, unroll 3", 112, 2, 3},
      {"112/row, 2 rows, unroll 6", 112, 2, 6},
      {"96/row, 2 rows, unroll 7", 96, 2, 7},
      {"56/row, 4 rows, unroll 6", 56, 4, 6},
  };
  fmt::print("{:<30} {:>9} {:>9} {:>8}\n", "variant", "ms", "GB/s", "% copy");
  for (const Variant& v : variants) {
    KernelSource source = codegen::render(spec);
    tune::replace_all(source.text, "constexpr int kThreadsPerRow = 224;",
                      fmt::format("constexpr int kThreadsPerRow = {};", v.threads_per_row));
    tune::replace_all(source.text, "constexpr int kRowsPerBlock = 1;",
                      fmt::format("constexpr int kRowsPerBlock = {};", v.rows_per_block));
    tune::replace_all(source.text, "constexpr int kUnroll = 3;", fmt::format("constexpr int kUnroll = {};", v.unroll));
    if (v.load_hint) tune::replace_all(source.text, "ld.global.nc.v4.u32", "ld.global.nc.L1::no_allocate.v4.u32");
    if (v.store_hint) tune::replace_all(source.text, "st.global.v4.u32", "st.global.cs.v4.u32");
    const CompileOutput compiled = die_on(nvrtc.compile(source));
    CUmodule module;
    CUfunction function;
    die_on(cu.check(cu.cuModuleLoadData(&module, compiled.image.data()), "cuModuleLoadData"));
    die_on(cu.check(cu.cuModuleGetFunction(&function, module, source.entry.c_str()), "cuModuleGetFunction"));
    const unsigned grid = static_cast<unsigned>((seq + v.rows_per_block - 1) / v.rows_per_block);
    const unsigned threads = static_cast<unsigned>(v.threads_per_row * v.rows_per_block);
    const float ms = timer.median_ms([&](int s) {
      uint64_t params[9] = {residual[s].address(), table.address() + 2 * hidden * 2, d_index.address(), y[s].address(),
                            out[s].address(), static_cast<uint64_t>(seq), static_cast<uint64_t>(seq),
                            static_cast<uint64_t>(table_rows), errors.address()};
      void* args[9];
      for (int k = 0; k < 9; ++k) args[k] = &params[k];
      die_on(cu.check(cu.cuLaunchKernel(function, grid, 1, 1, threads, 1, 1, 0, nullptr, args, nullptr), "launch"));
    });
    fmt::print("{:<30} {:>9.4f} {:>9.0f} {:>7.1f}%\n", v.name, ms, bytes / ms / 1e6,
               100.0 * bytes / ms / 1e6 / copy_gbs);
    cu.cuModuleUnload(module);
  }
  return 0;
}
