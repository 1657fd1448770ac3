#!/usr/bin/env python3
"""The PyTorch operators without a GPU: registration, schemas, fake kernels, autograd formulas and
torch.compile(fullgraph=True) tracing, all on the meta device (where an operator runs its fake
kernel), plus the rules the Python layer enforces itself. Skips cleanly where torch is not
importable; the real kernels are checked on the GPU machine (tests/gpu/ops_torch.py, which also
runs torch.library.opcheck on CUDA tensors). Run by ctest; exits non-zero on failure."""
import importlib.util
import sys
import unittest

import package_under_test  # noqa: F401  (puts the package on sys.path)

HAS_TORCH = importlib.util.find_spec("torch") is not None
if HAS_TORCH:
    import torch

    import exactjit
    from exactjit import _lib

H, S, T = 64, 8, 3
META = "meta"

# The schemas are the operators' contract with compiled graphs and serialized programs: a change
# must be deliberate.
SCHEMAS = {
    "gate_residual": "exactjit::gate_residual(Tensor residual, Tensor gate, Tensor index, Tensor y) -> Tensor",
    "gate_residual_out": "exactjit::gate_residual_out(Tensor residual, Tensor gate, Tensor index, Tensor y, "
                         "Tensor(a!) out) -> ()",
    "gate_residual_backward": "exactjit::gate_residual_backward(Tensor grad, Tensor gate, Tensor index, Tensor y, "
                              "bool need_d_y, bool need_d_gate) -> (Tensor, Tensor)",
    "adaln_row_gather": "exactjit::adaln_row_gather(Tensor rows, Tensor timestep_indices, Tensor token_tags) "
                        "-> Tensor",
    "adaln_row_gather_backward": "exactjit::adaln_row_gather_backward(Tensor grad, Tensor timestep_indices, "
                                 "Tensor token_tags, SymInt table_rows, ScalarType dtype) -> Tensor",
    "rms_norm": "exactjit::rms_norm(Tensor x, Tensor? weight, float eps, Tensor? shift, Tensor? scale, "
                "Tensor? index, bool compute_rstd) -> (Tensor, Tensor)",
    "rms_norm_backward": "exactjit::rms_norm_backward(Tensor grad, Tensor x, Tensor? weight, Tensor? scale, "
                         "Tensor? index, Tensor rstd, float eps, bool need_dx, bool need_dweight, "
                         "bool need_dshift, bool need_dscale) -> (Tensor, Tensor, Tensor, Tensor)",
    "gate_residual_rms_norm": "exactjit::gate_residual_rms_norm(Tensor residual, Tensor gate, Tensor index, "
                              "Tensor y, Tensor? weight, float eps, Tensor? shift, Tensor? scale, bool compute_rstd) "
                              "-> (Tensor, Tensor, Tensor)",
    "gate_residual_rms_norm_backward": "exactjit::gate_residual_rms_norm_backward(Tensor grad_out, Tensor? grad_h, "
                                       "Tensor h, Tensor y, Tensor gate, Tensor index, Tensor? weight, "
                                       "Tensor? scale, Tensor rstd, float eps, bool need_d_y, bool need_d_gate, "
                                       "bool need_d_weight, bool need_d_shift, bool need_d_scale) -> (Tensor, "
                                       "Tensor, Tensor, Tensor, Tensor, Tensor)",
    "timestep_sinusoid": "exactjit::timestep_sinusoid(Tensor t, SymInt num_channels, float max_period, "
                         "bool flip_sin_to_cos, float downscale_freq_shift, float scale, bool check_range) "
                         "-> Tensor",
    "timestep_sinusoid_backward": "exactjit::timestep_sinusoid_backward(Tensor t, Tensor grad, float max_period, "
                                  "bool flip_sin_to_cos, float downscale_freq_shift, float scale) -> Tensor",
    "det_linear": "exactjit::det_linear(Tensor x, Tensor weight, Tensor? bias, bool silu, bool compute_pre) "
                  "-> (Tensor, Tensor)",
    "det_linear_backward": "exactjit::det_linear_backward(Tensor grad, Tensor x, Tensor weight, "
                           "Tensor? pre_activation, bool silu, bool need_input, bool need_weight, bool need_bias) "
                           "-> (Tensor, Tensor, Tensor)",
}


def table(dtype=torch.bfloat16 if HAS_TORCH else None, grad=False, t=T, width=18):
    return torch.randn(t, width * H, device=META, dtype=dtype, requires_grad=grad)


def chain(x, tab, weight, index, y):
    """One block's conditioning chain over the (T, 18H) table: modulated norm, gated residual."""
    rows = tab.view(3 * T, 6 * H)
    shift, scale, gate = rows[:, 0:H], rows[:, H:2 * H], rows[:, 2 * H:3 * H]
    n = exactjit.rms_norm(x, weight, 1e-5, shift=shift, scale=scale, index=index)
    return exactjit.gate_residual(x, gate, index, n * y)


def fused_chain(x, tab, weight, index, attn, ff):
    """The block after attention: the first gated residual feeding the modulated norm2 (one fused
    op), then the second gated residual on its output."""
    rows = tab.view(3 * T, 6 * H)
    gate_msa, shift_mlp, scale_mlp, gate_mlp = (rows[:, c * H:(c + 1) * H] for c in (2, 3, 4, 5))
    h, n = exactjit.gate_residual_rms_norm(x, gate_msa, index, attn, weight, 1e-5, shift=shift_mlp, scale=scale_mlp)
    return exactjit.gate_residual(h, gate_mlp, index, n * ff)


if HAS_TORCH:
    class ExactjitCalls(torch.utils._python_dispatch.TorchDispatchMode):
        """Records the exactjit operators that run (the backward's too) with their arguments."""

        def __init__(self):
            super().__init__()
            self.calls = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.namespace == "exactjit":
                self.calls.append((func._schema.name.split("::")[1], args))
            return func(*args, **(kwargs or {}))


@unittest.skipUnless(HAS_TORCH, "torch is not installed")
class Operators(unittest.TestCase):
    def test_every_operator_is_registered_with_its_schema(self):
        self.assertEqual(set(exactjit.ops.OPERATORS), set(SCHEMAS))
        for name, schema in SCHEMAS.items():
            overload = getattr(torch.ops.exactjit, name).default
            self.assertEqual(str(overload._schema), schema, name)

    def test_fake_kernels_give_shapes_dtypes_and_strides(self):
        rows = table().view(3 * T, 6 * H)
        gate = rows[:, 2 * H:3 * H]  # strided view: row stride 6H
        x = torch.empty(2, S, H, device=META, dtype=torch.bfloat16)
        index = torch.empty(S, device=META, dtype=torch.int64)
        ops = torch.ops.exactjit
        out = ops.gate_residual(x, gate, index, x)
        self.assertEqual((out.shape, out.dtype, out.stride()), (x.shape, x.dtype, x.stride()))
        d_y, d_gate = ops.gate_residual_backward(x, gate, index, x, True, True)
        self.assertEqual((d_y.shape, d_y.stride()), (x.shape, x.stride()))
        self.assertEqual((d_gate.shape, d_gate.stride(), d_gate.dtype), ((3 * T, H), (H, 1), torch.bfloat16))
        d_y, d_gate = ops.gate_residual_backward(x, gate, index, x, False, True)
        self.assertEqual(d_y.numel(), 0)
        out, rstd = ops.rms_norm(x, None, 1e-5, rows[:, :H], rows[:, H:2 * H], index, True)
        self.assertEqual((out.shape, rstd.shape, rstd.dtype), (x.shape, (2, S), torch.float32))
        self.assertEqual(ops.rms_norm(x, None, 1e-5, None, None, None, False)[1].numel(), 0)
        weight = torch.empty(H, device=META, dtype=torch.bfloat16)
        grads = ops.rms_norm_backward(x, x, weight, gate, index, rstd, 1e-5, True, True, True, False)
        self.assertEqual([tuple(g.shape) for g in grads], [(2, S, H), (H,), (3 * T, H), (0,)])
        scale = rows[:, 4 * H:5 * H]
        h, out, rstd = ops.gate_residual_rms_norm(x, gate, index, x, weight, 1e-5, rows[:, 3 * H:4 * H], scale, True)
        self.assertEqual([(t.shape, t.stride(), t.dtype) for t in (h, out, rstd)],
                         [(x.shape, x.stride(), x.dtype)] * 2 + [((2, S), (S, 1), torch.float32)])
        self.assertEqual(ops.gate_residual_rms_norm(x, gate, index, x, None, 1e-5, None, None, False)[2].numel(), 0)
        grads = ops.gate_residual_rms_norm_backward(x, x, h, x, gate, index, weight, scale, rstd, 1e-5, True, True,
                                                    True, True, False)
        self.assertEqual([(tuple(g.shape), g.dtype) for g in grads],
                         [((2, S, H), torch.bfloat16)] * 2 + [((3 * T, H), torch.bfloat16), ((H,), torch.bfloat16),
                                                              ((3 * T, H), torch.bfloat16), ((0,), torch.bfloat16)])
        self.assertEqual(grads[2].stride(), (H, 1))
        grads = ops.gate_residual_rms_norm_backward(x, None, h, x, gate, index, None, None, rstd, 1e-5, False, False,
                                                    False, False, False)  # d_residual is always computed
        self.assertEqual([tuple(g.shape) for g in grads], [(2, S, H)] + [(0,)] * 5)
        six = ops.adaln_row_gather(rows, index, index)
        self.assertEqual((six.shape, six.dtype), ((6, S, H), torch.bfloat16))
        d_rows = ops.adaln_row_gather_backward(six, index, index, 3 * T, torch.float32)
        self.assertEqual((d_rows.shape, d_rows.dtype), ((3 * T, 6 * H), torch.float32))
        t = torch.empty(T, device=META)
        self.assertEqual(ops.timestep_sinusoid(t, 256, 10000.0, True, 0.0, 1.0, False).shape, (T, 256))
        self.assertEqual(ops.timestep_sinusoid_backward(t, torch.empty(T, 256, device=META), 1e4, True, 0.0,
                                                        1.0).shape, (T,))
        temb = torch.empty(T, 2688, device=META)
        w = torch.empty(18 * H, 2688, device=META, dtype=torch.bfloat16)
        out, pre = ops.det_linear(temb, w, None, True, False)
        self.assertEqual((out.shape, out.dtype, pre.numel()), ((T, 18 * H), torch.bfloat16, 0))
        d_x, d_w, d_b = ops.det_linear_backward(out, temb, w, None, True, True, True, True)
        self.assertEqual((d_x.dtype, d_w.dtype, d_w.shape, d_b.shape), (torch.float32, torch.bfloat16, w.shape,
                                                                       (18 * H,)))
        w32 = torch.empty(16, 2688, device=META)
        self.assertEqual(ops.det_linear(temb, w32, None, True, True)[1].shape, (T, 16))

    def test_autograd_formulas_reach_every_differentiable_input(self):
        x = torch.randn(1, S, H, device=META, dtype=torch.bfloat16, requires_grad=True)
        y = torch.randn(1, S, H, device=META, dtype=torch.bfloat16, requires_grad=True)
        weight = torch.randn(H, device=META, dtype=torch.bfloat16, requires_grad=True)
        tab = table(grad=True)
        index = torch.zeros(S, device=META, dtype=torch.int64)
        out = chain(x, tab, weight, index, y)
        self.assertIn("GateResidual", type(out.grad_fn).__name__)
        out.sum().backward()
        for name, tensor in (("x", x), ("y", y), ("weight", weight), ("table", tab)):
            self.assertIsNotNone(tensor.grad, name)
            self.assertEqual((tensor.grad.shape, tensor.grad.dtype), (tensor.shape, tensor.dtype), name)

        rows = table(grad=True).view(3 * T, 6 * H)
        chunks = exactjit.adaln_row_gather(rows, index, index)
        self.assertEqual(len(chunks), 6)
        (chunks[2] * 2).sum().backward()  # one chunk used: the others' gradients are zeros
        t = torch.rand(T, device=META, requires_grad=True)
        exactjit.timestep_sinusoid(t).sum().backward()
        self.assertEqual(t.grad.shape, (T,))
        temb = torch.randn(T, 2688, device=META, requires_grad=True)
        w = torch.randn(18 * H, 2688, device=META, dtype=torch.bfloat16, requires_grad=True)
        b = torch.randn(18 * H, device=META, dtype=torch.bfloat16, requires_grad=True)
        exactjit.adaln_projection(temb, w, b).float().sum().backward()
        self.assertEqual((temb.grad.dtype, w.grad.dtype, b.grad.shape), (torch.float32, torch.bfloat16, (18 * H,)))
        w1 = torch.randn(32, 256, device=META, requires_grad=True)
        w2 = torch.randn(16, 32, device=META, requires_grad=True)
        features = torch.randn(T, 256, device=META)
        exactjit.timestep_mlp(features, w1, None, w2, None).sum().backward()
        self.assertEqual((w1.grad.shape, w2.grad.shape), (w1.shape, w2.shape))

    def test_gate_residual_rms_norm_gradients_reach_every_input(self):
        x, attn, ff = (torch.randn(2, S, H, device=META, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
        weight = torch.randn(H, device=META, dtype=torch.bfloat16, requires_grad=True)
        tab = table(grad=True)
        index = torch.zeros(S, device=META, dtype=torch.int64)
        out = fused_chain(x, tab, weight, index, attn, ff)
        out.sum().backward()
        for name, tensor in (("x", x), ("attn", attn), ("ff", ff), ("weight", weight), ("table", tab)):
            self.assertIsNotNone(tensor.grad, name)
            self.assertEqual((tensor.grad.shape, tensor.grad.dtype), (tensor.shape, tensor.dtype), name)

    def test_gate_residual_rms_norm_backward_computes_what_is_needed(self):
        """needs_input_grad picks the gradients; an output nothing used is a NULL grad_h, or (out unused)
        gate_residual's backward alone."""
        index = torch.zeros(S, device=META, dtype=torch.int64)

        def backward(need, use=("h", "out"), weighted=True):
            x, y = (torch.randn(2, S, H, device=META, dtype=torch.bfloat16, requires_grad=k in need) for k in "xy")
            weight = torch.randn(H, device=META, dtype=torch.bfloat16, requires_grad="weight" in need)
            rows = table(grad="table" in need).view(3 * T, 6 * H)
            gate, shift, scale = (rows[:, c * H:(c + 1) * H] for c in (2, 3, 4))
            with ExactjitCalls() as mode:
                h, out = exactjit.gate_residual_rms_norm(x, gate, index, y, weight if weighted else None, 1e-5,
                                                         shift=shift, scale=scale)
                used = [t for k, t in (("h", h), ("out", out)) if k in use]
                torch.autograd.backward(used, [torch.ones_like(t) for t in used])
            return [(name, args) for name, args in mode.calls if name.endswith("_backward")]

        cases = [  # (inputs requiring grad, need_d_y, need_d_gate, need_d_weight, need_d_shift, need_d_scale)
            (("x",), False, False, False, False, False),
            (("y",), True, False, False, False, False),
            (("weight",), False, False, True, False, False),
            (("table",), False, True, False, True, True),
            (("x", "y", "weight", "table"), True, True, True, True, True),
        ]
        for need, *flags in cases:
            with self.subTest(need=need):
                (name, args), = backward(need)
                self.assertEqual(name, "gate_residual_rms_norm_backward")
                self.assertEqual(list(args[10:]), flags)
                self.assertIsNotNone(args[1])  # grad_h
        (name, args), = backward(("y", "table"), weighted=False)
        self.assertEqual((args[6], list(args[10:])), (None, [True, True, False, True, True]))
        (name, args), = backward(("x", "table"), use=("out",))
        self.assertEqual((name, args[1]), ("gate_residual_rms_norm_backward", None))
        (name, args), = backward(("y", "table"), use=("h",))
        self.assertEqual((name, list(args[4:])), ("gate_residual_backward", [True, True]))
        self.assertEqual(backward(("x", "weight"), use=("h",)), [])  # d_residual = grad_h, no norm gradient

    def test_rstd_and_pre_activation_are_not_differentiable(self):
        x = torch.randn(S, H, device=META, requires_grad=True)
        out, rstd = exactjit.rms_norm(x, None, 1e-5, return_rstd=True)
        self.assertTrue(out.requires_grad)
        self.assertFalse(rstd.requires_grad)

    def test_compile_fullgraph_traces_forward_and_backward_operators(self):
        graphs = []

        from functorch.compile import make_boxed_func
        from torch._functorch.aot_autograd import aot_module_simplified

        def record(gm, example_inputs):
            graphs.append(gm.code)
            return make_boxed_func(gm.forward)

        def backend(gm, example_inputs):
            return aot_module_simplified(gm, example_inputs, fw_compiler=record, bw_compiler=record)

        torch._dynamo.reset()
        x = torch.randn(1, S, H, device=META, dtype=torch.bfloat16, requires_grad=True)
        y = torch.randn(1, S, H, device=META, dtype=torch.bfloat16, requires_grad=True)
        weight = torch.randn(H, device=META, dtype=torch.bfloat16, requires_grad=True)
        tab = table(grad=True)
        index = torch.zeros(S, device=META, dtype=torch.int64)
        explanation = torch._dynamo.explain(chain)(x, tab, weight, index, y)
        self.assertEqual((explanation.graph_count, explanation.graph_break_count), (1, 0))
        compiled = torch.compile(chain, backend=backend, fullgraph=True)
        compiled(x, tab, weight, index, y).sum().backward()
        self.assertEqual(len(graphs), 2, "one forward and one backward graph")
        forward, backward = graphs
        self.assertIn("exactjit.rms_norm.default", forward)
        self.assertIn("exactjit.gate_residual.default", forward)
        self.assertIn("exactjit.gate_residual_backward.default", backward)
        self.assertIn("exactjit.rms_norm_backward.default", backward)

        graphs.clear()
        torch._dynamo.reset()
        attn, ff = (torch.randn(1, S, H, device=META, dtype=torch.bfloat16, requires_grad=True) for _ in range(2))
        explanation = torch._dynamo.explain(fused_chain)(x, tab, weight, index, attn, ff)
        self.assertEqual((explanation.graph_count, explanation.graph_break_count), (1, 0))
        compiled = torch.compile(fused_chain, backend=backend, fullgraph=True)
        compiled(x, tab, weight, index, attn, ff).sum().backward()
        self.assertEqual(len(graphs), 2, "one forward and one backward graph")
        forward, backward = graphs
        self.assertIn("exactjit.gate_residual_rms_norm.default", forward)
        self.assertIn("exactjit.gate_residual_rms_norm_backward.default", backward)

    def test_opcheck_on_meta_checks_schema_fake_and_autograd_registration(self):
        # On the GPU machine opcheck runs the real kernels too; here the meta kernels stand in.
        x = torch.randn(1, S, H, device=META, dtype=torch.bfloat16, requires_grad=True)
        rows = table().view(3 * T, 6 * H)
        index = torch.zeros(S, device=META, dtype=torch.int64)
        torch.library.opcheck(torch.ops.exactjit.gate_residual.default, (x, rows[:, 2 * H:3 * H], index, x))
        torch.library.opcheck(torch.ops.exactjit.rms_norm.default,
                              (x, None, 1e-5, rows[:, :H], rows[:, H:2 * H], index, True))
        weight = torch.randn(H, device=META, dtype=torch.bfloat16, requires_grad=True)
        torch.library.opcheck(torch.ops.exactjit.gate_residual_rms_norm.default,
                              (x, rows[:, 2 * H:3 * H], index, x, weight, 1e-5, rows[:, 3 * H:4 * H],
                               rows[:, 4 * H:5 * H], True))
        out = torch.empty(1, S, H, device=META, dtype=torch.bfloat16)
        torch.library.opcheck(torch.ops.exactjit.gate_residual_out.default,
                              (x.detach(), rows[:, 2 * H:3 * H], index, x.detach(), out))

    def test_python_rules(self):
        x = torch.zeros(4, H, requires_grad=True)
        tab = torch.zeros(3, 6 * H)
        index = torch.zeros(4, dtype=torch.int64)
        with self.assertRaises(exactjit.InvalidArgumentError) as caught:
            exactjit.gate_residual(x, tab[:, :H], index, x, out=torch.empty(4, H))
        self.assertIn("out=", str(caught.exception))
        with self.assertRaises(exactjit.InvalidArgumentError) as caught:
            exactjit.gate_residual(x, [1.0], index, x)
        self.assertIn("gate", str(caught.exception))
        # A raw launch refuses to drop a gradient.
        with self.assertRaises(exactjit.InvalidArgumentError) as caught:
            exactjit.runtime().gate_residual(x, tab[:, :H], index, x)
        self.assertIn("not differentiable", str(caught.exception))
        with self.assertRaises(exactjit.InvalidArgumentError) as caught:
            exactjit.runtime().gate_residual_rms_norm(x, tab[:, :H], index, x, None, 1e-5)
        self.assertIn("not differentiable", str(caught.exception))
        with self.assertRaises(exactjit.InvalidArgumentError) as caught:
            exactjit.gate_residual_rms_norm(x, tab[:, :H], index, x, "weight", 1e-5)
        self.assertIn("weight", str(caught.exception))
        # CPU tensors reach the library through the operator, which names the op and the rule.
        with torch.no_grad():
            with self.assertRaises(exactjit.InvalidArgumentError) as caught:
                exactjit.gate_residual(x, tab[:, :H], index, x)
            self.assertIn("gate_residual", str(caught.exception))
            with self.assertRaises(exactjit.InvalidArgumentError) as caught:
                exactjit.gate_residual_rms_norm(x, tab[:, :H], index, x, None, 1e-5, shift=tab[:, H:2 * H],
                                                scale=tab[:, 2 * H:3 * H])
            self.assertIn("gate_residual_rms_norm", str(caught.exception))

    def test_import_registers_the_operators_only_with_torch_loaded(self):
        self.assertIn("exactjit._ops", sys.modules)  # torch was imported first, so import exactjit registered
        self.assertTrue(hasattr(torch.ops.exactjit, "gate_residual"))
        self.assertEqual(_lib.library_path, exactjit.library_path())


if __name__ == "__main__":
    unittest.main()
