// exactjit backward validation helpers (see backward_check.hpp).
#include "kernels/backward_check.hpp"

#include "kernels/segment_plan.hpp"

#include <fmt/format.h>

#include <climits>

namespace exactjit {

llvm::Error require_like(ArgName name, const DLTensor& t, std::string_view like_name, const DLTensor& like) {
  bool same = t.ndim == like.ndim && t.dtype.code == like.dtype.code && t.dtype.bits == like.dtype.bits;
  for (int d = 0; same && d < like.ndim; ++d) same = t.shape[d] == like.shape[d];
  if (!same) return invalid(name, fmt::format("must have {}'s shape {} and dtype", like_name, shape_string(like)));
  if (!is_contiguous(t)) return invalid(name, "must be contiguous");
  return llvm::Error::success();
}

llvm::Expected<DType> gradient_dtype(ArgName name, const DLTensor& t, std::string_view input_name, DType input) {
  auto got = float_dtype(name, t);
  if (!got) return got.takeError();
  if (*got != input && *got != DType::F32)
    return invalid(name, fmt::format("must be in {}'s dtype {} or float32 (got {})", input_name, dtype_name(input),
                                     dtype_name(*got)));
  return *got;
}

llvm::Error require_partials(ArgName name, const DLTensor& t, int64_t width, int64_t min_rows, std::string_view bound) {
  auto got = float_dtype(name, t);
  if (!got) return got.takeError();
  if (*got != DType::F32 || t.ndim != 2 || t.shape[0] < min_rows || t.shape[1] != width || !is_contiguous(t))
    return invalid(name, fmt::format("must be (P, {}) float32 contiguous with P >= {} (got {} {})", width, bound,
                                     dtype_name(*got), shape_string(t)));
  return llvm::Error::success();
}

llvm::Error require_dense(ArgName name, const DLTensor& t, std::initializer_list<int64_t> shape, DType dtype) {
  auto got = float_dtype(name, t);
  if (!got) return got.takeError();
  bool same = *got == dtype && t.ndim == static_cast<int>(shape.size());
  int d = 0;
  for (int64_t extent : shape) same = same && t.shape[d++] == extent;
  if (!same) {
    std::string want;
    for (int64_t extent : shape) want += (want.empty() ? "" : ", ") + std::to_string(extent);
    return invalid(name, fmt::format("must be ({}) in {} (got {} {})", want, dtype_name(dtype), shape_string(t),
                                     dtype_name(*got)));
  }
  if (!is_contiguous(t)) return invalid(name, "must be contiguous");
  return llvm::Error::success();
}

llvm::Error require_workspace(ArgName name, const DLTensor* workspace, int64_t bytes) {
  // A size query's -1 (shapes whose workspace overflows 64 bits): any buffer would "hold" it.
  if (bytes < 0) return invalid(name, "cannot be sized for these shapes (its size overflows 64 bits)");
  if (!workspace) return invalid(name, fmt::format("is required ({} bytes)", bytes));
  if (workspace->dtype.code != kDLUInt || workspace->dtype.bits != 8 || !is_contiguous(*workspace))
    return invalid(name, "must be a contiguous uint8 tensor");
  if (element_count(*workspace) < bytes)
    return invalid(name, fmt::format("must hold at least {} bytes (got {})", bytes, element_count(*workspace)));
  if (data_address(*workspace) % 256 != 0) return invalid(name, "must be 256-byte aligned");
  return llvm::Error::success();
}

llvm::Error require_plan_limits(ArgName index_name, int64_t seq, ArgName table_name, int64_t table_rows) {
  if (seq > INT_MAX)
    return invalid(index_name, fmt::format("length must be <= {} for the backward (got {})", INT_MAX, seq));
  if (table_rows > kMaxPlanTableRows)
    return invalid(table_name, fmt::format("must have <= {} rows for the backward's segment plan (got {})",
                                           kMaxPlanTableRows, table_rows));
  return llvm::Error::success();
}

}  // namespace exactjit
