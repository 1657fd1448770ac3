"""exactjit.Runtime: one xj_runtime handle, and the raw launches on it.

The methods take torch tensors, describe them as DLTensors and launch on torch's current CUDA
stream of the tensors' device, so they order with the surrounding PyTorch work exactly like a torch
op. They return at once; an out-of-range index found by a kernel is reported by the next exactjit
call on the same stream (without a synchronisation) or by synchronize(), not by the op itself
(unless the runtime checks after each launch).

These are the launches themselves, not differentiable and not visible to torch.compile: the
PyTorch operators in _ops.py (torch.ops.exactjit.*, and the module-level functions exactjit.*)
call them on the shared runtime (default_runtime()) and add autograd, fake kernels and the
schema. A forward method refuses an input that requires grad under grad mode rather than
silently dropping the gradient. The *_backward methods take the forward's inputs (or what it
saved) and the upstream gradient, and compute only the gradients asked for; a reducing backward
gets its workspace from torch's caching allocator on the current stream (see _workspace).

torch is imported on the first op call, never at import time: `import exactjit` must work on a
machine without torch or a GPU.
"""
import ctypes
import operator
import os
import sys
import threading

from . import _lib
from ._dlpack import pack
from ._errors import invalid_argument

_torch = None
_current_stream = None  # device index -> CUstream of torch's current stream there, as an int
_GATE_RESIDUAL_ARGS = ("residual", "gate", "index", "y", "out")
_ADALN_ROW_GATHER_ARGS = ("rows", "timestep_indices", "token_tags", "out")
_RMS_NORM_ARGS = ("x", "weight", "shift", "scale", "index", "out", "rstd")
_RMS_NORM_BACKWARD_ARGS = ("grad", "x", "weight", "scale", "index", "rstd", "dx", "dweight", "dshift", "dscale",
                           "workspace")
_RMS_NORM_BACKWARD_EPS_AT = _RMS_NORM_BACKWARD_ARGS.index("rstd") + 1  # the C ABI's eps follows rstd
_GATE_RESIDUAL_RMS_NORM_ARGS = ("residual", "gate", "index", "y", "weight", "shift", "scale", "h", "out", "rstd")
_GATE_RESIDUAL_RMS_NORM_BACKWARD_ARGS = ("grad_out", "grad_h", "h", "y", "gate", "index", "weight", "scale", "rstd",
                                         "d_residual", "d_y", "d_gate", "d_weight", "d_shift", "d_scale", "workspace")
_GATE_RESIDUAL_RMS_NORM_BACKWARD_EPS_AT = _GATE_RESIDUAL_RMS_NORM_BACKWARD_ARGS.index("rstd") + 1
_default_runtime = None
_default_lock = threading.Lock()


def _import_torch():
    global _torch, _current_stream
    if _torch is None:
        import torch
        # NOTE: torch._C._cuda_getCurrentRawStream is what Inductor's generated code calls before
        # each launch: 0.1 us on the GPU machine against 1.7 us for torch.cuda.current_stream(),
        # which builds a Stream object. The public call is the fallback should it ever go away.
        raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        _current_stream = raw or (lambda device: torch.cuda.current_stream(device).cuda_stream)
        _torch = torch
    return _torch


def default_runtime():
    """The shared Runtime, created on first use from the environment (xj_runtime_create(NULL)).
    It lives until the process exits, so kernels compile and load once per process."""
    global _default_runtime
    rt = _default_runtime
    if rt is None:
        with _default_lock:
            if _default_runtime is None:
                _default_runtime = Runtime()
                _default_runtime._shared = True
            rt = _default_runtime
    return rt


def _refuse_grad(torch, op, *tensors):
    """A raw launch cannot record a backward: refuse it rather than return a result whose
    gradient would silently be missing."""
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors):
        raise invalid_argument(
            f"Runtime.{op} is not differentiable and an input requires grad; call exactjit.{op} (the "
            f"torch operator, with autograd) or run it under torch.no_grad()")


def _require_tensors(torch, op, **tensors):
    for name, value in tensors.items():
        if not isinstance(value, torch.Tensor):
            raise invalid_argument(f"{op}: {name} must be a torch.Tensor, got {type(value).__name__}")


def _count(op, name, value):
    """A shape count for a *_workspace_bytes query: an int (bools and numpy ints too), else TypeError."""
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{op}: {name} must be an int, got {type(value).__name__}") from None


def _workspace_bytes(function, **counts):
    """Calls the library's `function`(*counts) -> bytes; -1 (invalid shapes) raises ValueError."""
    op = function[3:]  # without the xj_ prefix
    values = [_count(op, name, value) for name, value in counts.items()]
    nbytes = _lib.function(function)(*values)
    if nbytes < 0:
        shapes = ", ".join(f"{name}={value}" for name, value in zip(counts, values))
        raise ValueError(f"{op}: invalid shapes ({shapes}); {function} returned {nbytes}")
    return int(nbytes)


def _rms_norm_grad_request(torch, op, grad, x, weight, rstd, scale, index, need_dweight, need_dshift, need_dscale):
    """rms_norm's backward entry points' checks and defaults: (need_dweight, need_dshift,
    need_dscale, H, M, S, R). need_dweight defaults to "weight is given", need_dshift and need_dscale
    to "modulated"; a gradient without its parameter is refused; plain, S = 1 as in the forward."""
    _require_tensors(torch, op, grad=grad, x=x, rstd=rstd)
    for name, value in (("weight", weight), ("scale", scale), ("index", index)):
        if value is not None and not isinstance(value, torch.Tensor):
            raise invalid_argument(f"{op}: {name} must be a torch.Tensor or None, got {type(value).__name__}")
    modulated = scale is not None or index is not None
    need_dweight = weight is not None if need_dweight is None else bool(need_dweight)
    need_dshift = modulated if need_dshift is None else bool(need_dshift)
    need_dscale = modulated if need_dscale is None else bool(need_dscale)
    if need_dweight and weight is None:
        raise invalid_argument(f"{op}: dweight asked for but the forward had no weight")
    if (need_dshift or need_dscale) and scale is None:
        raise invalid_argument(f"{op}: dshift/dscale asked for but scale and index were not given "
                               "(the plain norm has no table)")
    hidden = x.shape[-1] if x.dim() >= 1 else 0
    rows = x.numel() // hidden if hidden else 0
    table_rows = (scale.shape[0] if scale.dim() == 2 else 0) if scale is not None else 0
    seq = (index.shape[0] if index.dim() == 1 else 0) if index is not None else 1
    return need_dweight, need_dshift, need_dscale, hidden, rows, seq, table_rows


def _workspace(torch, op, function, device, **counts):
    """A fresh uint8 workspace of the bytes `function` asks for, from torch's caching allocator.

    NOTE: one allocation per backward call, on the current stream, freed (to the cache) when the
    call returns. The caching allocator makes this about as cheap as a pointer bump after the first
    call, it stays ordered with our kernels because both use the current stream, and under CUDA
    graph capture it comes from the graph's private pool, so capture needs nothing special. At
    least one byte, so the library never sees a NULL data pointer. Invalid shapes (-1) become an
    InvalidArgumentError naming the op, like every other argument error of an op.
    """
    try:
        nbytes = _workspace_bytes(function, **counts)
    except ValueError as e:
        raise invalid_argument(f"{op}: {e}") from None
    return torch.empty((max(nbytes, 1),), dtype=torch.uint8, device=device)


def _tristate(value):
    return -1 if value is None else int(bool(value))


def _c_string(value):
    return None if value is None else os.fsencode(value)



def _det_linear_backward_inputs(torch, op, grad, x, weight, pre_activation):
    """(grad, x) as det_linear's backward entry points take them: bfloat16 weights consume a
    bfloat16 or float32 gradient as is and x (temb) as float32, and have no pre_activation; float32
    weights take a float32 gradient."""
    if weight.dtype != torch.bfloat16:
        return grad.float().contiguous(), x
    if pre_activation is not None:
        raise invalid_argument(f"{op}: pre_activation must be None for bfloat16 weights")
    grad = grad if grad.dtype in (torch.bfloat16, torch.float32) else grad.float()
    return grad.contiguous(), x.float().contiguous()


def _det_linear_parameter_grads(torch, x, weight, need_weight, need_bias):
    """Fresh (d_weight, d_bias) for det_linear's backward, None where not asked for: in the
    weight's dtype for bfloat16 weights, else float32."""
    dtype = weight.dtype if weight.dtype == torch.bfloat16 else torch.float32
    d_weight = torch.empty_like(weight, dtype=dtype) if need_weight else None
    d_bias = torch.empty((weight.shape[0],), dtype=dtype, device=x.device) if need_bias else None
    return d_weight, d_bias


def _bf16_weights(torch, op, weight_dtype):
    """Whether det_linear's weights are bfloat16 (else float32, the only other dtype it takes)."""
    if weight_dtype not in (torch.bfloat16, torch.float32):
        raise invalid_argument(f"{op}: weight_dtype must be torch.bfloat16 or torch.float32 (got {weight_dtype})")
    return weight_dtype == torch.bfloat16


def _pack_optional(torch, op, names, values):
    """(what keeps the DLTensors alive, their pointers in `names` order with None for each absent
    value): the packing of every call that takes optional tensors."""
    present = [(n, t) for n, t in zip(names, values) if t is not None]
    packed, addresses = pack(torch, op, [n for n, _ in present], [t for _, t in present])
    by_name = dict(zip((n for n, _ in present), addresses))
    return packed, [by_name.get(n) for n in names]

class Runtime:
    """Owns exactjit's kernel caches and per-device state (an xj_runtime). Thread-safe.

    Every option left as None comes from the environment (EXACTJIT_CACHE_DIR, EXACTJIT_CACHE_PATH,
    EXACTJIT_OFFLINE, EXACTJIT_ARCH, EXACTJIT_CHECK_AFTER_LAUNCH); with no options at all the
    library is given NULL and reads the environment itself. Most code wants the shared
    `exactjit.runtime()` rather than its own: each Runtime compiles and loads its own kernels.
    """

    def __init__(self, *, cache_dir=None, read_only_cache_path=None, offline=None, arch=None,
                 check_after_launch=None):
        self._handle = None
        self._shared = False
        options = None
        if any(v is not None for v in (cache_dir, read_only_cache_path, offline, arch,
                                        check_after_launch)):
            if read_only_cache_path is not None and not isinstance(
                    read_only_cache_path, (str, bytes, os.PathLike)):
                read_only_cache_path = os.pathsep.join(os.fspath(p) for p in read_only_cache_path)
            options = _lib.RuntimeOptions(
                ctypes.sizeof(_lib.RuntimeOptions), _c_string(cache_dir),
                _c_string(read_only_cache_path), _tristate(offline), _c_string(arch),
                _tristate(check_after_launch))
        handle = ctypes.c_void_p()
        _lib.check(_lib.lib.xj_runtime_create(options, ctypes.byref(handle)), "xj_runtime_create")
        self._handle = handle

    @property
    def handle(self):
        """The xj_runtime* as an int, for passing to other code that speaks the C ABI."""
        return self._live().value

    def _live(self):
        if self._handle is None:
            raise invalid_argument("this exactjit.Runtime was closed")
        return self._handle

    def close(self):
        """Destroys the xj_runtime. Kernels already launched must have finished (synchronize).
        The shared runtime (exactjit.runtime()) serves every op, the C++ kernels' too, until the
        process exits: closing it is refused."""
        if self._shared:
            raise invalid_argument("exactjit.runtime() is shared by every exactjit op until the process exits and "
                                   "cannot be closed; close an exactjit.Runtime() of your own instead")
        handle, self._handle = self._handle, None
        if handle is not None:
            _lib.lib.xj_runtime_destroy(handle)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        # NOTE: at interpreter exit the CUDA context may already be torn down (torch's atexit
        # hooks, driver shutdown); leaking the runtime then is safe, destroying it is not.
        if not sys.is_finalizing() and not self._shared:
            self.close()

    def gate_residual(self, residual, gate, index, y, *, out=None):
        """out = residual + gate[index[r mod S]] * y, bitwise equal to PyTorch eager's
        `residual + gate.index_select(0, index) * y` (bf16, fp16, fp32; docs: NUMERICS.md).

        residual, y: (S, H), (M, H) with M % S == 0, or (B, S, H), contiguous, one dtype.
        gate: (R, H) with unit column stride and row stride >= H, e.g. one chunk of an AdaLN
        table: `table.view(3 * T, 6 * H)[:, c * H:(c + 1) * H]` (no copy needed).
        index: (S,) int32 or int64 on the same device; values must lie in [0, R). A bad value is
        not an error here: the kernel records it, and the next call on the stream (or synchronize())
        raises BadIndexError.
        out: optional destination like residual; by default a new contiguous tensor.
        The library checks every rule and names the one broken (InvalidArgumentError).
        Not differentiable (exactjit.gate_residual is).
        """
        torch = _import_torch()
        _require_tensors(torch, "gate_residual", residual=residual, gate=gate, index=index, y=y)
        if out is not None and not isinstance(out, torch.Tensor):
            raise invalid_argument(
                f"gate_residual: out must be a torch.Tensor, got {type(out).__name__}")
        _refuse_grad(torch, "gate_residual", residual, gate, y)
        return self._gate_residual(residual, gate, index, y, out)

    def _gate_residual(self, residual, gate, index, y, out):
        """The forward alone: no argument checks beyond the library's, no autograd."""
        torch = _torch
        if out is None:
            out = torch.empty_like(residual, memory_format=torch.contiguous_format)
        stream = _current_stream(residual.get_device()) if residual.is_cuda else None
        # `packed` owns the DLTensors and their shape arrays: it must outlive the call.
        packed, tensors = pack(torch, "gate_residual", _GATE_RESIDUAL_ARGS,
                               (residual, gate, index, y, out))
        status = _lib.lib.xj_gate_residual(self._live(), *tensors, stream)
        del packed
        _lib.check(status, "xj_gate_residual")
        return out

    def synchronize(self, device=None, stream=None):
        """Waits for `stream` (default: torch's current stream of `device`, default: the current
        device) and raises BadIndexError if a kernel on that stream found an out-of-range index since
        the last check, naming the op. The record is cleared, so the context stays usable."""
        torch = _import_torch()
        if device is None:
            device_index = torch.cuda.current_device()
        elif isinstance(device, int):
            device_index = device
        else:
            device = torch.device(device)
            if device.type != "cuda":
                raise invalid_argument(f"synchronize: {device} is not a CUDA device")
            device_index = torch.cuda.current_device() if device.index is None else device.index
        if stream is None:
            stream = _current_stream(device_index)
        elif isinstance(stream, torch.cuda.Stream):
            stream = stream.cuda_stream
        _lib.check(_lib.lib.xj_synchronize(self._live(), device_index, stream), "xj_synchronize")

    def adaln_row_gather(self, rows, timestep_indices, token_tags):
        """The six AdaLN chunks of every position, bitwise equal to six index_selects:
        chunk c of position s is rows[timestep_indices[s] * 3 + token_tags[s], c*H:(c+1)*H].

        rows: (3T, 6H) with unit column stride and row stride >= 6H, e.g. the block's AdaLN
        table (T, 18H) viewed as `table.view(3 * T, 6 * H)`. timestep_indices and token_tags:
        (S,) of one integer type (int32 or int64). Returns a tuple of six (S, H) tensors (shift_msa,
        scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp), views of one (6, S, H) tensor.
        Out-of-range indices are checked before they are combined and reported like gate_residual's.
        Not differentiable (exactjit.adaln_row_gather is).
        """
        torch = _import_torch()
        _require_tensors(torch, "adaln_row_gather", rows=rows, timestep_indices=timestep_indices,
                         token_tags=token_tags)
        if rows.dim() != 2 or rows.shape[1] % 6 != 0 or timestep_indices.dim() != 1:
            raise invalid_argument(
                f"adaln_row_gather: rows must be (3T, 6H) and timestep_indices (S,) "
                f"(got {tuple(rows.shape)} and {tuple(timestep_indices.shape)})")
        _refuse_grad(torch, "adaln_row_gather", rows)
        return tuple(self._adaln_row_gather(rows, timestep_indices, token_tags).unbind(0))

    def _adaln_row_gather(self, rows, timestep_indices, token_tags):
        """The forward alone: the (6, S, H) tensor."""
        torch = _torch
        out = torch.empty((6, timestep_indices.shape[0], rows.shape[1] // 6), dtype=rows.dtype, device=rows.device)
        stream = _current_stream(rows.get_device()) if rows.is_cuda else None
        packed, tensors = pack(torch, "adaln_row_gather", _ADALN_ROW_GATHER_ARGS,
                               (rows, timestep_indices, token_tags, out))
        status = _lib.lib.xj_adaln_row_gather(self._live(), *tensors, stream)
        del packed
        _lib.check(status, "xj_adaln_row_gather")
        return out

    def rms_norm(self, x, weight, eps, shift=None, scale=None, index=None, return_rstd=False):
        """PyTorch's RMSNorm bit for bit (`F.rms_norm(x, (H,), weight, eps)`), optionally with
        the AdaLN modulation of the same rows in the same kernel:
        `norm(x) * (1 + scale.index_select(0, index)) + shift.index_select(0, index)`.

        x: (..., S, H) contiguous, H % 4 == 0; weight: (H,) or None; eps: a float (None means
        FLT_EPSILON, as PyTorch). shift, scale: (R, H) table views with one row stride, index:
        (S,) int32/int64 shared across the batch (all three or none). Returns out, or
        (out, rstd) with the fp32 rstd of every row when return_rstd.
        Not differentiable (exactjit.rms_norm is).
        """
        torch = _import_torch()
        if not isinstance(x, torch.Tensor):
            raise invalid_argument(f"rms_norm: x must be a torch.Tensor, got {type(x).__name__}")
        optional = {"weight": weight, "shift": shift, "scale": scale, "index": index}
        for name, value in optional.items():
            if value is not None and not isinstance(value, torch.Tensor):
                raise invalid_argument(f"rms_norm: {name} must be a torch.Tensor or None, got {type(value).__name__}")
        if eps is None:
            eps = torch.finfo(torch.float32).eps
        _refuse_grad(torch, "rms_norm", x, weight, shift, scale)
        return self._rms_norm(x, weight, eps, shift, scale, index, return_rstd)

    def _rms_norm(self, x, weight, eps, shift, scale, index, return_rstd):
        """The forward alone (eps already resolved)."""
        torch = _torch
        out = torch.empty_like(x, memory_format=torch.contiguous_format)
        rstd = torch.empty(x.shape[:-1], dtype=torch.float32, device=x.device) if return_rstd else None
        stream = _current_stream(x.get_device()) if x.is_cuda else None
        packed, args = _pack_optional(torch, "rms_norm", _RMS_NORM_ARGS, (x, weight, shift, scale, index, out, rstd))
        status = _lib.lib.xj_rms_norm(self._live(), *args, float(eps), stream)
        del packed
        _lib.check(status, "xj_rms_norm")
        return (out, rstd) if return_rstd else out

    def gate_residual_rms_norm(self, residual, gate, index, y, weight, eps, *, shift=None, scale=None,
                               return_rstd=False):
        """The gated residual and the RMSNorm that follows it, in one kernel, each bit for bit:
        `h = residual + gate.index_select(0, index) * y` and `out = F.rms_norm(h, (H,), weight, eps)`,
        with shift and scale `out * (1 + scale.index_select(0, index)) + shift.index_select(0, index)`.

        residual, y, gate, index: as gate_residual's; weight (H,) or None; eps as rms_norm's (None:
        FLT_EPSILON); shift, scale: both or neither, table views with the gate's rows and row stride
        (the block's chunks of one AdaLN table). Returns (h, out), or (h, out, rstd) with the fp32
        rstd of every row when return_rstd. Not differentiable (exactjit.gate_residual_rms_norm is).
        """
        torch = _import_torch()
        op = "gate_residual_rms_norm"
        _require_tensors(torch, op, residual=residual, gate=gate, index=index, y=y)
        for name, value in (("weight", weight), ("shift", shift), ("scale", scale)):
            if value is not None and not isinstance(value, torch.Tensor):
                raise invalid_argument(f"{op}: {name} must be a torch.Tensor or None, got {type(value).__name__}")
        if eps is None:
            eps = torch.finfo(torch.float32).eps
        _refuse_grad(torch, op, residual, gate, y, weight, shift, scale)
        h, out, rstd = self._gate_residual_rms_norm(residual, gate, index, y, weight, eps, shift, scale, return_rstd)
        return (h, out, rstd) if return_rstd else (h, out)

    def _gate_residual_rms_norm(self, residual, gate, index, y, weight, eps, shift, scale, return_rstd):
        """The forward alone (eps already resolved): (h, out, rstd or None)."""
        torch = _torch
        h = torch.empty_like(residual, memory_format=torch.contiguous_format)
        out = torch.empty_like(residual, memory_format=torch.contiguous_format)
        rstd = torch.empty(residual.shape[:-1], dtype=torch.float32, device=residual.device) if return_rstd else None
        tensors = (residual, gate, index, y, weight, shift, scale, h, out, rstd)
        stream = _current_stream(residual.get_device()) if residual.is_cuda else None
        packed, args = _pack_optional(torch, "gate_residual_rms_norm", _GATE_RESIDUAL_RMS_NORM_ARGS, tensors)
        status = _lib.lib.xj_gate_residual_rms_norm(self._live(), *args, float(eps), stream)
        del packed
        _lib.check(status, "xj_gate_residual_rms_norm")
        return h, out, rstd

    def timestep_sinusoid(self, t, num_channels=256, max_period=10000, flip_sin_to_cos=True,
                          downscale_freq_shift=0, scale=1.0, check_range=False):
        """diffusers `get_timestep_embedding(t, num_channels, flip_sin_to_cos, downscale_freq_shift,
        scale, max_period)`, bit for bit: t (T,) of any float dtype (cast with .float(), as diffusers
        does) -> (T, num_channels) float32. check_range: a t that is not finite or outside [0, 1]
        (the H3 convention) is reported like a bad index. Not differentiable (exactjit.timestep_sinusoid is)."""
        torch = _import_torch()
        if not isinstance(t, torch.Tensor):
            raise invalid_argument(f"timestep_sinusoid: t must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 1:
            raise invalid_argument(f"timestep_sinusoid: t must be 1-D (T,), got shape {tuple(t.shape)}")
        _refuse_grad(torch, "timestep_sinusoid", t)
        return self._timestep_sinusoid(t, num_channels, max_period, flip_sin_to_cos, downscale_freq_shift, scale,
                                       check_range)

    def _timestep_sinusoid(self, t, num_channels, max_period, flip_sin_to_cos, downscale_freq_shift, scale,
                           check_range):
        """The forward alone."""
        torch = _torch
        t = t.float().contiguous()
        out = torch.empty((t.shape[0], int(num_channels)), dtype=torch.float32, device=t.device)
        stream = _current_stream(t.get_device()) if t.is_cuda else None
        packed, tensors = pack(torch, "timestep_sinusoid", ("t", "out"), (t, out))
        status = _lib.lib.xj_timestep_sinusoid(self._live(), *tensors, float(max_period), int(bool(flip_sin_to_cos)),
                                               float(downscale_freq_shift), float(scale), int(bool(check_range)),
                                               stream)
        del packed
        _lib.check(status, "xj_timestep_sinusoid")
        return out

    def det_linear(self, x, weight, bias=None, *, silu=False, return_pre_activation=False):
        """out = act(x @ weight.T + bias) in a fixed, batch-invariant order (docs/det_linear.md):
        a row's result does not depend on how many rows run with it. x (T, K) float32; weight (N, K)
        float32 (fma chains; silu applies SiLU to the output; out float32) or bfloat16 (tensor-core
        mma; silu applies SiLU to x before its bf16 cast, as the AdaLN projection does; out
        bfloat16). bias (N,) in the weight's dtype or None. With return_pre_activation, also the
        float32 x @ weight.T + bias. Not differentiable (exactjit.det_linear is, for T <= 8)."""
        torch = _import_torch()
        _refuse_grad(torch, "det_linear", x, weight, bias)
        out, pre = self._det_linear(x, weight, bias, silu, return_pre_activation)
        return (out, pre) if return_pre_activation else out

    def _det_linear(self, x, weight, bias, silu, with_pre_activation):
        """The forward alone: (out, pre_activation or None)."""
        torch = _torch
        x = x.float().contiguous()
        out = torch.empty((x.shape[0], weight.shape[0]), dtype=weight.dtype, device=x.device)
        pre = (torch.empty((x.shape[0], weight.shape[0]), dtype=torch.float32, device=x.device)
               if with_pre_activation else None)
        names = ("x", "weight", "bias", "out", "pre_activation")
        stream = _current_stream(x.get_device()) if x.is_cuda else None
        packed, args = _pack_optional(torch, "det_linear", names, (x, weight, bias, out, pre))
        status = _lib.lib.xj_det_linear(self._live(), *args, int(bool(silu)), stream)
        del packed
        _lib.check(status, "xj_det_linear")
        return out, pre

    def det_linear_backward(self, grad, x, weight, pre_activation=None, *, silu=False, need_input=True,
                            need_weight=True, need_bias=True):
        """Gradients of det_linear, T <= 8: (d_input, d_weight, d_bias), each None when not asked
        for. d_input (float32) in fixed output chunks (64 for fp32 weights, 256 for bf16) folded in
        order, d_weight and d_bias (in the weight's dtype) as chains over the rows.
        float32 weights: grad is used as float32; pre_activation (the forward's) is required with silu.
        bfloat16 weights (the AdaLN projection): x is the forward's temb (float32, before SiLU and
        the bf16 cast), grad bfloat16 or float32 (consumed as is: an fp32 table gradient, e.g.
        adaln_row_gather_backward(..., dtype=torch.float32), is not rounded first); silu as in the
        forward (d_input goes through SiLU's derivative at temb); pre_activation must be None."""
        torch = _import_torch()
        op = "det_linear_backward"
        grad, x = _det_linear_backward_inputs(torch, op, grad, x, weight, pre_activation)
        rows, in_features, out_features = x.shape[0], x.shape[1], weight.shape[0]
        d_input = torch.empty_like(x, dtype=torch.float32) if need_input else None
        d_weight, d_bias = _det_linear_parameter_grads(torch, x, weight, need_weight, need_bias)
        workspace = (_workspace(torch, op, "xj_det_linear_backward_workspace_bytes", x.device, rows=rows,
                                in_features=in_features, out_features=out_features) if need_input else None)
        names = ("grad", "pre_activation", "x", "weight", "d_input", "d_weight", "d_bias", "workspace")
        values = (grad, pre_activation, x, weight, d_input, d_weight, d_bias, workspace)
        stream = _current_stream(x.get_device()) if x.is_cuda else None
        packed, args = _pack_optional(torch, op, names, values)
        status = _lib.lib.xj_det_linear_backward(self._live(), *args, int(bool(silu)), stream)
        del packed
        _lib.check(status, "xj_det_linear_backward")
        return d_input, d_weight, d_bias

    # Tensor parallelism over det_linear's outputs (exactjit.tensor_parallel, docs/tensor-parallel.md):
    # d_input is a fold of per-chunk partials; a rank computes its chunks', every rank folds all.

    @staticmethod
    def det_linear_input_chunk(weight_dtype):
        """Outputs per chunk of det_linear's d_input partials: 256 for bfloat16 weights, 64 for
        float32. A column shard of whole chunks computes exactly its chunks' partials."""
        torch = _import_torch()
        bf16 = _bf16_weights(torch, "det_linear_input_chunk", weight_dtype)
        return int(_lib.function("xj_det_linear_input_chunk")(int(bf16)))

    def det_linear_backward_partials(self, grad, x, weight, pre_activation=None, *, silu=False, need_weight=True,
                                     need_bias=True):
        """det_linear_backward with d_input left as its per-chunk partials, not folded:
        (partials (C, T, K) float32, d_weight, d_bias), C = ceil(N / det_linear_input_chunk), chunk c
        the outputs [c * chunk, (c + 1) * chunk) of this weight's N. Arguments as det_linear_backward's.
        The partials of every chunk of the whole layer, in order, fold into its d_input
        (det_linear_input_fold)."""
        fn = _lib.function("xj_det_linear_backward_partials")
        torch = _import_torch()
        op = "det_linear_backward_partials"
        _require_tensors(torch, op, grad=grad, x=x, weight=weight)
        grad, x = _det_linear_backward_inputs(torch, op, grad, x, weight, pre_activation)
        chunk = self.det_linear_input_chunk(weight.dtype)
        partials = torch.empty((-(-weight.shape[0] // chunk), x.shape[0], x.shape[1]), dtype=torch.float32,
                               device=x.device)
        d_weight, d_bias = _det_linear_parameter_grads(torch, x, weight, need_weight, need_bias)
        names = ("grad", "pre_activation", "x", "weight", "partials", "d_weight", "d_bias")
        values = (grad, pre_activation, x, weight, partials, d_weight, d_bias)
        stream = _current_stream(x.get_device()) if x.is_cuda else None
        packed, args = _pack_optional(torch, op, names, values)
        status = fn(self._live(), *args, int(bool(silu)), stream)
        del packed
        _lib.check(status, "xj_det_linear_backward_partials")
        return partials, d_weight, d_bias

    def det_linear_input_fold(self, partials, x, *, weight_dtype, silu=False):
        """det_linear's d_input (T, K) float32 from the partials (C, T, K) float32 of every chunk of
        its outputs, in chunk order (e.g. every rank's det_linear_backward_partials, gathered): added
        in ascending chunk order, compensated, then for bfloat16 weights with silu through SiLU's
        derivative at x, the forward's temb: the bits det_linear_backward gives on one GPU.
        weight_dtype and silu: the forward's."""
        fn = _lib.function("xj_det_linear_input_fold")
        torch = _import_torch()
        op = "det_linear_input_fold"
        _require_tensors(torch, op, partials=partials, x=x)
        bf16 = _bf16_weights(torch, op, weight_dtype)
        x = x.float().contiguous()
        d_input = torch.empty(x.shape, dtype=torch.float32, device=x.device)
        stream = _current_stream(x.get_device()) if x.is_cuda else None
        packed, tensors = pack(torch, op, ("partials", "x", "d_input"), (partials, x, d_input))
        status = fn(self._live(), *tensors, int(bf16), int(bool(silu)), stream)
        del packed
        _lib.check(status, "xj_det_linear_input_fold")
        return d_input

    # Backward passes (NUMERICS.md): deterministic, no host synchronisation, CUDA-graph safe. Each
    # launches on torch's current stream of the tensors' device and returns at once; a bad index
    # is reported like the forwards'. The library checks every argument rule.

    @staticmethod
    def gate_residual_backward_workspace_bytes(rows, seq, table_rows, hidden):
        """Workspace bytes of gate_residual_backward for M = rows rows of y, index length S = seq,
        R = table_rows gate rows and hidden size H. ValueError for shapes the library calls
        invalid (it returns -1); TypeError for a count that is not an int."""
        return _workspace_bytes("xj_gate_residual_backward_workspace_bytes", rows=rows, seq=seq,
                                table_rows=table_rows, hidden=hidden)

    @staticmethod
    def rms_norm_backward_workspace_bytes(rows, seq, table_rows, hidden, weighted):
        """Workspace bytes of rms_norm_backward: M rows of x, index length S, R rows of
        shift/scale (0 for the plain norm), H, and whether the forward had a weight."""
        return _workspace_bytes("xj_rms_norm_backward_workspace_bytes", rows=rows, seq=seq, table_rows=table_rows,
                                hidden=hidden, weighted=int(bool(weighted)))

    @staticmethod
    def gate_residual_rms_norm_backward_workspace_bytes(rows, seq, table_rows, hidden, weighted, modulated):
        """Workspace bytes of gate_residual_rms_norm_backward: M rows of y, index length S, R rows of
        the gate (and of shift/scale), H, whether the forward had a weight and whether it was modulated."""
        return _workspace_bytes("xj_gate_residual_rms_norm_backward_workspace_bytes", rows=rows, seq=seq,
                                table_rows=table_rows, hidden=hidden, weighted=int(bool(weighted)),
                                modulated=int(bool(modulated)))

    @staticmethod
    def adaln_row_gather_backward_workspace_bytes(seq, table_rows, hidden):
        """Workspace bytes of adaln_row_gather_backward: S positions, R = 3T rows, H."""
        return _workspace_bytes("xj_adaln_row_gather_backward_workspace_bytes", seq=seq, table_rows=table_rows,
                                hidden=hidden)

    def gate_residual_backward(self, grad, gate, index, y, *, need_d_y=True, need_d_gate=True, dtype=None):
        """Gradients of out = residual + gate[index[r mod S]] * y for the upstream `grad` (like y):
        returns (d_y, d_gate), each None when not asked for. d_y = rT(grad * gate[i]), like y,
        bitwise equal to eager's VJP; d_gate (R, H) contiguous in `dtype` (default the gate's;
        torch.float32 keeps the fp32 sums), the fixed-order fp32 segment sums of grad * y with one
        rounding. d_residual is grad itself (not computed). gate, index, y: the forward's (gate may
        be the strided table view)."""
        fn = _lib.function("xj_gate_residual_backward")
        torch = _import_torch()
        op = "gate_residual_backward"
        _require_tensors(torch, op, grad=grad, gate=gate, index=index, y=y)
        if not (need_d_y or need_d_gate):
            return None, None
        grad = grad.contiguous()
        d_y = torch.empty_like(y, memory_format=torch.contiguous_format) if need_d_y else None
        d_gate = (torch.empty(tuple(gate.shape), dtype=gate.dtype if dtype is None else dtype, device=gate.device)
                  if need_d_gate else None)
        hidden = y.shape[-1] if y.dim() >= 1 else 0
        workspace = _workspace(torch, op, "xj_gate_residual_backward_workspace_bytes", grad.device,
                               rows=y.numel() // hidden if hidden else 0, seq=index.shape[0] if index.dim() == 1 else 0,
                               table_rows=gate.shape[0] if gate.dim() == 2 else 0, hidden=hidden)
        names = ("grad", "gate", "index", "y", "d_y", "d_gate", "workspace")
        stream = _current_stream(grad.get_device()) if grad.is_cuda else None
        packed, args = _pack_optional(torch, op, names, (grad, gate, index, y, d_y, d_gate, workspace))
        status = fn(self._live(), *args, stream)
        del packed
        _lib.check(status, "xj_gate_residual_backward")
        return d_y, d_gate

    def rms_norm_backward(self, grad, x, weight, rstd, eps, *, scale=None, index=None, need_dx=True, need_dweight=None,
                          need_dshift=None, need_dscale=None):
        """Gradients of rms_norm (plain, or modulated when scale and index are given) for the upstream
        `grad` (like x): returns (dx, dweight, dshift, dscale), each None when not asked for.

        x, weight (or None), scale, index: the forward's (the shift is not needed); rstd: the fp32
        rstd the forward returned (return_rstd=True), one per row of x; eps: the forward's (None:
        FLT_EPSILON, as the forward; fp32 dx recomputes rstd in fp64 with it). need_dweight defaults to
        "weight is given", need_dshift and need_dscale to "modulated". dx like x; dweight (H,) in
        the weight's dtype; dshift, dscale (R, H) contiguous in the table's dtype (scale's), to be
        scattered into the table through the shift/scale views by the caller (autograd does it).
        Deterministic and batch-invariant in dx; not claimed bitwise equal to eager."""
        fn = _lib.function("xj_rms_norm_backward")
        torch = _import_torch()
        op = "rms_norm_backward"
        if eps is None:
            eps = torch.finfo(torch.float32).eps
        need_dweight, need_dshift, need_dscale, hidden, rows, seq, table_rows = _rms_norm_grad_request(
            torch, op, grad, x, weight, rstd, scale, index, need_dweight, need_dshift, need_dscale)
        if not (need_dx or need_dweight or need_dshift or need_dscale):
            return None, None, None, None
        grad = grad.contiguous()
        rstd = rstd.reshape(-1)  # (M,), as the C ABI documents it
        dx = torch.empty_like(x, memory_format=torch.contiguous_format) if need_dx else None
        dweight = torch.empty((hidden,), dtype=weight.dtype, device=weight.device) if need_dweight else None
        dshift = torch.empty((table_rows, hidden), dtype=scale.dtype, device=scale.device) if need_dshift else None
        dscale = torch.empty((table_rows, hidden), dtype=scale.dtype, device=scale.device) if need_dscale else None
        workspace = _workspace(torch, op, "xj_rms_norm_backward_workspace_bytes", grad.device, rows=rows, seq=seq,
                               table_rows=table_rows, hidden=hidden, weighted=int(weight is not None))
        tensors = (grad, x, weight, scale, index, rstd, dx, dweight, dshift, dscale, workspace)
        stream = _current_stream(grad.get_device()) if grad.is_cuda else None
        packed, args = _pack_optional(torch, op, _RMS_NORM_BACKWARD_ARGS, tensors)
        at = _RMS_NORM_BACKWARD_EPS_AT
        status = fn(self._live(), *args[:at], float(eps), *args[at:], stream)
        del packed
        _lib.check(status, "xj_rms_norm_backward")
        return dx, dweight, dshift, dscale

    def rms_norm_backward_tile_partials(self, grad, x, weight, rstd, *, scale=None, index=None, need_dweight=None,
                                        need_dshift=None, need_dscale=None):
        """rms_norm_backward's parameter gradients before their fold (sequence parallelism folds a
        shard's tiles elsewhere, docs/sequence-parallel.md): returns (dshift, dscale, dweight)
        partials, each (P, H) float32 with tile t's in row t (P the bound
        xj_rms_norm_backward_partial_tiles; rows past the tiles are unwritten), or None when not
        asked for. Modulated (scale and index given) the tiles are the index's segment plan's
        (segment_fold folds dshift's and dscale's; dweight's fold is every tile in order into one
        row); plain, dweight's tiles of 256 consecutive rows. The arguments and defaults are
        rms_norm_backward's."""
        fn = _lib.function("xj_rms_norm_backward_tile_partials")
        torch = _import_torch()
        op = "rms_norm_backward_tile_partials"
        need_dweight, need_dshift, need_dscale, hidden, rows, seq, table_rows = _rms_norm_grad_request(
            torch, op, grad, x, weight, rstd, scale, index, need_dweight, need_dshift, need_dscale)
        if not (need_dweight or need_dshift or need_dscale):
            return None, None, None
        grad = grad.contiguous()
        rstd = rstd.reshape(-1)
        tiles = _workspace_bytes("xj_rms_norm_backward_partial_tiles", rows=rows, seq=seq, table_rows=table_rows)
        partials = [torch.empty((tiles, hidden), dtype=torch.float32, device=x.device) if need else None
                    for need in (need_dshift, need_dscale, need_dweight)]
        workspace = _workspace(torch, op, "xj_rms_norm_backward_workspace_bytes", grad.device, rows=rows, seq=seq,
                               table_rows=table_rows, hidden=hidden, weighted=int(weight is not None))
        names = ("grad", "x", "weight", "scale", "index", "rstd", "shift_partials", "scale_partials",
                 "weight_partials", "workspace")
        stream = _current_stream(grad.get_device()) if grad.is_cuda else None
        packed, args = _pack_optional(torch, op, names, (grad, x, weight, scale, index, rstd, *partials, workspace))
        status = fn(self._live(), *args, stream)
        del packed
        _lib.check(status, "xj_rms_norm_backward_tile_partials")
        return tuple(partials)

    def gate_residual_rms_norm_backward(self, grad_out, grad_h, h, y, gate, index, weight, rstd, eps, *, scale=None,
                                        need_d_y=True, need_d_gate=True, need_d_weight=None, need_d_shift=None,
                                        need_d_scale=None):
        """Gradients of (h, out) = gate_residual_rms_norm(residual, gate, index, y, weight, eps, shift=, scale=)
        for the upstream grad_out (like out) and grad_h (like h, or None when h feeds nothing but the
        norm): returns (d_residual, d_y, d_gate, d_weight, d_shift, d_scale), each but d_residual None
        when not asked for.

        h (the forward's output), y, gate, index, weight (or None), scale (or None: the plain norm;
        the shift is not needed), rstd (the forward's, return_rstd=True) and eps: the forward's.
        need_d_weight defaults to "weight is given", need_d_shift and need_d_scale to "modulated".
        d_residual, like h, is the sum grad_h + dh that eager's autograd forms from the norm's dh (always
        computed: d_y and d_gate are taken from it); d_y like y and d_gate (R, H) contiguous as
        gate_residual_backward gives them for that sum; d_weight (H,), d_shift, d_scale (R, H)
        contiguous as rms_norm_backward gives them, to be scattered into the table through the views
        by the caller (autograd does it). Deterministic; not claimed bitwise equal to eager."""
        fn = _lib.function("xj_gate_residual_rms_norm_backward")
        torch = _import_torch()
        op = "gate_residual_rms_norm_backward"
        _require_tensors(torch, op, grad_out=grad_out, h=h, y=y, gate=gate, index=index, rstd=rstd)
        if eps is None:
            eps = torch.finfo(torch.float32).eps
        for name, value in (("grad_h", grad_h), ("weight", weight), ("scale", scale)):
            if value is not None and not isinstance(value, torch.Tensor):
                raise invalid_argument(f"{op}: {name} must be a torch.Tensor or None, got {type(value).__name__}")
        modulated = scale is not None
        need_d_weight = weight is not None if need_d_weight is None else bool(need_d_weight)
        need_d_shift = modulated if need_d_shift is None else bool(need_d_shift)
        need_d_scale = modulated if need_d_scale is None else bool(need_d_scale)
        if need_d_weight and weight is None:
            raise invalid_argument(f"{op}: d_weight asked for but the forward had no weight")
        if (need_d_shift or need_d_scale) and scale is None:
            raise invalid_argument(f"{op}: d_shift/d_scale asked for but scale was not given (the forward was not "
                                   "modulated)")
        grad_out = grad_out.contiguous()
        grad_h = grad_h.contiguous() if grad_h is not None else None
        rstd = rstd.reshape(-1)  # (M,), as the C ABI documents it
        hidden = h.shape[-1] if h.dim() >= 1 else 0
        d_residual = torch.empty_like(h, memory_format=torch.contiguous_format)
        d_y = torch.empty_like(y, memory_format=torch.contiguous_format) if need_d_y else None
        d_gate = torch.empty(tuple(gate.shape), dtype=gate.dtype, device=gate.device) if need_d_gate else None
        d_weight = torch.empty((hidden,), dtype=weight.dtype, device=weight.device) if need_d_weight else None
        d_shift = torch.empty(tuple(scale.shape), dtype=scale.dtype, device=scale.device) if need_d_shift else None
        d_scale = torch.empty(tuple(scale.shape), dtype=scale.dtype, device=scale.device) if need_d_scale else None
        workspace = _workspace(torch, op, "xj_gate_residual_rms_norm_backward_workspace_bytes", grad_out.device,
                               rows=h.numel() // hidden if hidden else 0, seq=index.shape[0] if index.dim() == 1 else 0,
                               table_rows=gate.shape[0] if gate.dim() == 2 else 0, hidden=hidden,
                               weighted=int(weight is not None), modulated=int(modulated))
        tensors = (grad_out, grad_h, h, y, gate, index, weight, scale, rstd, d_residual, d_y, d_gate, d_weight, d_shift,
                   d_scale, workspace)
        stream = _current_stream(grad_out.get_device()) if grad_out.is_cuda else None
        packed, args = _pack_optional(torch, op, _GATE_RESIDUAL_RMS_NORM_BACKWARD_ARGS, tensors)
        at = _GATE_RESIDUAL_RMS_NORM_BACKWARD_EPS_AT
        status = fn(self._live(), *args[:at], float(eps), *args[at:], stream)
        del packed
        _lib.check(status, "xj_gate_residual_rms_norm_backward")
        return d_residual, d_y, d_gate, d_weight, d_shift, d_scale

    def adaln_row_gather_backward(self, grad, timestep_indices, token_tags, table_rows, *, dtype=None):
        """Gradient of adaln_row_gather for the upstream grad (6, S, H) (made contiguous):
        d_rows (table_rows, 6H) contiguous, per table row the fixed-order fp32 segment sum of the
        positions that gathered it, rounded once to `dtype` (default grad's dtype, i.e. the rows';
        torch.float32 keeps the fp32 sums, e.g. to feed a projection backward)."""
        fn = _lib.function("xj_adaln_row_gather_backward")
        torch = _import_torch()
        op = "adaln_row_gather_backward"
        _require_tensors(torch, op, grad=grad, timestep_indices=timestep_indices, token_tags=token_tags)
        table_rows = _count(op, "table_rows", table_rows)
        if grad.dim() != 3 or grad.shape[0] != 6:
            raise invalid_argument(f"{op}: grad must be (6, S, H), got shape {tuple(grad.shape)}")
        grad = grad.contiguous()
        seq, hidden = grad.shape[1], grad.shape[2]
        d_rows = torch.empty((table_rows, 6 * hidden), dtype=grad.dtype if dtype is None else dtype,
                             device=grad.device)
        workspace = _workspace(torch, op, "xj_adaln_row_gather_backward_workspace_bytes", grad.device, seq=seq,
                               table_rows=table_rows, hidden=hidden)
        stream = _current_stream(grad.get_device()) if grad.is_cuda else None
        packed, tensors = pack(torch, op, ("grad", "timestep_indices", "token_tags", "d_rows", "workspace"),
                               (grad, timestep_indices, token_tags, d_rows, workspace))
        status = fn(self._live(), *tensors, stream)
        del packed
        _lib.check(status, "xj_adaln_row_gather_backward")
        return d_rows

    @staticmethod
    def segment_fold_tiles(rows, seq, table_rows):
        """The least rows of segment_fold's partials for M = rows rows, index length S and R table
        rows: the plan's bound on its tiles, ceil(M / 256) + R. ValueError for invalid sizes."""
        return _workspace_bytes("xj_segment_fold_tiles", rows=rows, seq=seq, table_rows=table_rows)

    def segment_fold(self, partials, index, table_rows, *, rows=None, dtype=None):
        """The last step of a segment sum over given tile partials (sequence parallelism,
        docs/sequence-parallel.md): partials (P, W) float32, tile t of the single-GPU plan of
        `index` (S,) over `rows` = B * S rows (default S) in row t, P >= segment_fold_tiles (rows
        past the plan's tiles are not read) -> (table_rows, W) contiguous in `dtype` (default
        float32): each table row's tiles added in order, compensated, rounded once, the bits the
        op's own backward gives for those partials."""
        fn = _lib.function("xj_segment_fold")
        torch = _import_torch()
        op = "segment_fold"
        _require_tensors(torch, op, partials=partials, index=index)
        table_rows = _count(op, "table_rows", table_rows)
        seq = index.shape[0] if index.dim() == 1 else 0
        rows = _count(op, "rows", seq if rows is None else rows)
        width = partials.shape[1] if partials.dim() == 2 else 0
        workspace = _workspace(torch, op, "xj_segment_fold_workspace_bytes", partials.device, rows=rows,
                               seq=seq, table_rows=table_rows)
        out = torch.empty((table_rows, width), dtype=torch.float32 if dtype is None else dtype,
                          device=partials.device)
        stream = _current_stream(partials.get_device()) if partials.is_cuda else None
        packed, tensors = pack(torch, op, ("partials", "index", "out", "workspace"), (partials, index, out, workspace))
        status = fn(self._live(), tensors[0], tensors[1], rows, tensors[2], tensors[3], stream)
        del packed
        _lib.check(status, "xj_segment_fold")
        return out

    def timestep_sinusoid_backward(self, t, grad, max_period=10000, flip_sin_to_cos=True, downscale_freq_shift=0,
                                   scale=1.0):
        """Gradient of timestep_sinusoid for the upstream grad (T, C) float32: d_t (T,) float32, the
        sum over the C channels of grad times d out / d t in a fixed order. t and the parameters are
        the forward's (t is cast with .float() as the forward does; the caller casts d_t back)."""
        fn = _lib.function("xj_timestep_sinusoid_backward")
        torch = _import_torch()
        op = "timestep_sinusoid_backward"
        _require_tensors(torch, op, t=t, grad=grad)
        if t.dim() != 1:
            raise invalid_argument(f"{op}: t must be 1-D (T,), got shape {tuple(t.shape)}")
        t = t.float().contiguous()
        grad = grad.contiguous()
        d_t = torch.empty((t.shape[0],), dtype=torch.float32, device=t.device)
        stream = _current_stream(t.get_device()) if t.is_cuda else None
        packed, tensors = pack(torch, op, ("t", "grad", "d_t"), (t, grad, d_t))
        status = fn(self._live(), *tensors, float(max_period), int(bool(flip_sin_to_cos)),
                    float(downscale_freq_shift), float(scale), stream)
        del packed
        _lib.check(status, "xj_timestep_sinusoid_backward")
        return d_t
