// exactjit op gate_residual_rms_norm: validate (as gate_residual into h, then rms_norm of h, then
// what only the fused call adds), spec, parameters; its backward's sequence; its rows.
#include "kernels/gate_residual_rms_norm.hpp"

#include "api/c_entry.hpp"
#include "codegen/render.hpp"
#include "kernels/backward_check.hpp"
#include "kernels/gate_residual.hpp"
#include "kernels/gate_residual_backward.hpp"
#include "kernels/op_rules.hpp"
#include "kernels/rms_norm.hpp"
#include "kernels/rms_norm_backward.hpp"
#include "kernels/segment_plan.hpp"
#include "kernels/tensor_check.hpp"
#include "runtime/errors.hpp"

#include <fmt/format.h>
#include <llvm/ADT/SmallVector.h>

#include <algorithm>
#include <optional>
#include <string>

namespace exactjit {
namespace {
constexpr std::string_view kOp = "gate_residual_rms_norm";
constexpr std::string_view kBackwardOp = "gate_residual_rms_norm_backward";
ArgName arg(std::string_view name) { return {kOp, name}; }

// The two parts are validated by gate_residual's and rms_norm's own planners, so each rule is
// written once; their messages are restated in this op's terms: gate_residual's out and
// rms_norm's x are h here.
llvm::Error in_terms_of(std::string_view op, llvm::Error error) {
  ErrorReport report = take_error(std::move(error));
  std::string& m = report.message;
  for (const auto& [from, to] : {std::pair{"gate_residual: out", "h"}, {"rms_norm: x", "h"},
                                 {"gate_residual_backward: grad", "d_residual"},
                                 {"rms_norm_backward: grad", "grad_out"},
                                 {"rms_norm_backward: x", "h"}, {"rms_norm_backward: dx", "d_residual"},
                                 {"rms_norm_backward: residual_grad", "grad_h"},
                                 {"rms_norm_backward: dweight", "d_weight"}, {"rms_norm_backward: dshift", "d_shift"},
                                 {"rms_norm_backward: dscale", "d_scale"}})
    if (m.rfind(from, 0) == 0) m = fmt::format("{}: {}{}", op, to, m.substr(std::string_view(from).size()));
  for (std::string_view part : {"gate_residual_backward: ", "rms_norm_backward: ", "gate_residual: ", "rms_norm: "})
    if (m.rfind(part, 0) == 0) m = fmt::format("{}: {}", op, m.substr(part.size()));
  for (size_t at = m.find("x's"); at != std::string::npos; at = m.find("x's", at)) m.replace(at, 3, "h's");
  return make_error(report.code, std::move(m));
}

KernelSpec forward_spec(DType dtype, IndexType index, int64_t hidden, int64_t table_stride, bool weighted,
                        bool modulated) {
  KernelSpec spec = make_spec(Op::GateResidualRmsNorm, dtype, index, hidden, table_stride, 4, weighted);
  spec.modulated = modulated;
  return spec;
}

llvm::Error require_quads(const ArgName& name, const DLTensor& t, DType dtype) {
  const size_t quad = 4 * dtype_size(dtype);
  if (data_address(t) % quad != 0)
    return invalid(name, fmt::format("must be aligned to 4 elements ({} bytes)", quad));
  return llvm::Error::success();
}
}  // namespace

llvm::Expected<LaunchPlan> plan_gate_residual_rms_norm(const GateResidualRmsNormArgs& a) {
  auto gated = plan_gate_residual({a.residual, a.gate, a.index, a.y, a.h});
  if (!gated) return in_terms_of(kOp, gated.takeError());
  const bool modulated = a.shift || a.scale;
  auto norm = plan_rms_norm({a.h, a.weight, a.shift, a.scale, modulated ? &a.index : nullptr, a.out, a.rstd, a.eps});
  if (!norm) return in_terms_of(kOp, norm.takeError());

  // What neither part sees: the kernel reads residual, y and the gate by quads, the modulation
  // shares the gate's rows, and no output overlaps an input of the other part.
  const DType dtype = gated->spec.dtype;
  const int64_t table_stride = gated->spec.table_stride;
  for (const auto& [name, tensor] : {std::pair{"residual", &a.residual}, {"y", &a.y}, {"gate", &a.gate}})
    if (auto err = require_quads(arg(name), *tensor, dtype)) return err;
  const KernelSpec spec =
      forward_spec(dtype, gated->spec.index, gated->spec.hidden, table_stride, a.weight != nullptr, modulated);
  if (auto err = require_row_rules(spec, arg("h"), arg("gate"))) return err;
  if (modulated) {
    if (a.shift->shape[0] != a.gate.shape[0] || norm->spec.table_stride != table_stride)
      return invalid(arg("shift"),
                     fmt::format("must have the gate's {} rows and row stride {} (got {} rows, stride {})",
                                 a.gate.shape[0], table_stride, a.shift->shape[0], norm->spec.table_stride));
  }
  llvm::SmallVector<NamedTensor, 10> tensors = {
      {"residual", &a.residual}, {"gate", &a.gate}, {"index", &a.index}, {"y", &a.y}, {"h", &a.h}, {"out", &a.out}};
  for (const auto& [name, t] :
       {std::pair{"weight", a.weight}, {"shift", a.shift}, {"scale", a.scale}, {"rstd", a.rstd}})
    if (t) tensors.push_back({name, t});
  // h may be residual itself (in place), as gate_residual's out may.
  for (const auto& [name, t] : tensors) {
    if (name == "h" || name == "residual") continue;
    if (overlaps(a.h, *t)) return invalid(arg("h"), fmt::format("must not overlap {}", name));
  }
  for (const auto& [name, t] : tensors) {
    if (name == "out") continue;
    if (overlaps(a.out, *t)) return invalid(arg("out"), fmt::format("must not overlap {}", name));
    if (a.rstd && name != "rstd" && overlaps(*a.rstd, *t))
      return invalid(arg("rstd"), fmt::format("must not overlap {}", name));
  }

  LaunchPlan plan;
  plan.spec = spec;
  plan.device_id = gated->device_id;
  plan.grid = norm->grid;
  plan.threads = norm->threads;
  const int64_t rows = element_count(a.residual) / gated->spec.hidden;
  for (uint64_t v : {data_address(a.residual), data_address(a.gate), data_address(a.index), data_address(a.y),
                     a.weight ? data_address(*a.weight) : 0, modulated ? data_address(*a.shift) : 0,
                     modulated ? data_address(*a.scale) : 0, data_address(a.h), data_address(a.out),
                     a.rstd ? data_address(*a.rstd) : 0, static_cast<uint64_t>(rows),
                     static_cast<uint64_t>(a.index.shape[0]), static_cast<uint64_t>(a.gate.shape[0])})
    plan.push(v);
  plan.push_float(static_cast<float>(a.eps));
  return plan;
}

int64_t gate_residual_rms_norm_backward_workspace(int64_t rows, int64_t seq, int64_t table_rows, int64_t hidden,
                                                  bool weighted, bool modulated) {
  const int64_t norm = rms_norm_backward_workspace(rows, seq, modulated ? table_rows : 0, hidden, weighted);
  const int64_t gated = gate_residual_backward_workspace(rows, seq, table_rows, hidden);
  if (norm < 0 || gated < 0) return -1;
  return (align_workspace(CheckedSize(norm)) + gated).value_or(-1);
}

llvm::Expected<LaunchSequence> plan_gate_residual_rms_norm_backward(const GateResidualRmsNormBackwardArgs& a,
                                                                    const DeviceTraits& device) {
  const ArgName workspace_name{kBackwardOp, "workspace"};
  const bool modulated = a.scale != nullptr;
  const bool weighted = a.weight != nullptr;
  llvm::SmallVector<NamedTensor, 17> tensors = {{"grad_out", &a.grad_out}, {"h", &a.h},           {"y", &a.y},
                                                {"gate", &a.gate},         {"index", &a.index},   {"rstd", &a.rstd},
                                                {"d_residual", &a.d_residual}};
  for (const auto& [name, t] : {std::pair{"grad_h", a.grad_h}, {"weight", a.weight}, {"scale", a.scale},
                                {"d_y", a.d_y}, {"d_gate", a.d_gate}, {"d_weight", a.d_weight}, {"d_shift", a.d_shift},
                                {"d_scale", a.d_scale}, {"workspace", a.workspace}})
    if (t) tensors.push_back({name, t});
  // The device first: the workspace's own rules (alignment) mean nothing for a host tensor.
  if (auto err = require_cuda_on_one_device(kBackwardOp, tensors)) return err;
  if (a.h.ndim < 1 || a.gate.ndim != 2 || a.index.ndim != 1)
    return invalid({kBackwardOp, "h"}, "h, gate and index must be the forward's (..., H), (R, H) and (S,)");
  if (modulated && a.scale->ndim >= 1 && a.scale->shape[0] != a.gate.shape[0])
    return invalid({kBackwardOp, "scale"}, fmt::format("must have the gate's {} rows, as in the forward (got {})",
                                                       a.gate.shape[0], a.scale->shape[0]));
  const int64_t hidden = a.h.shape[a.h.ndim - 1];
  const int64_t rows = hidden > 0 ? element_count(a.h) / hidden : 0;
  const int64_t bytes = gate_residual_rms_norm_backward_workspace(rows, a.index.shape[0], a.gate.shape[0], hidden,
                                                                  weighted, modulated);
  const bool gate_part = a.d_y || a.d_gate;
  const bool norm_workspace = a.d_weight || a.d_shift || a.d_scale;
  // Invalid shapes (bytes < 0) are left to the parts' planners, which name the rule.
  const bool needs_workspace = gate_part || norm_workspace;
  if (needs_workspace && bytes >= 0)
    if (auto err = require_workspace(workspace_name, a.workspace, bytes)) return err;
  // The two parts' workspaces: rms_norm's first, gate_residual's at the next 256-byte boundary.
  const int64_t norm_bytes = std::max<int64_t>(
      0, rms_norm_backward_workspace(rows, a.index.shape[0], modulated ? a.gate.shape[0] : 0, hidden, weighted));
  const int64_t gated_at = align_workspace(CheckedSize(norm_bytes)).value_or(0);
  int64_t norm_shape[1] = {norm_bytes}, gated_shape[1] = {std::max<int64_t>(0, bytes - gated_at)};
  DLTensor norm_ws{}, gated_ws{};
  if (a.workspace) {
    norm_ws = *a.workspace;
    norm_ws.shape = norm_shape;
    norm_ws.strides = nullptr;
    gated_ws = norm_ws;
    gated_ws.shape = gated_shape;
    gated_ws.byte_offset += static_cast<uint64_t>(gated_at);
  }

  // gate_residual's part first: where rms_norm's one-pass kernel runs, it forms that part too (its
  // gate partials where gate_residual's tiles would write them, folded over rms_norm's plan).
  llvm::Expected<LaunchSequence> gated =
      gate_part ? plan_gate_residual_backward({a.d_residual, a.gate, a.index, a.y, a.d_y, a.d_gate, &gated_ws})
                : LaunchSequence{};
  if (!gated) return in_terms_of(kBackwardOp, gated.takeError());
  std::optional<OnePassGate> one_pass_gate;
  if (a.d_y && a.d_gate && modulated && gated->count > 0) {
    auto d_gate_dtype = float_dtype({kBackwardOp, "d_gate"}, *a.d_gate);  // validated: F32 or y's
    if (!d_gate_dtype) return d_gate_dtype.takeError();
    const uint64_t partials = data_address(gated_ws) + segment_layout(rows, a.index.shape[0], a.gate.shape[0]).end;
    one_pass_gate.emplace(OnePassGate{a.y, a.gate, *a.d_y, *a.d_gate, *d_gate_dtype, partials});
  }
  auto sequence = plan_rms_norm_backward({a.grad_out, a.h, a.weight, a.scale, modulated ? &a.index : nullptr, a.rstd,
                                          a.eps, &a.d_residual, a.d_weight, a.d_shift, a.d_scale,
                                          a.workspace ? &norm_ws : nullptr, a.grad_h,
                                          one_pass_gate ? &*one_pass_gate : nullptr},
                                         device);
  if (!sequence) return in_terms_of(kBackwardOp, sequence.takeError());
  const bool gate_in_one_pass =
      std::any_of(sequence->steps, sequence->steps + sequence->count,
                  [](const LaunchPlan& step) { return step.spec.op == Op::GateResidualRmsNormOnePass; });
  if (gate_part && !gate_in_one_pass) {
    if (sequence->count + gated->count > LaunchSequence::kMaxSteps)
      return make_error(ErrorCode::Internal, "gate_residual_rms_norm_backward: too many launches for one sequence");
    for (int k = 0; k < gated->count; ++k) sequence->steps[sequence->count++] = gated->steps[k];
  }
  if (needs_workspace && bytes < 0) return invalid(workspace_name, "has no valid size for these shapes");
  // Across the parts: no output overlaps any other argument (the workspace as one tensor).
  if (auto err = require_disjoint_outputs(
          kBackwardOp, tensors, {"d_residual", "d_y", "d_gate", "d_weight", "d_shift", "d_scale", "workspace"}))
    return err;

  // With grad_h (passed as the residual gradient), rms_norm's dx kernel becomes this op's: the
  // same template adding grad_h, reporting a bad index as this op's (the one-pass kernel adds it
  // itself and reads no index). The plans' segment_count kernels, the first to meet a bad index,
  // report it as this op's.
  for (int k = 0; k < sequence->count; ++k) {
    LaunchPlan& step = sequence->steps[k];
    if (step.spec.op == Op::SegmentCount)
      step.params[kSegmentCountReportCode] = op_code(Op::GateResidualRmsNormBackward);
    if (step.spec.op == Op::RmsNormBackward && a.grad_h) step.spec.op = Op::GateResidualRmsNormBackward;
  }
  return sequence;
}

namespace {
std::vector<std::string_view> forward_templates(const KernelSpec&) {
  return {"gate_residual_math.cuh", "quad_io.cuh",         "row_sum.cuh",
          "row_slot.cuh",           "rms_norm_output.cuh", "gate_residual_rms_norm.cuh"};
}
// The forward always gathers the gate: a table stride >= H.
RuleBreak forward_rule(const KernelSpec& spec) {
  if (RuleBreak broken = table_stride_rule(spec)) return broken;
  return rms_norm_rule(spec);
}
std::vector<KernelSpec> forward_family(const KernelSpec& sizes) {
  std::vector<KernelSpec> specs;
  for (IndexType index : index_types_for(sizes.table_stride))
    for (bool modulated : {true, false})
      for (bool weighted : {true, false})
        specs.push_back(forward_spec(sizes.dtype, index, sizes.hidden, sizes.table_stride, weighted, modulated));
  return specs;
}

std::string dx_constants(const KernelSpec& spec) { return rms_norm_dx_constants(spec, true); }
// As rms_norm's dx: the plain and the modulated norm, weighted or not.
std::vector<KernelSpec> dx_family(const KernelSpec& sizes) {
  std::vector<KernelSpec> specs;
  for (int64_t stride : {sizes.table_stride, int64_t{0}})
    for (IndexType index : index_types_for(stride))
      for (bool weighted : {true, false})
        specs.push_back(
            make_spec(Op::GateResidualRmsNormBackward, sizes.dtype, index, sizes.hidden, stride, 4, weighted));
  return specs;
}
}  // namespace

const OpRow kGateResidualRmsNormRow = {
    Op::GateResidualRmsNorm, "gate_residual_rms_norm", OpRole::Forward, "gate_residual_rms_norm",
    SpecShape::Rows, /*describes_weight=*/true, /*row_chunks=*/1, /*threads=*/0, /*row_unroll=*/1,
    {"index", "index"}, ErrorValue::Index, /*value_rule=*/"",
    forward_templates, codegen::render_row_norm_constants, forward_rule,
    forward_family, [](DType dtype) { return h3_strides(Op::GateResidualRmsNorm, dtype, {6}); },
    "--hidden H --table-stride N",
    "gate_residual into h, then rms_norm of h (optionally modulated), in one pass", /*default_stride_in_h=*/6};
const OpRow kGateResidualRmsNormBackwardRow = {
    Op::GateResidualRmsNormBackward, "gate_residual_rms_norm_backward", OpRole::Backward,
    "gate_residual_rms_norm", SpecShape::Rows, /*describes_weight=*/false, /*row_chunks=*/1, /*threads=*/128,
    /*row_unroll=*/1, {"index", "index"}, ErrorValue::Index, /*value_rule=*/"",
    rms_norm_dx_templates, dx_constants, rms_norm_rule,
    dx_family, [](DType dtype) { return h3_strides(Op::GateResidualRmsNormBackward, dtype, {6}); }};

}  // namespace exactjit

extern "C" exactjit_status_t xj_gate_residual_rms_norm(xj_runtime* runtime, const DLTensor* residual,
                                                       const DLTensor* gate, const DLTensor* index, const DLTensor* y,
                                                       const DLTensor* weight, const DLTensor* shift,
                                                       const DLTensor* scale, const DLTensor* h, const DLTensor* out,
                                                       const DLTensor* rstd, double eps, void* stream) {
  return exactjit::c_abi::call_op(
      runtime, "gate_residual_rms_norm",
      {{"residual", residual}, {"gate", gate}, {"index", index}, {"y", y}, {"h", h}, {"out", out}},
      [&](exactjit::Runtime& r) {
        return r.launch(exactjit::plan_gate_residual_rms_norm(
                            {*residual, *gate, *index, *y, weight, shift, scale, *h, *out, rstd, eps}),
                        stream);
      });
}

extern "C" long long xj_gate_residual_rms_norm_backward_workspace_bytes(long long rows, long long seq,
                                                                        long long table_rows, long long hidden,
                                                                        int weighted, int modulated) {
  return exactjit::gate_residual_rms_norm_backward_workspace(rows, seq, table_rows, hidden, weighted != 0,
                                                             modulated != 0);
}

extern "C" exactjit_status_t xj_gate_residual_rms_norm_backward(
    xj_runtime* runtime, const DLTensor* grad_out, const DLTensor* grad_h, const DLTensor* h, const DLTensor* y,
    const DLTensor* gate, const DLTensor* index, const DLTensor* weight, const DLTensor* scale, const DLTensor* rstd,
    double eps, const DLTensor* d_residual, const DLTensor* d_y, const DLTensor* d_gate, const DLTensor* d_weight,
    const DLTensor* d_shift, const DLTensor* d_scale, const DLTensor* workspace, void* stream) {
  return exactjit::c_abi::call_op(
      runtime, "gate_residual_rms_norm_backward",
      {{"grad_out", grad_out}, {"h", h}, {"y", y}, {"gate", gate}, {"index", index}, {"rstd", rstd},
       {"d_residual", d_residual}},
      [&](exactjit::Runtime& r) {
        return r.launch(exactjit::plan_gate_residual_rms_norm_backward({*grad_out, grad_h, *h, *y, *gate, *index,
                                                                        weight, scale, *rstd, eps, *d_residual, d_y,
                                                                        d_gate, d_weight, d_shift, d_scale,
                                                                        workspace},
                                                                       r.traits(h->device)),
                        stream);
      });
}
