// exactjit's op families (see op_families.hpp).
#include "kernels/op_families.hpp"

#include "codegen/op_row.hpp"

namespace exactjit {

llvm::ArrayRef<OpFamily> op_families() {
  static const std::vector<OpFamily> families = [] {
    std::vector<OpFamily> list = {
        {"gate_residual", "--hidden H --table-stride N", "residual + gate.index_select(0, index) * y", 6, {}},
        {"adaln_row_gather", "--hidden H --table-stride N", "the six AdaLN chunks of a (3T, 6H) table, gathered", 6,
         {}},
        {"rms_norm", "--hidden H [--table-stride N]", "F.rms_norm, optionally AdaLN-modulated (with a table stride)",
         0, {}},
        {"gate_residual_rms_norm", "--hidden H --table-stride N",
         "gate_residual into h, then rms_norm of h (optionally modulated), in one pass", 6, {}},
        {"timestep_sinusoid", "--channels C", "diffusers' get_timestep_embedding", 0, {}},
        {"det_linear", "--in-features K --out-features N [--activation none|silu]",
         "batch-invariant linear layer (timestep MLP, AdaLN projection)", 0, {}},
        {"segment_plan", "(sized by the backward kernels)", "the deterministic segment sums the backwards share", 6,
         {}},
    };
    for (OpFamily& family : list)
      for (const OpRow* row : op_table())
        if (row->family == family.name) family.kernels.push_back(row->op);
    return list;
  }();
  return families;
}

const OpFamily& op_family(Op op) {
  for (const OpFamily& family : op_families())
    if (family.name == op_row(op).family) return family;
  return op_families().front();  // unreachable: the op table test checks every row's family is listed
}

std::string op_names() {
  std::string names;
  for (const OpFamily& family : op_families())
    for (Op op : family.kernels) names += (names.empty() ? "" : ", ") + std::string(op_name(op));
  return names;
}

}  // namespace exactjit
