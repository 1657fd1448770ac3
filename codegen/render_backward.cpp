// exactjit codegen for the backward and segment-plan kernels: one constant block for all of
// them (each template reads the constants it needs). The segment sizes come from
// kernels/segment_plan.hpp, so host layout and kernels cannot disagree.
#include "codegen/geometry.hpp"
#include "codegen/render.hpp"
#include "kernels/det_linear.hpp"
#include "kernels/det_linear_backward.hpp"
#include "kernels/segment_plan.hpp"

#include <fmt/format.h>

namespace exactjit::codegen {

std::string render_backward_constants(const KernelSpec& spec) {
  return render_spec_constants(spec) +
         fmt::format(
             "constexpr bool kWeighted = {weighted};\n"
             "constexpr bool kSegmented = {segmented};  // rms_norm parameter grads: table rows (segment tiles)\n"
             "constexpr int kThreads = {threads};\n"
             "constexpr int kRowUnroll = {unroll};  // tile kernels: rows loaded before their adds\n"
             "constexpr long long kTilePositions = {tile};\n"
             "constexpr long long kChunkPositions = {chunk};\n"
             "constexpr int kMaxTableRows = {max_rows};\n"
             "constexpr int kTargetArch = {arch};\n",
             fmt::arg("weighted", spec.weighted ? "true" : "false"),
             fmt::arg("segmented", spec.op == Op::RmsNormTableGrad ? "true" : "false"),
             fmt::arg("threads", backward_threads(spec)), fmt::arg("unroll", backward_row_unroll(spec)),
             fmt::arg("tile", kTilePositions),
             fmt::arg("chunk", kChunkPositions), fmt::arg("max_rows", kMaxPlanTableRows), fmt::arg("arch", spec.target.sm));
}

std::string render_det_linear_constants(const KernelSpec& spec) {
  std::string geometry;
  if (spec.op == Op::DetLinear) {
    const DetLinearGeometry g = det_linear_geometry(spec.dtype, spec.hidden, spec.out_features, spec.target.sm);
    geometry = fmt::format(
        "constexpr int kWarps = {warps};  // per block\n"
        "constexpr int kColumnsPerWarp = {columns};\n"
        "constexpr int kDepth = {depth};  // weight loads in flight per lane (fp32: groups; bf16: 32-wide chunks)\n"
        "constexpr int kTileChunks = {tile};  // bf16: 32-wide chunks of x staged at a time\n"
        "constexpr int kStageChunks = {stage_chunks};  // bf16 bulk copies: chunks per ring slot\n"
        "constexpr int kStages = {stages};  // bf16 bulk copies: ring slots per warp\n",
        fmt::arg("warps", g.warps), fmt::arg("columns", g.columns_per_warp), fmt::arg("depth", g.depth),
        fmt::arg("tile", g.tile_chunks), fmt::arg("stage_chunks", g.stage_chunks), fmt::arg("stages", g.stages));
  }
  if (spec.op != Op::DetLinear && spec.dtype == DType::BF16)  // the bf16 backward (det_linear_backward.hpp)
    geometry = fmt::format(
        "constexpr bool kGradBf16 = {grad_bf16};  // the incoming gradient: bf16 (else fp32)\n"
        "constexpr int kThreads = {threads};  // per block (partials, weight grad: 8 inputs k per thread)\n"
        "constexpr int kFoldDepth = {depth};  // fold: partials loaded ahead per thread\n",
        fmt::arg("grad_bf16", spec.grad_dtype == DType::BF16 ? "true" : "false"),
        fmt::arg("threads", det_linear_bf16_backward_threads(spec.op, spec.hidden)),
        fmt::arg("depth", kDetLinearFoldDepth));
  return fmt::format(
      "constexpr unsigned kOpCode = {op_code};  // error-record op code\n"
      "constexpr int kInFeatures = {k};\n"
      "constexpr long long kOutFeatures = {n};\n"
      "constexpr int kRowTile = {rows};\n"
      "constexpr bool kSilu = {silu};  // fp32: SiLU on the output; bf16: on the input before the cast\n"
      "constexpr int kMode = {mode};  // backward: 0 input partials, 1 weight and bias, 2 input fold (bf16)\n"
      "constexpr int kTargetArch = {arch};\n",
      fmt::arg("op_code", static_cast<int>(spec.op) + 1), fmt::arg("k", spec.hidden), fmt::arg("n", spec.out_features),
      fmt::arg("rows", spec.row_tile), fmt::arg("silu", spec.silu ? "true" : "false"),
      fmt::arg("mode", spec.op == Op::DetLinearWeightGrad ? 1 : spec.op == Op::DetLinearInputFold ? 2 : 0), fmt::arg("arch", spec.target.sm)) + geometry;
}

}  // namespace exactjit::codegen
