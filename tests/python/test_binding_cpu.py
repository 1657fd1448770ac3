#!/usr/bin/env python3
"""The Python binding on a machine without torch or a GPU (CI): import loads only the library,
the C ABI's status codes become the right exception classes with the library's message, and a
bad EXACTJIT_LIBRARY is an ImportError that names it. The ctypes declarations are checked against
include/exactjit/exactjit.h, and the backward entry points either work as declared or, in a
library that predates them, are reported by name. Tests that need torch or the backward entry
points skip without them. Run by ctest; exits non-zero on failure."""
import ctypes
import importlib.util
import os
import re
import subprocess
import sys
import unittest
from unittest import mock

from package_under_test import INSTALLED, REPO, child_env  # noqa: E402  (puts the package on sys.path)

import exactjit  # noqa: E402
from exactjit import _lib  # noqa: E402

# What `import exactjit` itself loaded, before any test (one may import torch) runs.
LOADED_BY_IMPORT = {name for name in ("torch", "exactjit._ops") if name in sys.modules}

HEADER = os.path.join(REPO, "include", "exactjit", "exactjit.h")
BACKWARD = ("xj_gate_residual_backward", "xj_rms_norm_backward", "xj_gate_residual_rms_norm_backward",
            "xj_adaln_row_gather_backward", "xj_timestep_sinusoid_backward")
WORKSPACE = ("xj_gate_residual_backward_workspace_bytes", "xj_rms_norm_backward_workspace_bytes",
             "xj_gate_residual_rms_norm_backward_workspace_bytes", "xj_adaln_row_gather_backward_workspace_bytes")


def has_torch():
    return importlib.util.find_spec("torch") is not None


def header_functions():
    """{name: (return type, [parameter types])} of every XJ_API function in exactjit.h, types
    with the parameter names dropped and spaces normalised ("const DLTensor*", "long long")."""
    with open(HEADER) as f:
        text = re.sub(r"/\*.*?\*/", " ", f.read(), flags=re.S)
    text = re.sub(r"\s+", " ", text)

    def norm(c_type):
        return re.sub(r"\s*\*", "*", c_type.strip())

    functions = {}
    for ret, name, params in re.findall(r"XJ_API ([\w\s*]+?) ?\b(xj_\w+) ?\(([^)]*)\)", text):
        types = []
        for param in params.split(","):
            param = param.strip()
            if param in ("", "void"):
                continue
            match = re.fullmatch(r"(.*?[\s*])(\w+)", param)
            types.append(norm(match.group(1)))
        functions[name] = (norm(ret), types)
    return functions


# How each C type of the header is declared to ctypes.
C_TO_CTYPES = {
    "void": None,
    "const char*": ctypes.c_char_p,
    "exactjit_status_t": ctypes.c_int,
    "int": ctypes.c_int,
    "double": ctypes.c_double,
    "long long": ctypes.c_longlong,
    "void*": ctypes.c_void_p,
    "xj_runtime*": ctypes.c_void_p,
    "const DLTensor*": ctypes.c_void_p,
    "xj_runtime**": ctypes.POINTER(ctypes.c_void_p),
    "const xj_runtime_options*": ctypes.POINTER(_lib.RuntimeOptions),
    "const long long*": ctypes.POINTER(ctypes.c_longlong),
    "long long*": ctypes.POINTER(ctypes.c_longlong),
    "xj_sequence_parallel_sizes*": ctypes.POINTER(_lib.SequenceParallelSizes),
}


class BindingWithoutGpu(unittest.TestCase):
    def test_import_loads_the_library_only(self):
        self.assertEqual(exactjit.version(), "0.1.0")
        self.assertTrue(exactjit.library_path().endswith("libexactjit.so"))
        self.assertEqual(LOADED_BY_IMPORT, set(), "import exactjit must load neither torch nor _ops")

    def test_runtime_lifecycle_and_unavailable_driver(self):
        with exactjit.Runtime(cache_dir="/tmp/exactjit-python-test", offline=True) as rt:
            status = _lib.lib.xj_synchronize(rt.handle, 0, None)
            if status == exactjit.Status.OK:  # the wheel's check on the GPU machine
                self.skipTest("a CUDA driver and GPU are present; this checks the driverless path")
            self.assertEqual(status, exactjit.Status.UNAVAILABLE)
            with self.assertRaises(exactjit.UnavailableError) as caught:
                _lib.check(status, "xj_synchronize")
            self.assertEqual(caught.exception.code, 6)
            self.assertIn("CUDA driver", str(caught.exception))

    def test_null_arguments_are_invalid(self):
        with exactjit.Runtime() as rt:
            status = _lib.lib.xj_gate_residual(rt.handle, None, None, None, None, None, None)
            self.assertEqual(status, 1)
            with self.assertRaises(exactjit.InvalidArgumentError) as caught:
                _lib.check(status, "xj_gate_residual")
            self.assertIn("gate_residual", str(caught.exception))

    def test_every_op_refuses_null_tensors_by_name(self):
        with exactjit.Runtime() as rt:
            calls = {
                "adaln_row_gather": lambda: _lib.lib.xj_adaln_row_gather(rt.handle, None, None, None, None, None),
                "rms_norm": lambda: _lib.lib.xj_rms_norm(rt.handle, None, None, None, None, None, None, None,
                                                         1e-5, None),
                "gate_residual_rms_norm": lambda: _lib.lib.xj_gate_residual_rms_norm(rt.handle, *[None] * 10, 1e-5,
                                                                                     None),
                "timestep_sinusoid": lambda: _lib.lib.xj_timestep_sinusoid(rt.handle, None, None, 10000.0, 1,
                                                                           0.0, 1.0, 0, None),
            }
            for op, call in calls.items():
                self.assertEqual(call(), exactjit.Status.INVALID_ARGUMENT, op)
                self.assertIn(op + ":", _lib.last_error())

    def test_bad_arch_option_is_reported_at_first_use(self):
        with exactjit.Runtime(arch="banana") as rt:
            # Checked before the driver is even loaded, so the message is the same on any machine.
            self.assertEqual(_lib.lib.xj_synchronize(rt.handle, 0, None), exactjit.Status.INVALID_ARGUMENT)
            self.assertIn("arch 'banana'", _lib.last_error())

    def test_ctypes_signatures_match_the_header(self):
        functions = header_functions()
        self.assertGreaterEqual(len(functions), 16, "the header parser found too few functions")
        self.assertEqual(set(functions), set(_lib.SIGNATURES), "declared entry points differ from exactjit.h")
        for name, (ret, params) in functions.items():
            restype, argtypes = _lib.SIGNATURES[name]
            for c_type in [ret] + params:
                self.assertIn(c_type, C_TO_CTYPES, f"{name}: no ctypes mapping for C type {c_type!r}")
            self.assertEqual(restype, C_TO_CTYPES[ret], f"{name}: return type {ret}")
            self.assertEqual(list(argtypes), [C_TO_CTYPES[t] for t in params], f"{name}: parameters {params}")

    def test_backward_entry_points_are_optional_and_declared_when_present(self):
        self.assertEqual(set(_lib.OPTIONAL), set(BACKWARD) | set(WORKSPACE))
        for name in _lib.SIGNATURES:
            present = hasattr(_lib.lib, name)
            if name not in _lib.OPTIONAL:
                self.assertTrue(present, name)
            self.assertEqual(name in _lib.missing, not present, name)
            if present:
                fn = _lib.function(name)
                restype, argtypes = _lib.SIGNATURES[name]
                self.assertEqual(fn.restype, restype, name)
                self.assertEqual(list(fn.argtypes), list(argtypes), name)
            else:
                with self.assertRaises(exactjit.UnavailableError) as caught:
                    _lib.function(name)
                self.assertEqual(caught.exception.code, exactjit.Status.UNAVAILABLE)
                self.assertIn(name, str(caught.exception))

    def test_backward_ops_on_a_library_without_them_name_the_missing_function(self):
        missing = [name for name in BACKWARD if name in _lib.missing]
        if not missing:
            self.skipTest("this library has every backward entry point")
        calls = {
            "xj_gate_residual_backward": lambda rt: rt.gate_residual_backward(None, None, None, None),
            "xj_rms_norm_backward": lambda rt: rt.rms_norm_backward(None, None, None, None, 1e-5),
            "xj_gate_residual_rms_norm_backward": lambda rt: rt.gate_residual_rms_norm_backward(
                None, None, None, None, None, None, None, None, 1e-5),
            "xj_adaln_row_gather_backward": lambda rt: rt.adaln_row_gather_backward(None, None, None, 9),
            "xj_timestep_sinusoid_backward": lambda rt: rt.timestep_sinusoid_backward(None, None),
        }
        with exactjit.Runtime() as rt:
            for name in missing:
                with self.assertRaises(exactjit.UnavailableError, msg=name) as caught:
                    calls[name](rt)
                self.assertIn(name, str(caught.exception))

    def test_workspace_queries_take_ints_only(self):
        # Checked in Python before the library is asked, so this runs with or without the entry points.
        queries = [
            (exactjit.Runtime.gate_residual_backward_workspace_bytes, (131072, 131072, 9.0, 5376), "table_rows"),
            (exactjit.Runtime.rms_norm_backward_workspace_bytes, ("131072", 131072, 9, 5376, True), "rows"),
            (exactjit.Runtime.gate_residual_rms_norm_backward_workspace_bytes, (131072, 1.5, 9, 5376, True, True),
             "seq"),
            (exactjit.Runtime.adaln_row_gather_backward_workspace_bytes, (131072, 9, None), "hidden"),
        ]
        for query, args, name in queries:
            with self.assertRaises(TypeError) as caught:
                query(*args)
            self.assertIn(name, str(caught.exception))

    def test_workspace_queries_pass_counts_in_order_and_minus_one_is_value_error(self):
        # The Python layer alone, over a stand-in for the library function.
        calls = []

        def fake(result):
            def function(name):
                def call(*args):
                    calls.append((name, args))
                    return result
                return call
            return function

        rt = exactjit.Runtime
        with mock.patch.object(_lib, "function", fake(4096)):
            self.assertEqual(rt.gate_residual_backward_workspace_bytes(262144, 131072, 9, 5376), 4096)
            self.assertEqual(rt.rms_norm_backward_workspace_bytes(8, 4, 3, 64, True), 4096)
            self.assertEqual(rt.rms_norm_backward_workspace_bytes(8, 1, 0, 64, None), 4096)
            self.assertEqual(rt.gate_residual_rms_norm_backward_workspace_bytes(8, 4, 3, 64, None, True), 4096)
            self.assertEqual(rt.adaln_row_gather_backward_workspace_bytes(7, 9, 5376), 4096)
        self.assertEqual(calls, [
            ("xj_gate_residual_backward_workspace_bytes", (262144, 131072, 9, 5376)),
            ("xj_rms_norm_backward_workspace_bytes", (8, 4, 3, 64, 1)),
            ("xj_rms_norm_backward_workspace_bytes", (8, 1, 0, 64, 0)),
            ("xj_gate_residual_rms_norm_backward_workspace_bytes", (8, 4, 3, 64, 0, 1)),
            ("xj_adaln_row_gather_backward_workspace_bytes", (7, 9, 5376)),
        ])
        with mock.patch.object(_lib, "function", fake(-1)):
            for query, args, hidden in ((rt.gate_residual_backward_workspace_bytes, (10, 3, 9, 64), 64),
                                        (rt.rms_norm_backward_workspace_bytes, (10, 3, 9, 64, False), 64),
                                        (rt.gate_residual_rms_norm_backward_workspace_bytes, (10, 3, 9, 64, 1, 0), 64),
                                        (rt.adaln_row_gather_backward_workspace_bytes, (0, 9, 64), 64)):
                with self.assertRaises(ValueError) as caught:
                    query(*args)
                self.assertIn("invalid shapes", str(caught.exception))
                self.assertIn(f"hidden={hidden}", str(caught.exception))

    def test_workspace_queries_in_the_library(self):
        present = [name for name in WORKSPACE if name not in _lib.missing]
        if not present:
            self.skipTest("this library predates the backward workspace queries")
        rt = exactjit.Runtime
        good = {
            "xj_gate_residual_backward_workspace_bytes":
                lambda: rt.gate_residual_backward_workspace_bytes(2 * 131072, 131072, 9, 5376),
            "xj_rms_norm_backward_workspace_bytes":
                lambda: rt.rms_norm_backward_workspace_bytes(131072, 131072, 9, 5376, False),
            "xj_gate_residual_rms_norm_backward_workspace_bytes":
                lambda: rt.gate_residual_rms_norm_backward_workspace_bytes(2 * 131072, 131072, 9, 5376, True, True),
            "xj_adaln_row_gather_backward_workspace_bytes":
                lambda: rt.adaln_row_gather_backward_workspace_bytes(131072, 9, 5376),
        }
        bad = {  # a negative count or a zero hidden size is never a valid shape
            "xj_gate_residual_backward_workspace_bytes":
                (lambda: rt.gate_residual_backward_workspace_bytes(-131072, 131072, 9, 5376),
                 lambda: rt.gate_residual_backward_workspace_bytes(131072, 131072, 9, 0)),
            "xj_rms_norm_backward_workspace_bytes":
                (lambda: rt.rms_norm_backward_workspace_bytes(-1, 1, 0, 5376, True),
                 lambda: rt.rms_norm_backward_workspace_bytes(4097, 4097, 9, 0, False)),
            "xj_gate_residual_rms_norm_backward_workspace_bytes":
                (lambda: rt.gate_residual_rms_norm_backward_workspace_bytes(-4097, 4097, 9, 5376, True, True),
                 lambda: rt.gate_residual_rms_norm_backward_workspace_bytes(4097, 4097, 9, 0, False, False)),
            "xj_adaln_row_gather_backward_workspace_bytes":
                (lambda: rt.adaln_row_gather_backward_workspace_bytes(-7, 9, 5376),
                 lambda: rt.adaln_row_gather_backward_workspace_bytes(7, 9, 0)),
        }
        for name in present:
            nbytes = good[name]()
            self.assertIsInstance(nbytes, int)
            self.assertGreaterEqual(nbytes, 0, name)
            for call in bad[name]:
                with self.assertRaises(ValueError, msg=name):
                    call()

    def test_backward_entry_points_refuse_null_tensors(self):
        present = [name for name in BACKWARD if name not in _lib.missing]
        if not present:
            self.skipTest("this library predates the backward entry points")
        with exactjit.Runtime() as rt:
            calls = {
                "xj_gate_residual_backward": lambda: _lib.function("xj_gate_residual_backward")(
                    rt.handle, *[None] * 7, None),
                "xj_rms_norm_backward": lambda: _lib.function("xj_rms_norm_backward")(
                    rt.handle, *[None] * 6, 1e-5, *[None] * 5, None),
                "xj_gate_residual_rms_norm_backward": lambda: _lib.function("xj_gate_residual_rms_norm_backward")(
                    rt.handle, *[None] * 9, 1e-5, *[None] * 7, None),
                "xj_adaln_row_gather_backward": lambda: _lib.function("xj_adaln_row_gather_backward")(
                    rt.handle, *[None] * 5, None),
                "xj_timestep_sinusoid_backward": lambda: _lib.function("xj_timestep_sinusoid_backward")(
                    rt.handle, None, None, None, 10000.0, 1, 0.0, 1.0, None),
            }
            for name in present:
                self.assertEqual(calls[name](), exactjit.Status.INVALID_ARGUMENT, name)
                op = name[3:-len("_backward")]
                self.assertIn(op, _lib.last_error(), name)

    def test_backward_argument_rules_without_a_gpu(self):
        if not has_torch():
            self.skipTest("torch is not installed")
        import torch
        h = 64
        y = torch.zeros(4, h)
        table = torch.zeros(3, 6 * h)
        index = torch.zeros(4, dtype=torch.int64)
        rt = exactjit.runtime()
        if "xj_rms_norm_backward" not in _lib.missing:
            with self.assertRaises(exactjit.InvalidArgumentError) as caught:
                rt.rms_norm_backward(y, y, None, torch.ones(4), 1e-5, need_dweight=True)
            self.assertIn("weight", str(caught.exception))
            with self.assertRaises(exactjit.InvalidArgumentError) as caught:
                rt.rms_norm_backward(y, y, None, torch.ones(4), 1e-5, need_dshift=True)
            self.assertIn("scale", str(caught.exception))
            self.assertEqual(rt.rms_norm_backward(y, y, None, torch.ones(4), 1e-5, need_dx=False), (None,) * 4)
        if "xj_gate_residual_rms_norm_backward" not in _lib.missing:
            gate = table[:, :h]
            for flags, word in ((dict(need_d_weight=True), "weight"), (dict(need_d_scale=True), "scale")):
                with self.assertRaises(exactjit.InvalidArgumentError) as caught:
                    rt.gate_residual_rms_norm_backward(y, None, y, y, gate, index, None, torch.ones(4), 1e-5, **flags)
                self.assertIn(word, str(caught.exception))
            # d_residual is always computed: CPU tensors get as far as the library, which refuses them by name.
            with self.assertRaises(exactjit.InvalidArgumentError) as caught:
                rt.gate_residual_rms_norm_backward(y, None, y, y, gate, index, None, torch.ones(4), 1e-5,
                                                   need_d_y=False, need_d_gate=False)
            self.assertIn("gate_residual_rms_norm_backward", str(caught.exception))
        if "xj_gate_residual_backward" not in _lib.missing:
            self.assertEqual(rt.gate_residual_backward(y, table[:, :h], index, y, need_d_y=False,
                                                       need_d_gate=False), (None, None))
            # CPU tensors get as far as the library, which refuses them by name.
            with self.assertRaises(exactjit.InvalidArgumentError) as caught:
                rt.gate_residual_backward(y, table[:, :h], index, y)
            self.assertIn("gate_residual", str(caught.exception))

    @unittest.skipUnless(INSTALLED, "tests the checkout's package (EXACTJIT_TEST_INSTALLED=1: the wheel)")
    def test_installed_package_loads_the_library_beside_it(self):
        package_dir = os.path.dirname(os.path.abspath(exactjit.__file__))
        self.assertFalse(package_dir.startswith(REPO + os.sep), f"{package_dir} is the checkout's package")
        self.assertNotIn("EXACTJIT_LIBRARY", os.environ)
        self.assertEqual(exactjit.library_path(), os.path.join(package_dir, "libexactjit.so"))

    def test_bad_library_override_names_it(self):
        env = child_env(EXACTJIT_LIBRARY="/nonexistent/libexactjit.so")
        result = subprocess.run([sys.executable, "-c", "import exactjit"], env=env, capture_output=True, text=True)
        self.assertNotEqual(result.returncode, 0)
        self.assertIn("EXACTJIT_LIBRARY", result.stderr)
        self.assertIn("/nonexistent/libexactjit.so", result.stderr)


class EnvironmentSpellings(unittest.TestCase):
    """The package's boolean variables take the library's spellings and refuse the rest by name."""

    def test_booleans_match_the_library(self):
        from exactjit import _environment
        for spelling, value in (("1", True), ("TRUE", True), ("yes", True), ("On", True), ("0", False),
                                ("false", False), ("NO", False), ("off", False)):
            with mock.patch.dict(os.environ, {"EXACTJIT_SOME_SWITCH": spelling}):
                self.assertIs(_environment.boolean("EXACTJIT_SOME_SWITCH", default=not value), value)
        with mock.patch.dict(os.environ, {"EXACTJIT_SOME_SWITCH": ""}):
            self.assertIs(_environment.boolean("EXACTJIT_SOME_SWITCH", default=True), True)
        with mock.patch.dict(os.environ, {"EXACTJIT_SOME_SWITCH": "maybe"}):
            with self.assertRaisesRegex(ValueError, r"^EXACTJIT_SOME_SWITCH='maybe' is not valid: use 1/0, "
                                                    r"true/false, yes/no, on/off$"):
                _environment.boolean("EXACTJIT_SOME_SWITCH")

    def test_boolean_or_path(self):
        from exactjit import _environment
        for value, expected in (("off", False), ("YES", True), ("/opt/x/libexactjit_torch.so",
                                                                 "/opt/x/libexactjit_torch.so")):
            with mock.patch.dict(os.environ, {"EXACTJIT_SOME_FILE": value}):
                self.assertEqual(_environment.boolean_or_path("EXACTJIT_SOME_FILE"), expected)
        with mock.patch.dict(os.environ, {"EXACTJIT_SOME_FILE": "libfoo"}):
            with self.assertRaisesRegex(ValueError, "EXACTJIT_SOME_FILE='libfoo' is not valid"):
                _environment.boolean_or_path("EXACTJIT_SOME_FILE")

    def test_a_malformed_library_variable_fails_runtime_creation_by_name(self):
        with mock.patch.dict(os.environ, {"EXACTJIT_OFFLINE": "perhaps"}):
            with self.assertRaisesRegex(exactjit.InvalidArgumentError, "EXACTJIT_OFFLINE='perhaps' is not valid"):
                exactjit.Runtime()


if __name__ == "__main__":
    unittest.main()
