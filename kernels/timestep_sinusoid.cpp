// exactjit op timestep_sinusoid: validate, spec, the scalar constants PyTorch derives, parameters.
#include "kernels/timestep_sinusoid.hpp"

#include "api/c_entry.hpp"
#include "codegen/render.hpp"
#include "kernels/catalog.hpp"
#include "kernels/segment_plan.hpp"
#include "kernels/spec_limits.hpp"
#include "kernels/tensor_check.hpp"

#include <fmt/format.h>

#include <climits>
#include <cmath>

namespace exactjit {
namespace {
constexpr std::string_view kOp = "timestep_sinusoid";
ArgName arg(std::string_view name) { return {kOp, name}; }
}  // namespace

KernelSpec timestep_sinusoid_spec(int64_t channels, OpCode op) {
  KernelSpec spec = channels_sizes(channels);
  spec.op = op;
  return spec;
}

llvm::Expected<LaunchPlan> plan_timestep_sinusoid(const TimestepSinusoidArgs& a) {
  const NamedTensor tensors[] = {{"t", &a.t}, {"out", &a.out}};
  if (auto err = require_cuda_on_one_device(kOp, tensors)) return err;
  for (const NamedTensor& t : tensors)
    if (t.tensor->dtype.code != kDLFloat || t.tensor->dtype.bits != 32 || t.tensor->dtype.lanes != 1)
      return invalid(arg(t.name), "must be float32 (cast timesteps with .float(), as diffusers does)");
  if (a.t.ndim != 1) return invalid(arg("t"), fmt::format("must be 1-D (T,) (got {})", shape_string(a.t)));
  if (!is_contiguous(a.t)) return invalid(arg("t"), "must be contiguous");
  const int64_t timesteps = a.t.shape[0];
  if (a.out.ndim != 2 || a.out.shape[0] != timesteps)
    return invalid(arg("out"), fmt::format("must be ({}, C) (got {})", timesteps, shape_string(a.out)));
  if (std::string rule = cap_rule(kChannelsCap, a.out.shape[1]); !rule.empty()) return invalid(arg("out"), rule);
  if (auto err = require_row_rules(timestep_sinusoid_spec(a.out.shape[1]), arg("out"), arg("out"))) return err;
  if (!is_contiguous(a.out)) return invalid(arg("out"), "must be contiguous");
  if (overlaps(a.out, a.t)) return invalid(arg("out"), "must not overlap t");
  const SinusoidParams& p = a.params;
  if (auto err = check_sinusoid_params(kOp, p)) return err;

  const int64_t channels = a.out.shape[1];
  const int64_t half = channels / 2;
  LaunchPlan plan;
  plan.spec = timestep_sinusoid_spec(channels);
  plan.device_id = a.t.device.device_id;
  const int64_t blocks = (timesteps * half + 127) / 128;
  if (blocks > INT_MAX) return invalid(arg("t"), fmt::format("has too many timesteps ({})", timesteps));
  plan.grid = static_cast<uint32_t>(blocks);
  plan.threads = 128;
  plan.push(data_address(a.t));
  plan.push(data_address(a.out));
  plan.push(static_cast<uint64_t>(timesteps));
  push_frequency_params(plan, p, half);
  plan.push(p.check_range ? 1 : 0);
  return plan;
}

llvm::Error check_sinusoid_params(std::string_view op, const SinusoidParams& p) {
  if (!(p.max_period > 0) || !std::isfinite(p.max_period))
    return invalid({op, "max_period"}, fmt::format("must be finite and > 0 (got {})", p.max_period));
  if (!std::isfinite(p.downscale_freq_shift) || !std::isfinite(p.scale))
    return invalid({op, "downscale_freq_shift"}, "and scale must be finite");
  return llvm::Error::success();
}

void push_frequency_params(LaunchPlan& plan, const SinusoidParams& p, int64_t half) {
  // As PyTorch evaluates diffusers' Python scalars: -math.log(max_period) rounded to float, and a
  // tensor divided by a scalar as a multiply by the float reciprocal of the float scalar.
  plan.push_float(static_cast<float>(-std::log(p.max_period)));
  plan.push_float(1.0f / static_cast<float>(static_cast<double>(half) - p.downscale_freq_shift));
  plan.push_float(static_cast<float>(p.scale));
  plan.push(p.flip_sin_to_cos ? 1 : 0);
}

llvm::Expected<LaunchPlan> plan_timestep_sinusoid_backward(const TimestepSinusoidBackwardArgs& a) {
  constexpr std::string_view kBackward = "timestep_sinusoid_backward";
  auto barg = [&](std::string_view name) { return ArgName{kBackward, name}; };
  const NamedTensor tensors[] = {{"t", &a.t}, {"grad", &a.grad}, {"d_t", &a.d_t}};
  if (auto err = require_cuda_on_one_device(kBackward, tensors)) return err;
  for (const NamedTensor& t : tensors)
    if (t.tensor->dtype.code != kDLFloat || t.tensor->dtype.bits != 32 || t.tensor->dtype.lanes != 1 ||
        !is_contiguous(*t.tensor))
      return invalid(barg(t.name), "must be float32 and contiguous");
  if (a.t.ndim != 1) return invalid(barg("t"), fmt::format("must be 1-D (T,) (got {})", shape_string(a.t)));
  const int64_t timesteps = a.t.shape[0];
  if (a.grad.ndim != 2 || a.grad.shape[0] != timesteps)
    return invalid(barg("grad"), fmt::format("must be ({}, C) (got {})", timesteps, shape_string(a.grad)));
  if (std::string rule = cap_rule(kChannelsCap, a.grad.shape[1]); !rule.empty()) return invalid(barg("grad"), rule);
  if (auto err = require_row_rules(timestep_sinusoid_spec(a.grad.shape[1], Op::TimestepSinusoidBackward), barg("grad"),
                                   barg("grad")))
    return err;
  if (a.d_t.ndim != 1 || a.d_t.shape[0] != timesteps)
    return invalid(barg("d_t"), fmt::format("must be ({},) (got {})", timesteps, shape_string(a.d_t)));
  if (overlaps(a.d_t, a.t) || overlaps(a.d_t, a.grad)) return invalid(barg("d_t"), "must not overlap t or grad");
  if (auto err = check_sinusoid_params(kBackward, a.params)) return err;
  if (timesteps > INT_MAX) return invalid(barg("t"), fmt::format("has too many timesteps ({})", timesteps));

  const int64_t channels = a.grad.shape[1];
  LaunchPlan plan;
  plan.spec = timestep_sinusoid_spec(channels, Op::TimestepSinusoidBackward);
  plan.device_id = a.t.device.device_id;
  plan.grid = static_cast<uint32_t>(timesteps);
  plan.threads = 128;
  plan.push(data_address(a.t));
  plan.push(data_address(a.grad));
  plan.push(data_address(a.d_t));
  push_frequency_params(plan, a.params, channels / 2);
  return plan;
}

namespace {
std::vector<std::string_view> sinusoid_templates(const KernelSpec&) { return {"timestep_sinusoid.cuh"}; }
std::vector<std::string_view> sinusoid_backward_templates(const KernelSpec&) {
  return {"row_sum.cuh", "timestep_sinusoid_backward.cuh"};
}
RuleBreak channels_rule(const KernelSpec& spec) {
  if (spec.channels < 2) return {RuleSubject::Sizes, fmt::format("channels C must be >= 2 (got {})", spec.channels)};
  return {};
}
// fp32 only, whatever the dtype asked for.
std::vector<KernelSpec> sinusoid_family(const KernelSpec& sizes) { return {timestep_sinusoid_spec(sizes.channels)}; }
std::vector<KernelSpec> sinusoid_backward_family(const KernelSpec& sizes) {
  return {timestep_sinusoid_spec(sizes.channels, Op::TimestepSinusoidBackward)};
}
// H3's 256 channels, listed once (under fp32).
std::vector<KernelSpec> sinusoid_catalog(DType dtype) {
  return dtype == DType::F32 ? sinusoid_family(channels_sizes(kSinusoidChannels)) : std::vector<KernelSpec>{};
}
std::vector<KernelSpec> sinusoid_backward_catalog(DType dtype) {
  return dtype == DType::F32 ? sinusoid_backward_family(channels_sizes(kSinusoidChannels)) : std::vector<KernelSpec>{};
}
}  // namespace

const OpRow kTimestepSinusoidRow = {
    Op::TimestepSinusoid, "timestep_sinusoid", OpRole::Forward, "timestep_sinusoid",
    SpecShape::Channels, /*describes_weight=*/false, /*row_chunks=*/1, /*threads=*/0, /*row_unroll=*/1,
    {"t", "t"}, ErrorValue::FloatBits, /*value_rule=*/"a finite value in [0, 1] (check_range)",
    sinusoid_templates, codegen::render_sinusoid_constants, channels_rule, sinusoid_family, sinusoid_catalog,
    "--channels C", "diffusers' get_timestep_embedding", /*default_stride_in_h=*/0};
const OpRow kTimestepSinusoidBackwardRow = {
    Op::TimestepSinusoidBackward, "timestep_sinusoid_backward", OpRole::Backward, "timestep_sinusoid",
    SpecShape::Channels, /*describes_weight=*/false, /*row_chunks=*/1, /*threads=*/128, /*row_unroll=*/1,
    {"t", "t"}, ErrorValue::Index, /*value_rule=*/"",
    sinusoid_backward_templates, codegen::render_sinusoid_constants, channels_rule, sinusoid_backward_family,
    sinusoid_backward_catalog};

}  // namespace exactjit

extern "C" exactjit_status_t xj_timestep_sinusoid(xj_runtime* runtime, const DLTensor* t, const DLTensor* out,
                                                  double max_period, int flip_sin_to_cos, double downscale_freq_shift,
                                                  double scale, int check_range, void* stream) {
  return exactjit::c_abi::call_op(runtime, "timestep_sinusoid", {{"t", t}, {"out", out}}, [&](exactjit::Runtime& r) {
    const exactjit::SinusoidParams params{max_period, flip_sin_to_cos != 0, downscale_freq_shift, scale,
                                          check_range != 0};
    return r.launch(exactjit::plan_timestep_sinusoid({*t, *out, params}), stream);
  });
}

extern "C" exactjit_status_t xj_timestep_sinusoid_backward(xj_runtime* runtime, const DLTensor* t,
                                                           const DLTensor* grad, const DLTensor* d_t,
                                                           double max_period, int flip_sin_to_cos,
                                                           double downscale_freq_shift, double scale, void* stream) {
  return exactjit::c_abi::call_op(
      runtime, "timestep_sinusoid_backward", {{"t", t}, {"grad", grad}, {"d_t", d_t}}, [&](exactjit::Runtime& r) {
        const exactjit::SinusoidParams params{max_period, flip_sin_to_cos != 0, downscale_freq_shift, scale, false};
        return r.launch(exactjit::plan_timestep_sinusoid_backward({*t, *grad, *d_t, params}), stream);
      });
}
