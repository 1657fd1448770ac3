#!/usr/bin/env python3
"""The benchmarks' target verdicts, without a GPU or torch: the absolute targets are the H200's, so
a run on another card must say "not judged" rather than met or missed, and the relative ones
(det_linear no slower than cuBLAS) are judged on any card. The scripts' torch and bench_forward
imports are stubbed: only their verdict functions run here. Run by ctest; exits non-zero on
failure."""
import os
import sys
import types
import unittest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "bench"))

H100, H200 = "NVIDIA H100 80GB HBM3", "NVIDIA H200"


def stub_modules():
    """Stand-ins for torch and bench_forward, enough for the scripts' module-level code."""
    torch = types.ModuleType("torch")
    torch.nn = types.ModuleType("torch.nn")
    torch.nn.functional = types.ModuleType("torch.nn.functional")
    shared = types.ModuleType("bench_forward")
    for name in ("BITS", "EPS", "Timer", "add_speedups", "add_timing", "finish", "gate_inputs", "gate_residual_eager",
                 "gate_residual_rms_norm_eager", "gate_residual_rms_norm_for_compile", "git_commit", "load_exactjit",
                 "log", "measure_copy", "rms_inputs", "rms_norm_modulated_eager", "rotating_sets"):
        setattr(shared, name, None)
    shared.T, shared.CHUNK, shared.FUSED, shared.TARGET_CARD = 3, 2, "gate_residual+rms_norm+mod", "H200"
    sys.modules.update({"torch": torch, "torch.nn": torch.nn, "torch.nn.functional": torch.nn.functional,
                        "bench_forward": shared})


stub_modules()
import bench_backward  # noqa: E402
import bench_det_linear  # noqa: E402


class BackwardTargets(unittest.TestCase):
    def test_judged_only_on_the_card_the_targets_are_set_on(self):
        on_h100 = bench_backward.target_fields("rms_norm+mod+w", 131072, "exactjit", 2.639, H100)
        self.assertEqual(on_h100, {"target_ms": 2.1})
        self.assertEqual(bench_backward.judged(on_h100), "not judged on this card (an H200 target)")
        missed = bench_backward.target_fields("rms_norm+mod+w", 131072, "exactjit", 2.639, H200)
        self.assertEqual(bench_backward.judged(missed), "MISSED")
        met = bench_backward.target_fields("rms_norm+mod+w", 131072, "exactjit", 2.0, H200)
        self.assertEqual(bench_backward.judged(met), "met")

    def test_the_fused_op_has_issue_16s_target(self):
        fields = bench_backward.target_fields("gate_residual+rms_norm+mod", 131072, "exactjit fused", 3.7, H200)
        self.assertEqual(fields, {"target_ms": 3.8, "target_met": True})

    def test_no_target_for_references_other_sizes_or_plain_norms(self):
        for op, s, impl in (("rms_norm+mod", 131072, "eager"), ("rms_norm+mod", 32768, "exactjit"),
                            ("rms_norm+w", 131072, "exactjit"), ("gate_residual+rms_norm+mod", 131072,
                                                                  "exactjit 2 ops")):
            self.assertEqual(bench_backward.target_fields(op, s, impl, 1.0, H200), {}, (op, s, impl))


class DetLinearTargets(unittest.TestCase):
    def row(self, op, T, impl, ms, vs_cublas):
        return dict(op=op, T=T, impl=impl, ms=ms, vs_cublas=vs_cublas)

    def test_cublas_ratio_on_any_card_absolute_time_on_the_h200_only(self):
        mlp = self.row("timestep mlp", 8, "exactjit", 0.0447, 1.56)
        self.assertEqual(bench_det_linear.verdict(mlp, H100),
                         "vs cuBLAS >= 1.00x: met; <= 0.03 ms on the H200: not judged here")
        self.assertEqual(bench_det_linear.verdict(mlp, H200), "vs cuBLAS >= 1.00x: met; <= 0.03 ms: NOT met")
        backward = self.row("adaln projection fwd+bwd", 3, "exactjit", 0.39, 1.08)
        self.assertEqual(bench_det_linear.verdict(backward, H200), "vs cuBLAS >= 1.00x: met; <= 0.4 ms: met")

    def test_slower_than_cublas_is_not_met_on_any_card(self):
        projection = self.row("final projection", 8, "exactjit", 0.0352, 0.84)
        for device in (H100, H200):
            self.assertEqual(bench_det_linear.verdict(projection, device), "vs cuBLAS >= 1.00x: NOT met")

    def test_the_reference_rows_have_no_verdict(self):
        self.assertEqual(bench_det_linear.verdict(self.row("timestep mlp", 8, "cuBLAS (eager)", 0.07, 1.0), H200), "")


if __name__ == "__main__":
    unittest.main()
