"""exactjit for Python: JIT-generated CUDA kernels that are bitwise equal to PyTorch eager.

A thin ctypes binding over libexactjit.so's C ABI (include/exactjit/exactjit.h); no compiled
extension, so it matches any torch build. Importing it only loads the library (which itself loads
neither NVRTC nor libcuda until needed), so `import exactjit` works without torch or a GPU; torch
is imported by the first op. Set EXACTJIT_LIBRARY to pick a library explicitly.

    import exactjit
    out = exactjit.gate_residual(residual, table_view, index, y)  # on the current stream
    exactjit.synchronize()  # raises exactjit.BadIndexError if an index was out of range

Autograd: with grad mode on and an input that requires grad, the ops are differentiable
(torch.autograd.Functions whose backward runs exactjit's deterministic backward kernels); gradients
reach AdaLN tables through the views the ops are given. Otherwise they call the forward directly.
The backward kernels are also callable on their own: Runtime.gate_residual_backward,
rms_norm_backward, adaln_row_gather_backward, timestep_sinusoid_backward.
"""
import threading

from . import _lib
from ._errors import (BadIndexError, CacheIOError, CompileError, CudaError, Error,
                      InternalError, InvalidArgumentError, OfflineMissError, Status,
                      UnavailableError)
from ._runtime import Runtime

__all__ = [
    "BadIndexError", "CacheIOError", "CompileError", "CudaError", "Error", "InternalError",
    "InvalidArgumentError", "OfflineMissError", "Runtime", "Status", "UnavailableError",
    "adaln_projection", "adaln_row_gather", "det_linear", "gate_residual", "rms_norm", "timestep_sinusoid", "library_path", "runtime",
    "synchronize", "timestep_mlp", "version",
]

_default_runtime = None
_default_lock = threading.Lock()


def version():
    """The library's version string (xj_version)."""
    return _lib.lib.xj_version().decode()


def library_path():
    """The libexactjit.so this process loaded (the path, or the bare name if the dynamic linker
    found it)."""
    return _lib.library_path


def runtime():
    """The shared Runtime, created on first use from the environment (xj_runtime_create(NULL)).
    It lives until the process exits, so kernels compile and load once per process."""
    global _default_runtime
    rt = _default_runtime
    if rt is None:
        with _default_lock:
            if _default_runtime is None:
                _default_runtime = Runtime()
            rt = _default_runtime
    return rt


def gate_residual(residual, gate, index, y, *, out=None):
    """out = residual + gate.index_select(0, index) * y, bit for bit; see Runtime.gate_residual.
    Differentiable in residual, gate and y (out= only without autograd)."""
    return runtime().gate_residual(residual, gate, index, y, out=out)


def adaln_row_gather(rows, timestep_indices, token_tags):
    """The six (S, H) AdaLN chunks rows[ti * 3 + tag, cH:(c+1)H], bit for bit; see
    Runtime.adaln_row_gather. Differentiable in rows."""
    return runtime().adaln_row_gather(rows, timestep_indices, token_tags)


def rms_norm(x, weight, eps, shift=None, scale=None, index=None, return_rstd=False):
    """PyTorch's RMSNorm (optionally AdaLN-modulated), bit for bit; see Runtime.rms_norm.
    Differentiable in x, weight, shift and scale (rstd is not)."""
    return runtime().rms_norm(x, weight, eps, shift=shift, scale=scale, index=index, return_rstd=return_rstd)


def timestep_sinusoid(t, num_channels=256, max_period=10000, flip_sin_to_cos=True, downscale_freq_shift=0,
                      scale=1.0, check_range=False):
    """diffusers get_timestep_embedding, bit for bit; see Runtime.timestep_sinusoid. Differentiable in t."""
    return runtime().timestep_sinusoid(t, num_channels, max_period, flip_sin_to_cos, downscale_freq_shift, scale,
                                       check_range)


def det_linear(x, weight, bias=None, *, silu=False, return_pre_activation=False):
    """act(x @ weight.T + bias), batch-invariant and repeatable; see Runtime.det_linear."""
    return runtime().det_linear(x, weight, bias, silu=silu, return_pre_activation=return_pre_activation)


def timestep_mlp(features, w1, b1, w2, b2):
    """linear_2(SiLU(linear_1(features))), fp32, batch-invariant; see Runtime.timestep_mlp."""
    return runtime().timestep_mlp(features, w1, b1, w2, b2)


def adaln_projection(temb, weight, bias, *, silu=True):
    """The AdaLN table from temb with bf16 weights on tensor cores; see Runtime.adaln_projection."""
    return runtime().adaln_projection(temb, weight, bias, silu=silu)


def synchronize(device=None, stream=None):
    """Waits for the stream and raises BadIndexError for an out-of-range index found by a kernel
    since the last check; see Runtime.synchronize."""
    runtime().synchronize(device, stream)
