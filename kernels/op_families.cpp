// exactjit's op families (see op_families.hpp).
#include "kernels/op_families.hpp"

namespace exactjit {

llvm::ArrayRef<OpFamily> op_families() {
  static const std::vector<OpFamily> families = {
      {"gate_residual", "--hidden H --table-stride N", "residual + gate.index_select(0, index) * y",
       {Op::GateResidual, Op::GateResidualBackward}},
      {"adaln_row_gather", "--hidden H --table-stride N", "the six AdaLN chunks of a (3T, 6H) table, gathered",
       {Op::AdalnRowGather, Op::AdalnRowGatherBackward}},
      {"rms_norm", "--hidden H [--table-stride N]", "F.rms_norm, optionally AdaLN-modulated (with a table stride)",
       {Op::RmsNorm, Op::RmsNormBackward, Op::RmsNormTableGrad, Op::RmsNormWeightGrad}},
      {"timestep_sinusoid", "--channels C", "diffusers' get_timestep_embedding",
       {Op::TimestepSinusoid, Op::TimestepSinusoidBackward}},
      {"det_linear", "--in-features K --out-features N [--activation none|silu]",
       "batch-invariant linear layer (timestep MLP, AdaLN projection)",
       {Op::DetLinear, Op::DetLinearInputGrad, Op::DetLinearInputFold, Op::DetLinearWeightGrad}},
      {"segment_plan", "(sized by the backward kernels)", "the deterministic segment sums the backwards share",
       {Op::SegmentCount, Op::SegmentScan, Op::SegmentScatter, Op::SegmentFold}},
  };
  return families;
}

std::string op_names() {
  std::string names;
  for (const OpFamily& family : op_families())
    for (Op op : family.kernels) names += (names.empty() ? "" : ", ") + std::string(op_name(op));
  return names;
}

}  // namespace exactjit
