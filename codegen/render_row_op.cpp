// exactjit codegen for the row-wise ops (gate_residual, adaln_row_gather): their specialisation
// constants. Both kernels share the constant block, so each reads like the other.
#include "codegen/geometry.hpp"
#include "codegen/op_row.hpp"
#include "codegen/render.hpp"

#include <fmt/format.h>

namespace exactjit::codegen {

std::string render_spec_constants(const KernelSpec& spec) {
  std::string text = fmt::format(
      "constexpr unsigned kOpCode = {op_code};  // error-record op code\n"
      "constexpr int kDType = {dtype};  // {dtype_name}\n"
      "constexpr int kIndexBytes = {index_bytes};  // {index_name}\n",
      fmt::arg("op_code", op_code(spec.op)), fmt::arg("dtype", static_cast<int>(spec.dtype)),
      fmt::arg("dtype_name", dtype_name(spec.dtype)), fmt::arg("index_bytes", spec.index == IndexType::I32 ? 4 : 8),
      fmt::arg("index_name", index_type_name(spec.index)));
  if (op_row(spec.op).shape == SpecShape::Plan)
    return text + fmt::format("constexpr int kKeyTensors = {};\n", spec.key_tensors);
  return text + fmt::format(
                    "constexpr int kHidden = {hidden};\n"
                    "constexpr long long kTableStride = {table_stride};\n"
                    "constexpr int kVec = {vec};\n",
                    fmt::arg("hidden", spec.hidden), fmt::arg("table_stride", spec.table_stride),
                    fmt::arg("vec", spec.vec));
}

std::string render_row_constants(const KernelSpec& spec) {
  const RowGeometry g = row_geometry(spec);
  return render_spec_constants(spec) +
         fmt::format(
             "constexpr int kThreadsPerRow = {threads_per_row};\n"
             "constexpr int kRowsPerBlock = {rows_per_block};\n"
             "constexpr int kUnroll = {unroll};\n"
             "constexpr int kTargetArch = {arch};\n",
             fmt::arg("threads_per_row", g.threads_per_row), fmt::arg("rows_per_block", g.rows_per_block),
             fmt::arg("unroll", g.unroll), fmt::arg("arch", spec.target.sm));
}

}  // namespace exactjit::codegen
