// exactjit codegen entry point (see render.hpp).
#include "codegen/render.hpp"

#include "codegen/digest.hpp"
#include "codegen/nvrtc_options.hpp"
#include "codegen/templates.hpp"

#include <fmt/format.h>

#include <cstdlib>

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

std::string assemble(const KernelSpec& spec, const std::string& entry, const std::string& constants,
                     std::initializer_list<std::string_view> template_names) {
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

KernelSource render(const KernelSpec& spec) {
  KernelSource source;
  source.spec = spec;
  source.entry = entry_name(spec);
  switch (spec.op) {
    case Op::GateResidual:
      source.text = assemble(spec, source.entry, render_row_constants(spec),
                             {"numerics.cuh", "vector_io.cuh", "error_record.cuh", "gate_residual_math.cuh",
                              "gate_residual.cuh"});
      break;
    case Op::AdalnRowGather:
      source.text = assemble(spec, source.entry, render_row_constants(spec),
                             {"numerics.cuh", "vector_io.cuh", "error_record.cuh", "adaln_row_gather.cuh"});
      break;
    case Op::RmsNorm:
      source.text = assemble(spec, source.entry, render_rms_norm_constants(spec),
                             {"numerics.cuh", "vector_io.cuh", "quad_io.cuh", "row_sum.cuh", "error_record.cuh", "rms_norm.cuh"});
      break;
    case Op::TimestepSinusoid:
      source.text = assemble(spec, source.entry, render_sinusoid_constants(spec),
                             {"numerics.cuh", "error_record.cuh", "timestep_sinusoid.cuh"});
      break;
    case Op::DetLinear:
      source.text = assemble(spec, source.entry, render_det_linear_constants(spec),
                             {"numerics.cuh", "error_record.cuh",
                              spec.dtype == DType::F32 ? "det_linear_fp32.cuh" : "det_linear_bf16.cuh"});
      break;
    case Op::DetLinearInputGrad:
    case Op::DetLinearWeightGrad:
      source.text = assemble(spec, source.entry, render_det_linear_constants(spec),
                             {"numerics.cuh", "error_record.cuh", "det_linear_grad.cuh"});
      break;
    case Op::GateResidualBackward:
      source.text = assemble(spec, source.entry, render_backward_constants(spec),
                             {"numerics.cuh", "vector_io.cuh", "error_record.cuh", "segment_tiles.cuh",
                              "gate_residual_backward.cuh"});
      break;
    case Op::AdalnRowGatherBackward:
      source.text = assemble(spec, source.entry, render_backward_constants(spec),
                             {"numerics.cuh", "vector_io.cuh", "error_record.cuh", "segment_tiles.cuh",
                              "adaln_row_gather_backward.cuh"});
      break;
    case Op::RmsNormBackward:
      source.text = assemble(spec, source.entry, render_backward_constants(spec),
                             {"numerics.cuh", "vector_io.cuh", "quad_io.cuh", "row_sum.cuh", "error_record.cuh",
                              "rms_norm_backward.cuh"});
      break;
    case Op::RmsNormTableGrad:
    case Op::RmsNormWeightGrad:
      source.text = assemble(spec, source.entry, render_backward_constants(spec),
                             {"numerics.cuh", "vector_io.cuh", "quad_io.cuh", "error_record.cuh", "segment_tiles.cuh",
                              "rms_norm_param_grad.cuh"});
      break;
    case Op::TimestepSinusoidBackward:
      source.text = assemble(spec, source.entry, render_backward_constants(spec),
                             {"numerics.cuh", "row_sum.cuh", "error_record.cuh", "timestep_sinusoid_backward.cuh"});
      break;
    case Op::SegmentCount:
      source.text = assemble(spec, source.entry, render_backward_constants(spec),
                             {"numerics.cuh", "vector_io.cuh", "error_record.cuh", "segment_count.cuh"});
      break;
    case Op::SegmentScan:
      source.text = assemble(spec, source.entry, render_backward_constants(spec),
                             {"numerics.cuh", "error_record.cuh", "segment_scan.cuh"});
      break;
    case Op::SegmentScatter:
      source.text = assemble(spec, source.entry, render_backward_constants(spec),
                             {"numerics.cuh", "error_record.cuh", "segment_scatter.cuh"});
      break;
    case Op::SegmentFold:
      source.text = assemble(spec, source.entry, render_backward_constants(spec),
                             {"numerics.cuh", "vector_io.cuh", "error_record.cuh", "segment_fold.cuh"});
      break;
  }
  source.options = nvrtc_options(spec.target);
  return source;
}

}  // namespace exactjit::codegen
