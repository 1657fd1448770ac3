// exactjit kernel specification: names, parsing and hashing of KernelSpec.
#include "codegen/kernel_spec.hpp"

#include "codegen/op_row.hpp"

#include <fmt/format.h>

#include <charconv>
#include <utility>

namespace exactjit {

std::string Target::name() const { return fmt::format("{}_{}", ptx ? "compute" : "sm", sm); }

std::string_view op_name(OpCode op) { return op_row(op).name; }

std::string_view index_argument_name(OpCode op, unsigned argument) {
  return op_row(op).index_arguments[argument == 0 ? 0 : 1];
}

std::string_view dtype_name(DType dtype) {
  switch (dtype) {
    case DType::F32: return "fp32";
    case DType::BF16: return "bf16";
    case DType::F16: return "fp16";
  }
  return "unknown";
}

std::string_view index_type_name(IndexType index) {
  return index == IndexType::I32 ? "int32" : "int64";
}

size_t dtype_size(DType dtype) { return dtype == DType::F32 ? 4 : 2; }

std::optional<OpCode> parse_op(std::string_view text) {
  for (const OpRow* row : op_table())
    if (row->name == text) return row->op;
  return std::nullopt;
}

std::optional<DType> parse_dtype(std::string_view text) {
  if (text == "fp32" || text == "float32") return DType::F32;
  if (text == "bf16" || text == "bfloat16") return DType::BF16;
  if (text == "fp16" || text == "float16") return DType::F16;
  return std::nullopt;
}

std::optional<IndexType> parse_index_type(std::string_view text) {
  if (text == "int32" || text == "i32") return IndexType::I32;
  if (text == "int64" || text == "i64") return IndexType::I64;
  return std::nullopt;
}

std::optional<Target> parse_target(std::string_view text) {
  Target target;
  if (text.rfind("sm_", 0) == 0) {
    text.remove_prefix(3);
  } else if (text.rfind("compute_", 0) == 0) {
    text.remove_prefix(8);
    target.ptx = true;
  }
  int sm = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), sm);
  if (ec != std::errc() || end != text.data() + text.size() || sm < 10 || sm > 1000) return std::nullopt;
  target.sm = sm;
  return target;
}

KernelSpec make_spec(OpCode op, DType dtype, IndexType index, int64_t hidden, int64_t table_stride, int vec,
                     bool weighted) {
  KernelSpec spec;
  spec.op = op;
  spec.dtype = dtype;
  spec.index = index;
  spec.hidden = hidden;
  spec.table_stride = table_stride;
  spec.vec = vec;
  spec.weighted = weighted;
  return spec;
}

KernelSpec make_plan_spec(OpCode op, DType dtype, IndexType index, int key_tensors) {
  KernelSpec spec = make_spec(op, dtype, index, 0, 0, 1);
  spec.key_tensors = key_tensors;
  return spec;
}

// Sizes leave the op (spec_family names it) and the per-call choices at their defaults.
KernelSpec rows_sizes(DType dtype, int64_t hidden, int64_t table_stride) {
  return make_spec(KernelSpec{}.op, dtype, IndexType::I64, hidden, table_stride, 1);
}

KernelSpec channels_sizes(int64_t channels) {
  KernelSpec sizes = rows_sizes(DType::F32, 0, 0);
  sizes.channels = channels;
  return sizes;
}

KernelSpec linear_sizes(DType dtype, int64_t in_features, int64_t out_features) {
  KernelSpec sizes = rows_sizes(dtype, 0, 0);
  sizes.in_features = in_features;
  sizes.out_features = out_features;
  return sizes;
}

std::string KernelSpec::describe() const {
  const OpRow& row = op_row(op);
  switch (row.shape) {
    case SpecShape::Linear:
      return fmt::format("{} dtype={} in_features={} out_features={} activation={} rows={}{} target={}", op_name(op),
                         dtype_name(dtype), in_features, out_features, silu ? "silu" : "none", row_tile,
                         grad_dtype == DType::F32 ? "" : fmt::format(" grad={}", dtype_name(grad_dtype)),
                         target.name());
    case SpecShape::Channels:
      return fmt::format("{} dtype={} channels={} target={}", op_name(op), dtype_name(dtype), channels, target.name());
    case SpecShape::Plan:
      return fmt::format("{} dtype={}{} index={} target={}", op_name(op), dtype_name(dtype),
                         key_tensors ? fmt::format(" keys={}", key_tensors) : "", index_type_name(index),
                         target.name());
    case SpecShape::Rows: break;
  }
  return fmt::format("{} dtype={} hidden={} table_stride={} vec={} index={} target={}{}{}", op_name(op),
                     dtype_name(dtype), hidden, table_stride, vec, index_type_name(index), target.name(),
                     weighted ? " weight=yes" : (row.describes_weight ? " weight=no" : ""),
                     modulated ? " modulation=yes" : "");
}

std::optional<KernelSpec> parse_spec(std::string_view text) {
  auto split = [](std::string_view rest, char by) {
    const size_t at = rest.find(by);
    return std::pair{rest.substr(0, at), at == std::string_view::npos ? std::string_view{} : rest.substr(at + 1)};
  };
  auto number = [](std::string_view value, auto& out) {
    auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), out);
    return ec == std::errc() && end == value.data() + value.size();
  };
  auto [name, rest] = split(text, ' ');
  const std::optional<OpCode> op = parse_op(name);
  if (!op) return std::nullopt;
  KernelSpec spec;
  spec.op = *op;
  bool have_target = false;
  while (!rest.empty()) {
    auto [field, next] = split(rest, ' ');
    rest = next;
    auto [key, value] = split(field, '=');
    bool ok = true;
    if (key == "dtype") {
      const std::optional<DType> dtype = parse_dtype(value);
      ok = dtype.has_value();
      if (ok) spec.dtype = *dtype;
    } else if (key == "grad") {
      const std::optional<DType> dtype = parse_dtype(value);
      ok = dtype.has_value();
      if (ok) spec.grad_dtype = *dtype;
    } else if (key == "index") {
      const std::optional<IndexType> index = parse_index_type(value);
      ok = index.has_value();
      if (ok) spec.index = *index;
    } else if (key == "target") {
      const std::optional<Target> target = parse_target(value);
      ok = have_target = target.has_value();
      if (ok) spec.target = *target;
    } else if (key == "hidden") {
      ok = number(value, spec.hidden);
    } else if (key == "channels") {
      ok = number(value, spec.channels);
    } else if (key == "in_features") {
      ok = number(value, spec.in_features);
    } else if (key == "keys") {
      ok = number(value, spec.key_tensors);
    } else if (key == "table_stride") {
      ok = number(value, spec.table_stride);
    } else if (key == "out_features") {
      ok = number(value, spec.out_features);
    } else if (key == "vec") {
      ok = number(value, spec.vec);
    } else if (key == "rows") {
      ok = number(value, spec.row_tile);
    } else if (key == "activation") {
      ok = value == "silu" || value == "none";
      spec.silu = value == "silu";
    } else if (key == "weight") {
      ok = value == "yes" || value == "no";
      spec.weighted = value == "yes";
    } else if (key == "modulation") {
      ok = value == "yes";
      spec.modulated = true;
    } else {
      ok = false;
    }
    if (!ok) return std::nullopt;
  }
  // Canonical text only: a spec reads back exactly as describe() wrote it.
  if (!have_target || spec.describe() != text) return std::nullopt;
  return spec;
}

std::string KernelSpec::stem() const {
  const std::string_view arch = target.ptx ? "compute" : "sm";
  switch (op_row(op).shape) {
    case SpecShape::Linear:
      return fmt::format("{}_{}_k{}_n{}_{}_r{}{}_{}{}", op_name(op), dtype_name(dtype), in_features, out_features,
                         silu ? "silu" : "none", row_tile, grad_dtype == DType::F32 ? "" : "_gbf16", arch, target.sm);
    case SpecShape::Channels:
      return fmt::format("{}_{}_c{}_{}{}", op_name(op), dtype_name(dtype), channels, arch, target.sm);
    case SpecShape::Plan:
      return fmt::format("{}_{}{}_{}_{}{}", op_name(op), dtype_name(dtype),
                         key_tensors ? fmt::format("_k{}", key_tensors) : "",
                         index == IndexType::I32 ? "i32" : "i64", arch, target.sm);
    case SpecShape::Rows: break;
  }
  return fmt::format("{}_{}_h{}_ts{}_v{}_{}_{}{}{}{}", op_name(op), dtype_name(dtype), hidden,
                     table_stride, vec, index == IndexType::I32 ? "i32" : "i64",
                     arch, target.sm, weighted ? "_w" : "", modulated ? "_m" : "");
}

size_t KernelSpecHash::operator()(const KernelSpec& s) const noexcept {
  // The hot path hashes a spec on every call: one multiply per 64-bit word of fields, not per
  // byte, then a murmur3 finalizer so every field reaches the low bits.
  uint64_t h = 1469598103934665603ull;
  auto mix = [&h](uint64_t v) { h = (h ^ v) * 0x9E3779B97F4A7C15ull; };
  mix(static_cast<uint64_t>(s.op) | static_cast<uint64_t>(s.dtype) << 8 |
      static_cast<uint64_t>(s.index) << 16 | static_cast<uint64_t>(s.target.ptx) << 24 |
      static_cast<uint64_t>(s.weighted) << 32 | static_cast<uint64_t>(s.modulated) << 40);
  mix(static_cast<uint64_t>(s.hidden) ^ static_cast<uint64_t>(s.channels) << 32 ^
      static_cast<uint64_t>(s.key_tensors) << 60);
  mix(static_cast<uint64_t>(s.table_stride));
  mix(static_cast<uint64_t>(s.vec) << 32 | static_cast<uint32_t>(s.target.sm));
  mix(static_cast<uint64_t>(s.in_features) << 24 ^ static_cast<uint64_t>(s.out_features) ^
      static_cast<uint64_t>(s.silu) << 62 ^ static_cast<uint64_t>(s.row_tile) << 48 ^
      static_cast<uint64_t>(s.grad_dtype) << 56);
  h ^= h >> 33;
  h *= 0xFF51AFD7ED558CCDull;
  h ^= h >> 33;
  return static_cast<size_t>(h);
}

}  // namespace exactjit
