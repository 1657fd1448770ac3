// exactjit rules and kernel families that several ops' rows share: written once here, used by the
// rows (kernels/op_table.cpp) and so by the planners' specs, the catalog, validate_spec and the CLI.
#pragma once

#include "codegen/kernel_spec.hpp"
#include "codegen/op_row.hpp"

#include <string>
#include <vector>

namespace exactjit {

/// The 16-byte vector width of a dtype, in elements.
inline int wide_vec(DType dtype) { return static_cast<int>(16 / dtype_size(dtype)); }

/// gate_residual and adaln_row_gather: the table row holds `chunks` rows of H, vec is 1 or 16
/// bytes and divides H and the stride.
RuleBreak row_op_rule(const KernelSpec& spec, int chunks);
/// Every kernel of rms_norm: H % 4 == 0, a stride of 0 (plain) or a multiple of 4 >= H,
/// 4-element vectors.
RuleBreak rms_norm_rule(const KernelSpec& spec);
/// The segment-tile backward kernels (gate_residual, adaln_row_gather): vec is 1 or 16 bytes and
/// divides H and the table stride.
RuleBreak backward_vec_rule(const KernelSpec& spec);
/// A gathered table view: its row stride is >= H.
RuleBreak table_stride_rule(const KernelSpec& spec);
/// A rule that every spec of the op keeps.
inline RuleBreak no_rule(const KernelSpec&) { return {}; }

/// The forward row ops: both index types, the 16-byte and the scalar width where they differ.
std::vector<KernelSpec> row_op_family(OpCode op, DType dtype, int64_t hidden, int64_t table_stride);
/// The segment-tile backward kernels: the 16-byte width where it divides, then the scalar one.
std::vector<KernelSpec> backward_vec_family(OpCode op, DType dtype, int64_t hidden, int64_t table_stride);
/// The catalog of a row whose H3 shapes are table strides: its family at H = 5376 for each
/// stride, given in multiples of H (0: the plain rms_norm, or no table).
std::vector<KernelSpec> h3_strides(OpCode op, DType dtype, std::initializer_list<int> strides_in_h);

/// The index types a modulated kernel (table stride > 0) can be called with; plain: int64 only.
std::vector<IndexType> index_types_for(int64_t table_stride);

}  // namespace exactjit
