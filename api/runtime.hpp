// exactjit's internal C++ API, over the static core: the C ABI, the CLI and the tests use it; users
// get include/exactjit/exactjit.h and its C++ wrapper exactjit.hpp instead. A Runtime owns the
// kernel caches and the per-device state, and runs the ops.
//
// Tensors are DLPack DLTensors (dlpack/dlpack.h). Every op validates its arguments on the host,
// launches on the caller's stream and returns at once; a bad index found by a kernel is reported,
// naming the op, by the next call on the same stream (it fails without launching; no
// synchronisation is involved, so a report still in flight shows at a later call), by
// synchronize() for a definite answer, or at once when RuntimeOptions::check_after_launch is set.
// Records are per stream (per device, for the first 255 streams a device sees; later streams share
// one), so one stream's bad index is never reported to a call on another.
// A Runtime is thread-safe.
#pragma once

#include <dlpack/dlpack.h>

#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace exactjit {

/// The outcome of a call: ok, or a code (exactjit_status_t in exactjit.h) and a message that
/// names the argument, path or spec involved.
class Status {
 public:
  Status() = default;
  Status(int code, std::string message) : code_(code), message_(std::move(message)) {}
  bool ok() const { return code_ == 0; }
  int code() const { return code_; }
  const std::string& message() const { return message_; }

 private:
  int code_ = 0;
  std::string message_;
};

struct RuntimeOptions {
  std::string cache_dir;                    ///< writable cache; empty: no writable layer
  std::vector<std::string> read_only_dirs;  ///< searched before cache_dir, in order
  bool offline = false;                     ///< never compile: a miss is an error
  std::string arch;                         ///< "" = the device's; else "sm_90" or "compute_90"
  bool check_after_launch = false;          ///< synchronize and check device errors after each op
  std::string record_manifest;              ///< append every spec used to this spec list; "" = none
  /// Set by from_environment() when a variable is malformed (EXACTJIT_OFFLINE=maybe): names it and
  /// the accepted values. A Runtime made from such options fails every call with it
  /// (InvalidArgument); xj_runtime_create refuses to create one.
  std::string environment_error;

  /// EXACTJIT_CACHE_DIR, EXACTJIT_CACHE_PATH, EXACTJIT_OFFLINE, EXACTJIT_ARCH,
  /// EXACTJIT_CHECK_AFTER_LAUNCH, EXACTJIT_RECORD_MANIFEST (see README.md).
  static RuntimeOptions from_environment();
};

class Runtime {
 public:
  /// Creating a runtime loads nothing: NVRTC is loaded on the first compile, libcuda on the first
  /// launch.
  explicit Runtime(RuntimeOptions options = RuntimeOptions::from_environment());
  ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  /// out = residual + gate[index[r mod S]] * y with eager's roundings (NUMERICS.md).
  /// residual, y, out: (M, H) or (B, S, H) contiguous, one dtype (bf16, fp16, fp32); gate: (R, H)
  /// with unit column stride and row stride >= H; index: (S,) int32 or int64 with M % S == 0.
  /// `stream` is a CUstream of the tensors' device (nullptr: the legacy default stream).
  Status gate_residual(const DLTensor& residual, const DLTensor& gate, const DLTensor& index,
                       const DLTensor& y, const DLTensor& out, void* stream);

  /// out[c, s, :] = rows[timestep_indices[s] * 3 + token_tags[s], cH : (c+1)H] for c = 0..5: the
  /// six AdaLN chunks of every position, bitwise equal to six index_selects. rows: (3T, 6H) with
  /// unit column stride and row stride >= 6H; both index tensors (S,) of one type (int32/int64);
  /// out: (6, S, H) contiguous in rows' dtype.
  Status adaln_row_gather(const DLTensor& rows, const DLTensor& timestep_indices, const DLTensor& token_tags,
                          const DLTensor& out, void* stream);

  /// PyTorch's fused RMSNorm, bitwise, row by row: out = rT(w * (rstd * x)) (no w: rT(rstd * x)),
  /// rstd = rsqrt(mean(x^2) + eps) in PyTorch's reduction order. With shift, scale (R, H) table
  /// views of one row stride and index (S,), the AdaLN modulation follows in the same kernel:
  /// out = rT(rT(n * rT(1 + scale[i])) + shift[i]), i = index[r mod S]. x: (..., H) contiguous,
  /// H % 4 == 0, aligned to 4 elements; weight (H,) or null; rstd: (M,) fp32 or null.
  Status rms_norm(const DLTensor& x, const DLTensor* weight, const DLTensor* shift, const DLTensor* scale,
                  const DLTensor* index, const DLTensor& out, const DLTensor* rstd, double eps, void* stream);

  /// The gated residual feeding the next RMSNorm, in one kernel that reads residual and y once:
  /// h = gate_residual(residual, gate, index, y) and out = rms_norm(h, weight, shift, scale, index),
  /// each bitwise equal to its eager expression. The rules are both ops' (h is gate_residual's out
  /// and rms_norm's x), plus: residual, y and gate aligned to 4 elements, the gate's row stride a
  /// multiple of 4, shift and scale (or neither) with the gate's rows and row stride.
  Status gate_residual_rms_norm(const DLTensor& residual, const DLTensor& gate, const DLTensor& index,
                                const DLTensor& y, const DLTensor* weight, const DLTensor* shift,
                                const DLTensor* scale, const DLTensor& h, const DLTensor& out, const DLTensor* rstd,
                                double eps, void* stream);

  /// diffusers get_timestep_embedding, bitwise: t (T,) float32 -> out (T, C) float32 contiguous.
  /// With check_range, a t that is not finite or outside [0, 1] is reported like a bad index.
  Status timestep_sinusoid(const DLTensor& t, const DLTensor& out, double max_period, bool flip_sin_to_cos,
                           double downscale_freq_shift, double scale, bool check_range, void* stream);

  /// out = act(x @ weight^T + bias) in a fixed, batch-invariant order (docs/det_linear.md). x (T, K)
  /// float32; weight (N, K) float32 (fp32 fma chains; silu: SiLU on the output; out float32) or
  /// bfloat16 (tensor-core mma; silu: SiLU on x before its bf16 cast; out bfloat16, sm_80+);
  /// bias (N,) in the weight's dtype or null; pre_activation (T, N) float32 or null.
  Status det_linear(const DLTensor& x, const DLTensor& weight, const DLTensor* bias, const DLTensor& out,
                    const DLTensor* pre_activation, bool silu, void* stream);

  /// det_linear backward, T <= 8: d_input (T, K) float32, d_weight (N, K), d_bias (N,), each
  /// optional; workspace as det_linear_backward_workspace_bytes says (needed for d_input). fp32
  /// weights: grad float32, all outputs float32, pre_activation the forward's (required with silu).
  /// bf16 weights (the AdaLN projection): x is temb (float32, before SiLU and the cast), grad
  /// bfloat16 or float32 (consumed as is), pre_activation null, d_weight and d_bias bfloat16; silu
  /// as in the forward (d_input goes through SiLU's derivative at temb).
  Status det_linear_backward(const DLTensor& grad, const DLTensor* pre_activation, const DLTensor& x,
                             const DLTensor& weight, const DLTensor* d_input, const DLTensor* d_weight,
                             const DLTensor* d_bias, const DLTensor* workspace, bool silu, void* stream);

  // Backward passes (docs/backward.md): deterministic, no host synchronisation, capturable in
  // CUDA graphs. `workspace` is a contiguous uint8 CUDA tensor of at least the bytes the matching
  // *_backward_workspace_bytes function returns; outputs may be null (not computed).

  /// d_y = rT(grad * gate[i]) like y (bitwise equal to eager's VJP); d_gate (R, H) contiguous in
  /// the gate's dtype = segment sums of grad * y. (d_residual is grad itself.)
  Status gate_residual_backward(const DLTensor& grad, const DLTensor& gate, const DLTensor& index, const DLTensor& y,
                                const DLTensor* d_y, const DLTensor* d_gate, const DLTensor* workspace, void* stream);

  /// dx like x; dweight (H,); dshift, dscale (R, H) contiguous; from the forward's x, weight,
  /// scale and index (both or neither), rstd and eps (fp32 dx recomputes rstd in fp64 with eps).
  Status rms_norm_backward(const DLTensor& grad, const DLTensor& x, const DLTensor* weight, const DLTensor* scale,
                           const DLTensor* index, const DLTensor& rstd, double eps, const DLTensor* dx,
                           const DLTensor* dweight,
                           const DLTensor* dshift, const DLTensor* dscale, const DLTensor* workspace, void* stream);

  /// gate_residual_rms_norm's backward: d_residual = rT(grad_h + dh) (grad_h null: dh), the norm's
  /// dh from grad_out as rms_norm_backward computes it; then d_y, d_gate from d_residual as
  /// gate_residual_backward, d_weight, d_shift, d_scale from grad_out as rms_norm_backward.
  Status gate_residual_rms_norm_backward(const DLTensor& grad_out, const DLTensor* grad_h, const DLTensor& h,
                                         const DLTensor& y, const DLTensor& gate, const DLTensor& index,
                                         const DLTensor* weight, const DLTensor* scale, const DLTensor& rstd,
                                         double eps, const DLTensor& d_residual, const DLTensor* d_y,
                                         const DLTensor* d_gate, const DLTensor* d_weight, const DLTensor* d_shift,
                                         const DLTensor* d_scale, const DLTensor* workspace, void* stream);

  /// grad (6, S, H) -> d_rows (3T, 6H) contiguous in grad's dtype or float32.
  Status adaln_row_gather_backward(const DLTensor& grad, const DLTensor& timestep_indices,
                                   const DLTensor& token_tags, const DLTensor& d_rows, const DLTensor* workspace,
                                   void* stream);

  /// d_t (T,) float32 from grad (T, C) float32 and the forward's t and parameters.
  Status timestep_sinusoid_backward(const DLTensor& t, const DLTensor& grad, const DLTensor& d_t, double max_period,
                                    bool flip_sin_to_cos, double downscale_freq_shift, double scale, void* stream);

  /// Gets the kernel whose canonical spec text (KernelSpec::describe) is `spec` into the caches
  /// without launching it, so no GPU is needed: from a layer, else compiled (an offline miss when
  /// offline).
  Status prewarm(std::string_view spec);

  /// The resolved options, one "name: value" line each.
  std::string info() const;

  /// Waits for `stream` on `device_id` and reports any bad index a kernel on that stream found
  /// since the last check (then clears it).
  Status synchronize(int device_id, void* stream);

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

/// Workspace bytes of the backward passes (-1: the shapes are invalid). rows = M, seq = S,
/// table_rows = R (rms_norm: 0 for the plain norm).
long long gate_residual_backward_workspace_bytes(long long rows, long long seq, long long table_rows,
                                                 long long hidden);
long long rms_norm_backward_workspace_bytes(long long rows, long long seq, long long table_rows, long long hidden,
                                            bool weighted);
long long adaln_row_gather_backward_workspace_bytes(long long seq, long long table_rows, long long hidden);
long long gate_residual_rms_norm_backward_workspace_bytes(long long rows, long long seq, long long table_rows,
                                                          long long hidden, bool weighted, bool modulated);
long long det_linear_backward_workspace_bytes(long long rows, long long in_features, long long out_features);

}  // namespace exactjit
