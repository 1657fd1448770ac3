// exactjit codegen entry point (see render.hpp).
#include "codegen/render.hpp"

#include "codegen/digest.hpp"
#include "codegen/nvrtc_options.hpp"
#include "codegen/templates.hpp"
#include "kernels/det_linear.hpp"

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

// The op's own templates, in order, after the prelude.
std::vector<std::string_view> op_templates(const KernelSpec& spec) {
  switch (spec.op) {
    case Op::GateResidual: return {"gate_residual_math.cuh", "gate_residual.cuh"};
    case Op::AdalnRowGather: return {"adaln_row_gather.cuh"};
    case Op::RmsNorm: return {"quad_io.cuh", "row_sum.cuh", "rms_norm.cuh"};
    case Op::TimestepSinusoid: return {"timestep_sinusoid.cuh"};
    case Op::DetLinear:
      if (spec.dtype == DType::F32) return {"fixed_order_sum.cuh", "det_linear_fp32.cuh"};
      return {"det_linear_bf16_chunk.cuh",
              det_linear_geometry(spec.dtype, spec.hidden, spec.out_features, spec.target.sm).bulk
                  ? "det_linear_bf16_bulk.cuh"
                  : "det_linear_bf16.cuh"};
    case Op::DetLinearInputGrad:
    case Op::DetLinearWeightGrad:
      return {"fixed_order_sum.cuh", spec.dtype == DType::F32 ? "det_linear_grad.cuh" : "det_linear_grad_bf16.cuh"};
    case Op::DetLinearInputFold: return {"fixed_order_sum.cuh", "det_linear_grad_bf16.cuh"};
    case Op::GateResidualBackward: return {"fixed_order_sum.cuh", "segment_tiles.cuh", "gate_residual_backward.cuh"};
    case Op::AdalnRowGatherBackward: return {"fixed_order_sum.cuh", "segment_tiles.cuh", "adaln_row_gather_backward.cuh"};
    case Op::RmsNormBackward: return {"quad_io.cuh", "fixed_order_sum.cuh", "row_sum.cuh", "rms_norm_backward.cuh"};
    case Op::RmsNormTableGrad:
    case Op::RmsNormWeightGrad: return {"quad_io.cuh", "fixed_order_sum.cuh", "segment_tiles.cuh", "rms_norm_param_grad.cuh"};
    case Op::TimestepSinusoidBackward: return {"row_sum.cuh", "timestep_sinusoid_backward.cuh"};
    case Op::SegmentCount: return {"segment_count.cuh"};
    case Op::SegmentScan: return {"segment_scan.cuh"};
    case Op::SegmentScatter: return {"segment_scatter.cuh"};
    case Op::SegmentFold: return {"fixed_order_sum.cuh", "segment_fold.cuh"};
  }
  return {};
}

std::string op_constants(const KernelSpec& spec) {
  switch (spec.op) {
    case Op::GateResidual:
    case Op::AdalnRowGather: return render_row_constants(spec);
    case Op::RmsNorm: return render_rms_norm_constants(spec);
    case Op::TimestepSinusoid: return render_sinusoid_constants(spec);
    case Op::DetLinear:
    case Op::DetLinearInputGrad:
    case Op::DetLinearWeightGrad:
    case Op::DetLinearInputFold: return render_det_linear_constants(spec);
    default: return render_backward_constants(spec);
  }
}

}  // namespace

KernelSource render(const KernelSpec& spec) {
  KernelSource source;
  source.spec = spec;
  source.entry = entry_name(spec);
  std::vector<std::string_view> templates(std::begin(kPrelude), std::end(kPrelude));
  for (std::string_view name : op_templates(spec)) templates.push_back(name);
  source.text = assemble(spec, source.entry, op_constants(spec), templates);
  source.options = nvrtc_options(spec.target);
  return source;
}

}  // namespace exactjit::codegen
