#!/usr/bin/env python3
"""apply(sequence_parallel=True) under diffusers' context parallelism, on gloo ranks on the CPU.

A tiny MiniMax-H3 transformer (bench/minimax_h3_setup.py, fp32) runs under diffusers' own
ContextParallelConfig (ulysses over 2 ranks), patched with
sequence_parallel. exactjit's single-GPU ops are their torch expressions (test_integration_cpu's
mocks) and exactjit.distributed's kernels the contract model of test_distributed_cpu, so this checks
the wiring the GPU run (tests/gpu/context_parallel_torch.py) relies on: the model's forward builds the
plans from the unsplit index with diffusers' shard sizes, once per layout; every rank ends with the
same whole gradient of each parameter whole_gradient_parameters lists, close to the one-process
model's (the model's sums are in another order than eager's, and diffusers' split changes the
other ops' rounding), while the unpatched model's ranks hold parts of it (the control: the check
can fail), and every other parameter keeps its per-rank part; inside the step, every
exactjit.distributed call's output rows and whole gradients are byte-equal to the same op over the
gathered rows on one rank (distributed_calls.py, as the GPU check does with the one-GPU ops); a
forward without gradients runs the one-GPU ops; torch.compile (graph breaks around the distributed
ops) gives eager's whole gradients; an input the kernels do not take raises instead of falling back
to a part.

Tests that need torch, diffusers or gloo skip without them. Run by ctest.
"""
import importlib.util
import os
import sys
import unittest

from package_under_test import REPO  # noqa: F401  (puts the package on sys.path)

sys.path.insert(0, os.path.join(REPO, "bench"))  # minimax_h3_setup.py

HAS_TORCH = importlib.util.find_spec("torch") is not None
HAS_DIFFUSERS = HAS_TORCH and importlib.util.find_spec("diffusers") is not None
HAS_GLOO = False
if HAS_DIFFUSERS:
    import torch
    import torch.distributed as dist
    from unittest import mock

    import minimax_h3_setup as setup
    from distributed_calls import Recorder, call_checks
    from gloo_ranks import problems_of_ranks, write_problems
    from test_distributed_cpu import ModelRuntime
    from test_integration_cpu import kernels_on_cpu
    HAS_GLOO = dist.is_available() and dist.is_gloo_available()

SEQ, TEXT, AUDIO, BATCH = 30, 5, 6, 2  # 30 rows over 2 ranks: shards of 15


def rel(got, want):
    return float((got.double() - want.double()).norm() / want.double().norm())


def gradients(model, inputs, upstream, run=None):
    """{name: gradient} of every parameter of model for one forward (of `run`, default model) and
    `upstream`."""
    names, params = zip(*model.named_parameters())
    outputs = (model if run is None else run)(**inputs)
    return dict(zip(names, torch.autograd.grad(outputs, params, upstream, allow_unused=True)))


def same_on_every_rank(tensor):
    gathered = [torch.empty_like(tensor) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, tensor.contiguous())
    return all(torch.equal(g.view(torch.int32), tensor.view(torch.int32)) for g in gathered)


def summed(tensor):
    total = tensor.clone()
    dist.all_reduce(total)
    return total


def bits_equal(got, want):
    same = got.shape == want.shape and torch.equal(got.view(torch.int32), want.view(torch.int32))
    return same, "bitwise equal" if same else "differs"


def whole_sequence_op(xd, alone):
    """exactjit.distributed's op over a group of one rank holding the whole sequence (the one-GPU
    sums, with the kernels modelled), for distributed_calls.replay_whole."""
    def run(op, leaves, eps, plan):
        whole = xd.SequencePlan(plan.keys, plan.table_rows, [plan.seq], batch=plan.batch, group=alone, device="cpu")
        if op == "rms_norm":
            return (xd.rms_norm(leaves["x"], leaves["weight"], eps, whole, shift=leaves.get("shift"),
                                scale=leaves.get("scale")),)
        if op == "gate_residual_rms_norm":
            return xd.gate_residual_rms_norm(leaves["residual"], leaves["gate"], leaves["y"], leaves["weight"], eps,
                                             whole, shift=leaves.get("shift"), scale=leaves.get("scale"))
        return (xd.gate_residual(leaves["residual"], leaves["gate"], leaves["y"], whole),)
    return run


def rank_main(rank, world, folder):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{folder}/init", rank=rank, world_size=world)
    torch.accelerator.device_count = lambda: 1  # diffusers puts rank r on device r % count: no accelerator here
    from diffusers import ContextParallelConfig

    from exactjit import distributed as xd
    from exactjit.integrations import diffusers as xjd
    runtime = ModelRuntime()
    xd.default_runtime = lambda: runtime
    problems = []

    def build():
        model = setup.build_model(torch.float32, device="cpu", **setup.TINY)
        model.enable_parallelism(config=ContextParallelConfig(ulysses_degree=world))
        return model

    reference = setup.build_model(torch.float32, device="cpu", **setup.TINY)
    inputs = setup.packed_inputs(reference, SEQ, text=TEXT, audio=AUDIO, batch=BATCH)
    with torch.no_grad():
        upstream = setup.upstream(reference(**inputs))
    want = gradients(reference, inputs, upstream)
    whole = {name for name, _ in xjd.whole_gradient_parameters(reference)}

    plain = build()
    parts = gradients(plain, inputs, upstream)
    for name in sorted(whole):
        if rel(parts[name], want[name]) < 1e-2:
            problems.append(f"control: unpatched, rank {rank}'s {name} is already whole: the check cannot fail")
            break

    with kernels_on_cpu(), mock.patch.object(xd, "SequencePlan", wraps=xd.SequencePlan) as built:
        model = setup.build_model(torch.float32, device="cpu", **setup.TINY)
        xjd.apply(model, sequence_parallel=True)
        model.enable_parallelism(config=ContextParallelConfig(ulysses_degree=world))
        got = gradients(model, inputs, upstream)
        again = gradients(model, inputs, upstream)
        if built.call_count != 2:
            problems.append(f"one layout built {built.call_count} plans, want 2 (blocks' index, norm_out's)")
        sizes = [list(call.args[2]) for call in built.call_args_list]
        if sizes != [[15, 15]] * 2:
            problems.append(f"plans built for shards {sizes}, diffusers' split gives [15, 15]")
        for name, g in got.items():
            if not torch.equal(g, again[name]):
                problems.append(f"{name}: a second step gave other bits")
            if name in whole:
                if not same_on_every_rank(g):
                    problems.append(f"{name}: the ranks' gradients differ (not whole)")
                if rel(g, want[name]) > 1e-4:
                    problems.append(f"{name}: {rel(g, want[name]):.1e} from the one-process gradient (not whole)")
            elif g is not None and rel(summed(g), want[name]) > 1e-4:
                problems.append(f"{name}: the ranks' parts do not sum to the gradient "
                                f"({rel(summed(g), want[name]):.1e})")

        copied = dict(inputs, timestep_indices=inputs["timestep_indices"].clone())
        gradients(model, copied, upstream)
        if built.call_count != 2:
            problems.append("an equal index in a new tensor rebuilt the plans")
        moved = dict(inputs, timestep_indices=inputs["timestep_indices"].roll(1))
        gradients(model, moved, upstream)
        if built.call_count != 4:
            problems.append("a new layout did not rebuild the plans")
        with torch.no_grad(), mock.patch.object(xd, "rms_norm", wraps=xd.rms_norm) as sharded_norm:
            model(**inputs)
        if sharded_norm.call_count:
            problems.append("a forward without gradients ran exactjit.distributed's ops")

    alone = [dist.new_group([r]) for r in range(world)][rank]  # every rank makes every group
    with kernels_on_cpu(), Recorder(xd) as recorder:
        gradients(model, inputs, upstream)
    for quantity, ok, detail in call_checks(recorder, rank, dist.group.WORLD, whole_sequence_op(xd, alone),
                                            bits_equal):
        if not ok:
            problems.append(f"{quantity}: {detail}")
    if len(recorder.calls) != 3 * model.config.num_layers + 1:
        problems.append(f"{len(recorder.calls)} exactjit.distributed calls in a step")
    with kernels_on_cpu():
        compiled = gradients(model, inputs, upstream, run=torch.compile(model, backend="eager"))
    if any(not torch.equal(compiled[name], got[name]) for name in whole):
        problems.append("under torch.compile the whole gradients differ from eager's")

    with kernels_on_cpu(devices=frozenset()):  # nothing goes to the kernels: the fallback would be a part
        try:
            gradients(model, inputs, upstream)
            problems.append("an input the kernels do not take fell back instead of raising")
        except ValueError as e:
            if "sequence_parallel" not in str(e):
                problems.append(f"unexpected refusal: {e}")
    write_problems(folder, rank, problems)
    dist.destroy_process_group()


@unittest.skipUnless(HAS_DIFFUSERS and HAS_GLOO, "torch with gloo, and diffusers, are needed")
class ContextParallelOnCpuRanks(unittest.TestCase):
    maxDiff = None

    def test_whole_gradients_on_every_rank(self):
        self.assertEqual(problems_of_ranks(rank_main, 2), {})

    def test_shard_sizes_are_diffusers_split(self):
        from exactjit.integrations._context_parallel import shard_sizes
        for seq in (1, 2, 5, 29, 4097):
            for ranks in (1, 2, 3, 8):
                if seq >= ranks:
                    parts = [len(p) for p in torch.arange(seq).tensor_split(ranks)]
                    self.assertEqual(shard_sizes(seq, ranks, True), parts)
                if seq % ranks == 0:
                    self.assertEqual(shard_sizes(seq, ranks, False), [len(p) for p in torch.arange(seq).chunk(ranks)])
        with self.assertRaisesRegex(ValueError, "not divisible"):
            shard_sizes(29, 2, False)

    def test_sequence_parallel_is_refused_below_the_model(self):
        from exactjit.integrations import diffusers as xjd
        model = setup.build_model(torch.float32, device="cpu", **setup.TINY)
        for module in (model.transformer_blocks[0], model.norm_out):
            with self.assertRaisesRegex(ValueError, "sequence_parallel applies to a MiniMaxH3Transformer3DModel"):
                xjd.apply(module, sequence_parallel=True)
            self.assertNotIn("forward", module.__dict__)
        with self.assertRaisesRegex(ValueError, "expected a MiniMaxH3Transformer3DModel"):
            xjd.whole_gradient_parameters(model.norm_out)
        names = [n for n, _ in xjd.whole_gradient_parameters(model)]
        self.assertIn("time_embedder.linear_1.weight", names)
        self.assertIn("transformer_blocks.1.adaln_proj.linear.bias", names)
        self.assertIn("transformer_blocks.0.norm2.weight", names)
        self.assertIn("norm_out.linear.weight", names)
        self.assertFalse([n for n in names if ".attn." in n or ".ff." in n or n.startswith("token_refiner")])


if __name__ == "__main__":
    unittest.main()
