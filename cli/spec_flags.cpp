// exactjit command line: spec flags, --manifest (a spec list or a JSON array) and the targets.
#include "cli/commands.hpp"
#include "cli/json_output.hpp"
#include "cli/options.hpp"

#include "codegen/op_row.hpp"
#include "kernels/catalog.hpp"
#include "kernels/op_families.hpp"
#include "kernels/spec_limits.hpp"
#include "runtime/bounded_input.hpp"
#include "runtime/driver.hpp"
#include "runtime/errors.hpp"
#include "runtime/spec_list.hpp"

#include <fmt/format.h>
#include <llvm/ADT/STLExtras.h>
#include <llvm/Support/JSON.h>

#include <algorithm>
#include <unordered_set>

namespace exactjit::cli {
namespace {

llvm::Error usage(const std::string& message) { return make_error(ErrorCode::InvalidArgument, message); }

constexpr uint64_t kMaxManifestBytes = 16 << 20;  // a prewarm manifest: thousands of specs fit

struct FamilyRequest {
  std::string where;  // "manifest F: element k", whose sizes are required; empty: flags, whose defaults apply
  std::string op = "gate_residual";
  int64_t hidden = 0;
  std::string dtype;  // empty: all
  int64_t table_stride = 0;
  int64_t channels = 0;
  int64_t in_features = 0, out_features = 0;  // det_linear
  std::string activation;                     // det_linear: none | silu; empty: both
  std::string arch;
};

// det_linear weight dtypes: the one asked for, else `all`; fp16 weights have no kernel.
llvm::Expected<std::vector<DType>> det_linear_dtypes(const std::string& asked, std::vector<DType> all) {
  if (asked.empty()) return all;
  const std::optional<DType> dtype = parse_dtype(asked);
  if (!dtype || *dtype == DType::F16)
    return usage(fmt::format("det_linear weights are bf16 or fp32 (got '{}')", asked));
  return std::vector<DType>{*dtype};
}

// A size the request leaves out (0): the flag's default on the command line; a manifest names
// every size its op needs, so no model's shape is filled in behind its author's back.
llvm::Expected<int64_t> size_or_default(const FamilyRequest& request, std::string_view field, int64_t value,
                                        int64_t fallback) {
  if (value) return value;
  if (request.where.empty()) return fallback;
  return usage(fmt::format("{} needs \"{}\" (a positive integer)", request.op, field));
}

// The dtypes asked for: one, or all three when none is named.
llvm::Expected<std::vector<DType>> dtypes_asked(const std::string& asked) {
  if (asked.empty()) return std::vector<DType>{DType::BF16, DType::F16, DType::F32};
  const std::optional<DType> dtype = parse_dtype(asked);
  if (!dtype) return usage(fmt::format("unknown dtype '{}' (bf16, fp16, fp32)", asked));
  return std::vector<DType>{*dtype};
}

// A size the op's shape does not take is an error, not silently ignored.
llvm::Error require_shape_sizes(const FamilyRequest& request, const OpRow& row) {
  const struct {
    std::string_view name;
    int64_t value;
    bool taken;
  } sizes[] = {
      {"hidden", request.hidden, row.shape == SpecShape::Rows},
      {"table_stride", request.table_stride, row.shape == SpecShape::Rows},
      {"channels", request.channels, row.shape == SpecShape::Channels},
      {"in_features", request.in_features, row.shape == SpecShape::Linear},
      {"out_features", request.out_features, row.shape == SpecShape::Linear},
  };
  for (const auto& size : sizes) {
    if (size.value == 0 || size.taken) continue;
    std::string flag = fmt::format("--{}", size.name);
    std::replace(flag.begin(), flag.end(), '_', '-');
    // A manifest's element names the field (the caller prefixes where it is); flags name the flag.
    return usage(fmt::format("{} does not size {} (its sizes: {})",
                             request.where.empty() ? flag : fmt::format("\"{}\"", size.name), row.name,
                             op_family(row.op).sizes));
  }
  return llvm::Error::success();
}

llvm::Expected<std::vector<KernelSpec>> expand(const FamilyRequest& request, const Target& fallback) {
  const std::optional<OpCode> op = parse_op(request.op);
  if (!op)
    return usage(fmt::format("unknown op '{}' (known: {})", request.op, op_names()));
  Target target = fallback;
  if (!request.arch.empty()) {
    const std::optional<Target> parsed = parse_target(request.arch);
    if (!parsed) return usage(fmt::format("bad arch '{}' (expected sm_90, compute_90 or 90)", request.arch));
    target = *parsed;
  }
  const OpRow& row = op_row(*op);
  if (auto err = require_shape_sizes(request, row)) return err;
  if (row.shape == SpecShape::Channels) {  // fp32 only, sized by its channels
    if (!request.dtype.empty() && parse_dtype(request.dtype) != DType::F32)
      return usage(fmt::format("{} is fp32 only", row.name));
    auto channels = size_or_default(request, "channels", request.channels, kSinusoidChannels);
    if (!channels) return channels.takeError();
    if (std::string rule = cap_rule(kChannelsCap, *channels); !rule.empty()) return usage(rule);
    const std::vector<KernelSpec> specs = spec_family(*op, channels_sizes(*channels), target);
    if (auto err = validate_spec(specs.front())) return err;
    return specs;
  }
  if (row.shape == SpecShape::Plan) {  // sized by the backward kernels: every key count and index type
    auto dtypes = dtypes_asked(request.dtype);
    if (!dtypes) return dtypes.takeError();
    std::vector<KernelSpec> specs;
    for (DType dtype : *dtypes) {
      KernelSpec sizes;
      sizes.dtype = dtype;
      for (const KernelSpec& spec : spec_family(*op, sizes, target))
        if (!llvm::is_contained(specs, spec)) specs.push_back(spec);  // the dtype-free kernels are fp32's
    }
    return specs;
  }
  if (row.shape == SpecShape::Linear) {
    // det_linear's --activation: the SiLU settings asked for (both when none is named).
    std::vector<bool> activations = {false, true};
    if (request.activation == "silu") activations = {true};
    else if (request.activation == "none") activations = {false};
    else if (!request.activation.empty())
      return usage(fmt::format("unknown activation '{}' (none, silu)", request.activation));
    // Defaults: the H3 AdaLN projection (2688 -> 18 x 5376); the forward in bf16, the backward
    // for bf16 and fp32 weights (the fold: bf16 only).
    const bool forward = row.role == OpRole::Forward;
    auto dtypes = det_linear_dtypes(request.dtype, forward ? std::vector<DType>{DType::BF16}
                                                           : std::vector<DType>{DType::BF16, DType::F32});
    if (!dtypes) return dtypes.takeError();
    auto k = size_or_default(request, "in_features", request.in_features, kTimeEmbedDim);
    if (!k) return k.takeError();
    auto n = size_or_default(request, "out_features", request.out_features, 18 * kDefaultHidden);
    if (!n) return n.takeError();
    std::vector<KernelSpec> specs;
    for (DType dtype : *dtypes)
      for (const KernelSpec& spec : spec_family(*op, linear_sizes(dtype, *k, *n), target)) {
        if (!llvm::is_contained(activations, spec.silu)) continue;
        if (auto err = validate_spec(spec)) return err;
        specs.push_back(spec);
      }
    if (specs.empty()) return usage(fmt::format("{} has no {} kernel", request.op, request.dtype));
    return specs;
  }
  auto hidden = size_or_default(request, "hidden", request.hidden, kDefaultHidden);
  if (!hidden) return hidden.takeError();
  // Capped before any arithmetic: 6 x hidden of a 64-bit H overflows (undefined behaviour).
  if (std::string rule = cap_rule(kHiddenCap, *hidden); !rule.empty()) return usage(rule);
  // rms_norm without a table stride is the plain norm; the table ops default to the block's 6H.
  const int64_t stride =
      request.table_stride ? request.table_stride : op_family(*op).default_stride_in_h * *hidden;
  auto dtypes = dtypes_asked(request.dtype);
  if (!dtypes) return dtypes.takeError();
  std::vector<KernelSpec> specs;
  for (DType dtype : *dtypes) {
    for (const KernelSpec& spec : spec_family(*op, rows_sizes(dtype, *hidden, stride), target)) {
      if (auto err = validate_spec(spec)) return err;
      specs.push_back(spec);
    }
  }
  return specs;
}

llvm::Expected<std::vector<FamilyRequest>> read_json_manifest(const std::string& text, const std::string& file) {
  auto parsed = parse_bounded_json(text, "manifest " + file);
  if (!parsed) return usage(take_error(parsed.takeError()).message);
  const llvm::json::Array* list = parsed->getAsArray();
  if (!list) return usage(fmt::format("manifest {} must be a JSON array of spec objects", file));
  std::vector<FamilyRequest> requests;
  for (size_t k = 0; k < list->size(); ++k) {
    const llvm::json::Object* object = (*list)[k].getAsObject();
    if (!object) return usage(fmt::format("manifest {}: element {} is not an object", file, k));
    FamilyRequest request;
    request.where = fmt::format("manifest {}: element {}", file, k);
    request.op.clear();  // required: no element is silently a gate_residual
    for (const auto& [key, value] : *object) {
      const std::string name = key.str();
      std::string* word = name == "op"           ? &request.op
                          : name == "dtype"      ? &request.dtype
                          : name == "arch"       ? &request.arch
                          : name == "activation" ? &request.activation
                                                 : nullptr;
      int64_t* size = name == "hidden"         ? &request.hidden
                      : name == "table_stride" ? &request.table_stride
                      : name == "channels"     ? &request.channels
                      : name == "in_features"  ? &request.in_features
                      : name == "out_features" ? &request.out_features
                                               : nullptr;
      if (word && value.getAsString()) {
        *word = value.getAsString()->str();
      } else if (size && value.getAsInteger()) {
        // 0 would read as "absent" (the flags' default): a manifest says what it means.
        *size = *value.getAsInteger();
        if (*size < 1)
          return usage(fmt::format("{}: \"{}\" must be a positive integer (got {})", request.where, name, *size));
      } else {
        return usage(fmt::format("manifest {}: element {} has an unknown or mistyped field '{}'", file, k, name));
      }
    }
    if (request.op.empty()) return usage(fmt::format("{}: needs \"op\"", request.where));
    requests.push_back(request);
  }
  return requests;
}

// A recorded spec list names where each kernel ran; `targets`, when given (--arch), where they
// will run instead. Each spec is checked as one from flags would be.
llvm::Expected<std::vector<KernelSpec>> specs_from_spec_list(const std::string& text, const std::string& file,
                                                             const std::vector<Target>* targets) {
  auto recorded = parse_spec_list(text, "manifest " + file);
  if (!recorded) return recorded.takeError();
  std::vector<KernelSpec> specs;
  for (KernelSpec spec : *recorded) {
    for (const Target& target : targets ? *targets : std::vector<Target>{spec.target}) {
      spec.target = target;
      if (auto err = validate_spec(spec))
        return usage(fmt::format("manifest {}: {}", file, llvm::toString(std::move(err))));
      specs.push_back(spec);
    }
  }
  return specs;
}

}  // namespace

CacheConfig cache_config() {
  CacheConfig config = llvm::cantFail(cache_config_from_environment());
  if (!cache_dir_flag.empty()) config.writable_dir = cache_dir_flag;
  return config;
}

llvm::Expected<std::vector<Target>> targets_from_flags() {
  if (!arch_flag.empty()) {
    llvm::SmallVector<llvm::StringRef, 4> names;
    llvm::StringRef(arch_flag).split(names, ',');
    std::vector<Target> targets;
    for (llvm::StringRef name : names) {
      const std::optional<Target> target = parse_target(std::string_view(name.data(), name.size()));
      if (!target)
        return usage(fmt::format("bad --arch '{}' (expected sm_90, compute_90 or 90, or a comma-separated list of "
                                 "them)", name.str()));
      if (!llvm::is_contained(targets, *target)) targets.push_back(*target);
    }
    return targets;
  }
  if (Driver::available()) {
    const Driver* driver = *Driver::get();
    CUdevice device = 0;
    int major = 0, minor = 0;
    if (driver->cuDeviceGet(&device, 0) == CUDA_SUCCESS &&
        driver->cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, device) == CUDA_SUCCESS &&
        driver->cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, device) == CUDA_SUCCESS)
      return std::vector<Target>{Target{major * 10 + minor, false}};
  }
  return std::vector<Target>{Target{90, false}};
}

llvm::Expected<std::vector<KernelSpec>> specs_from_flags(bool single) {
  auto targets = targets_from_flags();
  if (!targets) return targets.takeError();
  if (single && targets->size() > 1) return usage("inspect shows one kernel: give --arch one target");
  if (hidden_flag < 0 || table_stride_flag < 0 || channels_flag < 0 || in_features_flag < 0 || out_features_flag < 0)
    return usage("--hidden, --table-stride, --channels, --in-features and --out-features must be positive");

  std::vector<KernelSpec> specs;
  std::unordered_set<KernelSpec, KernelSpecHash> seen;  // a spec listed twice is built once
  auto add = [&](const std::vector<KernelSpec>& more) {
    for (const KernelSpec& spec : more)
      if (seen.insert(spec).second) specs.push_back(spec);
  };
  if (!manifest_flag.empty()) {
    if (single) return usage("--manifest is for prewarm");
    auto text = read_bounded_file(manifest_flag, kMaxManifestBytes);
    if (!text) return usage(fmt::format("cannot read manifest: {}", take_error(text.takeError()).message));
    if (is_spec_list(*text)) {
      auto recorded = specs_from_spec_list(*text, manifest_flag, arch_flag.empty() ? nullptr : &*targets);
      if (!recorded) return recorded.takeError();
      add(*recorded);
      return specs;
    }
    auto requests = read_json_manifest(*text, manifest_flag);
    if (!requests) return requests.takeError();
    for (const FamilyRequest& request : *requests) {
      for (const Target& target : *targets) {  // an element's "arch" wins over --arch
        auto family = expand(request, target);
        if (!family) {
          ErrorReport report = take_error(family.takeError());
          return make_error(report.code, request.where + ": " + report.message);
        }
        add(*family);
      }
    }
    return specs;
  }
  const bool any_spec_flag = !op_flag.empty() || hidden_flag || !dtype_flag.empty() || table_stride_flag ||
                             channels_flag || in_features_flag || out_features_flag || !activation_flag.empty();
  if (!single && !any_spec_flag) {
    for (const Target& target : *targets) add(default_catalog(target));
    return specs;
  }

  FamilyRequest request;
  if (!op_flag.empty()) request.op = op_flag;
  request.hidden = hidden_flag;
  request.dtype = dtype_flag;
  request.table_stride = table_stride_flag;
  request.channels = channels_flag;
  request.in_features = in_features_flag;
  request.out_features = out_features_flag;
  request.activation = activation_flag;
  if (const std::optional<OpCode> op = parse_op(request.op); single && op) {  // one spec: the H3 defaults
    const OpRow& row = op_row(*op);
    if (request.dtype.empty() && row.shape != SpecShape::Channels) request.dtype = "bf16";
    if (request.activation.empty() && row.shape == SpecShape::Linear && row.role == OpRole::Forward)
      request.activation = "silu";
  }
  if (!single) {
    for (const Target& target : *targets) {
      auto family = expand(request, target);
      if (!family) return family.takeError();
      add(*family);
    }
    return specs;
  }
  auto family = expand(request, targets->front());
  if (!family) return family.takeError();

  const std::optional<IndexType> index = parse_index_type(index_type_flag);
  if (!index) return usage(fmt::format("bad --index-type '{}' (int64 or int32)", index_type_flag.getValue()));
  if (rows_flag != 0)
    if (std::string rule = cap_rule(kLinearRowsCap, rows_flag); !rule.empty()) return usage("--rows: " + rule);
  const int64_t rows = rows_flag ? rows_flag : kDefaultTimesteps;
  // --unweighted picks between the family's weighted and unweighted kernels where it has both
  // (rms_norm and its backward kernels), whether or not describe() names the weight.
  const auto weighted = [](const KernelSpec& spec) { return spec.weighted; };
  const bool both = llvm::any_of(*family, weighted) && !llvm::all_of(*family, weighted);
  for (const KernelSpec& spec : *family) {
    if (spec.index != *index || (both && spec.weighted == unweighted_flag)) continue;
    const OpRow& row = op_row(spec.op);
    if (row.serves_rows && !row.serves_rows(spec, rows)) continue;  // a kernel of another row tile
    if (vec_flag == 0 || spec.vec == vec_flag) return std::vector<KernelSpec>{spec};  // widest first
  }
  return usage(fmt::format("no {} spec with --vec {} (1, or 16 bytes' worth when H and the stride allow it)",
                           request.op, vec_flag.getValue()));
}

int report_error(llvm::Error error) {
  ErrorReport report = take_error(std::move(error));
  fmt::print(stderr, "exactjit: error: {}\n", report.message);
  const int code = report.code == ErrorCode::InvalidArgument ? kExitUsage : kExitFailed;
  if (json_flag) print_json(code, llvm::json::Object{{"error", report.message}});
  return code;
}

}  // namespace exactjit::cli
