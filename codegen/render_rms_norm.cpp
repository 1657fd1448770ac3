// exactjit codegen for rms_norm: its specialisation constants. The per-row order of operations is
// fixed by the template; the constants pick the dtype, H, the modulation table and the weight.
#include "codegen/geometry.hpp"
#include "codegen/op_row.hpp"
#include "codegen/render.hpp"

#include <fmt/format.h>

namespace exactjit::codegen {

namespace {
std::string norm_constants(const KernelSpec& spec, bool modulated) {
  return fmt::format(
      "constexpr unsigned kOpCode = {op_code};  // error-record op code\n"
      "constexpr int kDType = {dtype};  // {dtype_name}\n"
      "constexpr int kIndexBytes = {index_bytes};  // {index_name}\n"
      "constexpr int kHidden = {hidden};\n"
      "constexpr bool kModulated = {modulated};  // shift/scale gathered from table views\n"
      "constexpr long long kTableStride = {table_stride};\n"
      "constexpr bool kWeighted = {weighted};\n"
      "constexpr int kRowThreads = {row_threads};  // threads per row\n"
      "constexpr int kRowsPerBlock = {rows_per_block};  // a 128-thread block\n"
      "constexpr int kParamBatch = {param_batch};  // weight/shift/scale quads loaded together\n"
      "constexpr int kTargetArch = {arch};\n",
      fmt::arg("op_code", op_code(spec.op)), fmt::arg("dtype", static_cast<int>(spec.dtype)),
      fmt::arg("dtype_name", dtype_name(spec.dtype)), fmt::arg("index_bytes", spec.index == IndexType::I32 ? 4 : 8),
      fmt::arg("index_name", index_type_name(spec.index)), fmt::arg("hidden", spec.hidden),
      fmt::arg("modulated", modulated ? "true" : "false"), fmt::arg("table_stride", spec.table_stride),
      fmt::arg("weighted", spec.weighted ? "true" : "false"),
      fmt::arg("row_threads", rms_norm_row_threads(spec.hidden)),
      fmt::arg("rows_per_block", rms_norm_rows_per_block(spec.hidden)),
      fmt::arg("param_batch", kRmsNormParamBatch),
      fmt::arg("arch", spec.target.sm));
}
}  // namespace

std::string render_rms_norm_constants(const KernelSpec& spec) {
  return norm_constants(spec, spec.table_stride > 0);
}

std::string render_row_norm_constants(const KernelSpec& spec) { return norm_constants(spec, spec.modulated); }

}  // namespace exactjit::codegen
