// exactjit backward validation helpers: the rules every backward planner shares (an output like
// an input, a dense gradient buffer, the caller's workspace).
#pragma once

#include "kernels/tensor_check.hpp"

#include <dlpack/dlpack.h>
#include <llvm/Support/Error.h>

namespace exactjit {

/// `t` has `like`'s shape and dtype and is contiguous.
llvm::Error require_like(ArgName name, const DLTensor& t, std::string_view like_name, const DLTensor& like);

/// `t` is a contiguous tensor of `shape` (ndim given) in `dtype`.
llvm::Error require_dense(ArgName name, const DLTensor& t, std::initializer_list<int64_t> shape, DType dtype);

/// Tile partials given or asked for by the caller (sequence parallelism): (P, width) float32
/// contiguous with P >= min_rows; `bound` says what min_rows is, for the message.
llvm::Error require_partials(ArgName name, const DLTensor& t, int64_t width, int64_t min_rows, std::string_view bound);

/// The dtype of a parameter gradient output: the input's (`input`, named `input_name`), or float32
/// (the same sums rounded once to fp32 instead).
llvm::Expected<DType> gradient_dtype(ArgName name, const DLTensor& t, std::string_view input_name, DType input);

/// The workspace is a contiguous uint8 CUDA tensor of at least `bytes` bytes, 256-byte aligned;
/// `bytes` < 0 (a size query's -1) refuses any workspace.
llvm::Error require_workspace(ArgName name, const DLTensor* workspace, int64_t bytes);

/// The plan's limits: S fits int32 and R <= kMaxPlanTableRows.
llvm::Error require_plan_limits(ArgName index_name, int64_t seq, ArgName table_name, int64_t table_rows);

}  // namespace exactjit
