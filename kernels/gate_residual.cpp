// exactjit op gate_residual: validate, spec, geometry, parameters.
#include "kernels/gate_residual.hpp"

#include "api/c_entry.hpp"
#include "codegen/geometry.hpp"
#include "codegen/render.hpp"
#include "kernels/op_rules.hpp"
#include "kernels/spec_limits.hpp"
#include "kernels/tensor_check.hpp"

#include <fmt/format.h>

#include <climits>

namespace exactjit {
namespace {
constexpr std::string_view kOp = "gate_residual";
ArgName arg(std::string_view name) { return {kOp, name}; }
}  // namespace

llvm::Expected<LaunchPlan> plan_gate_residual(const GateResidualArgs& a) {
  const NamedTensor tensors[] = {
      {"residual", &a.residual}, {"gate", &a.gate}, {"index", &a.index}, {"y", &a.y}, {"out", &a.out}};
  if (auto err = require_cuda_on_one_device(kOp, tensors)) return err;

  auto dtype = float_dtype(arg("residual"), a.residual);
  if (!dtype) return dtype.takeError();
  for (const auto& [name, tensor] : {tensors[1], tensors[3], tensors[4]}) {
    auto other = float_dtype(arg(name), *tensor);
    if (!other) return other.takeError();
    if (*other != *dtype)
      return invalid(arg(name), fmt::format("must have residual's dtype {} (got {})", dtype_name(*dtype),
                                            dtype_name(*other)));
  }
  auto index_type = index_dtype(arg("index"), a.index);
  if (!index_type) return index_type.takeError();

  // Shapes.
  if (a.residual.ndim != 2 && a.residual.ndim != 3)
    return invalid(arg("residual"), fmt::format("must be (M, H) or (B, S, H) (got {})", shape_string(a.residual)));
  for (const auto& [name, tensor] : {tensors[3], tensors[4]}) {
    bool same = tensor->ndim == a.residual.ndim;
    for (int d = 0; same && d < a.residual.ndim; ++d) same = tensor->shape[d] == a.residual.shape[d];
    if (!same)
      return invalid(arg(name), fmt::format("must have residual's shape {} (got {})", shape_string(a.residual),
                                            shape_string(*tensor)));
  }
  for (const auto& [name, tensor] : {tensors[0], tensors[3], tensors[4]})
    if (!is_contiguous(*tensor)) return invalid(arg(name), "must be contiguous (row-major, no gaps)");

  const int64_t hidden = a.residual.shape[a.residual.ndim - 1];
  if (std::string rule = cap_rule(kHiddenCap, hidden); !rule.empty()) return invalid(arg("residual"), rule);
  const int64_t rows = element_count(a.residual) / hidden;

  if (a.gate.ndim != 2 || a.gate.shape[1] != hidden)
    return invalid(arg("gate"), fmt::format("must be (R, {}) (got {})", hidden, shape_string(a.gate)));
  const int64_t table_rows = a.gate.shape[0];
  if (table_rows < 1) return invalid(arg("gate"), "must have at least one row");
  if (hidden > 1 && stride_of(a.gate, 1) != 1)
    return invalid(arg("gate"), fmt::format("must have unit column stride (got {})", stride_of(a.gate, 1)));
  // A single-row table never steps to a second row: its stride is irrelevant, canonicalise it.
  const int64_t table_stride = table_rows == 1 ? hidden : stride_of(a.gate, 0);
  if (std::string rule = cap_rule(kTableStrideCap, table_stride); !rule.empty()) return invalid(arg("gate"), rule);
  if (auto err = require_row_rules(make_spec(Op::GateResidual, *dtype, IndexType::I64, hidden, table_stride, 1),
                                   arg("residual"), arg("gate")))
    return err;

  if (a.index.ndim != 1 || a.index.shape[0] < 1)
    return invalid(arg("index"), fmt::format("must be (S,) with S >= 1 (got {})", shape_string(a.index)));
  const int64_t seq = a.index.shape[0];
  if (!is_contiguous(a.index)) return invalid(arg("index"), "must be contiguous");
  if (rows % seq != 0)
    return invalid(arg("index"), fmt::format("length S = {} must divide the M = {} rows of residual", seq, rows));
  if (a.residual.ndim == 3 && a.residual.shape[1] != seq)
    return invalid(arg("index"), fmt::format("length {} must equal residual's S dimension {}", seq,
                                             a.residual.shape[1]));

  // Aliasing: out may be residual itself (in place), nothing else.
  const bool in_place = data_address(a.out) == data_address(a.residual);
  for (const auto& [name, tensor] : {tensors[1], tensors[2], tensors[3]})
    if (overlaps(a.out, *tensor)) return invalid(arg("out"), fmt::format("must not overlap {}", name));
  if (!in_place && overlaps(a.out, a.residual))
    return invalid(arg("out"), "must be residual itself or not overlap it");

  // The 16-byte path needs whole packs per row and 16-byte aligned rows everywhere.
  const int vec = pack_width(*dtype, hidden, table_stride, {&a.residual, &a.gate, &a.y, &a.out});

  LaunchPlan plan;
  plan.spec = make_spec(Op::GateResidual, *dtype, *index_type, hidden, table_stride, vec);
  plan.device_id = a.residual.device.device_id;
  const codegen::RowGeometry geometry = codegen::row_geometry(plan.spec);
  const int64_t blocks = (rows + geometry.rows_per_block - 1) / geometry.rows_per_block;
  if (blocks > INT_MAX)
    return invalid(arg("residual"), fmt::format("has too many rows ({}) for one launch", rows));
  plan.grid = static_cast<uint32_t>(blocks);
  plan.threads = static_cast<uint32_t>(geometry.threads());
  plan.push(data_address(a.residual));
  plan.push(data_address(a.gate));
  plan.push(data_address(a.index));
  plan.push(data_address(a.y));
  plan.push(data_address(a.out));
  plan.push(static_cast<uint64_t>(rows));
  plan.push(static_cast<uint64_t>(seq));
  plan.push(static_cast<uint64_t>(table_rows));
  return plan;
}

namespace {
std::vector<std::string_view> gate_residual_templates(const KernelSpec&) {
  return {"gate_residual_math.cuh", "gate_residual.cuh"};
}
RuleBreak gate_residual_rule(const KernelSpec& spec) { return row_op_rule(spec, 1); }
std::vector<KernelSpec> gate_residual_family(const KernelSpec& sizes) {
  return row_op_family(Op::GateResidual, sizes.dtype, sizes.hidden, sizes.table_stride);
}
}  // namespace

const OpRow kGateResidualRow = {
    Op::GateResidual, "gate_residual", OpRole::Forward, "gate_residual",
    SpecShape::Rows, /*describes_weight=*/false, /*row_chunks=*/1, /*threads=*/0, /*row_unroll=*/1,
    {"index", "index"}, ErrorValue::Index, /*value_rule=*/"",
    gate_residual_templates, codegen::render_row_constants, gate_residual_rule,
    gate_residual_family, [](DType dtype) { return h3_strides(Op::GateResidual, dtype, {6, 2}); },
    "--hidden H --table-stride N", "residual + gate.index_select(0, index) * y", /*default_stride_in_h=*/6};

}  // namespace exactjit

extern "C" exactjit_status_t xj_gate_residual(xj_runtime* runtime, const DLTensor* residual, const DLTensor* gate,
                                              const DLTensor* index, const DLTensor* y, const DLTensor* out,
                                              void* stream) {
  return exactjit::c_abi::call_op(
      runtime, "gate_residual", {{"residual", residual}, {"gate", gate}, {"index", index}, {"y", y}, {"out", out}},
      [&](exactjit::Runtime& r) {
        return r.launch(exactjit::plan_gate_residual({*residual, *gate, *index, *y, *out}), stream);
      });
}
