// exactjit's op families: each forward op with the backward kernels it launches (the rows of the
// op table that name the family), and the flags that size it on the command line. `exactjit
// --help`, the --op flag's description and the CLI's unknown-op message are generated from it.
#pragma once

#include "codegen/kernel_spec.hpp"

#include <llvm/ADT/ArrayRef.h>

#include <string>
#include <string_view>
#include <vector>

namespace exactjit {

struct OpFamily {
  std::string_view name;     ///< the forward op ("gate_residual"), or "segment_plan" for the shared kernels
  std::string_view sizes;    ///< the prewarm flags that size it
  std::string_view summary;  ///< what it computes
  /// The table stride the CLI assumes when none is given, in multiples of H (the block's 6H AdaLN
  /// chunk; rms_norm: 0, the plain norm).
  int default_stride_in_h;
  std::vector<OpCode> kernels;   ///< every kernel of the family `--op` accepts (op table order, forward first)
};

/// Every op family; each Op is a kernel of exactly one of them.
llvm::ArrayRef<OpFamily> op_families();

/// The family an op's row names.
const OpFamily& op_family(OpCode op);

/// "gate_residual, gate_residual_backward, adaln_row_gather, ...": every name --op accepts.
std::string op_names();

}  // namespace exactjit
