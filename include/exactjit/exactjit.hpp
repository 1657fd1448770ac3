// exactjit for C++: a header-only wrapper over the C ABI (exactjit.h), so a C++ program links only
// libexactjit.so (target exactjit::exactjit) and never the static core with its LLVM.
//
// xj::Runtime owns an xj_runtime (RAII, movable); every call that fails throws xj::Error, which
// carries the status code and the library's message for that call.
//
//   xj::Runtime runtime;                       // options from the environment
//   runtime.gate_residual(residual, gate, index, y, out, stream);   // DLTensors
//   runtime.synchronize(0, stream);            // throws xj::Error(XJ_ERROR_BAD_INDEX, ...)
#pragma once

#include "exactjit/exactjit.h"

#include <stdexcept>
#include <string>
#include <utility>

namespace xj {

/// A failed call: code() is its exactjit_status_t, what() the message that names the argument,
/// rule, path or spec involved.
class Error : public std::runtime_error {
 public:
  Error(exactjit_status_t code, const std::string& message) : std::runtime_error(message), code_(code) {}
  exactjit_status_t code() const noexcept { return code_; }

 private:
  exactjit_status_t code_;
};

/// Throws the Error for a failed status. The message is per thread, so this must run on the
/// thread that made the call, right after it.
inline void check(exactjit_status_t status) {
  if (status != XJ_OK) throw Error(status, xj_last_error());
}

/// The loaded library's version ("0.1.0"); XJ_VERSION_* are the header's.
inline std::string version() { return xj_version(); }

/// Options a Runtime resolves; a field left at its default comes from the environment.
inline xj_runtime_options default_options() {
  xj_runtime_options options{};
  options.struct_size = sizeof options;
  options.offline = -1;
  options.check_after_launch = -1;
  return options;
}

/// The C ABI's runtime: kernel caches and per-device state. Thread-safe; see exactjit.h for each op.
class Runtime {
 public:
  Runtime() : Runtime(default_options()) {}
  explicit Runtime(const xj_runtime_options& options) { check(xj_runtime_create(&options, &handle_)); }
  ~Runtime() { xj_runtime_destroy(handle_); }
  Runtime(Runtime&& other) noexcept : handle_(other.handle_) { other.handle_ = nullptr; }
  Runtime& operator=(Runtime&& other) noexcept {
    std::swap(handle_, other.handle_);
    return *this;
  }
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  /// The C handle, for calls this wrapper does not cover.
  xj_runtime* get() const noexcept { return handle_; }

  /// The resolved options, one "name: value" line each.
  std::string info() const { return xj_runtime_info(handle_); }

  /// Gets the kernel a canonical spec text names into the caches without a GPU (xj_prewarm).
  void prewarm(const std::string& spec) { check(xj_prewarm(handle_, spec.c_str())); }

  void gate_residual(const DLTensor& residual, const DLTensor& gate, const DLTensor& index, const DLTensor& y,
                     const DLTensor& out, void* stream = nullptr) {
    check(xj_gate_residual(handle_, &residual, &gate, &index, &y, &out, stream));
  }

  void adaln_row_gather(const DLTensor& rows, const DLTensor& timestep_indices, const DLTensor& token_tags,
                        const DLTensor& out, void* stream = nullptr) {
    check(xj_adaln_row_gather(handle_, &rows, &timestep_indices, &token_tags, &out, stream));
  }

  /// weight, shift, scale, index and rstd may be null (shift, scale and index together).
  void rms_norm(const DLTensor& x, const DLTensor* weight, const DLTensor* shift, const DLTensor* scale,
                const DLTensor* index, const DLTensor& out, const DLTensor* rstd, double eps, void* stream = nullptr) {
    check(xj_rms_norm(handle_, &x, weight, shift, scale, index, &out, rstd, eps, stream));
  }

  /// h = gate_residual(residual, gate, index, y), out = rms_norm(h, ...) in one kernel; weight,
  /// shift, scale and rstd may be null (shift and scale together).
  void gate_residual_rms_norm(const DLTensor& residual, const DLTensor& gate, const DLTensor& index, const DLTensor& y,
                              const DLTensor* weight, const DLTensor* shift, const DLTensor* scale, const DLTensor& h,
                              const DLTensor& out, const DLTensor* rstd, double eps, void* stream = nullptr) {
    check(xj_gate_residual_rms_norm(handle_, &residual, &gate, &index, &y, weight, shift, scale, &h, &out, rstd, eps,
                                    stream));
  }

  void timestep_sinusoid(const DLTensor& t, const DLTensor& out, double max_period = 10000,
                         bool flip_sin_to_cos = true, double downscale_freq_shift = 0, double scale = 1,
                         bool check_range = false, void* stream = nullptr) {
    check(xj_timestep_sinusoid(handle_, &t, &out, max_period, flip_sin_to_cos, downscale_freq_shift, scale,
                               check_range, stream));
  }

  /// bias and pre_activation may be null.
  void det_linear(const DLTensor& x, const DLTensor& weight, const DLTensor* bias, const DLTensor& out,
                  const DLTensor* pre_activation, bool silu, void* stream = nullptr) {
    check(xj_det_linear(handle_, &x, &weight, bias, &out, pre_activation, silu, stream));
  }

  // Backward passes: outputs may be null (not computed); workspaces as the *_workspace_bytes
  // functions of exactjit.h say.

  void det_linear_backward(const DLTensor& grad, const DLTensor* pre_activation, const DLTensor& x,
                           const DLTensor& weight, const DLTensor* d_input, const DLTensor* d_weight,
                           const DLTensor* d_bias, const DLTensor* workspace, bool silu, void* stream = nullptr) {
    check(xj_det_linear_backward(handle_, &grad, pre_activation, &x, &weight, d_input, d_weight, d_bias, workspace,
                                 silu, stream));
  }

  /// Tensor parallelism (exactjit.h: xj_det_linear_backward_partials, xj_det_linear_input_fold).
  void det_linear_backward_partials(const DLTensor& grad, const DLTensor* pre_activation, const DLTensor& x,
                                    const DLTensor& weight, const DLTensor& partials, const DLTensor* d_weight,
                                    const DLTensor* d_bias, bool silu, void* stream = nullptr) {
    check(xj_det_linear_backward_partials(handle_, &grad, pre_activation, &x, &weight, &partials, d_weight, d_bias,
                                          silu, stream));
  }
  void det_linear_input_fold(const DLTensor& partials, const DLTensor& x, const DLTensor& d_input, bool bf16_weights,
                             bool silu, void* stream = nullptr) {
    check(xj_det_linear_input_fold(handle_, &partials, &x, &d_input, bf16_weights, silu, stream));
  }

  void gate_residual_backward(const DLTensor& grad, const DLTensor& gate, const DLTensor& index, const DLTensor& y,
                              const DLTensor* d_y, const DLTensor* d_gate, const DLTensor* workspace,
                              void* stream = nullptr) {
    check(xj_gate_residual_backward(handle_, &grad, &gate, &index, &y, d_y, d_gate, workspace, stream));
  }

  void rms_norm_backward(const DLTensor& grad, const DLTensor& x, const DLTensor* weight, const DLTensor* scale,
                         const DLTensor* index, const DLTensor& rstd, double eps, const DLTensor* dx,
                         const DLTensor* dweight, const DLTensor* dshift, const DLTensor* dscale,
                         const DLTensor* workspace, void* stream = nullptr) {
    check(xj_rms_norm_backward(handle_, &grad, &x, weight, scale, index, &rstd, eps, dx, dweight, dshift, dscale,
                               workspace, stream));
  }

  /// rms_norm_backward's unfolded tile partials (exactjit.h: xj_rms_norm_backward_tile_partials).
  void rms_norm_backward_tile_partials(const DLTensor& grad, const DLTensor& x, const DLTensor* weight,
                                       const DLTensor* scale, const DLTensor* index, const DLTensor& rstd,
                                       const DLTensor* shift_partials, const DLTensor* scale_partials,
                                       const DLTensor* weight_partials, const DLTensor* workspace,
                                       void* stream = nullptr) {
    check(xj_rms_norm_backward_tile_partials(handle_, &grad, &x, weight, scale, index, &rstd, shift_partials,
                                             scale_partials, weight_partials, workspace, stream));
  }

  /// grad_h may be null (h feeds only the norm); d_residual is required.
  void gate_residual_rms_norm_backward(const DLTensor& grad_out, const DLTensor* grad_h, const DLTensor& h,
                                       const DLTensor& y, const DLTensor& gate, const DLTensor& index,
                                       const DLTensor* weight, const DLTensor* scale, const DLTensor& rstd, double eps,
                                       const DLTensor& d_residual, const DLTensor* d_y, const DLTensor* d_gate,
                                       const DLTensor* d_weight, const DLTensor* d_shift, const DLTensor* d_scale,
                                       const DLTensor* workspace, void* stream = nullptr) {
    check(xj_gate_residual_rms_norm_backward(handle_, &grad_out, grad_h, &h, &y, &gate, &index, weight, scale, &rstd,
                                             eps, &d_residual, d_y, d_gate, d_weight, d_shift, d_scale, workspace,
                                             stream));
  }

  void adaln_row_gather_backward(const DLTensor& grad, const DLTensor& timestep_indices, const DLTensor& token_tags,
                                 const DLTensor& d_rows, const DLTensor* workspace, void* stream = nullptr) {
    check(xj_adaln_row_gather_backward(handle_, &grad, &timestep_indices, &token_tags, &d_rows, workspace, stream));
  }

  /// The fold of given tile partials over index's plan (exactjit.h: xj_segment_fold).
  void segment_fold(const DLTensor& partials, const DLTensor& index, long long rows, const DLTensor& out,
                    const DLTensor* workspace, void* stream = nullptr) {
    check(xj_segment_fold(handle_, &partials, &index, rows, &out, workspace, stream));
  }

  void timestep_sinusoid_backward(const DLTensor& t, const DLTensor& grad, const DLTensor& d_t,
                                  double max_period = 10000, bool flip_sin_to_cos = true,
                                  double downscale_freq_shift = 0, double scale = 1, void* stream = nullptr) {
    check(xj_timestep_sinusoid_backward(handle_, &t, &grad, &d_t, max_period, flip_sin_to_cos, downscale_freq_shift,
                                        scale, stream));
  }

  /// Waits for `stream` and throws for a bad index a kernel on it found since the last check.
  void synchronize(int device_id = 0, void* stream = nullptr) { check(xj_synchronize(handle_, device_id, stream)); }

 private:
  xj_runtime* handle_ = nullptr;
};

}  // namespace xj
