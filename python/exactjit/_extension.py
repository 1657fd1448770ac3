"""libexactjit_torch.so: the operators' CUDA kernels in C++ on torch's stable ABI (python/csrc/torch_ops.cpp).

When it is loaded, every exactjit operator called on CUDA tensors runs C++ that describes the
tensors, allocates the outputs and launches through the C ABI, with no Python in between; the
operators' Python implementations over ctypes (_ops.py) remain the path for builds without it
and for tensors on other devices. Both give the same tensors and the same errors.

Where it is looked for: $EXACTJIT_TORCH_EXTENSION, a full path (an error if it does not load), or
a boolean (_environment.py: 0 / off / false / no keep the ctypes path); else libexactjit_torch.so
next to the libexactjit.so this process loaded. It is built for torch's 2.10 stable ABI, so an older torch keeps the ctypes path.

A kernel's failure reaches Python as RuntimeError("exactjit status <code>: <message>");
`translated` turns it into the exactjit.Error subclass of <code>, as the ctypes path raises.
"""
import ctypes
import os
import re

from . import _environment, _lib
from ._errors import error_for

ENV = "EXACTJIT_TORCH_EXTENSION"
NAME = "libexactjit_torch.so"
_MIN_TORCH = (2, 10)
_STATUS = re.compile(r"exactjit status (\d+): ")

path = None  # the extension this process loaded, or None (the ctypes path)
reason = None  # why it is not loaded, when it is not


def _torch_version(torch):
    match = re.match(r"(\d+)\.(\d+)", torch.__version__)
    return (int(match.group(1)), int(match.group(2))) if match else (0, 0)


def load(torch, runtime_handle):
    """Loads the extension (once) and points it at `runtime_handle` (an xj_runtime* as an int);
    returns its path, or None when the ctypes path stays (`reason` says why)."""
    global path, reason
    if path is not None:
        return path
    choice = _environment.boolean_or_path(ENV)
    if choice is False:
        reason = f"{ENV}={os.environ[ENV]}"
        return None
    if isinstance(choice, str):
        candidate = choice
    else:
        candidate = os.path.join(os.path.dirname(_lib.library_path), NAME)
        if not os.path.isfile(candidate):
            reason = f"{candidate} not found (built with -DEXACTJIT_TORCH_EXTENSION=ON)"
            return None
        if _torch_version(torch) < _MIN_TORCH:
            reason = f"torch {torch.__version__} is older than the 2.10 stable ABI it is built for"
            return None
    try:
        torch.ops.load_library(candidate)
        ctypes.CDLL(candidate).exactjit_torch_use_runtime(ctypes.c_void_p(runtime_handle))
    except (OSError, RuntimeError, AttributeError) as e:
        raise ImportError(f"exactjit: cannot load the torch extension {candidate}: {e}") from None
    path = candidate
    return path


def translated(error):
    """The exactjit.Error that a RuntimeError raised by the extension carries, or None when
    `error` did not come from it."""
    text = str(error)
    match = _STATUS.search(text)
    return None if match is None else error_for(int(match.group(1)), text[match.end():])
