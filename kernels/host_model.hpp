// exactjit host models: each op computed on the host with the shared numerics
// (templates/*.cuh compiled for the host), element by element in the order NUMERICS.md gives.
// The GPU tests and `exactjit selftest` compare kernels against these bit for bit.
#pragma once

#include "codegen/kernel_spec.hpp"

#include <cstdint>

namespace exactjit {

/// out[r, j] = rT(residual[r, j] + rT(gate[index[r % seq] * table_stride + j] * y[r, j])).
/// Storage as raw bits (uint16 for bf16/fp16, float for fp32). Rows whose index is out of
/// [0, table_rows) are left unwritten, as the kernel does; returns how many rows that was.
int64_t gate_residual_model(DType dtype, const void* residual, const void* gate, int64_t table_stride,
                            int64_t table_rows, const void* index, IndexType index_type, const void* y,
                            void* out, int64_t rows, int64_t seq, int64_t hidden);

/// rms_norm, one row: the fp32 value PyTorch's RMSNorm hands to rsqrtf, add(div(s, H), eps), with the
/// sum of squares s reduced in the kernel's order (NUMERICS.md: 128 threads over 4-element vectors,
/// fma chains, the warp shuffle tree, (w0 + w2) + (w1 + w3)).
float rms_norm_rsqrt_argument_model(DType dtype, const void* x_row, int64_t hidden, float eps);

/// rms_norm, one output row for a given rstd: rT(w * (rstd * x)) (no weight: rT(rstd * x)), then, with
/// shift and scale rows, rT(rT(n * rT(1 + scale)) + shift). rstd is an input because the GPU's
/// rsqrt.approx.f32 has no bit-exact host equivalent.
void rms_norm_row_model(DType dtype, const void* x_row, const void* weight, const void* shift_row,
                        const void* scale_row, int64_t hidden, float rstd, void* out_row);

/// out[c, s, :] = rows[ti[s] * 3 + tag[s], cH : (c+1)H] on raw storage of `element_bytes` each;
/// positions with an index out of range are left unwritten; returns how many.
int64_t adaln_row_gather_model(size_t element_bytes, const void* rows, int64_t table_stride, int64_t timesteps,
                               const void* timestep_indices, const void* token_tags, IndexType index_type, void* out,
                               int64_t seq, int64_t hidden);

/// det_linear with fp32 weights, before the activation: v[t, n] = add(dot, b[n]) (no bias: dot)
/// with dot in the kernel's order (docs/det_linear.md): 32 lanes, lane l's compensated sum of the
/// fma chains of its groups of 4-element chunks (l + 64m, l + 64m + 32), the lanes' sums combined
/// in the xor-butterfly tree, value(). x (T, K), weight (N, K), v (T, N).
void det_linear_fp32_model(const float* x, const float* weight, const float* bias, int64_t rows, int64_t in_features,
                           int64_t out_features, float* v);

/// det_linear backward (fp32 weights) in the kernels' order: d_v = grad (or through SiLU at the
/// pre-activation), d_input[t, k] = compensated fold over 64-output chunks (ascending, from 0) of
/// each chunk's compensated sum of fma chains over 4 outputs; d_weight[n, k] an fma chain over t,
/// d_bias[n] a compensated sum over t. Null outputs are skipped. With silu the host's expf may
/// differ from libdevice's in the last bits.
void det_linear_fp32_backward_model(const float* grad, const float* pre_activation, const float* x,
                                    const float* weight, int64_t rows, int64_t in_features, int64_t out_features,
                                    bool silu, float* d_input, float* d_weight, float* d_bias);

/// det_linear backward with bf16 weights (templates/det_linear_grad_bf16.cuh), bitwise in the
/// kernels' order: grad (T, N) as fp32 values (a bf16 gradient widened exactly), temb (T, K),
/// weight (N, K) bf16 bits; d_input[t, k] (fp32) = the chunked, compensated d_x of grad and W
/// (the fp32 backward's form with 256-output chunks of 8-output fma chains), then (silu) times SiLU's derivative
/// at temb; d_weight[n, k] = rT(fma chain over t of
/// grad[t, n] * x[t, k]), x = rT(silu(temb)) or rT(temb); d_bias[n] = rT(compensated sum over t).
/// d_weight and d_bias as bf16 bits; null outputs are skipped. With silu the host's expf may
/// differ from libdevice's in the last bits.
void det_linear_bf16_backward_model(const float* grad, const float* temb, const uint16_t* weight, int64_t rows,
                                    int64_t in_features, int64_t out_features, bool silu, float* d_input,
                                    uint16_t* d_weight, uint16_t* d_bias);

}  // namespace exactjit
