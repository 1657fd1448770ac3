// exactjit op adaln_row_gather: validate, spec, geometry, parameters.
#include "kernels/adaln_row_gather.hpp"

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
constexpr std::string_view kOp = "adaln_row_gather";
ArgName arg(std::string_view name) { return {kOp, name}; }
}  // namespace

llvm::Expected<LaunchPlan> plan_adaln_row_gather(const AdalnRowGatherArgs& a) {
  const NamedTensor tensors[] = {
      {"rows", &a.rows}, {"timestep_indices", &a.timestep_indices}, {"token_tags", &a.token_tags}, {"out", &a.out}};
  if (auto err = require_cuda_on_one_device(kOp, tensors)) return err;
  auto dtype = float_dtype(arg("rows"), a.rows);
  if (!dtype) return dtype.takeError();
  auto out_dtype = float_dtype(arg("out"), a.out);
  if (!out_dtype) return out_dtype.takeError();
  if (*out_dtype != *dtype)
    return invalid(arg("out"),
                   fmt::format("must have rows' dtype {} (got {})", dtype_name(*dtype), dtype_name(*out_dtype)));
  auto index_type = index_dtype(arg("timestep_indices"), a.timestep_indices);
  if (!index_type) return index_type.takeError();
  auto tag_type = index_dtype(arg("token_tags"), a.token_tags);
  if (!tag_type) return tag_type.takeError();
  if (*tag_type != *index_type)
    return invalid(arg("token_tags"), fmt::format("must have timestep_indices' dtype {} (got {})",
                                                  index_type_name(*index_type), index_type_name(*tag_type)));

  if (a.rows.ndim != 2 || a.rows.shape[1] % 6 != 0 || a.rows.shape[1] < 6)
    return invalid(arg("rows"), fmt::format("must be (3T, 6H) (got {})", shape_string(a.rows)));
  const int64_t hidden = a.rows.shape[1] / 6;
  if (std::string rule = cap_rule(kHiddenCap, hidden); !rule.empty()) return invalid(arg("rows"), rule);
  const int64_t table_rows = a.rows.shape[0];
  if (table_rows < 3 || table_rows % 3 != 0)
    return invalid(arg("rows"), fmt::format("must have 3T rows, one per modality and timestep (got {})", table_rows));
  if (stride_of(a.rows, 1) != 1)
    return invalid(arg("rows"), fmt::format("must have unit column stride (got {})", stride_of(a.rows, 1)));
  const int64_t table_stride = stride_of(a.rows, 0);
  if (std::string rule = cap_rule(kTableStrideCap, table_stride); !rule.empty()) return invalid(arg("rows"), rule);
  if (auto err = require_row_rules(make_spec(Op::AdalnRowGather, *dtype, *index_type, hidden, table_stride, 1),
                                   arg("rows"), arg("rows")))
    return err;

  const DLTensor* indices[] = {&a.timestep_indices, &a.token_tags};
  const char* index_names[] = {"timestep_indices", "token_tags"};
  if (a.timestep_indices.ndim != 1)
    return invalid(arg("timestep_indices"), fmt::format("must be (S,) (got {})", shape_string(a.timestep_indices)));
  const int64_t seq = a.timestep_indices.shape[0];
  for (int k = 0; k < 2; ++k) {
    if (indices[k]->ndim != 1 || indices[k]->shape[0] != seq)
      return invalid(arg(index_names[k]), fmt::format("must be (S,) = ({},) (got {})", seq, shape_string(*indices[k])));
    if (!is_contiguous(*indices[k])) return invalid(arg(index_names[k]), "must be contiguous");
  }
  if (a.out.ndim != 3 || a.out.shape[0] != 6 || a.out.shape[1] != seq || a.out.shape[2] != hidden)
    return invalid(arg("out"), fmt::format("must be (6, {}, {}) (got {})", seq, hidden, shape_string(a.out)));
  if (!is_contiguous(a.out)) return invalid(arg("out"), "must be contiguous");
  for (const auto& [name, tensor] : {tensors[0], tensors[1], tensors[2]})
    if (overlaps(a.out, *tensor)) return invalid(arg("out"), fmt::format("must not overlap {}", name));

  LaunchPlan plan;
  plan.spec = make_spec(Op::AdalnRowGather, *dtype, *index_type, hidden, table_stride,
                        pack_width(*dtype, hidden, table_stride, {&a.rows, &a.out}));
  plan.device_id = a.rows.device.device_id;
  const codegen::RowGeometry geometry = codegen::row_geometry(plan.spec);
  const int64_t blocks = (seq + geometry.rows_per_block - 1) / geometry.rows_per_block;
  if (blocks > INT_MAX) return invalid(arg("timestep_indices"), fmt::format("S = {} is too long for one launch", seq));
  plan.grid = static_cast<uint32_t>(blocks);
  plan.threads = static_cast<uint32_t>(geometry.threads());
  plan.push(data_address(a.rows));
  plan.push(data_address(a.timestep_indices));
  plan.push(data_address(a.token_tags));
  plan.push(data_address(a.out));
  plan.push(static_cast<uint64_t>(seq));
  plan.push(static_cast<uint64_t>(table_rows / 3));
  return plan;
}

namespace {
std::vector<std::string_view> adaln_row_gather_templates(const KernelSpec&) { return {"adaln_row_gather.cuh"}; }
RuleBreak adaln_row_gather_rule(const KernelSpec& spec) { return row_op_rule(spec, 6); }
std::vector<KernelSpec> adaln_row_gather_family(const KernelSpec& sizes) {
  return row_op_family(Op::AdalnRowGather, sizes.dtype, sizes.hidden, sizes.table_stride);
}
}  // namespace

const OpRow kAdalnRowGatherRow = {
    Op::AdalnRowGather, "adaln_row_gather", OpRole::Forward, "adaln_row_gather",
    SpecShape::Rows, /*describes_weight=*/false, /*row_chunks=*/6, /*threads=*/0, /*row_unroll=*/1,
    {"timestep_indices", "token_tags"}, ErrorValue::Index, /*value_rule=*/"",
    adaln_row_gather_templates, codegen::render_row_constants, adaln_row_gather_rule,
    adaln_row_gather_family, [](DType dtype) { return h3_strides(Op::AdalnRowGather, dtype, {6}); },
    "--hidden H --table-stride N", "the six AdaLN chunks of a (3T, 6H) table, gathered", /*default_stride_in_h=*/6};

}  // namespace exactjit

extern "C" exactjit_status_t xj_adaln_row_gather(xj_runtime* runtime, const DLTensor* rows,
                                                 const DLTensor* timestep_indices, const DLTensor* token_tags,
                                                 const DLTensor* out, void* stream) {
  return exactjit::c_abi::call_op(
      runtime, "adaln_row_gather",
      {{"rows", rows}, {"timestep_indices", timestep_indices}, {"token_tags", token_tags}, {"out", out}},
      [&](exactjit::Runtime& r) {
        return r.launch(exactjit::plan_adaln_row_gather({*rows, *timestep_indices, *token_tags, *out}), stream);
      });
}
