"""torch.autograd.Functions for the exactjit ops, over the Runtime's forward and *_backward methods.

The Runtime's ops route here only when grad mode is on and an input requires grad; otherwise they
call the forward directly (no Function, no saved tensors). Imported on first use: it imports torch,
and `import exactjit` must not.

What each Function saves, and why (nothing else is kept alive by the graph):
  GateResidual      gate (the strided table view), index, y. d_residual is the incoming grad
                    itself; d_y needs gate and index, d_gate needs y and index.
  RmsNorm           x, weight, scale, index, rstd. The forward always computes rstd (the
                    backward reuses it instead of recomputing); the shift is not needed.
  AdalnRowGather    the two index tensors and R (the table's row count and dtype, not the table).
  TimestepSinusoid  t and the parameters.
  DetLinear         x, weight and the fp32 pre-activation (the SiLU's derivative needs it).
  DetLinearBf16     temb (fp32, before the SiLU and the bf16 cast) and weight: the backward
                    recomputes rT(silu(temb)) and SiLU's derivative from temb (adaln_projection).

Gradients into AdaLN tables: the ops take views such as `table.view(3T, 6H)[:, 2H:3H]`; a
backward returns a dense (R, H) gradient for that view and autograd's own view backward scatters
it into the table (zeros elsewhere), whatever the view's row stride. Index tensors never get
gradients. ctx.needs_input_grad decides which outputs the library computes (the others are NULL),
and a backward with nothing needed makes no call at all. The backwards are once_differentiable: a
double backward (create_graph=True through them) raises rather than silently treating exactjit's
gradients as constants.
"""
import torch
from torch.autograd.function import once_differentiable

Function = torch.autograd.Function


class GateResidual(Function):
    """out = residual + gate[index] * y. Inputs: (runtime, residual, gate, index, y)."""

    @staticmethod
    def forward(ctx, rt, residual, gate, index, y):
        out = rt._gate_residual(residual, gate, index, y, None)
        ctx.rt = rt
        ctx.save_for_backward(gate, index, y)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        _, need_residual, need_gate, _, need_y = ctx.needs_input_grad
        d_y = d_gate = None
        if need_gate or need_y:
            gate, index, y = ctx.saved_tensors
            d_y, d_gate = ctx.rt.gate_residual_backward(grad, gate, index, y, need_d_y=need_y,
                                                        need_d_gate=need_gate)
        return None, (grad if need_residual else None), d_gate, None, d_y


class RmsNorm(Function):
    """(out, rstd) = rms_norm(x, weight, eps[, shift, scale, index]); rstd is not differentiable.
    Inputs: (runtime, x, weight, eps, shift, scale, index)."""

    @staticmethod
    def forward(ctx, rt, x, weight, eps, shift, scale, index):
        out, rstd = rt._rms_norm(x, weight, eps, shift, scale, index, True)
        ctx.rt = rt
        ctx.save_for_backward(x, weight, scale, index, rstd)
        ctx.eps = eps
        ctx.mark_non_differentiable(rstd)
        return out, rstd

    @staticmethod
    @once_differentiable
    def backward(ctx, grad, _grad_rstd):
        _, need_x, need_weight, _, need_shift, need_scale, _ = ctx.needs_input_grad
        if not (need_x or need_weight or need_shift or need_scale):
            return None, None, None, None, None, None, None
        x, weight, scale, index, rstd = ctx.saved_tensors
        dx, dweight, dshift, dscale = ctx.rt.rms_norm_backward(
            grad, x, weight, rstd, ctx.eps, scale=scale, index=index, need_dx=need_x, need_dweight=need_weight,
            need_dshift=need_shift, need_dscale=need_scale)
        return None, dx, dweight, None, dshift, dscale, None


class AdalnRowGather(Function):
    """The (6, S, H) gather of rows[ti * 3 + tag, cH:(c+1)H]. Inputs: (runtime, rows,
    timestep_indices, token_tags).

    NOTE: the Function returns the one (6, S, H) tensor and the Runtime hands out its unbind(0).
    Autograd's UnbindBackward then stacks the six chunk gradients (zeros for a chunk that got
    none) into the contiguous (6, S, H) gradient the library takes, in one allocation, and the
    chunks are ordinary views with autograd's usual view rules, rather than views made inside a
    custom Function (which autograd treats specially)."""

    @staticmethod
    def forward(ctx, rt, rows, timestep_indices, token_tags):
        out = rt._adaln_row_gather(rows, timestep_indices, token_tags)
        ctx.rt = rt
        ctx.table_rows = rows.shape[0]
        ctx.rows_dtype = rows.dtype
        ctx.save_for_backward(timestep_indices, token_tags)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        if not ctx.needs_input_grad[1]:
            return None, None, None, None
        timestep_indices, token_tags = ctx.saved_tensors
        d_rows = ctx.rt.adaln_row_gather_backward(grad, timestep_indices, token_tags, ctx.table_rows,
                                                  dtype=ctx.rows_dtype)
        return None, d_rows, None, None


class TimestepSinusoid(Function):
    """The (T, C) float32 sinusoidal embedding of t. Inputs: (runtime, t, num_channels,
    max_period, flip_sin_to_cos, downscale_freq_shift, scale, check_range)."""

    @staticmethod
    def forward(ctx, rt, t, num_channels, max_period, flip_sin_to_cos, downscale_freq_shift, scale, check_range):
        out = rt._timestep_sinusoid(t, num_channels, max_period, flip_sin_to_cos, downscale_freq_shift, scale,
                                    check_range)
        ctx.rt = rt
        ctx.params = (max_period, flip_sin_to_cos, downscale_freq_shift, scale)
        ctx.save_for_backward(t)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        if not ctx.needs_input_grad[1]:
            return (None,) * 8
        (t,) = ctx.saved_tensors
        d_t = ctx.rt.timestep_sinusoid_backward(t, grad, *ctx.params)  # float32
        if d_t.dtype != t.dtype:
            d_t = d_t.to(t.dtype)
        return (None, d_t) + (None,) * 6


class DetLinear(Function):
    """(out, pre_activation) = det_linear(x, weight, bias, silu) with float32 weights; the
    pre-activation is not differentiable. Inputs: (runtime, x, weight, bias, silu)."""

    @staticmethod
    def forward(ctx, rt, x, weight, bias, silu):
        out, pre = rt._det_linear(x, weight, bias, silu, True)
        ctx.rt = rt
        ctx.silu = silu
        ctx.has_bias = bias is not None
        ctx.save_for_backward(x, weight, pre)
        ctx.mark_non_differentiable(pre)
        return out, pre

    @staticmethod
    @once_differentiable
    def backward(ctx, grad, _grad_pre):
        _, need_x, need_weight, need_bias, _ = ctx.needs_input_grad
        if not (need_x or need_weight or need_bias):
            return None, None, None, None, None
        x, weight, pre = ctx.saved_tensors
        d_x, d_w, d_b = ctx.rt.det_linear_backward(grad, x, weight, pre, silu=ctx.silu, need_input=need_x,
                                                   need_weight=need_weight, need_bias=need_bias and ctx.has_bias)
        return None, d_x, d_w, d_b, None


class DetLinearBf16(Function):
    """out = rT(rT(silu(temb)) @ weight.T + bias) with bfloat16 weights (the AdaLN projection;
    silu=False: rT(temb)); also the non-differentiable float32 pre-activation (empty unless
    with_pre). Inputs: (runtime, temb, weight, bias, silu, with_pre). The incoming gradient is
    consumed as is (bfloat16, or float32); d_temb is float32 (cast back to temb's dtype), d_weight
    and d_bias bfloat16."""

    @staticmethod
    def forward(ctx, rt, temb, weight, bias, silu, with_pre):
        out, pre = rt._det_linear(temb, weight, bias, silu, with_pre)
        ctx.rt = rt
        ctx.silu = silu
        ctx.has_bias = bias is not None
        ctx.temb_dtype = temb.dtype
        ctx.save_for_backward(temb, weight)
        if pre is None:
            pre = out.new_empty((0,), dtype=torch.float32)
        ctx.mark_non_differentiable(pre)
        return out, pre

    @staticmethod
    @once_differentiable
    def backward(ctx, grad, _grad_pre):
        _, need_temb, need_weight, need_bias, _, _ = ctx.needs_input_grad
        need_bias = need_bias and ctx.has_bias
        if not (need_temb or need_weight or need_bias):
            return None, None, None, None, None, None
        temb, weight = ctx.saved_tensors
        d_temb, d_w, d_b = ctx.rt.det_linear_backward(grad, temb, weight, None, silu=ctx.silu, need_input=need_temb,
                                                      need_weight=need_weight, need_bias=need_bias)
        if d_temb is not None and d_temb.dtype != ctx.temb_dtype:
            d_temb = d_temb.to(ctx.temb_dtype)
        return None, d_temb, d_w, d_b, None, None
