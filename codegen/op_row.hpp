// exactjit's op table: one row per op, the one place an op is registered. A row says what the op
// is called, its stable op code, its family and role, how a spec of it is sized and described,
// how its source is assembled (templates and constants), the rules a spec of it must keep, the
// kernels a call of one shape can select, and how its index errors read. Each op's file under
// kernels/ defines its row next to its planner; kernels/op_table.cpp lists them. codegen/ and
// runtime/ reach an op only through its row (docs/adding-an-op.md).
#pragma once

#include "codegen/kernel_spec.hpp"

#include <llvm/ADT/ArrayRef.h>

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace exactjit {

/// What a kernel is for: an op's forward, one of its backward kernels, or the shared segment plan.
enum class OpRole : uint8_t { Forward, Backward, Plan };

/// Which of KernelSpec's size fields an op's specs set, and so how describe() writes them and which
/// flags name them.
enum class SpecShape : uint8_t {
  Rows,      ///< hidden size H, table stride, vector width, index type (weight, modulation)
  Channels,  ///< timestep_sinusoid: channels C
  Linear,    ///< det_linear and its backward: in_features K, out_features N, activation, row tile
  Plan,      ///< the segment plan kernels: index type (segment_count: its key tensors)
};

/// The size a broken rule is about, so that a planner can report it against the tensor that
/// carries that size (x for H, the table view for its stride).
enum class RuleSubject : uint8_t { Spec, Sizes, TableStride };

/// The first rule of an op that a spec breaks; an empty `rule` when it keeps them all.
struct RuleBreak {
  RuleSubject subject = RuleSubject::Spec;
  std::string rule;
  explicit operator bool() const { return !rule.empty(); }
};

/// What a device error record's value is: a bad index, or the bits of a float outside its range.
enum class ErrorValue : uint8_t { Index, FloatBits };

struct OpRow {
  OpCode op;  ///< its stable code: the error records' and the kOpCode constant's
  std::string_view name;
  OpRole role;
  std::string_view family;  ///< the op family `exactjit --help` lists it under
  SpecShape shape;
  /// describe() says "weight=no" for an unweighted spec too (rms_norm), not only "weight=yes".
  bool describes_weight;
  /// Geometry that is the op's, not the spec's (codegen/geometry.hpp): the rows of H one table
  /// row holds (adaln_row_gather: 6); the threads per block of a backward or plan kernel; the
  /// rows a backward tile kernel loads before adding any (speed only, never bits).
  int row_chunks;
  int threads;
  int row_unroll;
  /// The kernel's index arguments as error records name them (argument 0 and 1).
  std::array<std::string_view, 2> index_arguments;
  ErrorValue error_value;
  /// What a FloatBits value must be, e.g. "a finite value in [0, 1] (check_range)".
  std::string_view value_rule;
  /// The op's own templates, after the shared prelude, in order.
  std::vector<std::string_view> (*templates)(const KernelSpec&);
  /// The `namespace spec` constant block of its generated source.
  std::string (*constants)(const KernelSpec&);
  /// The first of the op's own rules the spec breaks (validate_spec checks the size
  /// caps and the arch floor first).
  RuleBreak (*rule)(const KernelSpec&);
  /// The kernels a call of one shape can select (target unset): the catalog, the CLI and prewarm
  /// build these. `sizes` carries the dtype and the size fields of the row's SpecShape (Rows:
  /// hidden, table_stride; Channels: channels; Linear: in_features, out_features); the per-call
  /// choices (index type, vector width, row tile, activation) are the family's to enumerate.
  std::vector<KernelSpec> (*family_specs)(const KernelSpec& sizes);
  /// This row's kernels in exactjit's default catalog (MiniMax-H3's shapes, H = 5376) for one dtype
  /// (targets unset); empty where the model runs none in that dtype.
  std::vector<KernelSpec> (*catalog)(DType dtype);
  /// The family's line in `exactjit --help`, on the first row of each family in the op table: the
  /// flags that size it, what it computes, and the table stride the CLI assumes when none is given,
  /// in H (the block's 6H AdaLN chunk; rms_norm: 0, the plain norm). Empty on the other rows.
  std::string_view family_sizes = {};
  std::string_view family_summary = {};
  int default_stride_in_h = 0;
  /// Whether a call of `rows` rows runs this kernel of the row's family (det_linear's backward
  /// kernels are compiled per row tile); null: a call of any rows does.
  bool (*serves_rows)(const KernelSpec& spec, int64_t rows) = nullptr;
};

/// Every op's row, in the order `exactjit --help` lists them.
llvm::ArrayRef<const OpRow*> op_table();
/// The row of an op (every Op has one).
const OpRow& op_row(OpCode op);
/// The row whose stable code is `code`, or null.
const OpRow* op_row_by_code(unsigned code);

}  // namespace exactjit
