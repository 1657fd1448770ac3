#!/usr/bin/env python3
"""exactjit.integrations.diffusers and exactjit.nn on a machine without a GPU (CI).

The kernels need CUDA, so exactjit's ops are replaced by mocks that compute the exact torch
expressions they are bitwise equal to (and count their calls), and the integration is told that CPU
tensors go to the kernels (KERNEL_DEVICES). On a tiny MiniMax-H3 transformer (bench/minimax_h3_setup.py,
fp32 and the checkpoint's bf16 layout) this checks the wiring: a patched model's output is bitwise
equal to the unpatched one's under every option set, each op is called as often as expected,
state_dict, parameters and hooks are untouched, remove() restores the class forwards, refused
configurations leave nothing patched, a second apply is a no-op or refused, the fallbacks run the
original expressions, and dynamo traces patched modules without graph breaks. On the meta device the
real operators (their fake kernels) run in a patched model, eager and under torch.compile(fullgraph=
True) with AOTAutograd. exactjit.nn.RMSNorm loads nn.RMSNorm state_dicts and forwards to
exactjit.rms_norm.

Tests that need torch, or diffusers, skip without them (exit status 0). Run by ctest.
"""
import collections
import contextlib
import copy
import importlib.util
import os
import subprocess
import sys
import types
import unittest
from unittest import mock

from package_under_test import REPO, child_env  # noqa: E402  (puts the package on sys.path)
sys.path.insert(0, os.path.join(REPO, "bench"))  # minimax_h3_setup.py

import exactjit  # noqa: E402

HAS_TORCH = importlib.util.find_spec("torch") is not None
HAS_DIFFUSERS = HAS_TORCH and importlib.util.find_spec("diffusers") is not None
if HAS_TORCH:
    import torch
    import torch.nn.functional as F

    import exactjit.nn as xjnn
    from exactjit.integrations import diffusers as xjd
if HAS_DIFFUSERS:
    from diffusers.models.embeddings import get_timestep_embedding

    import minimax_h3_setup as setup

OPTION_SETS = (dict(), dict(qk_norm=True), dict(refiner_norms=True), dict(det_linear=True),
               dict(sequence_parallel=True), dict(qk_norm=True, refiner_norms=True, det_linear=True))
SEQ, TEXT, AUDIO, BATCH = 29, 5, 6, 2


# The torch expressions each exactjit op equals (det_linear's: the eager modules' expressions).

def rms_norm_ref(x, weight, eps, shift=None, scale=None, index=None, return_rstd=False):
    assert not return_rstd
    y = F.rms_norm(x, (x.shape[-1],), weight, eps)
    if shift is None:
        return y
    return y * (1.0 + scale.index_select(0, index)) + shift.index_select(0, index)


def gate_residual_ref(residual, gate, index, y):
    return residual + gate.index_select(0, index) * y


def gate_residual_rms_norm_ref(residual, gate, index, y, weight, eps, *, shift=None, scale=None):
    h = gate_residual_ref(residual, gate, index, y)
    return h, rms_norm_ref(h, weight, eps, shift, scale, index)


def timestep_sinusoid_ref(t, num_channels=256, max_period=10000, flip_sin_to_cos=True, downscale_freq_shift=0,
                          scale=1.0):
    return get_timestep_embedding(t, num_channels, flip_sin_to_cos, downscale_freq_shift, scale, max_period)


def timestep_mlp_ref(features, w1, b1, w2, b2):
    return F.linear(F.silu(F.linear(features, w1, b1)), w2, b2)


def adaln_projection_ref(temb, weight, bias, *, silu=True):
    assert silu
    return F.linear(F.silu(temb).to(weight.dtype), weight, bias)


REFERENCES = dict(rms_norm=rms_norm_ref, gate_residual=gate_residual_ref,
                  gate_residual_rms_norm=gate_residual_rms_norm_ref, timestep_sinusoid=timestep_sinusoid_ref,
                  timestep_mlp=timestep_mlp_ref, adaln_projection=adaln_projection_ref)


@contextlib.contextmanager
def kernels_on_cpu(counting=True, devices=frozenset({"cpu"})):
    """exactjit's ops replaced by their references (MagicMocks counting calls, or the plain
    functions, which dynamo can trace) and CPU tensors sent to them; yields {op: mock}."""
    with contextlib.ExitStack() as stack:
        mocks = {}
        for name, ref in REFERENCES.items():
            patch = (mock.patch.object(exactjit, name, side_effect=ref) if counting
                     else mock.patch.object(exactjit, name, ref))
            mocks[name] = stack.enter_context(patch)
        stack.enter_context(mock.patch.object(xjd, "KERNEL_DEVICES", devices))
        yield mocks


def calls(mocks):
    return {name: m.call_count for name, m in mocks.items()}


def instance_forwards(model):
    return [name for name, m in model.named_modules() if "forward" in m.__dict__]


class Bitwise:
    def assert_bitwise(self, got, want):
        got, want = (got,) if torch.is_tensor(got) else got, (want,) if torch.is_tensor(want) else want
        self.assertEqual(len(got), len(want))
        bits = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}
        for g, w in zip(got, want):
            self.assertEqual((g.shape, g.dtype), (w.shape, w.dtype))
            self.assertTrue(torch.equal(g.view(bits[g.dtype]), w.view(bits[w.dtype])), "outputs differ in their bits")


@unittest.skipUnless(HAS_DIFFUSERS, "torch and diffusers are not installed")
class DiffusersIntegration(unittest.TestCase, Bitwise):
    def model(self, dtype=None, **config):
        return setup.build_model(dtype or torch.float32, device="cpu", **{**setup.TINY, **config})

    def inputs(self, model):
        return setup.packed_inputs(model, SEQ, text=TEXT, audio=AUDIO, batch=BATCH)

    def assert_untouched(self, model):
        self.assertEqual(instance_forwards(model), [])
        self.assertNotIn(xjd.RECORD, model.__dict__)

    def block_args(self, model, inputs, name):
        """The positional arguments `name` gets in a forward of model."""
        seen = []

        def keep(module, args):
            seen.append(args)

        handle = model.get_submodule(name).register_forward_pre_hook(keep)
        with torch.no_grad():
            model(**inputs)
        handle.remove()
        return seen[0]

    def test_patched_model_is_bitwise_equal_and_calls_each_op(self):
        for dtype in (torch.float32, torch.bfloat16):
            model = self.model(dtype)
            inputs = self.inputs(model)
            with torch.no_grad():
                want = model(**inputs)
            for options in OPTION_SETS:
                if options.get("det_linear") and dtype != torch.bfloat16:
                    continue  # det_linear takes the checkpoint's bf16 projections only (refusal tested below)
                with self.subTest(dtype=dtype, **options), kernels_on_cpu() as mocks:
                    xjd.apply(model, **options)
                    try:
                        with torch.no_grad():
                            got = model(**inputs)
                    finally:
                        xjd.remove(model)
                    self.assert_bitwise(got, want)
                    self.assertEqual(calls(mocks), setup.expected_calls(model, **options))
            self.assert_untouched(model)

    def test_state_dict_parameters_and_hooks_are_untouched(self):
        model = self.model(torch.bfloat16)
        inputs = self.inputs(model)
        state = {k: v.clone() for k, v in model.state_dict().items()}
        params = [(n, id(p)) for n, p in model.named_parameters()]
        fired = collections.Counter()
        hooked = ("", "time_proj", "transformer_blocks.0", "transformer_blocks.0.adaln_proj",
                  "transformer_blocks.0.attn", "transformer_blocks.0.attn.norm_q", "transformer_blocks.1.ff",
                  "token_refiner.final_norm", "token_refiner.refiner_blocks.0.norm1", "norm_out", "norm_out.linear")
        for name in hooked:
            model.get_submodule(name).register_forward_hook(lambda m, a, o, name=name: fired.update([name]))
        model.transformer_blocks[1].register_forward_pre_hook(lambda m, a, k: fired.update(["pre+kwargs"]),
                                                              with_kwargs=True)
        with torch.no_grad():
            want = model(**inputs)
        eager_fired = dict(fired)
        fired.clear()
        with kernels_on_cpu() as mocks:
            xjd.apply(model, qk_norm=True, refiner_norms=True)
            with torch.no_grad():
                got = model(**inputs)
            self.assertEqual(calls(mocks), setup.expected_calls(model, qk_norm=True, refiner_norms=True))
        self.assert_bitwise(got, want)
        self.assertEqual(dict(fired), eager_fired)
        self.assertEqual(set(eager_fired), set(hooked) | {"pre+kwargs"})
        self.assertEqual([(n, id(p)) for n, p in model.named_parameters()], params)
        patched_state = model.state_dict()
        self.assertEqual(list(patched_state), list(state))
        for key, value in state.items():
            self.assertTrue(torch.equal(patched_state[key], value), key)
        model.load_state_dict(state)  # strict: no key added or missing
        xjd.remove(model)
        self.assert_untouched(model)

    def test_remove_restores_the_class_forwards(self):
        model = self.model(torch.bfloat16)
        inputs = self.inputs(model)
        with torch.no_grad():
            want = model(**inputs)
        options = OPTION_SETS[-1]
        xjd.apply(model, **options)
        patched = instance_forwards(model)
        record = model.__dict__[xjd.RECORD]
        self.assertEqual(sorted(patched), sorted(path for path, _, _ in record.swaps))
        self.assertIn("time_embedder", patched)
        self.assertIn("transformer_blocks.1.adaln_proj", patched)
        self.assertEqual(dict(record.options), dict(options, sequence_parallel=False))
        twin = copy.deepcopy(model)  # its forwards are bound to its own modules, so it is removable on its own
        xjd.remove(twin)
        self.assert_untouched(twin)
        self.assertEqual(sorted(instance_forwards(model)), sorted(patched))
        self.assertIs(xjd.remove(model), model)
        self.assert_untouched(model)
        with kernels_on_cpu() as mocks, torch.no_grad():
            got = model(**inputs)
        self.assertEqual(sum(calls(mocks).values()), 0)
        self.assert_bitwise(got, want)
        with self.assertRaisesRegex(ValueError, "not patched"):
            xjd.remove(model)

    def test_remove_refuses_a_forward_replaced_after_apply(self):
        model = self.model()
        xjd.apply(model)
        block = model.transformer_blocks[1]
        ours = block.forward
        block.forward = types.MethodType(lambda self, *a, **k: ours(*a, **k), block)  # a wrapper added later
        with self.assertRaisesRegex(ValueError, "transformer_blocks.1: forward was replaced after apply"):
            xjd.remove(model)
        self.assertIn(xjd.RECORD, model.__dict__)
        self.assertIn("forward", model.time_proj.__dict__)  # nothing restored
        block.forward = ours
        xjd.remove(model)
        self.assert_untouched(model)

    def test_refused_configurations_leave_nothing_patched(self):
        def refused(model, pattern, **options):
            with self.assertRaisesRegex(ValueError, pattern):
                xjd.apply(model, **options)
            self.assert_untouched(model)

        refused(self.model(hidden_size=62), r"transformer_blocks\.0\.norm1: size 62 is not a positive multiple of 4")
        odd_heads = self.model(attention_head_dim=34)
        refused(odd_heads, r"transformer_blocks\.0\.attn\.norm_q: size 34", qk_norm=True)
        xjd.remove(xjd.apply(odd_heads))  # the other swaps do not depend on the head size
        refused(self.model(), r"transformer_blocks\.0\.adaln_proj\.linear: det_linear needs a torch.bfloat16",
                det_linear=True)
        refused(self.model().double(), r"transformer_blocks\.0\.norm1: weight is torch.float64")

        hooked = self.model()
        hooked.transformer_blocks[1].norm2.register_forward_hook(lambda *a: None)
        refused(hooked, r"transformer_blocks\.1\.norm2: has hooks")
        projection_hooked = self.model(torch.bfloat16)
        projection_hooked.norm_out.linear.register_forward_pre_hook(lambda *a: None)
        refused(projection_hooked, r"norm_out\.linear: has hooks", det_linear=True)

        wrapped = self.model()
        block = wrapped.transformer_blocks[1]
        block.forward = types.MethodType(type(block).forward, block)  # as accelerate or diffusers hooks do
        with self.assertRaisesRegex(ValueError, r"transformer_blocks\.1: already has an instance forward"):
            xjd.apply(wrapped)
        self.assertEqual(instance_forwards(wrapped), ["transformer_blocks.1"])
        self.assertNotIn(xjd.RECORD, wrapped.__dict__)

        with self.assertRaisesRegex(ValueError, "exactjit patches a MiniMaxH3Transformer3DModel"):
            xjd.apply(torch.nn.Linear(4, 4))
        block = self.model().transformer_blocks[0]
        refused(block, "refiner_norms applies to a MiniMaxH3Transformer3DModel", refiner_norms=True)

    def test_second_apply_is_a_no_op_or_refused(self):
        model = self.model()
        xjd.apply(model, qk_norm=True)
        forwards = {name: m.__dict__["forward"] for name, m in model.named_modules() if "forward" in m.__dict__}
        self.assertIs(xjd.apply(model, qk_norm=True), model)
        self.assertEqual({name: m.__dict__["forward"] for name, m in model.named_modules() if "forward" in m.__dict__},
                         forwards)
        with self.assertRaisesRegex(ValueError, "already patched with"):
            xjd.apply(model)
        with self.assertRaisesRegex(ValueError, "already has an instance forward"):
            xjd.apply(model.transformer_blocks[0])
        self.assertEqual(dict(model.__dict__[xjd.RECORD].options)["qk_norm"], True)
        xjd.remove(model)
        self.assert_untouched(model)

    def test_single_block_and_norm_out(self):
        model = self.model(torch.bfloat16)
        inputs = self.inputs(model)
        block = model.transformer_blocks[1]
        args = self.block_args(model, inputs, "transformer_blocks.1")
        mask = torch.rand(SEQ, SEQ, generator=torch.Generator().manual_seed(3)) > 0.2
        mask |= torch.eye(SEQ, dtype=torch.bool)
        with torch.no_grad():
            want, want_masked = block(*args), block(*args, attention_mask=mask)
        with kernels_on_cpu() as mocks:
            xjd.apply(block, qk_norm=True, det_linear=True)
            with torch.no_grad():
                got, got_masked = block(*args), block(*args, attention_mask=mask)
            xjd.remove(block)
        self.assert_bitwise(got, want)
        self.assert_bitwise(got_masked, want_masked)
        self.assertEqual(calls(mocks), dict(rms_norm=2 * (1 + 2), gate_residual=2, gate_residual_rms_norm=2,
                                            timestep_sinusoid=0, timestep_mlp=0, adaln_projection=2))

        norm_out = model.norm_out
        args = self.block_args(model, inputs, "norm_out")
        with torch.no_grad():
            want = norm_out(*args)
        for options, projections in ((dict(), 0), (dict(det_linear=True), 1)):
            with self.subTest(**options), kernels_on_cpu() as mocks:
                xjd.apply(norm_out, **options)
                with torch.no_grad():
                    got = norm_out(*args)
                xjd.remove(norm_out)
                self.assert_bitwise(got, want)
                self.assertEqual((calls(mocks)["rms_norm"], calls(mocks)["adaln_projection"]), (1, projections))
        with self.assertRaisesRegex(ValueError, "qk_norm applies to a model or a block"):
            xjd.apply(norm_out, qk_norm=True)
        self.assert_untouched(model)

    def test_inputs_the_kernels_do_not_take_run_the_original(self):
        model = self.model(torch.bfloat16)
        inputs = self.inputs(model)
        with torch.no_grad():
            want = model(**inputs)
        options = dict(qk_norm=True, refiner_norms=True, det_linear=True)
        with kernels_on_cpu(devices=frozenset({"cuda"})) as mocks, torch.no_grad():  # CPU tensors: no kernel
            xjd.apply(model, **options)
            got = model(**inputs)
            self.assertEqual(sum(calls(mocks).values()), 0)
        self.assert_bitwise(got, want)

        norm = model.transformer_blocks[0].attn.norm_q
        x = torch.randn(BATCH, SEQ, 2, 64, dtype=torch.bfloat16)
        with kernels_on_cpu() as mocks, torch.no_grad():
            self.assert_bitwise(norm(x[..., :32]), torch.nn.RMSNorm.forward(norm, x[..., :32]))  # not contiguous
            self.assert_bitwise(norm(x[..., 1:33].contiguous()), torch.nn.RMSNorm.forward(norm, x[..., 1:33]))
            with torch.autocast("cpu", dtype=torch.bfloat16):
                xc = x[..., :32].contiguous()
                self.assert_bitwise(norm(xc), torch.nn.RMSNorm.forward(norm, xc))
            self.assertEqual(calls(mocks)["rms_norm"], 1)  # the contiguous one only
        xjd.remove(model)

    def test_dynamo_traces_patched_modules_without_graph_breaks(self):
        model = self.model(torch.bfloat16)
        inputs = self.inputs(model)
        block = model.transformer_blocks[0]
        args = self.block_args(model, inputs, "transformer_blocks.0")
        with torch.no_grad():
            want = model(**inputs)
        torch._dynamo.reset()
        unpatched = torch._dynamo.explain(block)(*args)
        self.assertEqual(unpatched.graph_break_count, 0, unpatched.break_reasons)
        for options in (OPTION_SETS[0], OPTION_SETS[-1], dict(sequence_parallel=True)):
            with self.subTest(**options), kernels_on_cpu(counting=False):
                xjd.apply(model, **options)
                try:
                    torch._dynamo.reset()
                    patched = torch._dynamo.explain(block)(*args)
                    torch._dynamo.reset()
                    compiled = torch.compile(model, backend="eager", fullgraph=True)
                    with torch.no_grad():
                        got = compiled(**inputs)
                finally:
                    xjd.remove(compiled)  # the wrapper is unwrapped
                    torch._dynamo.reset()
                self.assertEqual(patched.graph_break_count, 0, patched.break_reasons)
                self.assert_bitwise(got, want)

    def test_real_operators_trace_on_the_meta_device(self):
        """exactjit's real operators, whose fake kernels run on meta tensors, in a patched model with
        every option: the eager forward calls each as expected and the backward reaches the AdaLN
        and norm parameters; torch.compile(fullgraph=True) with AOTAutograd traces forward and
        backward, so the patch adds no graph break. Meta tensors have no autocast state."""
        model = self.model(torch.bfloat16)
        inputs = {k: v.to("meta") if torch.is_tensor(v) else v for k, v in self.inputs(model).items()}
        model.to("meta")
        options = OPTION_SETS[-1]
        watched = ("transformer_blocks.0.adaln_proj.linear.weight", "transformer_blocks.1.norm2.weight",
                   "norm_out.linear.bias", "time_embedder.linear_1.weight", "token_refiner.final_norm.weight")

        def forward_backward(fn):
            model.zero_grad(set_to_none=True)
            outputs = fn(**inputs)
            torch.autograd.backward(outputs, [torch.ones_like(o) for o in outputs])
            return [name for name in watched if model.get_parameter(name).grad is None]

        with mock.patch.object(xjd, "KERNEL_DEVICES", frozenset({"meta"})), \
                mock.patch.object(xjd, "_autocast", lambda t: False):
            xjd.apply(model, **options)
            try:
                with contextlib.ExitStack() as stack:
                    ops = {name: stack.enter_context(mock.patch.object(exactjit, name, wraps=getattr(exactjit, name)))
                           for name in REFERENCES}
                    self.assertEqual(forward_backward(model), [])
                self.assertEqual(calls(ops), setup.expected_calls(model, **options))
                torch._dynamo.reset()
                self.assertEqual(forward_backward(torch.compile(model, backend="aot_eager", fullgraph=True)), [])
            finally:
                xjd.remove(model)
                torch._dynamo.reset()

    def test_import_loads_neither_diffusers_nor_torch_early(self):
        code = ("import sys, exactjit.integrations; a = 'torch' in sys.modules; "
                "import exactjit.integrations.diffusers; print(a, 'diffusers' in sys.modules)")
        env = child_env()
        result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(result.stdout.split(), ["False", "False"])


@unittest.skipUnless(HAS_TORCH, "torch is not installed")
class NnModules(unittest.TestCase, Bitwise):
    def test_rms_norm_state_dict_is_torch_rms_norm(self):
        ref = torch.nn.RMSNorm(64, eps=1e-5)
        with torch.no_grad():
            ref.weight.copy_(torch.randn(64))
        ours = xjnn.RMSNorm(64, eps=1e-5)
        self.assertEqual(list(ours.state_dict()), ["weight"])
        ours.load_state_dict(ref.state_dict())
        self.assertTrue(torch.equal(ours.weight, ref.weight))
        back = torch.nn.RMSNorm(64, eps=1e-5)
        back.load_state_dict(ours.state_dict())
        self.assertTrue(torch.equal(back.weight, ref.weight))
        plain = xjnn.RMSNorm(8, elementwise_affine=False)
        self.assertIsNone(plain.weight)
        self.assertEqual(plain.state_dict(), torch.nn.RMSNorm(8, elementwise_affine=False).state_dict())

    def test_from_module_copies_shape_eps_dtype_and_weight(self):
        ref = torch.nn.RMSNorm([32], eps=1e-6, dtype=torch.bfloat16)
        with torch.no_grad():
            ref.weight.copy_(torch.randn(32))
        ref.weight.requires_grad_(False)
        ours = xjnn.RMSNorm.from_module(ref)
        self.assertIsInstance(ours, xjnn.RMSNorm)
        self.assertEqual((ours.normalized_shape, ours.eps, ours.weight.dtype), ((32,), 1e-6, torch.bfloat16))
        self.assertTrue(torch.equal(ours.weight, ref.weight))
        self.assertIsNot(ours.weight, ref.weight)
        self.assertFalse(ours.weight.requires_grad)
        with self.assertRaises(TypeError):
            xjnn.RMSNorm.from_module(torch.nn.LayerNorm(32))

    def test_rms_norm_forward_calls_exactjit(self):
        norm = xjnn.RMSNorm(16, eps=1e-5, dtype=torch.bfloat16)
        with torch.no_grad():
            norm.weight.copy_(torch.randn(16))
        x = torch.randn(2, 5, 16, dtype=torch.bfloat16)
        table = torch.randn(6, 6 * 16, dtype=torch.bfloat16)
        shift, scale = table[:, :16], table[:, 16:32]
        index = torch.tensor([0, 5, 2, 2, 1])
        with mock.patch.object(exactjit, "rms_norm", side_effect=rms_norm_ref) as op, torch.no_grad():
            self.assert_bitwise(norm(x), F.rms_norm(x, (16,), norm.weight, 1e-5))
            op.assert_called_with(x, norm.weight, 1e-5, shift=None, scale=None, index=None)
            got = norm(x, shift=shift, scale=scale, index=index)
            op.assert_called_with(x, norm.weight, 1e-5, shift=shift, scale=scale, index=index)
        want = (F.rms_norm(x, (16,), norm.weight, 1e-5) * (1.0 + scale.index_select(0, index))
                + shift.index_select(0, index))
        self.assert_bitwise(got, want)

    def test_rms_norm_refuses_what_the_kernel_cannot_do(self):
        cases = [(((4, 8),), {}, "one int"), ((62,), {}, "multiple of 4"), ((64,), dict(dtype=torch.float64), "dtype")]
        for args, kwargs, pattern in cases:
            with self.subTest(args=args, **kwargs), self.assertRaisesRegex(ValueError, pattern):
                xjnn.RMSNorm(*args, **kwargs)

    def test_timesteps_forwards_its_settings(self):
        module = xjnn.Timesteps(256, True, 0, scale=2, max_period=5000)
        t = torch.rand(3)
        with mock.patch.object(exactjit, "timestep_sinusoid", return_value="out") as op:
            self.assertEqual(module(t), "out")
        op.assert_called_once_with(t, 256, max_period=5000, flip_sin_to_cos=True, downscale_freq_shift=0, scale=2)
        self.assertEqual(list(module.state_dict()), [])


if __name__ == "__main__":
    unittest.main()
