// exactjit tuning bench for rms_norm: times rows-per-block and parameter-batch variants of the
// generated kernel (bf16, H = 5376; plain and block-modulated, with and without weight) with CUDA
// events, against a device-to-device copy of the same bytes. Variants rewrite
// generated constants only, so each row's order of operations is the product's.
//
//   tune_rms_norm [S=131072] [reps=30]
#include "codegen/geometry.hpp"
#include "codegen/render.hpp"
#include "kernels/catalog.hpp"
#include "kernels/rms_norm.hpp"
#include "runtime/device_buffer.hpp"
#include "runtime/driver.hpp"
#include "runtime/nvrtc.hpp"
#include "bench/tune_support.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

using namespace exactjit;

using tune::die_on;

// H = 5376: one 128-thread row per block (codegen::rms_norm_row_threads).
const int kGeneratedRowsPerBlock = codegen::rms_norm_rows_per_block(kDefaultHidden);

struct Variant {
  std::string name;
  int rows_per_block = kGeneratedRowsPerBlock;
  int param_batch = codegen::kRmsNormParamBatch;  // kParamBatch: parameter quads loaded together
};

struct Form {
  std::string name;
  bool modulated, weighted;
};

}  // namespace

int main(int argc, char** argv) {
  const int64_t rows = argc > 1 ? std::atoll(argv[1]) : 131072;
  const int reps = argc > 2 ? std::atoi(argv[2]) : 30;
  const int64_t hidden = kDefaultHidden, table_rows = 9, stride = 6 * hidden;
  const Driver& cu = *die_on(Driver::get());
  const Nvrtc& nvrtc = *die_on(Nvrtc::get());
  CUcontext ctx = die_on(primary_context(cu, 0));
  ScopedContext scope(cu, ctx);

  const size_t act_bytes = static_cast<size_t>(rows * hidden * 2);
  constexpr int kSets = 3;
  uint64_t seed = 777;
  auto filled = [&](size_t bytes) { return tune::random_buffer(cu, ctx, bytes, seed++); };
  std::vector<DeviceBuffer> x, out;
  for (int s = 0; s < kSets; ++s) {
    x.push_back(filled(act_bytes));
    out.push_back(filled(act_bytes));
  }
  DeviceBuffer table = filled(static_cast<size_t>(table_rows * stride * 2));
  DeviceBuffer weight = filled(static_cast<size_t>(hidden * 2));
  DeviceBuffer d_index = tune::index_buffer(cu, ctx, rows, table_rows, 5);
  DeviceBuffer errors = tune::error_record(cu, ctx);

  tune::EventTimer timer(cu, reps, kSets);
  const double copy_gbs = timer.copy_gbs(x, out, act_bytes);
  const double copy_ms = 2.0 * act_bytes / copy_gbs / 1e6;
  const double bytes = 2.0 * act_bytes;
  fmt::print("S={} H={} bf16: copy {:.3f} ms = {:.0f} GB/s; rms_norm bytes {:.3f} GB, floor {:.3f} ms\n", rows,
             hidden, copy_ms, copy_gbs, bytes / 1e9, bytes / copy_gbs / 1e6);

  const std::vector<Variant> variants = {{"parameter batch 1", 1, 1},  {"parameter batch 2", 1, 2},
                                         {"parameter batch 3", 1, 3},  {"parameter batch 4", 1, 4},
                                         {"parameter batch 6", 1, 6},  {"parameter batch 12 (all)", 1, 12},
                                         {"2 rows/block, batch 1", 2, 1}, {"2 rows/block, batch 4", 2, 4}};
  const std::vector<Form> forms = {
      {"plain", false, false}, {"plain+w", false, true}, {"mod 6H", true, false}, {"mod+w", true, true}};
  fmt::print("generated: {} row(s)/block, kParamBatch = {}\n", kGeneratedRowsPerBlock,
             codegen::kRmsNormParamBatch);
  fmt::print("{:<8} {:<30} {:>9} {:>9} {:>8}\n", "form", "variant", "ms", "GB/s", "% copy");
  for (const Form& form : forms) {
    const int64_t table_stride = form.modulated ? stride : 0;
    const KernelSpec spec = rms_norm_spec(DType::BF16, IndexType::I64, hidden, table_stride, form.weighted);
    KernelSpec targeted = spec;
    targeted.target = Target{90, false};
    for (const Variant& v : variants) {
      KernelSource source = codegen::render(targeted);
      tune::replace_all(source.text, fmt::format("constexpr int kRowsPerBlock = {};", kGeneratedRowsPerBlock),
              fmt::format("constexpr int kRowsPerBlock = {};", v.rows_per_block));
      tune::replace_all(source.text, fmt::format("constexpr int kParamBatch = {};", codegen::kRmsNormParamBatch),
                        fmt::format("constexpr int kParamBatch = {};", v.param_batch));
      const CompileOutput compiled = die_on(nvrtc.compile(source));
      CUmodule module;
      CUfunction function;
      die_on(cu.check(cu.cuModuleLoadData(&module, compiled.image.data()), "cuModuleLoadData"));
      die_on(cu.check(cu.cuModuleGetFunction(&function, module, source.entry.c_str()), "cuModuleGetFunction"));
      const unsigned grid = static_cast<unsigned>((rows + v.rows_per_block - 1) / v.rows_per_block);
      const bool modulated = form.modulated;
      const float ms = timer.median_ms([&](int s) {
        const float eps = 1e-5f;
        uint32_t eps_bits;
        std::memcpy(&eps_bits, &eps, 4);
        uint64_t params[12] = {x[s].address(), form.weighted ? weight.address() : 0, modulated ? table.address() : 0,
                               modulated ? table.address() + hidden * 2 : 0, modulated ? d_index.address() : 0,
                               out[s].address(), 0, static_cast<uint64_t>(rows), static_cast<uint64_t>(rows),
                               static_cast<uint64_t>(table_rows), eps_bits, errors.address()};
        void* args[12];
        for (int k = 0; k < 12; ++k) args[k] = &params[k];
        die_on(cu.check(cu.cuLaunchKernel(function, grid, 1, 1, 128 * v.rows_per_block, 1, 1, 0, nullptr, args,
                                          nullptr),
                        "launch"));
      });
      fmt::print("{:<8} {:<30} {:>9.4f} {:>9.0f} {:>7.1f}%\n", form.name, v.name, ms,
                 bytes / ms / 1e6, 100.0 * bytes / ms / 1e6 / copy_gbs);
      cu.cuModuleUnload(module);
    }
  }
  return 0;
}
