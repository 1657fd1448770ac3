// exactjit codegen for gate_residual: the specialisation constants and the row geometry.
#include "codegen/geometry.hpp"
#include "codegen/render.hpp"

#include <fmt/format.h>

namespace exactjit::codegen {

RowGeometry row_geometry(const KernelSpec& spec) {
  const int64_t packs = spec.hidden / spec.vec;
  RowGeometry g;
  if (packs >= 128) {
    // Pick the thread count (multiple of 32 in [128, 256]) that leaves the fewest idle lanes on the
    // last step; ties go to more threads.
    int best = 256;
    int64_t best_waste = -1;
    for (int threads = 256; threads >= 128; threads -= 32) {
      const int64_t steps = (packs + threads - 1) / threads;
      const int64_t waste = steps * threads - packs;
      if (best_waste < 0 || waste < best_waste) {
        best = threads;
        best_waste = waste;
      }
    }
    g.threads_per_row = best;
    g.rows_per_block = 1;
  } else {
    int width = 1;
    while (width < packs) width *= 2;
    g.threads_per_row = width;
    g.rows_per_block = 128 / width;
  }
  const int64_t steps = (packs + g.threads_per_row - 1) / g.threads_per_row;
  g.unroll = 1;
  for (int unroll : {4, 3, 2}) {
    if (steps % unroll == 0) {
      g.unroll = unroll;
      break;
    }
  }
  return g;
}

std::string render_gate_residual_constants(const KernelSpec& spec) {
  const RowGeometry g = row_geometry(spec);
  return fmt::format(
      "constexpr unsigned kOpCode = {op_code};  // error-record op code\n"
      "constexpr int kDType = {dtype};  // {dtype_name}\n"
      "constexpr int kIndexBytes = {index_bytes};  // {index_name}\n"
      "constexpr int kHidden = {hidden};\n"
      "constexpr long long kTableStride = {table_stride};\n"
      "constexpr int kVec = {vec};\n"
      "constexpr int kThreadsPerRow = {threads_per_row};\n"
      "constexpr int kRowsPerBlock = {rows_per_block};\n"
      "constexpr int kUnroll = {unroll};\n"
      "constexpr int kTargetArch = {arch};\n",
      fmt::arg("op_code", static_cast<int>(spec.op) + 1),
      fmt::arg("dtype", static_cast<int>(spec.dtype)), fmt::arg("dtype_name", dtype_name(spec.dtype)),
      fmt::arg("index_bytes", spec.index == IndexType::I32 ? 4 : 8),
      fmt::arg("index_name", index_type_name(spec.index)), fmt::arg("hidden", spec.hidden),
      fmt::arg("table_stride", spec.table_stride), fmt::arg("vec", spec.vec),
      fmt::arg("threads_per_row", g.threads_per_row), fmt::arg("rows_per_block", g.rows_per_block),
      fmt::arg("unroll", g.unroll), fmt::arg("arch", spec.target.sm));
}

}  // namespace exactjit::codegen
