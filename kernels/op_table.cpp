// exactjit's op table (codegen/op_row.hpp): every op's row, each defined in its op's file. Adding
// an op adds its row here; nothing outside its files, this list and the public surfaces changes.
#include "codegen/op_row.hpp"

#include "kernels/adaln_row_gather.hpp"
#include "kernels/adaln_row_gather_backward.hpp"
#include "kernels/det_linear.hpp"
#include "kernels/det_linear_backward.hpp"
#include "kernels/gate_residual.hpp"
#include "kernels/gate_residual_backward.hpp"
#include "kernels/gate_residual_rms_norm.hpp"
#include "kernels/rms_norm.hpp"
#include "kernels/rms_norm_backward.hpp"
#include "kernels/segment_fold.hpp"
#include "kernels/segment_plan.hpp"
#include "kernels/timestep_sinusoid.hpp"

#include <array>

namespace exactjit {

namespace {

// Listed by family, the row carrying the family's help line first: `exactjit --help` shows them
// in this order.
const std::array<const OpRow*, 22> kRows = {
    &kGateResidualRow,        &kGateResidualBackwardRow,        &kAdalnRowGatherRow,   &kAdalnRowGatherBackwardRow,
    &kRmsNormRow,             &kRmsNormBackwardRow,             &kRmsNormTableGradRow, &kRmsNormWeightGradRow,
    &kRmsNormOnePassRow,
    &kGateResidualRmsNormRow, &kGateResidualRmsNormBackwardRow, &kGateResidualRmsNormOnePassRow,
    &kTimestepSinusoidRow,    &kTimestepSinusoidBackwardRow,
    &kDetLinearRow,           &kDetLinearInputGradRow,          &kDetLinearInputFoldRow, &kDetLinearWeightGradRow,
    &kSegmentCountRow,        &kSegmentScanRow,                 &kSegmentScatterRow,   &kSegmentFoldRow,
};

}  // namespace

llvm::ArrayRef<const OpRow*> op_table() { return kRows; }

namespace {
// Built on first use, so a static initializer elsewhere may call it.
const std::array<const OpRow*, 256>& rows_by_code() {
  static const std::array<const OpRow*, 256> table = [] {
    std::array<const OpRow*, 256> by_code{};
    for (const OpRow* row : kRows) by_code[op_code(row->op)] = row;
    return by_code;
  }();
  return table;
}
}  // namespace

const OpRow& op_row(OpCode op) { return *rows_by_code()[op_code(op)]; }

const OpRow* op_row_by_code(unsigned code) { return code < 256 ? rows_by_code()[code] : nullptr; }

}  // namespace exactjit
