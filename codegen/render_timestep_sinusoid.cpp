// exactjit codegen for timestep_sinusoid: the channel count is its only specialisation; the
// frequency parameters are run-time values, as diffusers passes them.
#include "codegen/op_row.hpp"
#include "codegen/render.hpp"

#include <fmt/format.h>

namespace exactjit::codegen {

std::string render_sinusoid_constants(const KernelSpec& spec) {
  return fmt::format(
      "constexpr unsigned kOpCode = {op_code};  // error-record op code\n"
      "constexpr int kChannels = {channels};\n"
      "constexpr int kTargetArch = {arch};\n",
      fmt::arg("op_code", op_code(spec.op)), fmt::arg("channels", spec.channels),
      fmt::arg("arch", spec.target.sm));
}

}  // namespace exactjit::codegen
