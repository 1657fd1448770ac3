// exactjit's op families (see op_families.hpp).
#include "kernels/op_families.hpp"

#include "codegen/op_row.hpp"

#include <llvm/ADT/STLExtras.h>

namespace exactjit {

llvm::ArrayRef<OpFamily> op_families() {
  // A family's line is on its first row in the op table; its kernels are its rows, in table order.
  static const std::vector<OpFamily> families = [] {
    std::vector<OpFamily> list;
    for (const OpRow* row : op_table()) {
      auto family = llvm::find_if(list, [&](const OpFamily& f) { return f.name == row->family; });
      if (family == list.end())
        family = list.insert(list.end(), {row->family, row->family_sizes, row->family_summary,
                                          row->default_stride_in_h, {}});
      family->kernels.push_back(row->op);
    }
    return list;
  }();
  return families;
}

const OpFamily& op_family(OpCode op) {
  for (const OpFamily& family : op_families())
    if (family.name == op_row(op).family) return family;
  return op_families().front();  // unreachable: the op table test checks every row's family is listed
}

std::string op_names() {
  std::string names;
  for (const OpFamily& family : op_families())
    for (OpCode op : family.kernels) names += (names.empty() ? "" : ", ") + std::string(op_name(op));
  return names;
}

}  // namespace exactjit
