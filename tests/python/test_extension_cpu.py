#!/usr/bin/env python3
"""libexactjit_torch.so (the operators' CUDA kernels in C++ on torch's stable ABI) without a GPU:
it loads, registers a CUDA kernel for every operator, shares exactjit.runtime(), and its kernels
(reached on CPU tensors through the dispatcher's CUDA key) give the ctypes path's placeholders
and errors, type and message. Skips cleanly where torch is not importable or the extension was
not built (-DEXACTJIT_TORCH_EXTENSION=ON); the launches are checked on the GPU machine
(tests/gpu/ops_torch.py runs with and without it). Run by ctest; exits non-zero on failure."""
import importlib.util
import subprocess
import sys
import unittest

from package_under_test import child_env  # noqa: E402  (puts the package on sys.path)

HAS_TORCH = importlib.util.find_spec("torch") is not None
if HAS_TORCH:
    import torch

    import exactjit
    from exactjit import _extension, _ops

LOADED = HAS_TORCH and _extension.path is not None

bf16 = torch.bfloat16 if HAS_TORCH else None


def both(overload, impl, *args):
    """(C++ result or error, ctypes result or error) of one operator call."""
    outcomes = []
    for path in ("extension", "ctypes"):
        try:
            if path == "extension":
                outcomes.append(_ops._run(overload, impl, args))
            else:
                outcomes.append(impl(*args))
        except Exception as e:  # noqa: BLE001 - the outcome under test
            outcomes.append(e)
    return outcomes


@unittest.skipUnless(LOADED, "torch or libexactjit_torch.so not available")
class Extension(unittest.TestCase):
    def test_every_operator_has_a_cuda_kernel(self):
        for name in _ops.OPERATORS:
            with self.subTest(name):
                self.assertTrue(torch._C._dispatch_has_kernel_for_dispatch_key(f"exactjit::{name}", "CUDA"))

    def test_errors_match_the_ctypes_path(self):
        r, g = torch.zeros(4, 8, dtype=bf16), torch.zeros(2, 8, dtype=bf16)
        i = torch.zeros(4, dtype=torch.int32)
        t2 = torch.zeros(2, 2)
        cases = {
            "cpu tensor": (_ops.GATE_RESIDUAL, _ops._gate_residual_impl, r, g, i, r),
            "rms_norm cpu": (_ops.RMS_NORM, _ops._rms_norm_impl, r, None, 1e-6, None, None, None, True),
            "dweight without weight": (_ops.RMS_NORM_BACKWARD, _ops._rms_norm_backward_impl, r, r, None, None, None,
                                       torch.zeros(4), 1e-6, False, True, False, False),
            "dscale without table": (_ops.RMS_NORM_BACKWARD, _ops._rms_norm_backward_impl, r, r, None, None, None,
                                     torch.zeros(4), 1e-6, False, False, False, True),
            "gate_residual_rms_norm cpu": (_ops.GATE_RESIDUAL_RMS_NORM, _ops._gate_residual_rms_norm_impl, r, g, i, r,
                                           None, 1e-6, None, None, True),
            "d_weight without weight": (_ops.GATE_RESIDUAL_RMS_NORM_BACKWARD,
                                        _ops._gate_residual_rms_norm_backward_impl, r, None, r, r, g, i, None, None,
                                        torch.zeros(4), 1e-6, False, False, True, False, False),
            "d_shift without table": (_ops.GATE_RESIDUAL_RMS_NORM_BACKWARD, _ops._gate_residual_rms_norm_backward_impl,
                                      r, None, r, r, g, i, None, None, torch.zeros(4), 1e-6, False, False, False, True,
                                      False),
            "grad not (6, S, H)": (_ops.ADALN_ROW_GATHER_BACKWARD, _ops._adaln_row_gather_backward_impl, r, i, i, 3,
                                   bf16),
            "t not 1-D": (_ops.TIMESTEP_SINUSOID_BACKWARD, _ops._timestep_sinusoid_backward_impl, t2, t2, 1e4, True,
                          0.0, 1.0),
            "bf16 with pre_activation": (_ops.DET_LINEAR_BACKWARD, _ops._det_linear_backward_impl, t2, t2,
                                         torch.zeros(2, 2, dtype=bf16), t2, False, True, True, True),
            "invalid workspace shapes": (_ops.GATE_RESIDUAL_BACKWARD, _ops._gate_residual_backward_impl,
                                         torch.zeros(4, 0, dtype=bf16), torch.zeros(2, 0, dtype=bf16), i,
                                         torch.zeros(4, 0, dtype=bf16), True, True),
        }
        for name, (overload, impl, *args) in cases.items():
            with self.subTest(name):
                extension, ctypes_path = both(overload, impl, *args)
                self.assertIsInstance(ctypes_path, exactjit.Error)
                self.assertIs(type(extension), type(ctypes_path), extension)
                self.assertEqual(str(extension), str(ctypes_path))

    def test_unsupported_dtype_names_the_first_argument(self):
        r, g = torch.zeros(4, 8, dtype=torch.bool), torch.zeros(2, 8, dtype=torch.bool)
        i = torch.zeros(4, dtype=torch.int32)
        extension, ctypes_path = both(_ops.GATE_RESIDUAL, _ops._gate_residual_impl, r, g, i, r)
        for error in (extension, ctypes_path):
            self.assertIsInstance(error, exactjit.InvalidArgumentError)
            self.assertRegex(str(error), r"^gate_residual: residual: dtype \S+ has no DLPack 0.6 type code$")

    def test_placeholders_match_the_ctypes_path(self):
        """A gradient not asked for is a (0,) tensor of the schema's dtype; nothing is launched."""
        r, g = torch.zeros(4, 8, dtype=bf16), torch.zeros(2, 8, dtype=torch.float16)
        i = torch.zeros(4, dtype=torch.int32)
        cases = {
            "gate_residual_backward": (_ops.GATE_RESIDUAL_BACKWARD, _ops._gate_residual_backward_impl, r, g, i, r,
                                       False, False),
            "rms_norm_backward": (_ops.RMS_NORM_BACKWARD, _ops._rms_norm_backward_impl, r, r, None, None, None,
                                  torch.zeros(4), 1e-6, False, False, False, False),
        }
        for name, (overload, impl, *args) in cases.items():
            with self.subTest(name):
                extension, ctypes_path = both(overload, impl, *args)
                self.assertEqual(len(extension), len(ctypes_path))
                for a, b in zip(extension, ctypes_path):
                    self.assertEqual((a.shape, a.dtype, a.device), (b.shape, b.dtype, b.device))

    def test_not_an_exactjit_error_passes_through(self):
        self.assertIsNone(_extension.translated(RuntimeError("CUDA out of memory")))
        error = _extension.translated(RuntimeError("exactjit status 5: gate_residual: index 7 out of range"))
        self.assertIsInstance(error, exactjit.BadIndexError)
        self.assertEqual(str(error), "gate_residual: index 7 out of range")

    def test_the_shared_runtime_cannot_be_closed(self):
        with self.assertRaisesRegex(exactjit.InvalidArgumentError, "cannot be closed"):
            exactjit.runtime().close()
        own = exactjit.Runtime()
        own.close()  # a Runtime of one's own still closes


@unittest.skipUnless(HAS_TORCH, "torch not available")
class Switch(unittest.TestCase):
    def run_python(self, code, **env):
        result = subprocess.run([sys.executable, "-c", code], env=child_env(**env), capture_output=True, text=True)
        return result.returncode, result.stdout.strip(), result.stderr

    def test_off_keeps_the_ctypes_path(self):
        code = ("import torch, exactjit; from exactjit import _extension, "
                "ops; print(_extension.path, torch._C._dispatch_has_kernel_for_dispatch_key("
                "'exactjit::gate_residual', 'CUDA'), _extension.reason)")
        rc, out, err = self.run_python(code, EXACTJIT_TORCH_EXTENSION="off")
        self.assertEqual(rc, 0, err)
        self.assertEqual(out, "None False EXACTJIT_TORCH_EXTENSION=off")

    def test_every_boolean_spelling_of_off_keeps_the_ctypes_path(self):
        code = "import sys; sys.path.insert(0, 'python'); import torch, exactjit; exactjit.ops; " \
               "from exactjit import _extension; print(_extension.path, _extension.reason)"
        for off in ("0", "false", "No", "OFF"):
            rc, out, err = self.run_python(code, EXACTJIT_TORCH_EXTENSION=off)
            self.assertEqual(rc, 0, err)
            self.assertEqual(out, f"None EXACTJIT_TORCH_EXTENSION={off}")

    def test_a_malformed_value_is_an_error_naming_the_variable(self):
        code = "import sys; sys.path.insert(0, 'python'); import torch, exactjit; exactjit.ops"
        rc, _, err = self.run_python(code, EXACTJIT_TORCH_EXTENSION="maybe")
        self.assertNotEqual(rc, 0)
        self.assertIn("EXACTJIT_TORCH_EXTENSION='maybe' is not valid: use 1/0, true/false, yes/no, on/off, "
                      "or the path of a file", err)

    def test_a_path_that_does_not_load_is_an_error(self):
        code = "import torch, exactjit; exactjit.ops"
        rc, _, err = self.run_python(code, EXACTJIT_TORCH_EXTENSION="/nonexistent/libexactjit_torch.so")
        self.assertNotEqual(rc, 0)
        self.assertIn("cannot load the torch extension /nonexistent/libexactjit_torch.so", err)


if __name__ == "__main__":
    unittest.main()
