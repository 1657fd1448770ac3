// exactjit host-side tensor validation: the rules every op applies to its DLTensor arguments, with
// messages that name the op, the argument and the rule ("gate_residual: gate must have unit column
// stride (got stride 2)").
#pragma once

#include "codegen/kernel_spec.hpp"
#include "codegen/op_row.hpp"

#include <dlpack/dlpack.h>
#include <llvm/ADT/ArrayRef.h>
#include <llvm/Support/Error.h>

#include <cstdint>
#include <string_view>

namespace exactjit {

/// Names an argument of an op for messages: "<op>: <arg> ...". Taken by reference: the checks
/// read it only to report a failure, and copying it into every call was measurable per launch.
struct ArgName {
  std::string_view op;
  std::string_view arg;
};

llvm::Error invalid(const ArgName& name, const std::string& rule);

int64_t element_count(const DLTensor& t);
/// Row-major compact (strides may be null); size-1 dimensions may have any stride.
bool is_contiguous(const DLTensor& t);
/// The address of element 0.
inline uint64_t data_address(const DLTensor& t) {
  return reinterpret_cast<uint64_t>(t.data) + t.byte_offset;
}
inline int64_t stride_of(const DLTensor& t, int dim) {
  if (t.strides) return t.strides[dim];
  int64_t stride = 1;
  for (int d = t.ndim - 1; d > dim; --d) stride *= t.shape[d];
  return stride;
}

/// A CUDA tensor (kDLCUDA) with a non-null pointer aligned to its element size.
llvm::Error require_cuda(const ArgName& name, const DLTensor& t);
struct NamedTensor {
  std::string_view name;
  const DLTensor* tensor;
};

/// require_cuda for every tensor, and all on the first one's device.
llvm::Error require_cuda_on_one_device(std::string_view op, llvm::ArrayRef<NamedTensor> tensors);

/// The storage dtype of a floating-point tensor (bf16, fp16, fp32, one lane).
llvm::Expected<DType> float_dtype(const ArgName& name, const DLTensor& t);
/// The index type of an int32/int64 tensor.
llvm::Expected<IndexType> index_dtype(const ArgName& name, const DLTensor& t);
std::string shape_string(const DLTensor& t);
/// Byte ranges [address, address + extent) of two tensors intersect.
bool overlaps(const DLTensor& a, const DLTensor& b);

/// No tensor named in `written` (an output or a workspace) overlaps another argument, another
/// output included. Arguments are told apart by name, not by pointer: one DLTensor passed for two
/// arguments overlaps itself and is refused.
llvm::Error require_disjoint_outputs(std::string_view op, llvm::ArrayRef<NamedTensor> tensors,
                                     llvm::ArrayRef<std::string_view> written);

/// The rules of the spec's op (its row's, written once there) for a spec a planner built from the
/// tensors, reported against the tensor that carries the size a rule is about: `sizes` (H, K, C)
/// or `table` (the row stride).
llvm::Error require_row_rules(const KernelSpec& spec, const ArgName& sizes, const ArgName& table);

/// 16 / element size when H, the table stride and every non-null tensor's address allow 16-byte
/// packs, else 1 (the scalar specialisation).
int pack_width(DType dtype, int64_t hidden, int64_t table_stride, std::initializer_list<const DLTensor*> tensors);

}  // namespace exactjit
