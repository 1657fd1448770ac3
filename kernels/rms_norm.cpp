// exactjit op rms_norm: validate, spec, geometry, parameters.
#include "kernels/rms_norm.hpp"

#include "api/c_entry.hpp"
#include "codegen/geometry.hpp"
#include "codegen/render.hpp"
#include "kernels/op_rules.hpp"
#include "kernels/spec_limits.hpp"
#include "kernels/tensor_check.hpp"

#include <fmt/format.h>
#include <llvm/ADT/SmallVector.h>

#include <climits>
#include <cmath>

namespace exactjit {
namespace {
constexpr std::string_view kOp = "rms_norm";
ArgName arg(std::string_view name) { return {kOp, name}; }
}  // namespace

KernelSpec rms_norm_spec(DType dtype, IndexType index, int64_t hidden, int64_t table_stride, bool weighted) {
  // Fixed 4-element vectors; plain kernels read no index, so their index type is canonical.
  return make_spec(Op::RmsNorm, dtype, table_stride > 0 ? index : IndexType::I64, hidden, table_stride, 4, weighted);
}

llvm::Expected<LaunchPlan> plan_rms_norm(const RmsNormArgs& a) {
  const bool modulated = a.shift || a.scale || a.index;
  if (modulated && !(a.shift && a.scale && a.index))
    return invalid(arg("shift"), "scale and index must be given together (AdaLN modulation) or not at all");
  // Inline storage: planning sits on the launch hot path and must not allocate.
  llvm::SmallVector<NamedTensor, 7> tensors = {{"x", &a.x}, {"out", &a.out}};
  if (a.weight) tensors.push_back({"weight", a.weight});
  if (modulated) tensors.append({{"shift", a.shift}, {"scale", a.scale}, {"index", a.index}});
  if (a.rstd) tensors.push_back({"rstd", a.rstd});
  if (auto err = require_cuda_on_one_device(kOp, tensors)) return err;
  auto dtype = float_dtype(arg("x"), a.x);
  if (!dtype) return dtype.takeError();
  for (const auto& [name, tensor] : tensors) {
    if (name == "x" || name == "index" || name == "rstd") continue;
    auto other = float_dtype(arg(name), *tensor);
    if (!other) return other.takeError();
    if (*other != *dtype)
      return invalid(arg(name), fmt::format("must have x's dtype {} (got {})", dtype_name(*dtype), dtype_name(*other)));
  }
  if (!std::isfinite(a.eps) || a.eps < 0)
    return invalid(arg("eps"), fmt::format("must be finite and >= 0 (got {})", a.eps));

  if (a.x.ndim < 1) return invalid(arg("x"), "must have a last dimension H");
  const int64_t hidden = a.x.shape[a.x.ndim - 1];
  if (std::string rule = cap_rule(kHiddenCap, hidden); !rule.empty()) return invalid(arg("x"), rule);
  if (auto err = require_row_rules(rms_norm_spec(*dtype, IndexType::I64, hidden, 0, a.weight != nullptr), arg("x"),
                                   arg("shift")))
    return err;
  if (!is_contiguous(a.x)) return invalid(arg("x"), "must be contiguous");
  const size_t elem = dtype_size(*dtype);
  if (data_address(a.x) % (4 * elem) != 0)
    return invalid(arg("x"), fmt::format("must be aligned to 4 elements ({} bytes): PyTorch reduces unaligned rows "
                                         "in another order", 4 * elem));
  const int64_t rows = element_count(a.x) / hidden;
  bool same = a.out.ndim == a.x.ndim;
  for (int d = 0; same && d < a.x.ndim; ++d) same = a.out.shape[d] == a.x.shape[d];
  if (!same)
    return invalid(arg("out"), fmt::format("must have x's shape {} (got {})", shape_string(a.x), shape_string(a.out)));
  if (!is_contiguous(a.out) || data_address(a.out) % (4 * elem) != 0)
    return invalid(arg("out"), fmt::format("must be contiguous and aligned to 4 elements ({} bytes)", 4 * elem));
  if (a.weight) {
    if (a.weight->ndim != 1 || a.weight->shape[0] != hidden || !is_contiguous(*a.weight))
      return invalid(arg("weight"), fmt::format("must be ({},) contiguous (got {})", hidden, shape_string(*a.weight)));
    if (data_address(*a.weight) % (4 * elem) != 0)
      return invalid(arg("weight"), fmt::format("must be aligned to 4 elements ({} bytes)", 4 * elem));
  }
  if (a.rstd) {
    if (a.rstd->dtype.code != kDLFloat || a.rstd->dtype.bits != 32 || a.rstd->dtype.lanes != 1)
      return invalid(arg("rstd"), "must be float32");
    if (element_count(*a.rstd) != rows || !is_contiguous(*a.rstd))
      return invalid(arg("rstd"), fmt::format("must hold one float per row ({}) contiguously (got {})", rows,
                                              shape_string(*a.rstd)));
  }

  int64_t table_stride = 0, table_rows = 1, seq = 1;
  IndexType index_type = IndexType::I64;
  if (modulated) {
    auto itype = index_dtype(arg("index"), *a.index);
    if (!itype) return itype.takeError();
    index_type = *itype;
    for (const auto& [name, t] : {std::pair{"shift", a.shift}, std::pair{"scale", a.scale}}) {
      if (t->ndim != 2 || t->shape[1] != hidden)
        return invalid(arg(name), fmt::format("must be (R, {}) (got {})", hidden, shape_string(*t)));
      if (stride_of(*t, 1) != 1)
        return invalid(arg(name), fmt::format("must have unit column stride (got {})", stride_of(*t, 1)));
      if (data_address(*t) % (4 * elem) != 0)
        return invalid(arg(name), fmt::format("must be aligned to 4 elements ({} bytes)", 4 * elem));
    }
    table_rows = a.shift->shape[0];
    if (table_rows < 1 || a.scale->shape[0] != table_rows)
      return invalid(arg("scale"), fmt::format("must have shift's {} rows (got {})", table_rows, a.scale->shape[0]));
    table_stride = table_rows == 1 ? hidden : stride_of(*a.shift, 0);
    const int64_t scale_stride = table_rows == 1 ? hidden : stride_of(*a.scale, 0);
    if (scale_stride != table_stride)
      return invalid(arg("scale"), fmt::format("must have shift's row stride {} (got {})", table_stride, scale_stride));
    if (std::string rule = cap_rule(kTableStrideCap, table_stride); !rule.empty()) return invalid(arg("shift"), rule);
    if (auto err = require_row_rules(rms_norm_spec(*dtype, index_type, hidden, table_stride, a.weight != nullptr),
                                     arg("x"), arg("shift")))
      return err;
    if (a.index->ndim != 1 || a.index->shape[0] < 1 || !is_contiguous(*a.index))
      return invalid(arg("index"), fmt::format("must be (S,) contiguous with S >= 1 (got {})", shape_string(*a.index)));
    seq = a.index->shape[0];
    if (rows % seq != 0)
      return invalid(arg("index"), fmt::format("length S = {} must divide the M = {} rows of x", seq, rows));
  }
  for (const auto& [name, tensor] : tensors)
    if (name != "out" && overlaps(a.out, *tensor))
      return invalid(arg("out"), fmt::format("must not overlap {}", name));

  LaunchPlan plan;
  plan.spec = rms_norm_spec(*dtype, index_type, hidden, table_stride, a.weight != nullptr);
  plan.device_id = a.x.device.device_id;
  const int64_t rows_per_block = codegen::rms_norm_rows_per_block(hidden);
  const int64_t blocks = (rows + rows_per_block - 1) / rows_per_block;
  if (blocks > INT_MAX) return invalid(arg("x"), fmt::format("has too many rows ({}) for one launch", rows));
  plan.grid = static_cast<uint32_t>(blocks);
  plan.threads = 128;
  plan.push(data_address(a.x));
  plan.push(a.weight ? data_address(*a.weight) : 0);
  plan.push(modulated ? data_address(*a.shift) : 0);
  plan.push(modulated ? data_address(*a.scale) : 0);
  plan.push(modulated ? data_address(*a.index) : 0);
  plan.push(data_address(a.out));
  plan.push(a.rstd ? data_address(*a.rstd) : 0);
  plan.push(static_cast<uint64_t>(rows));
  plan.push(static_cast<uint64_t>(seq));
  plan.push(static_cast<uint64_t>(table_rows));
  plan.push_float(static_cast<float>(a.eps));
  return plan;
}

namespace {
std::vector<std::string_view> rms_norm_templates(const KernelSpec&) {
  return {"quad_io.cuh", "row_sum.cuh", "row_slot.cuh", "rms_norm_output.cuh", "rms_norm.cuh"};
}
// Fixed 4-element vectors; weighted and unweighted; both index types where modulated.
std::vector<KernelSpec> rms_norm_family(const KernelSpec& sizes) {
  std::vector<KernelSpec> specs;
  for (IndexType index : index_types_for(sizes.table_stride))
    for (bool weighted : {true, false})
      specs.push_back(rms_norm_spec(sizes.dtype, index, sizes.hidden, sizes.table_stride, weighted));
  return specs;
}
}  // namespace

const OpRow kRmsNormRow = {
    Op::RmsNorm, "rms_norm", OpRole::Forward, "rms_norm",
    SpecShape::Rows, /*describes_weight=*/true, /*row_chunks=*/1, /*threads=*/0, /*row_unroll=*/1,
    {"index", "index"}, ErrorValue::Index, /*value_rule=*/"",
    rms_norm_templates, codegen::render_rms_norm_constants, rms_norm_rule,
    rms_norm_family, [](DType dtype) { return h3_strides(Op::RmsNorm, dtype, {0, 6, 2}); },
    "--hidden H [--table-stride N]", "F.rms_norm, optionally AdaLN-modulated (with a table stride)",
    /*default_stride_in_h=*/0};

}  // namespace exactjit

extern "C" exactjit_status_t xj_rms_norm(xj_runtime* runtime, const DLTensor* x, const DLTensor* weight,
                                         const DLTensor* shift, const DLTensor* scale, const DLTensor* index,
                                         const DLTensor* out, const DLTensor* rstd, double eps, void* stream) {
  return exactjit::c_abi::call_op(runtime, "rms_norm", {{"x", x}, {"out", out}}, [&](exactjit::Runtime& r) {
    return r.launch(exactjit::plan_rms_norm({*x, weight, shift, scale, index, *out, rstd, eps}), stream);
  });
}
