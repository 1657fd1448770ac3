"""exactjit's ops as PyTorch operators (torch.library), and the public functions over them.

Every forward and backward entry point is an operator in the `exactjit` namespace
(torch.ops.exactjit.gate_residual, ...): a schema, the implementation (the Runtime's raw launch on
the shared runtime), a fake kernel giving the exact output shapes, dtypes and strides (so
torch.compile and FakeTensor tracing never touch the GPU), and, on the forward operators, an
autograd kernel whose backward formulas call the backward operators, so AOTAutograd puts the
backward into compiled graphs too.

Operators are functional (each allocates what it returns) except gate_residual_out, which writes
into `out` and says so in its schema (Tensor(a!)). Outputs a caller may not need are still
returned, as empty tensors, because an operator's outputs are fixed by its schema:
  rms_norm         (out, rstd)        rstd is (0,) unless compute_rstd
  gate_residual_rms_norm  (h, out, rstd)  rstd is (0,) unless compute_rstd
  det_linear       (out, pre)         pre is (0,) unless compute_pre
  *_backward       one per gradient   (0,) for a gradient not asked for
The backward operators allocate their workspace themselves, once per call, from torch's caching
allocator on the current stream (under CUDA graph capture, from the graph's pool).

NOTE: the operators are registered with the low-level torch.library.Library API rather than
torch.library.custom_op, and each forward's autograd is one torch.autograd.Function of ours: on
the H200's host custom_op's generated layers (its autograd Function, the redispatch, a
torch.compile-disable wrapper around every implementation) cost more than the launches (see
docs/perf-notes.md). The same Function serves the registered autograd kernel (its forward
redispatches below autograd with the keyset it was given) and the public functions' eager
shortcut (keyset None: its forward runs the implementation directly), so there is one backward
formula per op.

The implementations are registered for every device: a CPU tensor reaches the library, which
refuses it naming the op and the argument, rather than a "no kernel for CPU" from the dispatcher.
Where libexactjit_torch.so is built (_extension.py), each operator also has a CUDA kernel in C++
that does the same below Python; the dispatcher prefers it for CUDA tensors, and the eager
shortcut reaches it in one hop.

Importing this module imports torch and registers the operators; `import exactjit` does it when
torch is already imported, otherwise the first op call (or `exactjit.ops`) does.
"""
import torch
from torch import Tensor

from . import _extension
from ._errors import invalid_argument
from ._runtime import _import_torch, _require_tensors, default_runtime

_import_torch()  # the Runtime's raw launches, which the operators call, use the module it sets up

_FLT_EPSILON = torch.finfo(torch.float32).eps  # torch's RMSNorm eps when eps is None
_LIBRARY = torch.library.Library("exactjit", "DEF")
_AFTER_AUTOGRAD = torch._C._after_autograd_keyset
_PLAIN_TYPES = (Tensor, torch.nn.Parameter)
_CUDA_KEYS = torch._C.DispatchKeySet(torch._C.DispatchKey.CUDA)

OPERATORS = {}  # name -> OpOverload of every operator this module defines
IMPLEMENTATIONS = {}  # name -> its Python implementation (over ctypes)


def _define(schema, impl, fake):
    """Defines exactjit::<schema> with `impl` for every device and `fake` for tracing; returns
    its OpOverload."""
    name = schema.split("(", 1)[0]
    _LIBRARY.define(schema)
    _LIBRARY.impl(name, impl, "CompositeExplicitAutograd")
    torch.library.register_fake(f"exactjit::{name}", fake, lib=_LIBRARY)
    OPERATORS[name] = getattr(torch.ops.exactjit, name).default
    IMPLEMENTATIONS[name] = impl
    return OPERATORS[name]


def _differentiable(overload, function):
    """Registers `function`, an autograd.Function whose forward takes the dispatch keyset first,
    as the operator's autograd kernel; without grad it only redispatches below autograd."""
    def kernel(keyset, *args):
        if torch.is_grad_enabled() and torch._C._any_requires_grad(*args):
            return function.apply(keyset, *args)
        with torch._C._AutoDispatchBelowAutograd():
            return overload.redispatch(keyset & _AFTER_AUTOGRAD, *args)
    _LIBRARY.impl(overload._schema.name.split("::")[1], kernel, "Autograd", with_keyset=True)


def _below_autograd(keyset, overload, impl, args):
    """A Function's forward: the implementation itself on the eager shortcut (keyset None), else
    the operator below autograd."""
    if keyset is None:
        return _run(overload, impl, args)
    with torch._C._AutoDispatchBelowAutograd():
        return overload.redispatch(keyset & _AFTER_AUTOGRAD, *args)


def _needs_grad(*tensors):
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def _direct(first, *tensors):
    """True when the dispatcher would only run the implementation (and the autograd Function):
    eager (not traced by torch.compile), no dispatch mode or functorch transform active, plain
    CUDA tensors (no subclass such as FakeTensor or DTensor, no __torch_function__ override).
    Then the public functions skip the dispatcher's Python layers, which cost more host time
    than the launch itself (docs/perf-notes.md); every other case, compiled graphs included,
    goes through the operator."""
    if torch.compiler.is_compiling() or not first.is_cuda:
        return False
    if torch._C._len_torch_dispatch_stack() or torch._C._are_functorch_transforms_active():
        return False
    present = [t for t in (first,) + tensors if t is not None]
    return all(type(t) in _PLAIN_TYPES for t in present) and not torch._C._has_torch_function(present)


def _call(overload, impl, args, tensors, function=None, differentiable=()):
    """One call of an operator from Python: the operator itself, or, where _direct allows, the
    implementation (no gradient needed) or `function` (an input in `differentiable` requires
    grad) without the dispatcher."""
    if _direct(*tensors):
        if not _needs_grad(*differentiable):
            return _run(overload, impl, args)
        if function is not None:
            return function.apply(None, *args)
    return _translating(overload, args)


def _run(overload, impl, args):
    """The implementation itself, for the eager shortcut: the extension's C++ kernel where it is
    loaded (one hop from Python straight to the CUDA kernel), else the Python implementation."""
    if _extension.path is None:
        return impl(*args)
    return _translating(lambda *a: overload._handle.redispatch_boxed(_CUDA_KEYS, *a), args)


def _translating(call, args):
    """call(*args), with the extension's errors raised as exactjit.Errors, as the ctypes path
    raises them (through the dispatcher too: a CPU tensor takes that way)."""
    try:
        return call(*args)
    except RuntimeError as e:
        error = _extension.translated(e)
        if error is None:
            raise
        raise error from None


def _empty(like, dtype=None):
    """The placeholder for an output that was not asked for."""
    return like.new_empty((0,), dtype=dtype)


# --- gate_residual ---------------------------------------------------------------------------------

def _gate_residual_impl(residual, gate, index, y):
    return default_runtime()._gate_residual(residual, gate, index, y, None)


def _gate_residual_out_impl(residual, gate, index, y, out):
    default_runtime()._gate_residual(residual, gate, index, y, out)


def _gate_residual_backward_impl(grad, gate, index, y, need_d_y, need_d_gate):
    d_y, d_gate = default_runtime().gate_residual_backward(grad, gate, index, y, need_d_y=need_d_y,
                                                           need_d_gate=need_d_gate)
    return (d_y if need_d_y else _empty(y)), (d_gate if need_d_gate else _empty(gate))


def _gate_residual_backward_fake(grad, gate, index, y, need_d_y, need_d_gate):
    d_y = torch.empty_like(y, memory_format=torch.contiguous_format) if need_d_y else _empty(y)
    d_gate = gate.new_empty(gate.shape) if need_d_gate else _empty(gate)
    return d_y, d_gate


GATE_RESIDUAL = _define("gate_residual(Tensor residual, Tensor gate, Tensor index, Tensor y) -> Tensor",
                        _gate_residual_impl,
                        lambda residual, gate, index, y: torch.empty_like(residual,
                                                                          memory_format=torch.contiguous_format))
GATE_RESIDUAL_OUT = _define("gate_residual_out(Tensor residual, Tensor gate, Tensor index, Tensor y, "
                            "Tensor(a!) out) -> ()", _gate_residual_out_impl, lambda *args: None)
GATE_RESIDUAL_BACKWARD = _define("gate_residual_backward(Tensor grad, Tensor gate, Tensor index, Tensor y, "
                                 "bool need_d_y, bool need_d_gate) -> (Tensor, Tensor)",
                                 _gate_residual_backward_impl, _gate_residual_backward_fake)


class _GateResidual(torch.autograd.Function):
    @staticmethod
    def forward(ctx, keyset, residual, gate, index, y):
        out = _below_autograd(keyset, GATE_RESIDUAL, _gate_residual_impl, (residual, gate, index, y))
        ctx.save_for_backward(gate, index, y)
        return out

    @staticmethod
    def backward(ctx, grad):
        _, need_residual, need_gate, _, need_y = ctx.needs_input_grad
        d_y = d_gate = None
        if need_gate or need_y:
            gate, index, y = ctx.saved_tensors
            d_y, d_gate = _call(GATE_RESIDUAL_BACKWARD, _gate_residual_backward_impl,
                                (grad, gate, index, y, need_y, need_gate), (grad, gate, index, y))
        return (None, grad if need_residual else None, d_gate if need_gate else None, None,
                d_y if need_y else None)


_differentiable(GATE_RESIDUAL, _GateResidual)


def gate_residual(residual, gate, index, y, *, out=None):
    """out = residual + gate.index_select(0, index) * y, bit for bit (Runtime.gate_residual has the
    argument rules). Differentiable in residual, gate (through its view: the table gets the
    gradient) and y; out= only without autograd, as torch's own out= ops."""
    _require_tensors(torch, "gate_residual", residual=residual, gate=gate, index=index, y=y)
    args = (residual, gate, index, y)
    if out is None:
        return _call(GATE_RESIDUAL, _gate_residual_impl, args, args, _GateResidual, (residual, gate, y))
    if not isinstance(out, Tensor):
        raise invalid_argument(f"gate_residual: out must be a torch.Tensor, got {type(out).__name__}")
    if _needs_grad(residual, gate, y):
        raise invalid_argument("gate_residual: out= is not differentiable; an input requires grad, so leave out "
                               "unset, or call it under torch.no_grad()")
    _call(GATE_RESIDUAL_OUT, _gate_residual_out_impl, args + (out,), args + (out,))
    return out


# --- adaln_row_gather ------------------------------------------------------------------------------

def _adaln_row_gather_impl(rows, timestep_indices, token_tags):
    return default_runtime()._adaln_row_gather(rows, timestep_indices, token_tags)


def _adaln_row_gather_backward_impl(grad, timestep_indices, token_tags, table_rows, dtype):
    return default_runtime().adaln_row_gather_backward(grad, timestep_indices, token_tags, table_rows, dtype=dtype)


ADALN_ROW_GATHER = _define(
    "adaln_row_gather(Tensor rows, Tensor timestep_indices, Tensor token_tags) -> Tensor", _adaln_row_gather_impl,
    lambda rows, timestep_indices, token_tags: rows.new_empty((6, timestep_indices.shape[0], rows.shape[1] // 6)))
ADALN_ROW_GATHER_BACKWARD = _define(
    "adaln_row_gather_backward(Tensor grad, Tensor timestep_indices, Tensor token_tags, SymInt table_rows, "
    "ScalarType dtype) -> Tensor", _adaln_row_gather_backward_impl,
    lambda grad, ti, tags, table_rows, dtype: grad.new_empty((table_rows, 6 * grad.shape[2]), dtype=dtype))


class _AdalnRowGather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, keyset, rows, timestep_indices, token_tags):
        out = _below_autograd(keyset, ADALN_ROW_GATHER, _adaln_row_gather_impl, (rows, timestep_indices, token_tags))
        ctx.table_rows, ctx.rows_dtype = rows.shape[0], rows.dtype
        ctx.save_for_backward(timestep_indices, token_tags)
        return out

    @staticmethod
    def backward(ctx, grad):
        if not ctx.needs_input_grad[1]:
            return None, None, None, None
        timestep_indices, token_tags = ctx.saved_tensors
        d_rows = _call(ADALN_ROW_GATHER_BACKWARD, _adaln_row_gather_backward_impl,
                       (grad, timestep_indices, token_tags, ctx.table_rows, ctx.rows_dtype),
                       (grad, timestep_indices, token_tags))
        return None, d_rows, None, None


_differentiable(ADALN_ROW_GATHER, _AdalnRowGather)


def adaln_row_gather(rows, timestep_indices, token_tags):
    """The six (S, H) AdaLN chunks rows[ti * 3 + tag, cH:(c+1)H], bit for bit (Runtime.adaln_row_gather
    has the rules). They are the unbind(0) of the operator's one (6, S, H) output, so autograd
    stacks their gradients (zeros for an unused chunk) into the (6, S, H) gradient the backward
    takes; as with any unbind output, they cannot be modified in place under autograd."""
    _require_tensors(torch, "adaln_row_gather", rows=rows, timestep_indices=timestep_indices, token_tags=token_tags)
    if rows.dim() != 2 or rows.shape[1] % 6 != 0 or timestep_indices.dim() != 1:
        raise invalid_argument(f"adaln_row_gather: rows must be (3T, 6H) and timestep_indices (S,) "
                               f"(got {tuple(rows.shape)} and {tuple(timestep_indices.shape)})")
    args = (rows, timestep_indices, token_tags)
    return tuple(_call(ADALN_ROW_GATHER, _adaln_row_gather_impl, args, args, _AdalnRowGather, (rows,)).unbind(0))


# --- rms_norm --------------------------------------------------------------------------------------

def _rms_norm_impl(x, weight, eps, shift, scale, index, compute_rstd):
    if compute_rstd:
        return default_runtime()._rms_norm(x, weight, eps, shift, scale, index, True)
    return default_runtime()._rms_norm(x, weight, eps, shift, scale, index, False), _empty(x, torch.float32)


def _rms_norm_fake(x, weight, eps, shift, scale, index, compute_rstd):
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    rstd = x.new_empty(x.shape[:-1], dtype=torch.float32) if compute_rstd else _empty(x, torch.float32)
    return out, rstd


def _rms_norm_backward_impl(grad, x, weight, scale, index, rstd, eps, need_dx, need_dweight, need_dshift,
                            need_dscale):
    dx, dweight, dshift, dscale = default_runtime().rms_norm_backward(
        grad, x, weight, rstd, eps, scale=scale, index=index, need_dx=need_dx, need_dweight=need_dweight,
        need_dshift=need_dshift, need_dscale=need_dscale)
    return (dx if need_dx else _empty(x), dweight if need_dweight else _empty(x),
            dshift if need_dshift else _empty(x), dscale if need_dscale else _empty(x))


def _rms_norm_backward_fake(grad, x, weight, scale, index, rstd, eps, need_dx, need_dweight, need_dshift,
                            need_dscale):
    dx = torch.empty_like(x, memory_format=torch.contiguous_format) if need_dx else _empty(x)
    dweight = weight.new_empty(weight.shape) if need_dweight else _empty(x)
    dshift = scale.new_empty(scale.shape) if need_dshift else _empty(x)
    dscale = scale.new_empty(scale.shape) if need_dscale else _empty(x)
    return dx, dweight, dshift, dscale


RMS_NORM = _define("rms_norm(Tensor x, Tensor? weight, float eps, Tensor? shift, Tensor? scale, Tensor? index, "
                   "bool compute_rstd) -> (Tensor, Tensor)", _rms_norm_impl, _rms_norm_fake)
RMS_NORM_BACKWARD = _define(
    "rms_norm_backward(Tensor grad, Tensor x, Tensor? weight, Tensor? scale, Tensor? index, Tensor rstd, "
    "float eps, bool need_dx, bool need_dweight, bool need_dshift, bool need_dscale) -> (Tensor, Tensor, Tensor, "
    "Tensor)", _rms_norm_backward_impl, _rms_norm_backward_fake)


class _RmsNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, keyset, x, weight, eps, shift, scale, index, compute_rstd):
        if not compute_rstd:
            raise invalid_argument("rms_norm: an input requires grad but compute_rstd is False; the backward "
                                   "needs rstd (exactjit.rms_norm asks for it itself)")
        out, rstd = _below_autograd(keyset, RMS_NORM, _rms_norm_impl, (x, weight, eps, shift, scale, index, True))
        ctx.mark_non_differentiable(rstd)
        ctx.eps = eps
        ctx.save_for_backward(x, weight, scale, index, rstd)
        return out, rstd

    @staticmethod
    def backward(ctx, grad, _grad_rstd):
        _, need_x, need_weight, _, need_shift, need_scale, _, _ = ctx.needs_input_grad
        if not (need_x or need_weight or need_shift or need_scale):
            return (None,) * 8
        x, weight, scale, index, rstd = ctx.saved_tensors
        dx, dweight, dshift, dscale = _call(
            RMS_NORM_BACKWARD, _rms_norm_backward_impl,
            (grad, x, weight, scale, index, rstd, ctx.eps, need_x, need_weight, need_shift, need_scale),
            (grad, x, weight, scale, index, rstd))
        return (None, dx if need_x else None, dweight if need_weight else None, None, dshift if need_shift else None,
                dscale if need_scale else None, None, None)


_differentiable(RMS_NORM, _RmsNorm)


def rms_norm(x, weight, eps, shift=None, scale=None, index=None, return_rstd=False):
    """F.rms_norm(x, (H,), weight, eps), bit for bit, optionally AdaLN-modulated in the same kernel
    (Runtime.rms_norm has the rules). Differentiable in x, weight, shift and scale (through their
    views); rstd, when returned, is not differentiable. The forward computes rstd only when it
    is returned or the backward will need it."""
    if not isinstance(x, Tensor):
        raise invalid_argument(f"rms_norm: x must be a torch.Tensor, got {type(x).__name__}")
    for name, value in (("weight", weight), ("shift", shift), ("scale", scale), ("index", index)):
        if value is not None and not isinstance(value, Tensor):
            raise invalid_argument(f"rms_norm: {name} must be a torch.Tensor or None, got {type(value).__name__}")
    differentiable = (x, weight, shift, scale)
    compute_rstd = bool(return_rstd) or _needs_grad(*differentiable)
    args = (x, weight, _FLT_EPSILON if eps is None else float(eps), shift, scale, index, compute_rstd)
    out, rstd = _call(RMS_NORM, _rms_norm_impl, args, (x, weight, shift, scale, index), _RmsNorm, differentiable)
    return (out, rstd) if return_rstd else out


# --- gate_residual_rms_norm ------------------------------------------------------------------------

def _gate_residual_rms_norm_impl(residual, gate, index, y, weight, eps, shift, scale, compute_rstd):
    h, out, rstd = default_runtime()._gate_residual_rms_norm(residual, gate, index, y, weight, eps, shift, scale,
                                                             compute_rstd)
    return h, out, (rstd if compute_rstd else _empty(residual, torch.float32))


def _gate_residual_rms_norm_fake(residual, gate, index, y, weight, eps, shift, scale, compute_rstd):
    h = torch.empty_like(residual, memory_format=torch.contiguous_format)
    out = torch.empty_like(residual, memory_format=torch.contiguous_format)
    rstd = (residual.new_empty(residual.shape[:-1], dtype=torch.float32) if compute_rstd
            else _empty(residual, torch.float32))
    return h, out, rstd


def _gate_residual_rms_norm_backward_impl(grad_out, grad_h, h, y, gate, index, weight, scale, rstd, eps, need_d_y,
                                          need_d_gate, need_d_weight, need_d_shift, need_d_scale):
    d_residual, d_y, d_gate, d_weight, d_shift, d_scale = default_runtime().gate_residual_rms_norm_backward(
        grad_out, grad_h, h, y, gate, index, weight, rstd, eps, scale=scale, need_d_y=need_d_y, need_d_gate=need_d_gate,
        need_d_weight=need_d_weight, need_d_shift=need_d_shift, need_d_scale=need_d_scale)
    return (d_residual, d_y if need_d_y else _empty(y), d_gate if need_d_gate else _empty(gate),
            d_weight if need_d_weight else _empty(h), d_shift if need_d_shift else _empty(h),
            d_scale if need_d_scale else _empty(h))


def _gate_residual_rms_norm_backward_fake(grad_out, grad_h, h, y, gate, index, weight, scale, rstd, eps, need_d_y,
                                          need_d_gate, need_d_weight, need_d_shift, need_d_scale):
    d_residual = torch.empty_like(h, memory_format=torch.contiguous_format)
    d_y = torch.empty_like(y, memory_format=torch.contiguous_format) if need_d_y else _empty(y)
    d_gate = gate.new_empty(gate.shape) if need_d_gate else _empty(gate)
    d_weight = weight.new_empty(weight.shape) if need_d_weight else _empty(h)
    d_shift = scale.new_empty(scale.shape) if need_d_shift else _empty(h)
    d_scale = scale.new_empty(scale.shape) if need_d_scale else _empty(h)
    return d_residual, d_y, d_gate, d_weight, d_shift, d_scale


GATE_RESIDUAL_RMS_NORM = _define(
    "gate_residual_rms_norm(Tensor residual, Tensor gate, Tensor index, Tensor y, Tensor? weight, float eps, "
    "Tensor? shift, Tensor? scale, bool compute_rstd) -> (Tensor, Tensor, Tensor)", _gate_residual_rms_norm_impl,
    _gate_residual_rms_norm_fake)
GATE_RESIDUAL_RMS_NORM_BACKWARD = _define(
    "gate_residual_rms_norm_backward(Tensor grad_out, Tensor? grad_h, Tensor h, Tensor y, Tensor gate, Tensor index, "
    "Tensor? weight, Tensor? scale, Tensor rstd, float eps, bool need_d_y, bool need_d_gate, bool need_d_weight, "
    "bool need_d_shift, bool need_d_scale) -> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)",
    _gate_residual_rms_norm_backward_impl, _gate_residual_rms_norm_backward_fake)


class _GateResidualRmsNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, keyset, residual, gate, index, y, weight, eps, shift, scale, compute_rstd):
        if not compute_rstd:
            raise invalid_argument("gate_residual_rms_norm: an input requires grad but compute_rstd is False; the "
                                   "backward needs rstd (exactjit.gate_residual_rms_norm asks for it itself)")
        h, out, rstd = _below_autograd(keyset, GATE_RESIDUAL_RMS_NORM, _gate_residual_rms_norm_impl,
                                       (residual, gate, index, y, weight, eps, shift, scale, True))
        ctx.mark_non_differentiable(rstd)
        # An output nothing used gets None rather than zeros: the backward reads no grad_h then (NULL to
        # the library), and runs only gate_residual's backward when out was not used.
        ctx.set_materialize_grads(False)
        ctx.eps = eps
        ctx.save_for_backward(h, y, gate, index, weight, scale, rstd)
        return h, out, rstd

    @staticmethod
    def backward(ctx, grad_h, grad_out, _grad_rstd):
        _, need_residual, need_gate, _, need_y, need_weight, _, need_shift, need_scale, _ = ctx.needs_input_grad
        if grad_out is None and grad_h is None:
            return (None,) * 10
        h, y, gate, index, weight, scale, rstd = ctx.saved_tensors
        if grad_out is None:  # only h was used: out = norm(h) adds nothing, as in eager's autograd
            d_residual, d_y, d_gate = grad_h, None, None
            if need_gate or need_y:
                d_y, d_gate = _call(GATE_RESIDUAL_BACKWARD, _gate_residual_backward_impl,
                                    (grad_h, gate, index, y, need_y, need_gate), (grad_h, gate, index, y))
            d_weight = d_shift = d_scale = None
        else:
            d_residual, d_y, d_gate, d_weight, d_shift, d_scale = _call(
                GATE_RESIDUAL_RMS_NORM_BACKWARD, _gate_residual_rms_norm_backward_impl,
                (grad_out, grad_h, h, y, gate, index, weight, scale, rstd, ctx.eps, need_y, need_gate, need_weight,
                 need_shift, need_scale), (grad_out, grad_h, h, y, gate, index, weight, scale, rstd))
        return (None, d_residual if need_residual else None, d_gate if need_gate else None, None,
                d_y if need_y else None, d_weight if need_weight else None, None, d_shift if need_shift else None,
                d_scale if need_scale else None, None)


_differentiable(GATE_RESIDUAL_RMS_NORM, _GateResidualRmsNorm)


def gate_residual_rms_norm(residual, gate, index, y, weight, eps, *, shift=None, scale=None):
    """(h, out): h = residual + gate.index_select(0, index) * y and out = F.rms_norm(h, (H,), weight, eps)
    [* (1 + scale.index_select(0, index)) + shift.index_select(0, index)], each bit for bit, in one
    kernel (Runtime.gate_residual_rms_norm has the rules). Differentiable in residual, gate, y,
    weight, shift and scale (through their views); h and out may each feed the rest of the graph."""
    _require_tensors(torch, "gate_residual_rms_norm", residual=residual, gate=gate, index=index, y=y)
    for name, value in (("weight", weight), ("shift", shift), ("scale", scale)):
        if value is not None and not isinstance(value, Tensor):
            raise invalid_argument(f"gate_residual_rms_norm: {name} must be a torch.Tensor or None, got "
                                   f"{type(value).__name__}")
    differentiable = (residual, gate, y, weight, shift, scale)
    args = (residual, gate, index, y, weight, _FLT_EPSILON if eps is None else float(eps), shift, scale,
            _needs_grad(*differentiable))
    h, out, _ = _call(GATE_RESIDUAL_RMS_NORM, _gate_residual_rms_norm_impl, args,
                      (residual, gate, index, y, weight, shift, scale), _GateResidualRmsNorm, differentiable)
    return h, out


# --- timestep_sinusoid -----------------------------------------------------------------------------

def _timestep_sinusoid_impl(t, num_channels, max_period, flip_sin_to_cos, downscale_freq_shift, scale,
                            check_range):
    return default_runtime()._timestep_sinusoid(t, num_channels, max_period, flip_sin_to_cos, downscale_freq_shift,
                                                scale, check_range)


def _timestep_sinusoid_backward_impl(t, grad, max_period, flip_sin_to_cos, downscale_freq_shift, scale):
    return default_runtime().timestep_sinusoid_backward(t, grad, max_period, flip_sin_to_cos, downscale_freq_shift,
                                                        scale)


TIMESTEP_SINUSOID = _define(
    "timestep_sinusoid(Tensor t, SymInt num_channels, float max_period, bool flip_sin_to_cos, "
    "float downscale_freq_shift, float scale, bool check_range) -> Tensor", _timestep_sinusoid_impl,
    lambda t, num_channels, *params: t.new_empty((t.shape[0], num_channels), dtype=torch.float32))
TIMESTEP_SINUSOID_BACKWARD = _define(
    "timestep_sinusoid_backward(Tensor t, Tensor grad, float max_period, bool flip_sin_to_cos, "
    "float downscale_freq_shift, float scale) -> Tensor", _timestep_sinusoid_backward_impl,
    lambda t, grad, *params: t.new_empty((t.shape[0],), dtype=torch.float32))


class _TimestepSinusoid(torch.autograd.Function):
    @staticmethod
    def forward(ctx, keyset, t, num_channels, max_period, flip_sin_to_cos, downscale_freq_shift, scale, check_range):
        args = (t, num_channels, max_period, flip_sin_to_cos, downscale_freq_shift, scale, check_range)
        out = _below_autograd(keyset, TIMESTEP_SINUSOID, _timestep_sinusoid_impl, args)
        ctx.params = (max_period, flip_sin_to_cos, downscale_freq_shift, scale)
        ctx.save_for_backward(t)
        return out

    @staticmethod
    def backward(ctx, grad):
        if not ctx.needs_input_grad[1]:
            return (None,) * 8
        (t,) = ctx.saved_tensors
        d_t = _call(TIMESTEP_SINUSOID_BACKWARD, _timestep_sinusoid_backward_impl, (t, grad) + ctx.params,
                    (t, grad))  # float32
        return (None, d_t.to(t.dtype)) + (None,) * 6


_differentiable(TIMESTEP_SINUSOID, _TimestepSinusoid)


def timestep_sinusoid(t, num_channels=256, max_period=10000, flip_sin_to_cos=True, downscale_freq_shift=0,
                      scale=1.0, check_range=False):
    """diffusers get_timestep_embedding, bit for bit: (T,) -> (T, num_channels) float32
    (Runtime.timestep_sinusoid has the rules). Differentiable in t."""
    if not isinstance(t, Tensor):
        raise invalid_argument(f"timestep_sinusoid: t must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != 1:
        raise invalid_argument(f"timestep_sinusoid: t must be 1-D (T,), got shape {tuple(t.shape)}")
    args = (t, int(num_channels), float(max_period), bool(flip_sin_to_cos), float(downscale_freq_shift), float(scale),
            bool(check_range))
    return _call(TIMESTEP_SINUSOID, _timestep_sinusoid_impl, args, (t,), _TimestepSinusoid, (t,))


# --- det_linear ------------------------------------------------------------------------------------

def _det_linear_impl(x, weight, bias, silu, compute_pre):
    out, pre = default_runtime()._det_linear(x, weight, bias, silu, compute_pre)
    return out, (pre if compute_pre else _empty(out, torch.float32))


def _det_linear_fake(x, weight, bias, silu, compute_pre):
    out = x.new_empty((x.shape[0], weight.shape[0]), dtype=weight.dtype)
    pre = (x.new_empty((x.shape[0], weight.shape[0]), dtype=torch.float32) if compute_pre
           else _empty(out, torch.float32))
    return out, pre


def _det_linear_backward_impl(grad, x, weight, pre_activation, silu, need_input, need_weight, need_bias):
    d_input, d_weight, d_bias = default_runtime().det_linear_backward(
        grad, x, weight, pre_activation, silu=silu, need_input=need_input, need_weight=need_weight,
        need_bias=need_bias)
    return (d_input if need_input else _empty(x, torch.float32), d_weight if need_weight else _empty(weight),
            d_bias if need_bias else _empty(weight))


def _det_linear_backward_fake(grad, x, weight, pre_activation, silu, need_input, need_weight, need_bias):
    grad_dtype = weight.dtype if weight.dtype == torch.bfloat16 else torch.float32
    d_input = x.new_empty(x.shape, dtype=torch.float32) if need_input else _empty(x, torch.float32)
    d_weight = weight.new_empty(weight.shape, dtype=grad_dtype) if need_weight else _empty(weight)
    d_bias = weight.new_empty((weight.shape[0],), dtype=grad_dtype) if need_bias else _empty(weight)
    return d_input, d_weight, d_bias


DET_LINEAR = _define("det_linear(Tensor x, Tensor weight, Tensor? bias, bool silu, bool compute_pre) -> "
                     "(Tensor, Tensor)", _det_linear_impl, _det_linear_fake)
DET_LINEAR_BACKWARD = _define(
    "det_linear_backward(Tensor grad, Tensor x, Tensor weight, Tensor? pre_activation, bool silu, bool need_input, "
    "bool need_weight, bool need_bias) -> (Tensor, Tensor, Tensor)", _det_linear_backward_impl,
    _det_linear_backward_fake)


class _DetLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, keyset, x, weight, bias, silu, compute_pre):
        fp32 = weight.dtype == torch.float32
        if fp32 and silu and not compute_pre:
            raise invalid_argument("det_linear: an input requires grad but compute_pre is False; the float32 SiLU "
                                   "backward needs the pre-activation (exactjit.det_linear asks for it itself)")
        out, pre = _below_autograd(keyset, DET_LINEAR, _det_linear_impl, (x, weight, bias, silu, compute_pre))
        ctx.mark_non_differentiable(pre)
        ctx.silu, ctx.has_bias, ctx.x_dtype = silu, bias is not None, x.dtype
        # float32 weights: SiLU's derivative from the saved pre-activation; bfloat16 (the AdaLN
        # projection): the backward recomputes it from x, the fp32 temb before SiLU and the cast.
        ctx.save_for_backward(x, weight, pre if fp32 and silu else None)
        return out, pre

    @staticmethod
    def backward(ctx, grad, _grad_pre):
        _, need_x, need_weight, need_bias, _, _ = ctx.needs_input_grad
        need_bias = need_bias and ctx.has_bias
        if not (need_x or need_weight or need_bias):
            return (None,) * 6
        x, weight, pre = ctx.saved_tensors
        d_x, d_w, d_b = _call(DET_LINEAR_BACKWARD, _det_linear_backward_impl,
                              (grad, x, weight, pre, ctx.silu, need_x, need_weight, need_bias), (grad, x, weight, pre))
        return (None, d_x.to(ctx.x_dtype) if need_x else None, d_w if need_weight else None,
                d_b if need_bias else None, None, None)


_differentiable(DET_LINEAR, _DetLinear)


def det_linear(x, weight, bias=None, *, silu=False, return_pre_activation=False):
    """act(x @ weight.T + bias) in a fixed, batch-invariant order (Runtime.det_linear has the rules).
    Differentiable in x, weight and bias for T <= 8 (the backward's row limit)."""
    _require_tensors(torch, "det_linear", x=x, weight=weight)
    differentiable = (x, weight, bias)
    compute_pre = bool(return_pre_activation) or (
        bool(silu) and weight.dtype == torch.float32 and _needs_grad(*differentiable))
    args = (x, weight, bias, bool(silu), compute_pre)
    out, pre = _call(DET_LINEAR, _det_linear_impl, args, differentiable, _DetLinear, differentiable)
    return (out, pre) if return_pre_activation else out


def timestep_mlp(features, w1, b1, w2, b2):
    """The timestep MLP, all fp32: det_linear(features, w1, b1) with SiLU, then det_linear(., w2, b2)
    (256 -> 5376 -> 2688 for H3). Differentiable."""
    return det_linear(det_linear(features, w1, b1, silu=True), w2, b2)


def adaln_projection(temb, weight, bias, *, silu=True):
    """The AdaLN table rT(silu(temb)) @ weight.T + bias (silu=False: rT(temb) @ ...) with bfloat16
    weights on tensor cores (the SiLU and the cast fused into the GEMV): (T, 18H) for a block,
    (T, 2H) for the final norm. Differentiable in temb, weight and bias for T <= 8."""
    return det_linear(temb, weight, bias, silu=silu)


# The CUDA kernels in C++ where libexactjit_torch.so is built (they replace the Python
# implementations above for CUDA tensors), on the same runtime as every other exactjit call.
_extension.load(torch, default_runtime().handle)
