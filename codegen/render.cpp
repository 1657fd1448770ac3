// exactjit codegen entry point (see render.hpp).
#include "codegen/render.hpp"

#include "codegen/digest.hpp"
#include "codegen/nvrtc_options.hpp"
#include "codegen/op_row.hpp"
#include "codegen/templates.hpp"

#include <fmt/format.h>

#include <cstdlib>
#include <vector>

namespace exactjit::codegen {

std::string_view template_text(std::string_view name) {
  for (const TemplateFile& file : embedded_templates())
    if (file.name == name) return file.text;
  // A renderer naming a file the build did not embed is a programming error in this library.
  fmt::print(stderr, "exactjit: internal error: template {} is not embedded\n", name);
  std::abort();
}

std::string entry_name(const KernelSpec& spec) {
  return spec.stem() + "_" + sha256_fields_hex({kGeneratorVersion, spec.describe()}).substr(0, 8);
}

namespace {

// The common frame of every generated file: banner, entry macro, the op's constants, then the
// named templates in order.
std::string assemble(const KernelSpec& spec, const std::string& entry, const std::string& constants,
                     const std::vector<std::string_view>& template_names) {
  std::string text = fmt::format(
      "// exactjit generated kernel (codegen/render.cpp): one self-contained file, no headers.\n"
      "// spec: {}\n"
      "// generator: {}\n"
      "#define XJ_ENTRY {}\n\n"
      "namespace spec {{\n{}}}  // namespace spec\n",
      spec.describe(), kGeneratorVersion, entry, constants);
  for (std::string_view name : template_names) {
    text += fmt::format("\n// ---- templates/{} ----\n", name);
    text += template_text(name);
  }
  return text;
}

// Every kernel starts with the shared numerics, vector I/O and error record templates.
constexpr std::string_view kPrelude[] = {"numerics.cuh", "vector_io.cuh", "error_record.cuh"};

}  // namespace

KernelSource render(const KernelSpec& spec) {
  KernelSource source;
  source.spec = spec;
  source.entry = entry_name(spec);
  const OpRow& row = op_row(spec.op);
  std::vector<std::string_view> templates(std::begin(kPrelude), std::end(kPrelude));
  for (std::string_view name : row.templates(spec)) templates.push_back(name);
  source.text = assemble(spec, source.entry, row.constants(spec), templates);
  source.options = nvrtc_options(spec.target);
  return source;
}

}  // namespace exactjit::codegen
