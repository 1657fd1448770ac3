// exactjit shared op rules and families (see op_rules.hpp).
#include "kernels/op_rules.hpp"

#include "codegen/op_row.hpp"
#include "kernels/catalog.hpp"

#include <fmt/format.h>

namespace exactjit {

RuleBreak row_op_rule(const KernelSpec& spec, int chunks) {
  if (spec.table_stride < chunks * spec.hidden)
    return {RuleSubject::TableStride,
            chunks == 1 ? fmt::format("row stride must be >= H = {} (got {})", spec.hidden, spec.table_stride)
                        : fmt::format("row stride must be >= {}H = {} (got {})", chunks, chunks * spec.hidden,
                                      spec.table_stride)};
  return backward_vec_rule(spec);
}

RuleBreak rms_norm_rule(const KernelSpec& spec) {
  if (spec.hidden % 4 != 0)
    return {RuleSubject::Sizes, fmt::format("hidden size must be a multiple of 4 (PyTorch's vectorized RMSNorm path, "
                                            "whose order exactjit reproduces; got {})", spec.hidden)};
  if (spec.table_stride != 0 && (spec.table_stride < spec.hidden || spec.table_stride % 4 != 0))
    return {RuleSubject::TableStride, fmt::format("row stride must be a multiple of 4 and >= H = {} (got {})",
                                                  spec.hidden, spec.table_stride)};
  if (spec.vec != 4)
    return {RuleSubject::Spec, fmt::format("rms_norm kernels move 4-element vectors (vec=4, got {})", spec.vec)};
  return {};
}

RuleBreak backward_vec_rule(const KernelSpec& spec) {
  const int wide = wide_vec(spec.dtype);
  if ((spec.vec != 1 && spec.vec != wide) || spec.hidden % spec.vec != 0 || spec.table_stride % spec.vec != 0)
    return {RuleSubject::Spec, fmt::format("vec must be 1 or {} and divide H = {} and the row stride {} (got {})", wide,
                                           spec.hidden, spec.table_stride, spec.vec)};
  return {};
}

RuleBreak table_stride_rule(const KernelSpec& spec) {
  if (spec.table_stride < spec.hidden)
    return {RuleSubject::TableStride,
            fmt::format("row stride must be >= H = {} (got {})", spec.hidden, spec.table_stride)};
  return {};
}

std::vector<KernelSpec> backward_vec_family(OpCode op, DType dtype, int64_t hidden, int64_t table_stride) {
  const int wide = wide_vec(dtype);
  std::vector<KernelSpec> specs;
  if (hidden % wide == 0 && table_stride % wide == 0)
    specs.push_back(make_spec(op, dtype, IndexType::I64, hidden, table_stride, wide));
  specs.push_back(make_spec(op, dtype, IndexType::I64, hidden, table_stride, 1));
  return specs;
}

std::vector<IndexType> index_types_for(int64_t table_stride) {
  if (table_stride > 0) return {IndexType::I64, IndexType::I32};
  return {IndexType::I64};
}

std::vector<KernelSpec> row_op_family(OpCode op, DType dtype, int64_t hidden, int64_t table_stride) {
  const int wide = wide_vec(dtype);
  std::vector<int> widths{1};
  if (hidden % wide == 0 && table_stride % wide == 0) widths.insert(widths.begin(), wide);
  std::vector<KernelSpec> specs;
  for (IndexType index : {IndexType::I64, IndexType::I32})
    for (int vec : widths) specs.push_back(make_spec(op, dtype, index, hidden, table_stride, vec));
  return specs;
}

std::vector<KernelSpec> h3_strides(OpCode op, DType dtype, std::initializer_list<int> strides_in_h) {
  std::vector<KernelSpec> specs;
  for (int stride : strides_in_h)
    for (const KernelSpec& spec : op_row(op).family_specs(rows_sizes(dtype, kDefaultHidden, stride * kDefaultHidden)))
      specs.push_back(spec);
  return specs;
}

}  // namespace exactjit
