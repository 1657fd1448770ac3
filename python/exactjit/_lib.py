"""Finds and loads libexactjit.so and declares the C ABI (include/exactjit/exactjit.h) to ctypes.

Loading the library loads neither NVRTC nor libcuda (the library dlopens them on first use), so
this works on a machine without a GPU. Where the library is looked for, first hit wins:

  1. $EXACTJIT_LIBRARY, a full path (no fallback when it is set: an override that silently did
     not apply would be worse than an error);
  2. build/libexactjit.so of the repository this package sits in (python/../build);
  3. libexactjit.so next to this package's files;
  4. the plain name libexactjit.so, through the dynamic linker (LD_LIBRARY_PATH, ldconfig).

A candidate file that exists but fails to load is an error at once rather than a reason to try
the next one, so a broken build is never hidden by an older library elsewhere.
"""
import ctypes
import os

from ._errors import error_for

LIBRARY_NAME = "libexactjit.so"
ENV_LIBRARY = "EXACTJIT_LIBRARY"

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
_REPO_BUILD = os.path.join(os.path.dirname(os.path.dirname(_PACKAGE_DIR)), "build", LIBRARY_NAME)


class RuntimeOptions(ctypes.Structure):
    """xj_runtime_options. NULL strings and negative ints mean "from the environment"."""

    _fields_ = [
        ("struct_size", ctypes.c_uint),
        ("cache_dir", ctypes.c_char_p),
        ("read_only_cache_path", ctypes.c_char_p),
        ("offline", ctypes.c_int),
        ("arch", ctypes.c_char_p),
        ("check_after_launch", ctypes.c_int),
    ]


def _load():
    override = os.environ.get(ENV_LIBRARY)
    if override:
        try:
            return ctypes.CDLL(override), override
        except OSError as e:
            raise ImportError(
                f"exactjit: cannot load {ENV_LIBRARY}={override!r}: {e}") from None

    tried = []
    for path in (_REPO_BUILD, os.path.join(_PACKAGE_DIR, LIBRARY_NAME)):
        if not os.path.isfile(path):
            tried.append(f"{path} (not found)")
            continue
        try:
            return ctypes.CDLL(path), path
        except OSError as e:
            raise ImportError(f"exactjit: {path} exists but does not load: {e}") from None
    try:
        return ctypes.CDLL(LIBRARY_NAME), LIBRARY_NAME
    except OSError as e:
        tried.append(f"{LIBRARY_NAME} via the dynamic linker ({e})")
    raise ImportError(
        "exactjit: libexactjit.so not found; looked at:\n  " + "\n  ".join(tried) +
        f"\nBuild it (cmake --build build) or set {ENV_LIBRARY} to its full path.")


def _declare(lib):
    """Gives every entry point its C signature, so ctypes converts and checks arguments."""
    c_int, c_void_p, c_char_p = ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p
    tensor = c_void_p  # const DLTensor*: addresses from _dlpack.pack()
    signatures = {
        "xj_version": (c_char_p, []),
        "xj_last_error": (c_char_p, []),
        "xj_runtime_create": (c_int, [ctypes.POINTER(RuntimeOptions), ctypes.POINTER(c_void_p)]),
        "xj_runtime_destroy": (None, [c_void_p]),
        "xj_gate_residual": (c_int, [c_void_p, tensor, tensor, tensor, tensor, tensor, c_void_p]),
        "xj_adaln_row_gather": (c_int, [c_void_p, tensor, tensor, tensor, tensor, c_void_p]),
        "xj_timestep_sinusoid": (c_int, [c_void_p, tensor, tensor, ctypes.c_double, c_int, ctypes.c_double,
                                         ctypes.c_double, c_int, c_void_p]),
        "xj_rms_norm": (c_int, [c_void_p, tensor, tensor, tensor, tensor, tensor, tensor, tensor,
                                ctypes.c_double, c_void_p]),
        "xj_synchronize": (c_int, [c_void_p, c_int, c_void_p]),
    }
    for name, (restype, argtypes) in signatures.items():
        try:
            fn = getattr(lib, name)
        except AttributeError:
            raise ImportError(
                f"exactjit: {library_path} lacks {name}; is it an older build?") from None
        fn.restype, fn.argtypes = restype, argtypes


lib, library_path = _load()
_declare(lib)


def last_error():
    """The message of the last failed call on this thread (xj_last_error)."""
    message = lib.xj_last_error()
    return message.decode("utf-8", "replace") if message else ""


def check(status, call):
    """Raises the Error for a non-zero status. Must run on the thread that made `call`, right
    after it: the library keeps the message per thread."""
    if status != 0:
        message = last_error() or f"{call} failed with status {status} and no message"
        raise error_for(status, message)
