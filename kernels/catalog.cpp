// exactjit kernel catalog (see catalog.hpp).
#include "kernels/catalog.hpp"

#include "kernels/rms_norm.hpp"
#include "kernels/timestep_sinusoid.hpp"
#include "runtime/errors.hpp"

#include <fmt/format.h>

#include <climits>

namespace exactjit {

std::vector<KernelSpec> spec_family(Op op, DType dtype, int64_t hidden, int64_t table_stride, Target target) {
  std::vector<KernelSpec> specs;
  if (op == Op::TimestepSinusoid) {  // fp32 only; `hidden` is the channel count
    KernelSpec spec = timestep_sinusoid_spec(hidden);
    spec.target = target;
    return {spec};
  }
  if (op == Op::RmsNorm) {  // fixed 4-element vectors; weighted and unweighted; index types if modulated
    for (IndexType index : table_stride > 0 ? std::vector<IndexType>{IndexType::I64, IndexType::I32}
                                            : std::vector<IndexType>{IndexType::I64}) {
      for (bool weighted : {true, false}) {
        KernelSpec spec = rms_norm_spec(dtype, index, hidden, table_stride, weighted);
        spec.target = target;
        specs.push_back(spec);
      }
    }
    return specs;
  }
  const int wide = static_cast<int>(16 / dtype_size(dtype));
  std::vector<int> widths{1};
  if (hidden % wide == 0 && table_stride % wide == 0) widths.insert(widths.begin(), wide);
  for (IndexType index : {IndexType::I64, IndexType::I32}) {
    for (int vec : widths) {
      KernelSpec spec = make_spec(op, dtype, index, hidden, table_stride, vec);  // the row-wise ops
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
    add(Op::RmsNorm, dtype, 0);                    // plain (nn.RMSNorm, F.rms_norm)
    add(Op::RmsNorm, dtype, 6 * kDefaultHidden);   // block modulation over the (3T, 6H) chunks
    add(Op::RmsNorm, dtype, 2 * kDefaultHidden);   // final-norm modulation over the (T, 2H) table
  }
  KernelSpec sinusoid = timestep_sinusoid_spec(256);  // H3: 256 channels
  sinusoid.target = target;
  specs.push_back(sinusoid);
  return specs;
}

llvm::Error validate_spec(const KernelSpec& spec) {
  auto bad = [&](const std::string& rule) {
    return make_error(ErrorCode::InvalidArgument, fmt::format("{}: {}", spec.describe(), rule));
  };
  if (spec.hidden < 1 || spec.hidden > INT_MAX) return bad(fmt::format("hidden must be in [1, {}]", INT_MAX));
  if (spec.op == Op::TimestepSinusoid) {
    if (spec.hidden < 2 || spec.hidden > INT_MAX) return bad("channels must be >= 2");
    if (spec.target.sm < 75) return bad("targets older than sm_75 are not supported");
    return llvm::Error::success();
  }
  if (spec.op == Op::RmsNorm) {
    if (spec.hidden % 4 != 0) return bad("rms_norm needs hidden % 4 == 0 (PyTorch's vectorized path)");
    if (spec.table_stride != 0 && (spec.table_stride < spec.hidden || spec.table_stride % 4 != 0))
      return bad("table stride must be 0 (plain) or a multiple of 4 that is >= hidden");
    if (spec.target.sm < 75) return bad("targets older than sm_75 are not supported");
    return llvm::Error::success();
  }
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
