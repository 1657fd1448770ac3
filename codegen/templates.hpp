// exactjit templates: the CUDA source files of templates/, embedded into the library at build
// time (codegen/embed_templates.cmake), looked up by file name.
#pragma once

#include <string_view>
#include <vector>

namespace exactjit::codegen {

struct TemplateFile {
  std::string_view name;  ///< file name under templates/, e.g. "numerics.cuh"
  std::string_view text;
};

const std::vector<TemplateFile>& embedded_templates();

/// The text of one embedded template; the build guarantees every name the renderers use exists.
std::string_view template_text(std::string_view name);

}  // namespace exactjit::codegen
