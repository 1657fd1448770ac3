// exactjit kernel specification: the plain value that names one specialised kernel.
//
// A KernelSpec holds every compile-time constant of a kernel (op, dtype, its sizes, vector width,
// index type, target). Each size has its own field; an op sets those its shape names
// (OpRow::shape) and leaves the others 0. Two calls with equal specs run the same cubin; run-time
// values (row counts, pointers) never appear here. Specs are cheap to copy, hash and compare,
// because the launch hot path looks them up on every call.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace exactjit {

/// An op's identity: its stable code. Error records and the kOpCode constant of every generated
/// source carry it (so every cache key does): never reused or renumbered. Each op's header names
/// its codes in namespace Op (callers write Op::<Name>), and its row in the op table
/// (codegen/op_row.hpp) holds everything else about it.
enum class OpCode : uint8_t {};
inline constexpr unsigned op_code(OpCode op) { return static_cast<unsigned>(op); }
enum class DType : uint8_t { F32 = 0, BF16 = 1, F16 = 2 };  // values match templates' StorageOf
enum class IndexType : uint8_t { I32, I64 };

/// A compilation target: a real architecture (cubin) or a virtual one (PTX, for devices newer
/// than the loaded NVRTC knows; the driver finishes the compile).
struct Target {
  int sm = 90;       ///< e.g. 90 for sm_90
  bool ptx = false;  ///< compile to PTX for compute_<sm> instead of a cubin
  bool operator==(const Target& o) const { return sm == o.sm && ptx == o.ptx; }
  std::string name() const;  ///< "sm_90" or "compute_90"
};

struct KernelSpec {
  OpCode op{};  ///< 0: none yet (make_spec, parse_spec or a row's family give one)
  DType dtype = DType::BF16;
  IndexType index = IndexType::I64;
  // SpecShape::Rows: the row ops and their backward.
  int64_t hidden = 0;        ///< H, the row length
  int64_t table_stride = 0;  ///< row stride of the table view, in elements (rms_norm: 0 = plain)
  int vec = 1;               ///< elements per memory access (16 bytes / element size, or 1)
  bool weighted = false;     ///< rms_norm: multiplies by a weight vector
  bool modulated = false;    ///< gate_residual_rms_norm: the norm is AdaLN-modulated (rms_norm: table_stride > 0)
  // SpecShape::Channels: timestep_sinusoid and its backward.
  int64_t channels = 0;      ///< C
  // SpecShape::Linear: det_linear and its backward.
  int64_t in_features = 0;   ///< K
  int64_t out_features = 0;  ///< N
  bool silu = false;         ///< SiLU (fp32: on the output; bf16: on the input)
  int row_tile = 0;          ///< rows per launch tile
  DType grad_dtype = DType::F32;  ///< backward, bf16 weights: the incoming gradient's dtype (bf16 or fp32)
  // SpecShape::Plan: the segment plan kernels.
  int key_tensors = 0;       ///< segment_count: index tensors combined into one key (1 or 2)
  Target target;

  bool operator==(const KernelSpec& o) const {
    return op == o.op && dtype == o.dtype && index == o.index && hidden == o.hidden &&
           table_stride == o.table_stride && vec == o.vec && weighted == o.weighted && modulated == o.modulated &&
           channels == o.channels && in_features == o.in_features && out_features == o.out_features &&
           silu == o.silu && row_tile == o.row_tile && grad_dtype == o.grad_dtype && key_tensors == o.key_tensors &&
           target == o.target;
  }
  /// Canonical, human-readable description, e.g.
  /// "gate_residual dtype=bf16 hidden=5376 table_stride=32256 vec=8 index=int64 target=sm_90".
  /// parse_spec reads it back.
  std::string describe() const;
  /// Readable identifier stem, e.g. "gate_residual_bf16_h5376_ts32256_v8_i64_sm90".
  std::string stem() const;
};

/// A spec of a row op (SpecShape::Rows); the runtime fills in the target per device.
KernelSpec make_spec(OpCode op, DType dtype, IndexType index, int64_t hidden, int64_t table_stride, int vec,
                     bool weighted = false);
/// A call's sizes: the dtype and the size fields of one SpecShape, which spec_family (and an op
/// row's family_specs) expand into the kernels the call can select.
KernelSpec rows_sizes(DType dtype, int64_t hidden, int64_t table_stride);
KernelSpec channels_sizes(int64_t channels);
KernelSpec linear_sizes(DType dtype, int64_t in_features, int64_t out_features);
/// A spec of a segment plan kernel (SpecShape::Plan): `key_tensors` is 0 for all but segment_count.
KernelSpec make_plan_spec(OpCode op, DType dtype, IndexType index, int key_tensors = 0);

struct KernelSpecHash {
  size_t operator()(const KernelSpec& s) const noexcept;
};

std::string_view op_name(OpCode op);
/// The name of an op's index argument as kernels report it (templates/error_record.cuh: the
/// error record's op field carries the op code in its low 16 bits and the argument above).
std::string_view index_argument_name(OpCode op, unsigned argument);
std::string_view dtype_name(DType dtype);
std::string_view index_type_name(IndexType index);
size_t dtype_size(DType dtype);
std::optional<OpCode> parse_op(std::string_view text);
std::optional<DType> parse_dtype(std::string_view text);
std::optional<IndexType> parse_index_type(std::string_view text);
/// The spec a describe() text stands for; nullopt for any other text (non-canonical included).
std::optional<KernelSpec> parse_spec(std::string_view text);
/// Parses "sm_90", "90", "compute_90".
std::optional<Target> parse_target(std::string_view text);

}  // namespace exactjit
