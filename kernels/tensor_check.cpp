// exactjit host-side tensor validation (see tensor_check.hpp).
#include "kernels/tensor_check.hpp"

#include "runtime/errors.hpp"

#include <fmt/format.h>

namespace exactjit {
namespace {
constexpr int kMaxDims = 8;
}  // namespace

llvm::Error invalid(const ArgName& name, const std::string& rule) {
  return make_error(ErrorCode::InvalidArgument, fmt::format("{}: {} {}", name.op, name.arg, rule));
}

llvm::Error require_row_rules(const KernelSpec& spec, const ArgName& sizes, const ArgName& table) {
  const RuleBreak broken = op_row(spec.op).rule(spec);
  if (!broken) return llvm::Error::success();
  return invalid(broken.subject == RuleSubject::TableStride ? table : sizes, broken.rule);
}

int64_t element_count(const DLTensor& t) {
  int64_t count = 1;
  for (int d = 0; d < t.ndim; ++d) count *= t.shape[d];
  return count;
}

bool is_contiguous(const DLTensor& t) {
  if (!t.strides) return true;
  int64_t expected = 1;
  for (int d = t.ndim - 1; d >= 0; --d) {
    if (t.shape[d] != 1 && t.strides[d] != expected) return false;
    expected *= t.shape[d];
  }
  return true;
}

std::string shape_string(const DLTensor& t) {
  std::string text = "(";
  for (int d = 0; d < t.ndim; ++d) text += fmt::format("{}{}", d ? ", " : "", t.shape[d]);
  return text + (t.ndim == 1 ? ",)" : ")");
}

llvm::Error require_cuda(const ArgName& name, const DLTensor& t) {
  if (t.device.device_type != kDLCUDA)
    return invalid(name, fmt::format("must be a CUDA device tensor (DLPack device type {}, got {})",
                                     static_cast<int>(kDLCUDA), static_cast<int>(t.device.device_type)));
  if (t.ndim < 0 || (t.ndim > 0 && !t.shape)) return invalid(name, "has no shape");
  if (t.ndim > kMaxDims) return invalid(name, fmt::format("has {} dimensions (at most {})", t.ndim, kMaxDims));
  int64_t count = 1;
  for (int d = 0; d < t.ndim; ++d) {
    if (t.shape[d] < 0) return invalid(name, fmt::format("has a negative dimension {}", shape_string(t)));
    if (__builtin_mul_overflow(count, t.shape[d], &count))
      return invalid(name, fmt::format("has more elements than 64 bits can count {}", shape_string(t)));
  }
  // Every later rule (alignment, overlap, extents) computes with the element size: a dtype of 0
  // lanes or 0 bits would make it 0 and let the tensor skip them.
  if (t.dtype.lanes != 1 || t.dtype.bits == 0 || t.dtype.bits % 8 != 0)
    return invalid(name, fmt::format("must have one lane of whole bytes (DLPack bits {} lanes {})", t.dtype.bits,
                                     t.dtype.lanes));
  uint64_t address = 0;
  if (__builtin_add_overflow(reinterpret_cast<uint64_t>(t.data), t.byte_offset, &address))
    return invalid(name, "has data + byte_offset beyond 64 bits");
  const unsigned element_bytes = t.dtype.bits / 8;
  if (count > 0) {
    // Every byte the tensor spans must be addressable without overflow: later rules (overlap,
    // alignment, row strides) compute with these offsets.
    int64_t last = 0;
    for (int d = 0; d < t.ndim; ++d) {
      const int64_t stride = stride_of(t, d);
      if (stride < 0) return invalid(name, "has a negative stride (not supported)");
      int64_t step = 0;
      if (__builtin_mul_overflow(t.shape[d] - 1, stride, &step) || __builtin_add_overflow(last, step, &last))
        return invalid(name, "spans more memory than 64 bits can address");
    }
    int64_t bytes = 0;
    uint64_t end = 0;
    if (__builtin_mul_overflow(last + 1, static_cast<int64_t>(element_bytes), &bytes) ||
        __builtin_add_overflow(data_address(t), static_cast<uint64_t>(bytes), &end))
      return invalid(name, "spans more memory than 64 bits can address");
    if (address == 0) return invalid(name, "has a null data pointer (data + byte_offset)");
  }
  if (element_bytes > 0 && data_address(t) % element_bytes != 0)
    return invalid(name, fmt::format("must be aligned to its element size ({} bytes)", element_bytes));
  return llvm::Error::success();
}

llvm::Error require_cuda_on_one_device(std::string_view op, llvm::ArrayRef<NamedTensor> tensors) {
  for (const NamedTensor& t : tensors)
    if (auto err = require_cuda({op, t.name}, *t.tensor)) return err;
  const NamedTensor& first = tensors.front();
  for (const NamedTensor& t : tensors)
    if (t.tensor->device.device_id != first.tensor->device.device_id)
      return invalid({op, t.name}, fmt::format("is on CUDA device {} but {} is on device {}",
                                               t.tensor->device.device_id, first.name, first.tensor->device.device_id));
  return llvm::Error::success();
}

llvm::Expected<DType> float_dtype(const ArgName& name, const DLTensor& t) {
  if (t.dtype.lanes == 1) {
    if (t.dtype.code == kDLFloat && t.dtype.bits == 32) return DType::F32;
    if (t.dtype.code == kDLFloat && t.dtype.bits == 16) return DType::F16;
    if (t.dtype.code == kDLBfloat && t.dtype.bits == 16) return DType::BF16;
  }
  return invalid(name, fmt::format("must be bfloat16, float16 or float32 (DLPack code {} bits {} lanes {})",
                                   t.dtype.code, t.dtype.bits, t.dtype.lanes));
}

llvm::Expected<IndexType> index_dtype(const ArgName& name, const DLTensor& t) {
  if (t.dtype.lanes == 1 && t.dtype.code == kDLInt) {
    if (t.dtype.bits == 32) return IndexType::I32;
    if (t.dtype.bits == 64) return IndexType::I64;
  }
  return invalid(name, fmt::format("must be int32 or int64 (DLPack code {} bits {} lanes {})", t.dtype.code,
                                   t.dtype.bits, t.dtype.lanes));
}

bool overlaps(const DLTensor& a, const DLTensor& b) {
  auto extent = [](const DLTensor& t) -> uint64_t {
    if (element_count(t) == 0) return 0;
    int64_t last = 0;  // offset of the last element, in elements
    for (int d = 0; d < t.ndim; ++d) last += (t.shape[d] - 1) * stride_of(t, d);
    return static_cast<uint64_t>(last + 1) * ((t.dtype.bits * t.dtype.lanes + 7) / 8);
  };
  const uint64_t a0 = data_address(a), a1 = a0 + extent(a);
  const uint64_t b0 = data_address(b), b1 = b0 + extent(b);
  return a0 < b1 && b0 < a1 && a1 > a0 && b1 > b0;
}

llvm::Error require_disjoint_outputs(std::string_view op, llvm::ArrayRef<NamedTensor> tensors,
                                     llvm::ArrayRef<std::string_view> written) {
  for (const NamedTensor& out : tensors) {
    if (llvm::find(written, out.name) == written.end()) continue;
    for (const NamedTensor& other : tensors)
      if (other.name != out.name && overlaps(*out.tensor, *other.tensor))
        return invalid({op, other.name}, fmt::format("must not overlap {}", out.name));
  }
  return llvm::Error::success();
}

int pack_width(DType dtype, int64_t hidden, int64_t table_stride, std::initializer_list<const DLTensor*> tensors) {
  const int wide = static_cast<int>(16 / dtype_size(dtype));
  if (hidden % wide != 0 || table_stride % wide != 0) return 1;
  for (const DLTensor* t : tensors)
    if (t && data_address(*t) % 16 != 0) return 1;
  return wide;
}

}  // namespace exactjit
