/* exactjit C ABI: the same operations as the C++ API for any language with a C FFI.
 *
 * Tensors are DLPack DLTensors. Every function returns an exactjit_status_t; on failure
 * xj_last_error() returns a message for the calling thread that names the argument, the rule it
 * broke, or the path and spec involved. libexactjit.so loads NVRTC and libcuda at run time, so it
 * loads on machines without a GPU. */
#ifndef EXACTJIT_EXACTJIT_H
#define EXACTJIT_EXACTJIT_H

#include <dlpack/dlpack.h>

/* The version of this header. CMake's project(VERSION) and the wheel's version are read from these
 * three lines; xj_version() is the loaded library's, which a caller can compare with them. */
#define XJ_VERSION_MAJOR 0
#define XJ_VERSION_MINOR 1
#define XJ_VERSION_PATCH 0

#ifdef __cplusplus
extern "C" {
#endif

#define XJ_API __attribute__((visibility("default")))

typedef enum {
  XJ_OK = 0,
  XJ_ERROR_INVALID_ARGUMENT = 1, /* a tensor, shape, dtype or option breaks a rule */
  XJ_ERROR_COMPILE = 2,          /* NVRTC rejected the generated source */
  XJ_ERROR_OFFLINE_MISS = 3,     /* EXACTJIT_OFFLINE and the kernel is in no cache */
  XJ_ERROR_CUDA = 4,             /* a CUDA driver call failed */
  XJ_ERROR_BAD_INDEX = 5,        /* a kernel found an index out of range */
  XJ_ERROR_UNAVAILABLE = 6,      /* NVRTC or the CUDA driver could not be loaded */
  XJ_ERROR_IO = 7,               /* the cache could not be read or written */
  XJ_ERROR_INTERNAL = 8
} exactjit_status_t;

typedef struct xj_runtime xj_runtime;

/* Options for xj_runtime_create; fields left NULL / negative come from the environment. */
typedef struct {
  unsigned struct_size;             /* sizeof(xj_runtime_options), for future growth */
  const char* cache_dir;            /* writable cache directory */
  const char* read_only_cache_path; /* colon-separated read-only layers */
  int offline;                      /* 1 never compile, 0 may compile, -1 from EXACTJIT_OFFLINE */
  const char* arch;                 /* "sm_90", "compute_90"; NULL: the device's */
  int check_after_launch;           /* 1 synchronize and check after each op, -1 from env */
} xj_runtime_options;

XJ_API const char* xj_version(void);
/* The message of the last failed call on this thread ("" if none). */
XJ_API const char* xj_last_error(void);

/* options may be NULL: everything from the environment. A malformed environment variable
 * (EXACTJIT_OFFLINE=maybe: booleans are 1/0, true/false, yes/no, on/off) fails with
 * XJ_ERROR_INVALID_ARGUMENT naming it. */
XJ_API exactjit_status_t xj_runtime_create(const xj_runtime_options* options, xj_runtime** runtime);
XJ_API void xj_runtime_destroy(xj_runtime* runtime);

/* What the runtime resolved its options to, one "name: value" line each (cache, read-only layers,
 * offline, arch, check after launch). Valid until the runtime is destroyed. */
XJ_API const char* xj_runtime_info(xj_runtime* runtime);

/* Gets one kernel into the runtime's caches without launching it, so no GPU is needed: from a cache
 * layer, else compiled by NVRTC (XJ_ERROR_OFFLINE_MISS when offline). `spec` is a kernel's canonical
 * text, as error messages and `exactjit inspect --emit key` print it, e.g.
 * "gate_residual dtype=bf16 hidden=5376 table_stride=32256 vec=8 index=int64 target=sm_90". */
XJ_API exactjit_status_t xj_prewarm(xj_runtime* runtime, const char* spec);

/* out = residual + gate[index[r mod S]] * y with eager's roundings, bitwise equal to PyTorch eager.
 * residual, y, out: (M, H) or (B, S, H) contiguous, one dtype (bf16, fp16, fp32); gate: (R, H) with
 * unit column stride and row stride >= H; index: (S,) int32 or int64 with M % S == 0. out may be
 * residual itself. `stream` is a CUstream of the tensors' device (NULL: the legacy default stream),
 * for this and every op below. */
XJ_API exactjit_status_t xj_gate_residual(xj_runtime* runtime, const DLTensor* residual,
                                          const DLTensor* gate, const DLTensor* index,
                                          const DLTensor* y, const DLTensor* out, void* stream);

/* out[c, s, :] = rows[timestep_indices[s] * 3 + token_tags[s], cH:(c+1)H] for c = 0..5: the six
 * AdaLN chunks of every position, bitwise equal to six index_selects. rows: (3T, 6H) with unit
 * column stride and row stride >= 6H; both index tensors (S,) of one type (int32/int64); out:
 * (6, S, H) contiguous in rows' dtype. */
XJ_API exactjit_status_t xj_adaln_row_gather(xj_runtime* runtime, const DLTensor* rows,
                                             const DLTensor* timestep_indices, const DLTensor* token_tags,
                                             const DLTensor* out, void* stream);

/* PyTorch's fused RMSNorm, bitwise, row by row: out = rT(w * (rstd * x)) (no w: rT(rstd * x)),
 * rstd = rsqrt(mean(x^2) + eps) in PyTorch's reduction order. With shift, scale (R, H) table views
 * of one row stride and index (S,), the AdaLN modulation follows in the same kernel:
 * out = rT(rT(n * rT(1 + scale[i])) + shift[i]), i = index[r mod S]. x: (..., H) contiguous,
 * H % 4 == 0, aligned to 4 elements; weight (H,); rstd (M,) float32. weight, shift, scale, index
 * and rstd may be NULL (shift, scale and index together). */
XJ_API exactjit_status_t xj_rms_norm(xj_runtime* runtime, const DLTensor* x, const DLTensor* weight,
                                     const DLTensor* shift, const DLTensor* scale, const DLTensor* index,
                                     const DLTensor* out, const DLTensor* rstd, double eps, void* stream);

/* The gated residual feeding the next RMSNorm, in one kernel that reads residual and y once:
 * h = residual + gate[i] * y and out = RMSNorm(h, weight, eps) [* (1 + scale[i]) + shift[i]],
 * i = index[r mod S], each bitwise equal to its eager expression. The rules are both ops' (h is
 * gate_residual's out and rms_norm's x), plus: residual, y and gate aligned to 4 elements, the
 * gate's row stride a multiple of 4. weight, shift, scale and rstd may be NULL; shift and scale
 * come together and share the gate's rows, row stride and index. */
XJ_API exactjit_status_t xj_gate_residual_rms_norm(xj_runtime* runtime, const DLTensor* residual,
                                                   const DLTensor* gate, const DLTensor* index,
                                                   const DLTensor* y, const DLTensor* weight,
                                                   const DLTensor* shift, const DLTensor* scale,
                                                   const DLTensor* h, const DLTensor* out,
                                                   const DLTensor* rstd, double eps, void* stream);

/* diffusers get_timestep_embedding(t, C, flip_sin_to_cos, downscale_freq_shift, scale, max_period),
 * bitwise: t (T,) float32 -> out (T, C) float32. check_range: report t outside [0, 1]. */
XJ_API exactjit_status_t xj_timestep_sinusoid(xj_runtime* runtime, const DLTensor* t, const DLTensor* out,
                                              double max_period, int flip_sin_to_cos,
                                              double downscale_freq_shift, double scale, int check_range,
                                              void* stream);

/* out = act(x @ weight^T + bias) in a fixed, batch-invariant order (docs/det_linear.md). x (T, K)
 * float32; weight (N, K) float32 (fp32 fma chains; silu: SiLU on the output; out float32) or
 * bfloat16 (tensor-core mma; silu: SiLU on x before its bf16 cast; out bfloat16, sm_80+); bias (N,)
 * in the weight's dtype; pre_activation (T, N) float32. bias and pre_activation may be NULL. */
XJ_API exactjit_status_t xj_det_linear(xj_runtime* runtime, const DLTensor* x, const DLTensor* weight,
                                       const DLTensor* bias, const DLTensor* out, const DLTensor* pre_activation,
                                       int silu, void* stream);

/* det_linear backward, T <= 8: d_input (T, K) float32, d_weight (N, K), d_bias (N,), each may be
 * NULL; the workspace (xj_det_linear_backward_workspace_bytes) is needed for d_input. fp32 weights:
 * grad float32, all outputs float32, pre_activation the forward's (required with silu). bf16
 * weights (the AdaLN projection): x is temb (float32, before SiLU and the cast), grad bfloat16 or
 * float32 (consumed as is), pre_activation NULL, d_weight and d_bias bfloat16; silu as in the
 * forward (d_input goes through SiLU's derivative at temb). */
XJ_API long long xj_det_linear_backward_workspace_bytes(long long rows, long long in_features,
                                                        long long out_features);
XJ_API exactjit_status_t xj_det_linear_backward(xj_runtime* runtime, const DLTensor* grad,
                                                const DLTensor* pre_activation, const DLTensor* x,
                                                const DLTensor* weight, const DLTensor* d_input,
                                                const DLTensor* d_weight, const DLTensor* d_bias,
                                                const DLTensor* workspace, int silu, void* stream);

/* Tensor parallelism over det_linear's outputs (docs/tensor-parallel.md): d_input is a fold of
 * per-chunk partials, chunk c covering outputs [c * chunk, (c + 1) * chunk) with chunk =
 * xj_det_linear_input_chunk (256 for bf16 weights, 64 for fp32). A rank holding whole chunks of
 * the weight's rows computes their partials; the partials of every chunk, gathered in chunk order,
 * fold into the bits xj_det_linear_backward gives on one GPU. */
XJ_API long long xj_det_linear_input_chunk(int bf16_weights);
/* xj_det_linear_backward with partials (ceil(N / chunk), T, K) float32 contiguous in place of
 * d_input and the workspace: the input pass's per-chunk partials, written, not folded. */
XJ_API exactjit_status_t xj_det_linear_backward_partials(xj_runtime* runtime, const DLTensor* grad,
                                                         const DLTensor* pre_activation, const DLTensor* x,
                                                         const DLTensor* weight, const DLTensor* partials,
                                                         const DLTensor* d_weight, const DLTensor* d_bias, int silu,
                                                         void* stream);
/* d_input (T, K) float32 from the partials (C, T, K) float32 of every chunk in order: added in
 * ascending c, compensated; with bf16 weights and silu then through SiLU's derivative at x (T, K)
 * float32, the forward's temb (fp32 weights: SiLU is on the output, its derivative inside the
 * partials). bf16_weights and silu: the forward's. */
XJ_API exactjit_status_t xj_det_linear_input_fold(xj_runtime* runtime, const DLTensor* partials, const DLTensor* x,
                                                  const DLTensor* d_input, int bf16_weights, int silu, void* stream);

/* Backward passes (NUMERICS.md; docs/backward.md): deterministic (bit-for-bit repeatable, no
 * atomics in any floating-point sum), no host synchronisation, safe under CUDA graph capture.
 * Sums over positions are segment sums: positions grouped by table row in ascending flattened
 * order, tiles of 256 positions summed in order, each row's tiles folded in order, one rounding.
 * A reducing backward takes a caller-provided workspace: a CUDA uint8 tensor (contiguous, on the
 * tensors' device) of at least the bytes its *_workspace_bytes function returns (-1: the shapes
 * are invalid). Any output pointer may be NULL: that gradient is not computed. */

/* rows = M (all rows of y), seq = S, table_rows = R (gate rows), hidden = H. */
XJ_API long long xj_gate_residual_backward_workspace_bytes(long long rows, long long seq, long long table_rows,
                                                          long long hidden);
/* d_y = rT(grad * gate[i]) (bitwise equal to eager's VJP), like y; d_gate (R, H) contiguous in the
 * gate dtype, or float32 (the same sums rounded once to fp32), = segment sums of grad * y.
 * d_residual is grad itself. */
XJ_API exactjit_status_t xj_gate_residual_backward(xj_runtime* runtime, const DLTensor* grad,
                                                   const DLTensor* gate, const DLTensor* index,
                                                   const DLTensor* y, const DLTensor* d_y,
                                                   const DLTensor* d_gate, const DLTensor* workspace,
                                                   void* stream);

/* table_rows = R of shift/scale (0 for the plain norm); weighted: the forward had a weight. */
XJ_API long long xj_rms_norm_backward_workspace_bytes(long long rows, long long seq, long long table_rows,
                                                     long long hidden, int weighted);
/* grad, x: like the forward's x; weight: the forward's or NULL; scale, index: the forward's (both
 * or neither; the modulated form); rstd (M,) float32 saved by the forward and eps the forward's
 * (fp32 dx recomputes rstd in fp64 with it). Outputs: dx like x;
 * dweight (H,); dshift, dscale (R, H) contiguous; each in x's dtype, or float32 (the same sums
 * rounded once to fp32). */
XJ_API exactjit_status_t xj_rms_norm_backward(xj_runtime* runtime, const DLTensor* grad, const DLTensor* x,
                                              const DLTensor* weight, const DLTensor* scale,
                                              const DLTensor* index, const DLTensor* rstd, double eps,
                                              const DLTensor* dx, const DLTensor* dweight,
                                              const DLTensor* dshift, const DLTensor* dscale,
                                              const DLTensor* workspace, void* stream);

/* rms_norm_backward's parameter gradients before their fold, for sequence parallelism (the fold
 * runs elsewhere: xj_segment_fold): the same arguments (eps is not needed without dx), and the
 * tile partials of dshift, dscale and dweight, each NULL or (P, H) float32 contiguous with P >=
 * xj_rms_norm_backward_partial_tiles (rows past the tiles are not written), tile t's in row t.
 * Modulated, the tiles are the index's segment plan's (xj_segment_fold folds dshift and dscale;
 * dweight is every tile folded in order into one row); plain, dweight's tiles of 256 consecutive
 * rows. The workspace: xj_rms_norm_backward_workspace_bytes. */
XJ_API long long xj_rms_norm_backward_partial_tiles(long long rows, long long seq, long long table_rows);
XJ_API exactjit_status_t xj_rms_norm_backward_tile_partials(
    xj_runtime* runtime, const DLTensor* grad, const DLTensor* x, const DLTensor* weight, const DLTensor* scale,
    const DLTensor* index, const DLTensor* rstd, const DLTensor* shift_partials, const DLTensor* scale_partials,
    const DLTensor* weight_partials, const DLTensor* workspace, void* stream);

/* table_rows = R of the gate (and of shift/scale when modulated). */
XJ_API long long xj_gate_residual_rms_norm_backward_workspace_bytes(long long rows, long long seq,
                                                                   long long table_rows, long long hidden,
                                                                   int weighted, int modulated);
/* grad_out like out; grad_h like h, or NULL when h feeds nothing but the norm; h, y, gate, index,
 * weight, scale, rstd and eps: the forward's (h is its output, weight and scale NULL as there).
 * d_residual (required) like h = rT(grad_h + dh), the sum eager's autograd forms from the norm's
 * dh; d_y like y and d_gate (R, H) as gate_residual_backward gives them for that sum; d_weight
 * (H,), d_shift, d_scale (R, H) contiguous as rms_norm_backward gives them. */
XJ_API exactjit_status_t xj_gate_residual_rms_norm_backward(
    xj_runtime* runtime, const DLTensor* grad_out, const DLTensor* grad_h, const DLTensor* h, const DLTensor* y,
    const DLTensor* gate, const DLTensor* index, const DLTensor* weight, const DLTensor* scale,
    const DLTensor* rstd, double eps, const DLTensor* d_residual, const DLTensor* d_y, const DLTensor* d_gate,
    const DLTensor* d_weight, const DLTensor* d_shift, const DLTensor* d_scale, const DLTensor* workspace,
    void* stream);

/* seq = S, table_rows = R = 3T rows of the forward's rows view, hidden = H. */
XJ_API long long xj_adaln_row_gather_backward_workspace_bytes(long long seq, long long table_rows,
                                                             long long hidden);
/* grad (6, S, H) contiguous -> d_rows (R, 6H) contiguous, in the rows' dtype or float32: per
 * table row the segment sum of the positions that gathered it. */
XJ_API exactjit_status_t xj_adaln_row_gather_backward(xj_runtime* runtime, const DLTensor* grad,
                                                      const DLTensor* timestep_indices,
                                                      const DLTensor* token_tags, const DLTensor* d_rows,
                                                      const DLTensor* workspace, void* stream);

/* Sequence parallelism (docs/sequence-parallel.md): a segment sum split over ranks gives the
 * single-GPU bits when each tile's partial is computed whole on one rank and the partials are
 * folded in the single-GPU order. segment_fold is that fold: partials (P, W) float32 contiguous,
 * tile t's in row t of the single-GPU plan of index (S,) over rows = M = B * S rows (P >=
 * xj_segment_fold_tiles, the plan's bound; rows past its tiles are not read) -> out (R, W)
 * contiguous, float32/bf16/fp16: each table row's tiles added in order, compensated, rounded once,
 * as the op's own backward would. The workspace holds the plan (xj_segment_fold_workspace_bytes). */
XJ_API long long xj_segment_fold_tiles(long long rows, long long seq, long long table_rows);
XJ_API long long xj_segment_fold_workspace_bytes(long long rows, long long seq, long long table_rows);
XJ_API exactjit_status_t xj_segment_fold(xj_runtime* runtime, const DLTensor* partials, const DLTensor* index,
                                         long long rows, const DLTensor* out, const DLTensor* workspace,
                                         void* stream);

/* One rank's share of a sequence-parallel segment sum, from the replicated keys (S,) (table rows
 * in [0, table_rows), or -1: in no sum), batch copies B and the shard bounds shard_start (ranks + 1,)
 * = 0 <= ... <= S (rank r holds positions [shard_start[r], shard_start[r + 1]) of every batch copy:
 * local rows b * S_r + s - shard_start[r]). Host only. Fills `sizes`, then each array that is not
 * NULL (call once with NULL arrays for the sizes):
 *   tile_start (rank_tiles + 1): offsets of this rank's tiles in `rows`;
 *   rows (rank_rows): its tiles' rows in summation order, as ids into its extended buffer (its
 *     local_rows rows, then the received rows grouped by source rank, as an all-to-all lays them);
 *   receive_counts (ranks), send_counts (ranks): rows it receives from / sends to each rank;
 *   send_rows (sent_rows): the local rows it sends, grouped by receiver, in the receiver's order;
 *   gathered_slot (tiles): where each single-GPU tile's partial lies after an all-gather of every
 *     rank's partials, each padded to max_tiles rows. */
typedef struct {
  long long tiles;       /* tiles of the single-GPU plan */
  long long max_tiles;   /* the most tiles one rank computes: the gather's stride */
  long long rank_tiles;  /* tiles this rank computes */
  long long rank_rows;   /* rows of those tiles */
  long long local_rows;  /* rows this rank holds: B * S_r */
  long long sent_rows;   /* rows it sends to the other ranks */
} xj_sequence_parallel_sizes;
XJ_API exactjit_status_t xj_sequence_parallel_plan(const long long* keys, long long seq, long long table_rows,
                                                   long long batch, const long long* shard_start, long long ranks,
                                                   long long rank, xj_sequence_parallel_sizes* sizes,
                                                   long long* tile_start, long long* rows,
                                                   long long* receive_counts, long long* send_counts,
                                                   long long* send_rows, long long* gathered_slot);

/* d_t (T,) float32 = sum over the C channels of grad (T, C) float32 times d out / d t, in a fixed
 * order; the other arguments are the forward's. */
XJ_API exactjit_status_t xj_timestep_sinusoid_backward(xj_runtime* runtime, const DLTensor* t,
                                                       const DLTensor* grad, const DLTensor* d_t,
                                                       double max_period, int flip_sin_to_cos,
                                                       double downscale_freq_shift, double scale,
                                                       void* stream);

/* Waits for stream on device_id and reports a bad index found by a kernel on that stream since the
 * last check. The next op call on the stream reports it too, without a synchronisation. */
XJ_API exactjit_status_t xj_synchronize(xj_runtime* runtime, int device_id, void* stream);

#ifdef __cplusplus
}
#endif

#endif /* EXACTJIT_EXACTJIT_H */
