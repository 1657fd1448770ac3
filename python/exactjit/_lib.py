"""Finds and loads libexactjit.so and declares the C ABI (include/exactjit/exactjit.h) to ctypes.

Loading the library loads neither NVRTC nor libcuda (the library dlopens them on first use), so
this works on a machine without a GPU. Where the library is looked for, first hit wins:

  1. $EXACTJIT_LIBRARY, a full path (no fallback when it is set: an override that silently did
     not apply would be worse than an error);
  2. libexactjit.so next to this package's files (an installed wheel);
  3. build/libexactjit.so of the checkout this package sits in (python/../build), for a package
     used in place with PYTHONPATH=python;
  4. the plain name libexactjit.so, through the dynamic linker (LD_LIBRARY_PATH, ldconfig).

A candidate file that exists but fails to load is an error at once rather than a reason to try
the next one, so a broken build is never hidden by an older library elsewhere.

Every entry point is declared from SIGNATURES. The backward entry points are OPTIONAL: a library
built before them still imports, and function(name) raises UnavailableError for the one missing.
"""
import ctypes
import os

from ._errors import Status, error_for

LIBRARY_NAME = "libexactjit.so"
ENV_LIBRARY = "EXACTJIT_LIBRARY"

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
_CHECKOUT = os.path.dirname(os.path.dirname(_PACKAGE_DIR))
# Only a package used in place in a checkout (python/exactjit) looks into the checkout's build/.
_IN_CHECKOUT = os.path.isfile(os.path.join(_CHECKOUT, "include", "exactjit", "exactjit.h"))


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


class SequenceParallelSizes(ctypes.Structure):
    """xj_sequence_parallel_sizes: one rank's share of a sequence-parallel segment sum."""

    _fields_ = [(name, ctypes.c_longlong)
                for name in ("tiles", "max_tiles", "rank_tiles", "rank_rows", "local_rows", "sent_rows")]


def _load():
    override = os.environ.get(ENV_LIBRARY)
    if override:
        try:
            return ctypes.CDLL(override), override
        except OSError as e:
            raise ImportError(
                f"exactjit: cannot load {ENV_LIBRARY}={override!r}: {e}") from None

    tried = []
    candidates = [os.path.join(_PACKAGE_DIR, LIBRARY_NAME)]
    if _IN_CHECKOUT:
        candidates.append(os.path.join(_CHECKOUT, "build", LIBRARY_NAME))
    for path in candidates:
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
        f"\nInstall the wheel (pip install .), build it (cmake --build build) or set {ENV_LIBRARY} to its full path.")


c_int, c_void_p, c_char_p, c_double, c_longlong = (ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p,
                                                  ctypes.c_double, ctypes.c_longlong)
_tensor = c_void_p  # const DLTensor*: addresses from _dlpack.pack(); NULL (None) where optional
_longs = ctypes.POINTER(c_longlong)  # a host array of long long

# Every entry point of include/exactjit/exactjit.h with its C signature: name -> (restype,
# argtypes). tests/python/test_binding_cpu.py checks this table against the header.
SIGNATURES = {
    "xj_version": (c_char_p, []),
    "xj_last_error": (c_char_p, []),
    "xj_runtime_create": (c_int, [ctypes.POINTER(RuntimeOptions), ctypes.POINTER(c_void_p)]),
    "xj_runtime_destroy": (None, [c_void_p]),
    "xj_runtime_info": (c_char_p, [c_void_p]),
    "xj_prewarm": (c_int, [c_void_p, c_char_p]),
    "xj_gate_residual": (c_int, [c_void_p, _tensor, _tensor, _tensor, _tensor, _tensor, c_void_p]),
    "xj_adaln_row_gather": (c_int, [c_void_p, _tensor, _tensor, _tensor, _tensor, c_void_p]),
    "xj_timestep_sinusoid": (c_int, [c_void_p, _tensor, _tensor, c_double, c_int, c_double, c_double, c_int,
                                     c_void_p]),
    "xj_rms_norm": (c_int, [c_void_p, _tensor, _tensor, _tensor, _tensor, _tensor, _tensor, _tensor, c_double,
                            c_void_p]),
    # runtime, residual, gate, index, y, weight, shift, scale, h, out, rstd, eps, stream
    "xj_gate_residual_rms_norm": (c_int, [c_void_p] + [_tensor] * 10 + [c_double, c_void_p]),
    "xj_synchronize": (c_int, [c_void_p, c_int, c_void_p]),
    # runtime, x, weight, bias, out, pre_activation, silu, stream
    "xj_det_linear": (c_int, [c_void_p] + [_tensor] * 5 + [c_int, c_void_p]),
    # rows T, in_features K, out_features N -> bytes, -1 for invalid shapes
    "xj_det_linear_backward_workspace_bytes": (c_longlong, [c_longlong] * 3),
    # runtime, grad, pre_activation, x, weight, d_input, d_weight, d_bias, workspace, silu, stream
    "xj_det_linear_backward": (c_int, [c_void_p] + [_tensor] * 8 + [c_int, c_void_p]),
    # Tensor parallelism. bf16_weights -> outputs per d_input chunk
    "xj_det_linear_input_chunk": (c_longlong, [c_int]),
    # runtime, grad, pre_activation, x, weight, partials, d_weight, d_bias, silu, stream
    "xj_det_linear_backward_partials": (c_int, [c_void_p] + [_tensor] * 7 + [c_int, c_void_p]),
    # runtime, partials, x, d_input, bf16_weights, silu, stream
    "xj_det_linear_input_fold": (c_int, [c_void_p] + [_tensor] * 3 + [c_int, c_int, c_void_p]),
    # Backward passes. (rows M, seq S, table_rows R, hidden H) -> bytes, -1 for invalid shapes.
    "xj_gate_residual_backward_workspace_bytes": (c_longlong, [c_longlong] * 4),
    # runtime, grad, gate, index, y, d_y, d_gate, workspace, stream
    "xj_gate_residual_backward": (c_int, [c_void_p] + [_tensor] * 7 + [c_void_p]),
    # rows, seq, table_rows, hidden, weighted
    "xj_rms_norm_backward_workspace_bytes": (c_longlong, [c_longlong] * 4 + [c_int]),
    # runtime, grad, x, weight, scale, index, rstd, eps, dx, dweight, dshift, dscale, workspace, stream
    "xj_rms_norm_backward": (c_int, [c_void_p] + [_tensor] * 6 + [c_double] + [_tensor] * 5 + [c_void_p]),
    # rows, seq, table_rows -> the tile partials' least rows, -1 for invalid sizes
    "xj_rms_norm_backward_partial_tiles": (c_longlong, [c_longlong] * 3),
    # runtime, grad, x, weight, scale, index, rstd, shift_partials, scale_partials, weight_partials, workspace,
    # stream
    "xj_rms_norm_backward_tile_partials": (c_int, [c_void_p] + [_tensor] * 10 + [c_void_p]),
    # rows, seq, table_rows, hidden, weighted, modulated
    "xj_gate_residual_rms_norm_backward_workspace_bytes": (c_longlong, [c_longlong] * 4 + [c_int] * 2),
    # runtime, grad_out, grad_h, h, y, gate, index, weight, scale, rstd, eps, d_residual, d_y, d_gate, d_weight,
    # d_shift, d_scale, workspace, stream
    "xj_gate_residual_rms_norm_backward": (c_int, [c_void_p] + [_tensor] * 9 + [c_double] + [_tensor] * 7
                                           + [c_void_p]),
    # seq, table_rows, hidden
    "xj_adaln_row_gather_backward_workspace_bytes": (c_longlong, [c_longlong] * 3),
    # runtime, grad, timestep_indices, token_tags, d_rows, workspace, stream
    "xj_adaln_row_gather_backward": (c_int, [c_void_p] + [_tensor] * 5 + [c_void_p]),
    # runtime, t, grad, d_t, max_period, flip_sin_to_cos, downscale_freq_shift, scale, stream
    "xj_timestep_sinusoid_backward": (c_int, [c_void_p, _tensor, _tensor, _tensor, c_double, c_int, c_double,
                                              c_double, c_void_p]),
    # Sequence parallelism. (rows M, seq S, table_rows R) -> the partials' least rows / workspace bytes.
    "xj_segment_fold_tiles": (c_longlong, [c_longlong] * 3),
    "xj_segment_fold_workspace_bytes": (c_longlong, [c_longlong] * 3),
    # runtime, partials, index, rows, out, workspace, stream
    "xj_segment_fold": (c_int, [c_void_p, _tensor, _tensor, c_longlong, _tensor, _tensor, c_void_p]),
    # keys, seq, table_rows, batch, shard_start, ranks, rank, sizes, tile_start, rows, receive_counts,
    # send_counts, send_rows, gathered_slot (host arrays)
    "xj_sequence_parallel_plan": (c_int, [_longs, c_longlong, c_longlong, c_longlong, _longs, c_longlong, c_longlong,
                                          ctypes.POINTER(SequenceParallelSizes)] + [_longs] * 6),
}

# Entry points a library may lack (it predates them): the import still works and only the ops
# that need them raise (function()). Everything else missing is an ImportError at once.
OPTIONAL = frozenset({
    "xj_gate_residual_backward_workspace_bytes", "xj_gate_residual_backward",
    "xj_rms_norm_backward_workspace_bytes", "xj_rms_norm_backward",
    "xj_gate_residual_rms_norm_backward_workspace_bytes", "xj_gate_residual_rms_norm_backward",
    "xj_adaln_row_gather_backward_workspace_bytes", "xj_adaln_row_gather_backward",
    "xj_timestep_sinusoid_backward",
})

missing = set()  # OPTIONAL entry points this library lacks


def _declare(lib):
    """Gives every entry point its C signature, so ctypes converts and checks arguments."""
    for name, (restype, argtypes) in SIGNATURES.items():
        try:
            fn = getattr(lib, name)
        except AttributeError:
            if name in OPTIONAL:
                missing.add(name)
                continue
            raise ImportError(
                f"exactjit: {library_path} lacks {name}; is it an older build?") from None
        fn.restype, fn.argtypes = restype, argtypes


lib, library_path = _load()
_declare(lib)


def function(name):
    """The declared entry point `name`. An OPTIONAL one this library lacks raises
    UnavailableError naming it and the library (the build predates it), not AttributeError."""
    if name in missing:
        raise error_for(Status.UNAVAILABLE, f"exactjit: {library_path} lacks {name} (it predates the "
                                            "backward ops); rebuild libexactjit.so")
    return getattr(lib, name)


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
