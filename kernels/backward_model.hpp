// exactjit host models of the backward passes: each gradient computed on the host in exactly
// the order the kernels use (docs/backward.md): segment sums in the plan's order (tile partials
// from 0, each row's tiles folded from 0, one rounding), dx with the forward's reduction shape.
// The GPU tests and `exactjit selftest` compare the kernels against these bit for bit. Storage
// is raw (uint16 bits for bf16/fp16, float for fp32).
#pragma once

#include "codegen/kernel_spec.hpp"

#include <cstdint>
#include <vector>

namespace exactjit {

/// Keys of the positions: index[s] if in [0, R), else -1 (in no sum).
std::vector<int64_t> keys_of(const void* index, IndexType index_type, int64_t seq, int64_t table_rows);

/// gate_residual: d_y = rT(grad * gate[k]) (rows with a bad key left unwritten) and d_gate (R, H)
/// = segment sums of grad * y, rounded to d_gate_dtype (dtype or F32); either output may be null.
void gate_residual_backward_model(DType dtype, const void* grad, const void* gate, int64_t table_stride,
                                  const std::vector<int64_t>& keys, int64_t table_rows, const void* y, int64_t rows,
                                  int64_t hidden, void* d_y, void* d_gate, DType d_gate_dtype);

/// rms_norm dx of one row: bf16/fp16 with the forward's rstd, fp32 with rstd recomputed in fp64
/// with eps, as the kernel does; weight and scale_row may be null.
void rms_norm_dx_row_model(DType dtype, const void* grad_row, const void* x_row, const void* weight,
                           const void* scale_row, int64_t hidden, float rstd, double eps, void* dx_row);

/// rms_norm dshift and dscale (R, H): segment sums of grad and grad * n, n as in the forward,
/// rounded to out_dtype (dtype or F32).
void rms_norm_table_grads_model(DType dtype, const void* grad, const void* x, const void* weight, const float* rstd,
                                const std::vector<int64_t>& keys, int64_t table_rows, int64_t rows, int64_t hidden,
                                void* dshift, void* dscale, DType out_dtype);

/// rms_norm dweight (H,): d_n * rstd * x summed over tiles, each compensated, folded in order.
/// Plain: tiles of 256 consecutive rows. With scale (a table of row stride table_stride):
/// d_n = grad * rT(1 + scale[k]) and the tiles are the segment plan's, every table row's list in
/// turn (rows with a bad key are in none). Rounded to out_dtype (dtype or F32).
void rms_norm_weight_grad_model(DType dtype, const void* grad, const void* x, const void* scale, int64_t table_stride,
                                const std::vector<int64_t>& keys, int64_t table_rows, const float* rstd, int64_t rows,
                                int64_t hidden, void* dweight, DType out_dtype);

/// adaln_row_gather: d_rows (R, 6H) in out_dtype = segment sums of grad (6, S, H) by key.
void adaln_row_gather_backward_model(DType dtype, DType out_dtype, const void* grad, const std::vector<int64_t>& keys,
                                     int64_t table_rows, int64_t hidden, void* d_rows);

}  // namespace exactjit
