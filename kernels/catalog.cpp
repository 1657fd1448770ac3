// exactjit kernel catalog (see catalog.hpp).
#include "kernels/catalog.hpp"

#include "kernels/adaln_row_gather.hpp"
#include "kernels/gate_residual.hpp"
#include "runtime/errors.hpp"

#include <fmt/format.h>

#include <climits>

namespace exactjit {

std::vector<KernelSpec> spec_family(Op op, DType dtype, int64_t hidden, int64_t table_stride, Target target) {
  std::vector<KernelSpec> specs;
  const int wide = static_cast<int>(16 / dtype_size(dtype));
  std::vector<int> widths{1};
  if (hidden % wide == 0 && table_stride % wide == 0) widths.insert(widths.begin(), wide);
  for (IndexType index : {IndexType::I64, IndexType::I32}) {
    for (int vec : widths) {
      KernelSpec spec;
      switch (op) {
        case Op::GateResidual: spec = gate_residual_spec(dtype, index, hidden, table_stride, vec); break;
        case Op::AdalnRowGather: spec = adaln_row_gather_spec(dtype, index, hidden, table_stride, vec); break;
      }
      spec.target = target;
      specs.push_back(spec);
    }
  }
  return specs;
}

std::vector<KernelSpec> default_catalog(Target target) {
  std::vector<KernelSpec> specs;
  auto add = [&](Op op, DType dtype, int64_t stride) {
    for (const KernelSpec& spec : spec_family(op, dtype, kDefaultHidden, stride, target)) specs.push_back(spec);
  };
  for (DType dtype : {DType::BF16, DType::F16, DType::F32}) {
    add(Op::GateResidual, dtype, 6 * kDefaultHidden);
    add(Op::GateResidual, dtype, 2 * kDefaultHidden);
    add(Op::AdalnRowGather, dtype, 6 * kDefaultHidden);
  }
  return specs;
}

llvm::Error validate_spec(const KernelSpec& spec) {
  auto bad = [&](const std::string& rule) {
    return make_error(ErrorCode::InvalidArgument, fmt::format("{}: {}", spec.describe(), rule));
  };
  if (spec.hidden < 1 || spec.hidden > INT_MAX) return bad(fmt::format("hidden must be in [1, {}]", INT_MAX));
  const int64_t row_elements = spec.op == Op::AdalnRowGather ? 6 * spec.hidden : spec.hidden;
  if (spec.table_stride < row_elements)
    return bad(spec.op == Op::AdalnRowGather ? "table stride must be >= 6 x hidden" : "table stride must be >= hidden");
  const int wide = static_cast<int>(16 / dtype_size(spec.dtype));
  if (spec.vec != 1 && spec.vec != wide) return bad(fmt::format("vec must be 1 or {}", wide));
  if (spec.hidden % spec.vec != 0 || spec.table_stride % spec.vec != 0)
    return bad("hidden and table stride must be multiples of vec");
  if (spec.target.sm < 75) return bad("targets older than sm_75 are not supported");
  return llvm::Error::success();
}

}  // namespace exactjit
