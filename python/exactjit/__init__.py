"""exactjit for Python: JIT-generated CUDA kernels that are bitwise equal to PyTorch eager.

A ctypes binding over libexactjit.so's C ABI (include/exactjit/exactjit.h), so it matches any
torch build; where libexactjit_torch.so is built (torch's stable ABI, _extension.py) the
operators' CUDA kernels run in C++ instead. Importing it loads the library (which itself loads
neither NVRTC nor libcuda until needed), so `import exactjit` works without torch or a GPU. Set
EXACTJIT_LIBRARY to pick a library explicitly.

    import exactjit
    out = exactjit.gate_residual(residual, table_view, index, y)  # on the current stream
    exactjit.synchronize()  # raises exactjit.BadIndexError if an index was out of range (so does
                            # the next exactjit call on the stream, without waiting)

The functions below call PyTorch operators (torch.ops.exactjit.*, registered by _ops.py): they
are differentiable (exactjit's deterministic backward kernels, registered as the operators'
autograd), work under torch.compile(fullgraph=True) and CUDA graphs, and reach AdaLN tables
through the views they are given. The operators are registered when this package is imported
after torch, else by the first op call or by `exactjit.ops`. exactjit.Runtime holds the raw,
non-differentiable launches, on a runtime of your own options.
"""
import sys

from . import _lib
from ._errors import (BadIndexError, CacheIOError, CompileError, CudaError, Error,
                      InternalError, InvalidArgumentError, OfflineMissError, Status,
                      UnavailableError)
from ._runtime import Runtime, default_runtime as runtime

__all__ = [
    "BadIndexError", "CacheIOError", "CompileError", "CudaError", "Error", "InternalError",
    "InvalidArgumentError", "OfflineMissError", "Runtime", "Status", "UnavailableError",
    "adaln_projection", "adaln_row_gather", "det_linear", "gate_residual", "gate_residual_rms_norm", "rms_norm",
    "timestep_sinusoid",
    "library_path", "runtime", "synchronize", "timestep_mlp", "version",
]

_ops_module = sys.modules.get(__name__ + "._ops")


def _operators():
    """_ops.py: imports torch and registers the operators, once."""
    global _ops_module
    if _ops_module is None:
        from . import _ops as module
        _ops_module = module
    return _ops_module


def __getattr__(name):
    """Submodules that import torch, loaded on first access: exactjit.ops (the operator
    registrations), exactjit.nn, exactjit.integrations, exactjit.distributed,
    exactjit.tensor_parallel."""
    if name == "ops":
        return _operators()
    if name in ("nn", "integrations", "distributed", "tensor_parallel"):
        import importlib
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def version():
    """The library's version string (xj_version)."""
    return _lib.lib.xj_version().decode()


def library_path():
    """The libexactjit.so this process loaded (the path, or the bare name if the dynamic linker
    found it)."""
    return _lib.library_path


def gate_residual(residual, gate, index, y, *, out=None):
    """out = residual + gate.index_select(0, index) * y, bit for bit; see Runtime.gate_residual for
    the rules. Differentiable in residual, gate and y (out= only without autograd)."""
    return _operators().gate_residual(residual, gate, index, y, out=out)


def adaln_row_gather(rows, timestep_indices, token_tags):
    """The six (S, H) AdaLN chunks rows[ti * 3 + tag, cH:(c+1)H], bit for bit; see
    Runtime.adaln_row_gather. Differentiable in rows."""
    return _operators().adaln_row_gather(rows, timestep_indices, token_tags)


def rms_norm(x, weight, eps, shift=None, scale=None, index=None, return_rstd=False):
    """PyTorch's RMSNorm (optionally AdaLN-modulated), bit for bit; see Runtime.rms_norm.
    Differentiable in x, weight, shift and scale (rstd is not)."""
    return _operators().rms_norm(x, weight, eps, shift=shift, scale=scale, index=index, return_rstd=return_rstd)


def gate_residual_rms_norm(residual, gate, index, y, weight, eps, *, shift=None, scale=None):
    """The gated residual and the (optionally AdaLN-modulated) RMSNorm that follows it, in one kernel
    that reads residual and y once; returns (h, out), each bit for bit equal to its eager expression:

        h = residual + gate.index_select(0, index) * y
        out = F.rms_norm(h, (H,), weight, eps) * (1 + scale.index_select(0, index)) + shift.index_select(0, index)

    (without shift and scale, out = F.rms_norm(h, (H,), weight, eps)). shift and scale share the
    gate's rows and row stride (chunks of one AdaLN table); see Runtime.gate_residual_rms_norm.
    Differentiable in residual, gate, y, weight, shift and scale."""
    return _operators().gate_residual_rms_norm(residual, gate, index, y, weight, eps, shift=shift, scale=scale)


def timestep_sinusoid(t, num_channels=256, max_period=10000, flip_sin_to_cos=True, downscale_freq_shift=0,
                      scale=1.0, check_range=False):
    """diffusers get_timestep_embedding, bit for bit; see Runtime.timestep_sinusoid. Differentiable in t."""
    return _operators().timestep_sinusoid(t, num_channels, max_period, flip_sin_to_cos, downscale_freq_shift, scale,
                                    check_range)


def det_linear(x, weight, bias=None, *, silu=False, return_pre_activation=False):
    """act(x @ weight.T + bias), batch-invariant and repeatable; see Runtime.det_linear."""
    return _operators().det_linear(x, weight, bias, silu=silu, return_pre_activation=return_pre_activation)


def timestep_mlp(features, w1, b1, w2, b2):
    """linear_2(SiLU(linear_1(features))), fp32, batch-invariant (two det_linear calls)."""
    return _operators().timestep_mlp(features, w1, b1, w2, b2)


def adaln_projection(temb, weight, bias, *, silu=True):
    """The AdaLN table rT(silu(temb)) @ weight.T + bias with bf16 weights on tensor cores."""
    return _operators().adaln_projection(temb, weight, bias, silu=silu)


def synchronize(device=None, stream=None):
    """Waits for the stream and raises BadIndexError for an out-of-range index found by a kernel
    on it since the last check (the next op call on the stream raises it too, without waiting);
    see Runtime.synchronize."""
    runtime().synchronize(device, stream)


if "torch" in sys.modules:  # torch is loaded anyway: register the operators now, so torch.ops.exactjit works
    _operators()
