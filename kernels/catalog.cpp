// exactjit kernel catalog (see catalog.hpp).
#include "kernels/catalog.hpp"

#include "codegen/op_row.hpp"
#include "kernels/spec_limits.hpp"
#include "runtime/errors.hpp"

#include <fmt/format.h>


namespace exactjit {

std::vector<KernelSpec> spec_family(OpCode op, const KernelSpec& sizes, Target target) {
  std::vector<KernelSpec> specs = op_row(op).family_specs(sizes);
  for (KernelSpec& spec : specs) spec.target = target;
  return specs;
}

std::vector<KernelSpec> default_catalog(Target target) {
  std::vector<KernelSpec> specs;
  for (DType dtype : {DType::BF16, DType::F16, DType::F32})
    for (const OpRow* row : op_table())
      for (KernelSpec spec : row->catalog(dtype)) {
        spec.target = target;
        // A kernel the target cannot run (the one-pass rms_norm backward before sm_90, bf16
        // det_linear before sm_80) is not that target's: its calls take another path.
        if (llvm::Error err = validate_spec(spec)) {
          llvm::consumeError(std::move(err));
          continue;
        }
        specs.push_back(spec);
      }
  return specs;
}

llvm::Error validate_spec(const KernelSpec& spec) {
  auto bad = [&](const std::string& rule) {
    return make_error(ErrorCode::InvalidArgument, fmt::format("{}: {}", spec.describe(), rule));
  };
  const OpRow& row = op_row(spec.op);
  // The caps first: the op's rules (and the templates) compute with these sizes.
  if (std::string rule = size_caps_rule(spec); !rule.empty()) return bad(rule);
  if (spec.target.sm < kMinTargetSm)
    return bad(fmt::format("targets older than sm_{} are not supported", kMinTargetSm));
  if (RuleBreak broken = row.rule(spec)) return bad(broken.rule);
  return llvm::Error::success();
}

}  // namespace exactjit
