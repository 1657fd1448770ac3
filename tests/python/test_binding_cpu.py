#!/usr/bin/env python3
"""The Python binding on a machine without torch or a GPU (CI): import loads only the library,
the C ABI's status codes become the right exception classes with the library's message, and a
bad EXACTJIT_LIBRARY is an ImportError that names it. Run by ctest; exits non-zero on failure."""
import os
import subprocess
import sys
import unittest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "python"))

import exactjit  # noqa: E402
from exactjit import _lib  # noqa: E402


class BindingWithoutGpu(unittest.TestCase):
    def test_import_loads_the_library_only(self):
        self.assertEqual(exactjit.version(), "0.1.0")
        self.assertTrue(exactjit.library_path().endswith("libexactjit.so"))
        self.assertNotIn("torch", sys.modules)

    def test_runtime_lifecycle_and_unavailable_driver(self):
        with exactjit.Runtime(cache_dir="/tmp/exactjit-python-test", offline=True) as rt:
            status = _lib.lib.xj_synchronize(rt.handle, 0, None)
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

    def test_bad_library_override_names_it(self):
        env = dict(os.environ, EXACTJIT_LIBRARY="/nonexistent/libexactjit.so",
                   PYTHONPATH=os.path.join(REPO, "python"))
        result = subprocess.run([sys.executable, "-c", "import exactjit"], env=env, capture_output=True, text=True)
        self.assertNotEqual(result.returncode, 0)
        self.assertIn("EXACTJIT_LIBRARY", result.stderr)
        self.assertIn("/nonexistent/libexactjit.so", result.stderr)


if __name__ == "__main__":
    unittest.main()
