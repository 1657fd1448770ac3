// exactjit C ABI (include/exactjit/exactjit.h) over the C++ Runtime. No exception or C++ type
// crosses this boundary; every failure becomes a status code plus a thread-local message.
#include "exactjit/exactjit.h"

#include "api/runtime.hpp"
#include "runtime/environment.hpp"

#include <new>
#include <string>

struct xj_runtime {
  explicit xj_runtime(exactjit::RuntimeOptions options) : runtime(std::move(options)), info(runtime.info()) {}
  exactjit::Runtime runtime;
  const std::string info;  // options never change, so xj_runtime_info's text is made once
};

namespace {

thread_local std::string g_last_error;

exactjit_status_t finish(const exactjit::Status& status) {
  g_last_error = status.message();
  return static_cast<exactjit_status_t>(status.code());
}

exactjit_status_t fail(exactjit_status_t code, const char* message) {
  g_last_error = message;
  return code;
}

}  // namespace

extern "C" {

const char* xj_version(void) { return EXACTJIT_VERSION; }

const char* xj_last_error(void) { return g_last_error.c_str(); }

exactjit_status_t xj_runtime_create(const xj_runtime_options* options, xj_runtime** runtime) {
  if (!runtime) return fail(XJ_ERROR_INVALID_ARGUMENT, "xj_runtime_create: runtime must not be NULL");
  *runtime = nullptr;
  exactjit::RuntimeOptions resolved = exactjit::RuntimeOptions::from_environment();
  if (!resolved.environment_error.empty()) {
    g_last_error = "xj_runtime_create: " + resolved.environment_error;
    return XJ_ERROR_INVALID_ARGUMENT;
  }
  if (options) {
    if (options->struct_size < sizeof(xj_runtime_options))
      return fail(XJ_ERROR_INVALID_ARGUMENT, "xj_runtime_create: options->struct_size must be sizeof(xj_runtime_options)");
    if (options->cache_dir) resolved.cache_dir = options->cache_dir;
    if (options->read_only_cache_path) resolved.read_only_dirs = exactjit::split_path_list(options->read_only_cache_path);
    if (options->offline >= 0) resolved.offline = options->offline != 0;
    if (options->arch) resolved.arch = options->arch;
    if (options->check_after_launch >= 0) resolved.check_after_launch = options->check_after_launch != 0;
  }
  *runtime = new (std::nothrow) xj_runtime(std::move(resolved));
  if (!*runtime) return fail(XJ_ERROR_INTERNAL, "xj_runtime_create: out of memory");
  g_last_error.clear();
  return XJ_OK;
}

void xj_runtime_destroy(xj_runtime* runtime) { delete runtime; }

const char* xj_runtime_info(xj_runtime* runtime) { return runtime ? runtime->info.c_str() : ""; }

exactjit_status_t xj_prewarm(xj_runtime* runtime, const char* spec) {
  if (!runtime) return fail(XJ_ERROR_INVALID_ARGUMENT, "prewarm: runtime must not be NULL");
  if (!spec) return fail(XJ_ERROR_INVALID_ARGUMENT, "prewarm: spec must not be NULL");
  return finish(runtime->runtime.prewarm(spec));
}

exactjit_status_t xj_gate_residual(xj_runtime* runtime, const DLTensor* residual, const DLTensor* gate,
                                   const DLTensor* index, const DLTensor* y, const DLTensor* out, void* stream) {
  if (!runtime) return fail(XJ_ERROR_INVALID_ARGUMENT, "gate_residual: runtime must not be NULL");
  if (!residual || !gate || !index || !y || !out)
    return fail(XJ_ERROR_INVALID_ARGUMENT, "gate_residual: residual, gate, index, y and out must not be NULL");
  return finish(runtime->runtime.gate_residual(*residual, *gate, *index, *y, *out, stream));
}

exactjit_status_t xj_adaln_row_gather(xj_runtime* runtime, const DLTensor* rows, const DLTensor* timestep_indices,
                                      const DLTensor* token_tags, const DLTensor* out, void* stream) {
  if (!runtime) return fail(XJ_ERROR_INVALID_ARGUMENT, "adaln_row_gather: runtime must not be NULL");
  if (!rows || !timestep_indices || !token_tags || !out)
    return fail(XJ_ERROR_INVALID_ARGUMENT,
                "adaln_row_gather: rows, timestep_indices, token_tags and out must not be NULL");
  return finish(runtime->runtime.adaln_row_gather(*rows, *timestep_indices, *token_tags, *out, stream));
}

exactjit_status_t xj_rms_norm(xj_runtime* runtime, const DLTensor* x, const DLTensor* weight, const DLTensor* shift,
                              const DLTensor* scale, const DLTensor* index, const DLTensor* out, const DLTensor* rstd,
                              double eps, void* stream) {
  if (!runtime) return fail(XJ_ERROR_INVALID_ARGUMENT, "rms_norm: runtime must not be NULL");
  if (!x || !out) return fail(XJ_ERROR_INVALID_ARGUMENT, "rms_norm: x and out must not be NULL");
  return finish(runtime->runtime.rms_norm(*x, weight, shift, scale, index, *out, rstd, eps, stream));
}

exactjit_status_t xj_gate_residual_rms_norm(xj_runtime* runtime, const DLTensor* residual, const DLTensor* gate,
                                            const DLTensor* index, const DLTensor* y, const DLTensor* weight,
                                            const DLTensor* shift, const DLTensor* scale, const DLTensor* h,
                                            const DLTensor* out, const DLTensor* rstd, double eps, void* stream) {
  if (!runtime) return fail(XJ_ERROR_INVALID_ARGUMENT, "gate_residual_rms_norm: runtime must not be NULL");
  if (!residual || !gate || !index || !y || !h || !out)
    return fail(XJ_ERROR_INVALID_ARGUMENT,
                "gate_residual_rms_norm: residual, gate, index, y, h and out must not be NULL");
  return finish(runtime->runtime.gate_residual_rms_norm(*residual, *gate, *index, *y, weight, shift, scale, *h, *out,
                                                        rstd, eps, stream));
}

exactjit_status_t xj_timestep_sinusoid(xj_runtime* runtime, const DLTensor* t, const DLTensor* out, double max_period,
                                       int flip_sin_to_cos, double downscale_freq_shift, double scale, int check_range,
                                       void* stream) {
  if (!runtime) return fail(XJ_ERROR_INVALID_ARGUMENT, "timestep_sinusoid: runtime must not be NULL");
  if (!t || !out) return fail(XJ_ERROR_INVALID_ARGUMENT, "timestep_sinusoid: t and out must not be NULL");
  return finish(runtime->runtime.timestep_sinusoid(*t, *out, max_period, flip_sin_to_cos != 0, downscale_freq_shift,
                                                   scale, check_range != 0, stream));
}

exactjit_status_t xj_det_linear(xj_runtime* runtime, const DLTensor* x, const DLTensor* weight, const DLTensor* bias,
                                const DLTensor* out, const DLTensor* pre_activation, int silu, void* stream) {
  if (!runtime) return fail(XJ_ERROR_INVALID_ARGUMENT, "det_linear: runtime must not be NULL");
  if (!x || !weight || !out) return fail(XJ_ERROR_INVALID_ARGUMENT, "det_linear: x, weight and out must not be NULL");
  return finish(runtime->runtime.det_linear(*x, *weight, bias, *out, pre_activation, silu != 0, stream));
}

long long xj_det_linear_backward_workspace_bytes(long long rows, long long in_features, long long out_features) {
  return exactjit::det_linear_backward_workspace_bytes(rows, in_features, out_features);
}

exactjit_status_t xj_det_linear_backward(xj_runtime* runtime, const DLTensor* grad, const DLTensor* pre_activation,
                                         const DLTensor* x, const DLTensor* weight, const DLTensor* d_input,
                                         const DLTensor* d_weight, const DLTensor* d_bias, const DLTensor* workspace,
                                         int silu, void* stream) {
  if (!runtime) return fail(XJ_ERROR_INVALID_ARGUMENT, "det_linear_backward: runtime must not be NULL");
  if (!grad || !x || !weight)
    return fail(XJ_ERROR_INVALID_ARGUMENT, "det_linear_backward: grad, x and weight must not be NULL");
  return finish(runtime->runtime.det_linear_backward(*grad, pre_activation, *x, *weight, d_input, d_weight, d_bias,
                                                     workspace, silu != 0, stream));
}

long long xj_gate_residual_backward_workspace_bytes(long long rows, long long seq, long long table_rows,
                                                   long long hidden) {
  return exactjit::gate_residual_backward_workspace_bytes(rows, seq, table_rows, hidden);
}

exactjit_status_t xj_gate_residual_backward(xj_runtime* runtime, const DLTensor* grad, const DLTensor* gate,
                                            const DLTensor* index, const DLTensor* y, const DLTensor* d_y,
                                            const DLTensor* d_gate, const DLTensor* workspace, void* stream) {
  if (!runtime) return fail(XJ_ERROR_INVALID_ARGUMENT, "gate_residual_backward: runtime must not be NULL");
  if (!grad || !gate || !index || !y)
    return fail(XJ_ERROR_INVALID_ARGUMENT, "gate_residual_backward: grad, gate, index and y must not be NULL");
  return finish(runtime->runtime.gate_residual_backward(*grad, *gate, *index, *y, d_y, d_gate, workspace, stream));
}

long long xj_rms_norm_backward_workspace_bytes(long long rows, long long seq, long long table_rows, long long hidden,
                                              int weighted) {
  return exactjit::rms_norm_backward_workspace_bytes(rows, seq, table_rows, hidden, weighted != 0);
}

exactjit_status_t xj_rms_norm_backward(xj_runtime* runtime, const DLTensor* grad, const DLTensor* x,
                                       const DLTensor* weight, const DLTensor* scale, const DLTensor* index,
                                       const DLTensor* rstd, double eps, const DLTensor* dx, const DLTensor* dweight,
                                       const DLTensor* dshift, const DLTensor* dscale, const DLTensor* workspace,
                                       void* stream) {
  if (!runtime) return fail(XJ_ERROR_INVALID_ARGUMENT, "rms_norm_backward: runtime must not be NULL");
  if (!grad || !x || !rstd)
    return fail(XJ_ERROR_INVALID_ARGUMENT, "rms_norm_backward: grad, x and rstd must not be NULL");
  return finish(runtime->runtime.rms_norm_backward(*grad, *x, weight, scale, index, *rstd, eps, dx, dweight, dshift, dscale,
                                                   workspace, stream));
}

long long xj_gate_residual_rms_norm_backward_workspace_bytes(long long rows, long long seq, long long table_rows,
                                                             long long hidden, int weighted, int modulated) {
  return exactjit::gate_residual_rms_norm_backward_workspace_bytes(rows, seq, table_rows, hidden, weighted != 0,
                                                                   modulated != 0);
}

exactjit_status_t xj_gate_residual_rms_norm_backward(
    xj_runtime* runtime, const DLTensor* grad_out, const DLTensor* grad_h, const DLTensor* h, const DLTensor* y,
    const DLTensor* gate, const DLTensor* index, const DLTensor* weight, const DLTensor* scale, const DLTensor* rstd,
    double eps, const DLTensor* d_residual, const DLTensor* d_y, const DLTensor* d_gate, const DLTensor* d_weight,
    const DLTensor* d_shift, const DLTensor* d_scale, const DLTensor* workspace, void* stream) {
  if (!runtime) return fail(XJ_ERROR_INVALID_ARGUMENT, "gate_residual_rms_norm_backward: runtime must not be NULL");
  if (!grad_out || !h || !y || !gate || !index || !rstd || !d_residual)
    return fail(XJ_ERROR_INVALID_ARGUMENT,
                "gate_residual_rms_norm_backward: grad_out, h, y, gate, index, rstd and d_residual must not be NULL");
  return finish(runtime->runtime.gate_residual_rms_norm_backward(*grad_out, grad_h, *h, *y, *gate, *index, weight,
                                                                 scale, *rstd, eps, *d_residual, d_y, d_gate,
                                                                 d_weight, d_shift, d_scale, workspace, stream));
}

long long xj_adaln_row_gather_backward_workspace_bytes(long long seq, long long table_rows, long long hidden) {
  return exactjit::adaln_row_gather_backward_workspace_bytes(seq, table_rows, hidden);
}

exactjit_status_t xj_adaln_row_gather_backward(xj_runtime* runtime, const DLTensor* grad,
                                               const DLTensor* timestep_indices, const DLTensor* token_tags,
                                               const DLTensor* d_rows, const DLTensor* workspace, void* stream) {
  if (!runtime) return fail(XJ_ERROR_INVALID_ARGUMENT, "adaln_row_gather_backward: runtime must not be NULL");
  if (!grad || !timestep_indices || !token_tags || !d_rows)
    return fail(XJ_ERROR_INVALID_ARGUMENT,
                "adaln_row_gather_backward: grad, timestep_indices, token_tags and d_rows must not be NULL");
  return finish(runtime->runtime.adaln_row_gather_backward(*grad, *timestep_indices, *token_tags, *d_rows, workspace,
                                                           stream));
}

exactjit_status_t xj_timestep_sinusoid_backward(xj_runtime* runtime, const DLTensor* t, const DLTensor* grad,
                                                const DLTensor* d_t, double max_period, int flip_sin_to_cos,
                                                double downscale_freq_shift, double scale, void* stream) {
  if (!runtime) return fail(XJ_ERROR_INVALID_ARGUMENT, "timestep_sinusoid_backward: runtime must not be NULL");
  if (!t || !grad || !d_t)
    return fail(XJ_ERROR_INVALID_ARGUMENT, "timestep_sinusoid_backward: t, grad and d_t must not be NULL");
  return finish(runtime->runtime.timestep_sinusoid_backward(*t, *grad, *d_t, max_period, flip_sin_to_cos != 0,
                                                            downscale_freq_shift, scale, stream));
}

exactjit_status_t xj_synchronize(xj_runtime* runtime, int device_id, void* stream) {
  if (!runtime) return fail(XJ_ERROR_INVALID_ARGUMENT, "synchronize: runtime must not be NULL");
  return finish(runtime->runtime.synchronize(device_id, stream));
}

}  // extern "C"
