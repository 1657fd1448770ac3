"""exactjit.Runtime: one xj_runtime handle, and the ops that run on it.

Ops take torch tensors, describe them as DLTensors and launch on torch's current CUDA stream of
the tensors' device, so they order with the surrounding PyTorch work exactly like a torch op.
They return at once; an out-of-range index found by a kernel is reported by synchronize(), not by
the op (unless the runtime checks after each launch).

torch is imported on the first op call, never at import time: `import exactjit` must work on a
machine without torch or a GPU.
"""
import ctypes
import os
import sys

from . import _lib
from ._dlpack import pack
from ._errors import invalid_argument

_torch = None
_current_stream = None  # device index -> CUstream of torch's current stream there, as an int
_GATE_RESIDUAL_ARGS = ("residual", "gate", "index", "y", "out")
_ADALN_ROW_GATHER_ARGS = ("rows", "timestep_indices", "token_tags", "out")
_RMS_NORM_ARGS = ("x", "weight", "shift", "scale", "index", "out", "rstd")


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


def _tristate(value):
    return -1 if value is None else int(bool(value))


def _c_string(value):
    return None if value is None else os.fsencode(value)


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
        """Destroys the xj_runtime. Kernels already launched must have finished (synchronize)."""
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
        if not sys.is_finalizing():
            self.close()

    def gate_residual(self, residual, gate, index, y, *, out=None):
        """out = residual + gate[index[r mod S]] * y, bitwise equal to PyTorch eager's
        `residual + gate.index_select(0, index) * y` (bf16, fp16, fp32; docs: NUMERICS.md).

        residual, y: (S, H), (M, H) with M % S == 0, or (B, S, H), contiguous, one dtype.
        gate: (R, H) with unit column stride and row stride >= H, e.g. one chunk of an AdaLN
        table: `table.view(3 * T, 6 * H)[:, c * H:(c + 1) * H]` (no copy needed).
        index: (S,) int32 or int64 on the same device; values must lie in [0, R). A bad value is
        not an error here: the kernel records it and synchronize() raises BadIndexError.
        out: optional destination like residual; by default a new contiguous tensor.
        The library checks every rule and names the one broken (InvalidArgumentError). There is
        no backward yet, so inputs that require grad are refused while grad mode is on rather
        than silently cut from the graph.
        """
        torch = _import_torch()
        for name, value in (("residual", residual), ("gate", gate), ("index", index), ("y", y)):
            if not isinstance(value, torch.Tensor):
                raise invalid_argument(
                    f"gate_residual: {name} must be a torch.Tensor, got {type(value).__name__}")
        if out is None:
            out = torch.empty_like(residual, memory_format=torch.contiguous_format)
        elif not isinstance(out, torch.Tensor):
            raise invalid_argument(
                f"gate_residual: out must be a torch.Tensor, got {type(out).__name__}")
        if torch.is_grad_enabled() and (residual.requires_grad or gate.requires_grad
                                        or y.requires_grad):
            raise invalid_argument(
                "gate_residual: an input requires grad but exactjit has no backward for this op "
                "yet; call it under torch.no_grad() / torch.inference_mode() or detach the inputs")
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
        device) and raises BadIndexError if a kernel found an out-of-range index since the last
        check, naming the op. The record is cleared, so the context stays usable."""
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
        Out-of-range indices are checked before they are combined; synchronize() reports them.
        """
        torch = _import_torch()
        for name, value in (("rows", rows), ("timestep_indices", timestep_indices), ("token_tags", token_tags)):
            if not isinstance(value, torch.Tensor):
                raise invalid_argument(
                    f"adaln_row_gather: {name} must be a torch.Tensor, got {type(value).__name__}")
        if torch.is_grad_enabled() and rows.requires_grad:
            raise invalid_argument(
                "adaln_row_gather: rows requires grad but exactjit has no backward for this op yet; "
                "call it under torch.no_grad() / torch.inference_mode() or detach the inputs")
        if rows.dim() != 2 or rows.shape[1] % 6 != 0 or timestep_indices.dim() != 1:
            raise invalid_argument(
                f"adaln_row_gather: rows must be (3T, 6H) and timestep_indices (S,) "
                f"(got {tuple(rows.shape)} and {tuple(timestep_indices.shape)})")
        out = torch.empty((6, timestep_indices.shape[0], rows.shape[1] // 6), dtype=rows.dtype, device=rows.device)
        stream = _current_stream(rows.get_device()) if rows.is_cuda else None
        packed, tensors = pack(torch, "adaln_row_gather", _ADALN_ROW_GATHER_ARGS,
                               (rows, timestep_indices, token_tags, out))
        status = _lib.lib.xj_adaln_row_gather(self._live(), *tensors, stream)
        del packed
        _lib.check(status, "xj_adaln_row_gather")
        return tuple(out.unbind(0))

    def rms_norm(self, x, weight, eps, shift=None, scale=None, index=None, return_rstd=False):
        """PyTorch's RMSNorm bit for bit (`F.rms_norm(x, (H,), weight, eps)`), optionally with
        the AdaLN modulation of the same rows in the same kernel:
        `norm(x) * (1 + scale.index_select(0, index)) + shift.index_select(0, index)`.

        x: (..., S, H) contiguous, H % 4 == 0; weight: (H,) or None; eps: a float (None means
        FLT_EPSILON, as PyTorch). shift, scale: (R, H) table views with one row stride, index:
        (S,) int32/int64 shared across the batch (all three or none). Returns out, or
        (out, rstd) with the fp32 rstd of every row when return_rstd.
        """
        torch = _import_torch()
        if not isinstance(x, torch.Tensor):
            raise invalid_argument(f"rms_norm: x must be a torch.Tensor, got {type(x).__name__}")
        optional = {"weight": weight, "shift": shift, "scale": scale, "index": index}
        for name, value in optional.items():
            if value is not None and not isinstance(value, torch.Tensor):
                raise invalid_argument(f"rms_norm: {name} must be a torch.Tensor or None, got {type(value).__name__}")
        if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (x, weight, shift, scale)):
            raise invalid_argument(
                "rms_norm: an input requires grad but exactjit has no backward for this op yet; call it "
                "under torch.no_grad() / torch.inference_mode() or detach the inputs")
        if eps is None:
            eps = torch.finfo(torch.float32).eps
        out = torch.empty_like(x, memory_format=torch.contiguous_format)
        rstd = torch.empty(x.shape[:-1], dtype=torch.float32, device=x.device) if return_rstd else None
        present = [(n, t) for n, t in zip(_RMS_NORM_ARGS, (x, weight, shift, scale, index, out, rstd)) if t is not None]
        stream = _current_stream(x.get_device()) if x.is_cuda else None
        packed, addresses = pack(torch, "rms_norm", [n for n, _ in present], [t for _, t in present])
        by_name = dict(zip((n for n, _ in present), addresses))
        status = _lib.lib.xj_rms_norm(self._live(), *(by_name.get(n) for n in _RMS_NORM_ARGS), float(eps), stream)
        del packed
        _lib.check(status, "xj_rms_norm")
        return (out, rstd) if return_rstd else out

    def timestep_sinusoid(self, t, num_channels=256, max_period=10000, flip_sin_to_cos=True,
                          downscale_freq_shift=0, scale=1.0, check_range=False):
        """diffusers `get_timestep_embedding(t, num_channels, flip_sin_to_cos, downscale_freq_shift,
        scale, max_period)`, bit for bit: t (T,) of any float dtype (cast with .float(), as diffusers
        does) -> (T, num_channels) float32. check_range: a t that is not finite or outside [0, 1]
        (the H3 convention) is reported by synchronize()."""
        torch = _import_torch()
        if not isinstance(t, torch.Tensor):
            raise invalid_argument(f"timestep_sinusoid: t must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 1:
            raise invalid_argument(f"timestep_sinusoid: t must be 1-D (T,), got shape {tuple(t.shape)}")
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
