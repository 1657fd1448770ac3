#!/usr/bin/env python3
"""exactjit.integrations.diffusers on diffusers 0.42.1's MiniMax-H3 transformer, on the GPU machine.

Model and inputs (bench/minimax_h3_setup.py): full width (H 5376, 56 heads x 128, ffn 14336), 2 blocks
and 1 token-refiner block, bf16 with the _keep_in_fp32_modules in fp32 (the shipped layout), RMSNorm
weights 1 + 0.1 randn, default (non-zero) AdaLN projections; one packed sequence of --seq rows (257
text, 320 audio, the rest video, interleaved at scattered positions), T = 3 timesteps.

Groups of cases (exit status 1 if any case fails):
  forward     The patched model's outputs (video and audio velocity, float32) and norm_out's bf16
              output are bitwise equal to the unpatched model's, under no_grad and with autograd, for
              the default options and for qk_norm + refiner_norms, and every exactjit op ran as often
              as expected (so the kernels ran, not the fallbacks). After remove(): eager's bits again.
  accuracy    Gradients of the AdaLN and norm parameters (each block's adaln_proj.linear weight and
              bias, norm1 and norm2 weights; norm_out's norm weight and linear weight and bias) for a
              fixed random upstream gradient, patched and eager (deterministic algorithms off, as
              shipped), against an fp64 copy of the unpatched model: grad_torch.py's rule, patched
              rel-L2 <= --factor x eager's, unless at the rounding floor of the gradient's dtype (bf16:
              one unit roundoff; fp32: 8; --floor-scale 0 is strict; the detail says when a case
              passed only by the floor).
              NOTE: both runs share every bf16 rounding of the forward and of the backward outside
              the conditioning chain, so their errors against fp64 are mostly the same; the ratio
              compares what differs, the chain's backward, and `vs eager` in the detail is how far
              the two gradients are apart.
  repeat      With torch.use_deterministic_algorithms(True) for the rest of the model
              (CUBLAS_WORKSPACE_CONFIG=:4096:8 is set before torch starts), --repeats patched backward
              runs give bit-identical gradients.
  compile     (1) Op bits: every exactjit call of one patched forward (all options, so all six ops)
              is recorded with its inputs and output, then replayed through torch.compile(fullgraph=
              True) of a function making only that call: same bits. That is the claim under compile,
              that Inductor leaves the exactjit ops' numerics alone; a compiled model's output cannot
              show it, since Inductor also changes the ops around them.
              (2) torch._dynamo.explain of a patched block (all options) on its real inputs, under
              no_grad and with autograd: no more graph breaks than the unpatched block (which has 0).
              (3) torch.compile(patched model, default options) runs and lands within --close rel-L2
              of the uncompiled patched output (printed; not bitwise, Inductor rewrites the other ops).
  det_linear  apply(det_linear=True): the expected op counts, forward within --close rel-L2 of eager
              (not bitwise by design: another summation order than cuBLAS), a backward (T = 3 <= 8)
              with finite gradients, their rel-L2 against eager's printed.

Usage: PYTHONPATH is set up from this file's location; EXACTJIT_LIBRARY picks the library.
  python3 tests/gpu/diffusers_torch.py [--groups forward,accuracy,repeat,compile,det_linear]
      [--seq 4097] [--report diffusers.md] [--json diffusers.json]
Exit status: 0 all cases pass, 1 a case failed, 2 exactjit, diffusers or CUDA unavailable.
"""
import os

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # before torch initialises cuBLAS

import argparse  # noqa: E402
import contextlib  # noqa: E402
import copy  # noqa: E402
import math  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import functools  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)  # check_support.py, grad_torch.py
sys.path.insert(0, os.path.join(REPO, "bench"))  # minimax_h3_setup.py
sys.path.insert(0, os.path.join(REPO, "python"))

import torch  # noqa: E402

import check_support  # noqa: E402
import grad_torch  # noqa: E402
import minimax_h3_setup as setup  # noqa: E402
from check_support import compare, log  # noqa: E402

OPS = ("rms_norm", "gate_residual", "gate_residual_rms_norm", "timestep_sinusoid", "timestep_mlp", "adaln_projection")
EVERY_OPTION = dict(qk_norm=True, refiner_norms=True, det_linear=True)
GROUPS = ("forward", "accuracy", "repeat", "compile", "det_linear")


class Suite(grad_torch.Suite):
    script = "diffusers_torch.py"
    title = "# exactjit.integrations.diffusers on MiniMax-H3 (diffusers 0.42.1): bits, gradients, compile"

    def notes(self, args):
        return [f"- accuracy rule: FAIL if the patched model's gradient rel-L2 error vs the fp64 model > "
                f"{args.factor} x eager's, unless at the rounding floor ({args.floor_scale} x FLOOR_ULPS unit "
                "roundoffs of the gradient's dtype: bf16 1, fp32 8)"]


class Recorder:
    """Wraps exactjit's ops (the integration looks them up on the module at each call): counts the
    calls and, with keep, keeps each call's arguments and output."""

    def __init__(self, xj, keep=False):
        self.xj, self.keep = xj, keep
        self.counts = dict.fromkeys(OPS, 0)
        self.calls = []

    def _wrap(self, op, fn):
        def wrapped(*args, **kwargs):
            out = fn(*args, **kwargs)
            self.counts[op] += 1
            if self.keep:
                self.calls.append((op, args, kwargs, out))
            return out
        return wrapped

    def __enter__(self):
        self.saved = {op: getattr(self.xj, op) for op in OPS}
        for op, fn in self.saved.items():
            setattr(self.xj, op, self._wrap(op, fn))
        return self

    def __exit__(self, *exc):
        for op, fn in self.saved.items():
            setattr(self.xj, op, fn)


class Context:
    """What every group uses: exactjit, the integration, the model, its inputs, the suite."""

    def __init__(self, xj, xjd, model, inputs, suite, args):
        self.xj, self.xjd, self.model, self.inputs, self.suite, self.args = xj, xjd, model, inputs, suite, args

    @contextlib.contextmanager
    def patched(self, **options):
        self.xjd.apply(self.model, **options)
        try:
            yield self.model
        finally:
            self.xjd.remove(self.model)

    def forward(self, grad=False):
        """(video, audio, norm_out's output) of one forward, detached."""
        seen = []
        handle = self.model.norm_out.register_forward_hook(lambda m, a, out: seen.append(out.detach()))
        try:
            with torch.set_grad_enabled(grad):
                video, audio = self.model(**self.inputs)
        finally:
            handle.remove()
        return video.detach(), audio.detach(), seen[0]

    def param_names(self):
        blocks = [f"transformer_blocks.{i}.{p}" for i in range(self.model.config.num_layers)
                  for p in ("adaln_proj.linear.weight", "adaln_proj.linear.bias", "norm1.weight", "norm2.weight")]
        return blocks + ["norm_out.norm.weight", "norm_out.linear.weight", "norm_out.linear.bias"]

    def param_grads(self, model, upstream):
        """Gradients of param_names() (the only parameters that require grad) for `upstream`."""
        model.requires_grad_(False)
        params = [model.get_parameter(n) for n in self.param_names()]
        for p in params:
            p.requires_grad_(True)
        outputs = model(**self.inputs)
        return torch.autograd.grad(outputs, params, upstream)

    def module_args(self, name):
        """The positional arguments module `name` gets in a no_grad forward."""
        seen = []
        handle = self.model.get_submodule(name).register_forward_pre_hook(lambda m, args: seen.append(args))
        try:
            with torch.no_grad():
                self.model(**self.inputs)
        finally:
            handle.remove()
        return seen[0]


def rel_l2(got, want):
    return grad_torch.errors(got, want.double())[1]


def all_bitwise(got, want):
    for name, g, w in zip(("video", "audio", "norm_out"), got, want):
        ok, detail = compare(g, w)
        if not ok:
            return False, f"{name}: {detail}"
    return True, "video, audio and norm_out bitwise equal"


def forward_group(ctx):
    ctx.model.requires_grad_(True)  # autograd runs the ops' autograd path
    want = {grad: ctx.forward(grad) for grad in (False, True)}
    for label, options in (("default", {}), ("qk_norm + refiner_norms", dict(qk_norm=True, refiner_norms=True))):
        for grad in (False, True):
            def case(options=options, grad=grad):
                with ctx.patched(**options), Recorder(ctx.xj) as rec:
                    got = ctx.forward(grad)
                ok, detail = all_bitwise(got, want[grad])
                expected = setup.expected_calls(ctx.model, **options)
                counted = rec.counts == expected
                calls = f"exactjit calls {rec.counts}" + ("" if counted else f", want {expected}")
                return ok and counted, f"{detail}; {calls}"
            ctx.suite.run("forward", f"patched ({label}, {'autograd' if grad else 'no_grad'}) == eager, bitwise", case)

    def removed():
        with Recorder(ctx.xj) as rec:
            got = ctx.forward()
        if any(rec.counts.values()):
            return False, f"exactjit still called after remove(): {rec.counts}"
        return all_bitwise(got, want[False])
    ctx.suite.run("forward", "after remove(): eager's bits, no exactjit call", removed)


def accuracy_group(ctx):
    with torch.no_grad():
        upstream = setup.upstream(ctx.model(**ctx.inputs))
    torch.use_deterministic_algorithms(False)  # eager as shipped: atomics in index_select's backward
    reference = copy.deepcopy(ctx.model).double()
    ref = ctx.param_grads(reference, tuple(g.double() for g in upstream))
    del reference
    torch.cuda.empty_cache()
    eager = ctx.param_grads(ctx.model, upstream)
    with ctx.patched():
        ours = ctx.param_grads(ctx.model, upstream)
    for name, o, e, r in zip(ctx.param_names(), ours, eager, ref):
        def case(name=name, o=o, e=e, r=r):
            ok, detail, rows = ctx.suite.accuracy.check([(name, o, e, r)])
            return ok, f"{detail}; patched vs eager rel-L2 {rel_l2(o, e):.3g}", rows
        ctx.suite.run("accuracy", f"d {name}: patched vs eager against fp64", case)


def repeat_group(ctx):
    with torch.no_grad():
        upstream = setup.upstream(ctx.model(**ctx.inputs))

    def case():
        torch.use_deterministic_algorithms(True)
        try:
            with ctx.patched():
                ok, detail, _ = grad_torch.repeat_check(lambda: ctx.param_grads(ctx.model, upstream),
                                                        ctx.param_names(), ctx.args.repeats)
        finally:
            torch.use_deterministic_algorithms(False)
        return ok, detail
    ctx.suite.run("repeat", f"patched gradients, {ctx.args.repeats} runs, deterministic algorithms on", case)


def compiled_caller(xj, op):
    def call(*args, **kwargs):
        return getattr(xj, op)(*args, **kwargs)
    return torch.compile(call, fullgraph=True, dynamic=False)


def compile_group(ctx):
    with ctx.patched(**EVERY_OPTION), Recorder(ctx.xj, keep=True) as rec, torch.no_grad():
        ctx.model(**ctx.inputs)
    torch._dynamo.reset()
    with torch._dynamo.config.patch(recompile_limit=64, fail_on_recompile_limit_hit=True):
        for op in OPS:
            calls = [c for c in rec.calls if c[0] == op]

            def case(op=op, calls=calls):
                if not calls:
                    return False, "not called in the patched forward"
                fn = compiled_caller(ctx.xj, op)
                with torch.no_grad():
                    for k, (_, args, kwargs, want) in enumerate(calls):
                        got = fn(*args, **kwargs)
                        pairs = zip(got, want) if isinstance(want, tuple) else [(got, want)]  # (h, out) of the fused op
                        for j, (g, w) in enumerate(pairs):
                            ok, detail = compare(g, w)
                            if not ok:
                                return False, f"call {k}, output {j}: {detail}"
                return True, f"{len(calls)} calls, compiled bitwise equal to uncompiled"
            ctx.suite.run("compile", f"{op}: recorded calls replayed under torch.compile(fullgraph=True)", case)
    del rec

    name = "transformer_blocks.0"
    block = ctx.model.get_submodule(name)
    args = ctx.module_args(name)
    for mode, grad in (("no_grad", False), ("autograd", True)):
        def breaks(grad=grad):
            ctx.model.requires_grad_(grad)
            inputs = (args[0].detach().requires_grad_(grad),) + tuple(args[1:])
            counts = []
            for options in (None, EVERY_OPTION):
                torch._dynamo.reset()
                with contextlib.ExitStack() as stack:
                    if options:
                        stack.enter_context(ctx.patched(**options))
                    stack.enter_context(torch.set_grad_enabled(grad))
                    explained = torch._dynamo.explain(block)(*inputs)
                counts.append(explained.graph_break_count)
            torch._dynamo.reset()
            reasons = "; ".join(str(r.reason).split("\n")[0] for r in explained.break_reasons)  # the patched block's
            return counts[1] <= counts[0], f"graph breaks: unpatched {counts[0]}, patched {counts[1]} {reasons}".strip()
        ctx.suite.run("compile", f"explain {name}, {mode}: no graph break added", breaks)

    def whole_model():
        ctx.model.requires_grad_(False)
        torch._dynamo.reset()
        with ctx.patched(), torch.no_grad():
            want = ctx.model(**ctx.inputs)
            t0 = time.perf_counter()
            got = torch.compile(ctx.model)(**ctx.inputs)
            seconds = time.perf_counter() - t0
        torch._dynamo.reset()
        rels = [rel_l2(g, w) for g, w in zip(got, want)]
        ok = all(math.isfinite(r) and r <= ctx.args.close for r in rels)
        return ok, (f"rel-L2 vs uncompiled patched: video {rels[0]:.3g}, audio {rels[1]:.3g} (limit {ctx.args.close}); "
                    f"first call {seconds:.1f} s")
    ctx.suite.run("compile", "torch.compile(patched model) runs, close to uncompiled", whole_model)


def det_linear_group(ctx):
    with torch.no_grad():
        want = ctx.model(**ctx.inputs)
        upstream = setup.upstream(want)

    def forward():
        with ctx.patched(det_linear=True), Recorder(ctx.xj) as rec, torch.no_grad():
            got = ctx.model(**ctx.inputs)
        expected = setup.expected_calls(ctx.model, det_linear=True)
        counted = rec.counts == expected
        rels = [rel_l2(g, w) for g, w in zip(got, want)]
        ok = counted and all(math.isfinite(r) and r <= ctx.args.close for r in rels)
        return ok, (f"rel-L2 vs eager: video {rels[0]:.3g}, audio {rels[1]:.3g} (limit {ctx.args.close}); "
                    f"exactjit calls {rec.counts}" + ("" if counted else f", want {expected}"))
    ctx.suite.run("det_linear", "det_linear=True forward: op counts, close to eager (not bitwise)", forward)

    def backward():
        eager = ctx.param_grads(ctx.model, upstream)
        with ctx.patched(det_linear=True):
            ours = ctx.param_grads(ctx.model, upstream)
        parts, ok = [], True
        for name, o, e in zip(ctx.param_names(), ours, eager):
            finite = bool(torch.isfinite(o).all())
            ok &= finite
            parts.append(f"{name} {rel_l2(o, e):.3g}" + ("" if finite else " NOT FINITE"))
        return ok, "rel-L2 vs eager: " + ", ".join(parts)
    ctx.suite.run("det_linear", "det_linear=True backward: finite gradients", backward)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--groups", default=",".join(GROUPS), help="comma-separated: " + ",".join(GROUPS))
    p.add_argument("--seq", type=int, default=4097, help="packed sequence length S")
    p.add_argument("--text", type=int, default=257, help="text rows")
    p.add_argument("--audio", type=int, default=320, help="audio rows")
    p.add_argument("--repeats", type=int, default=2, help="patched backward runs that must be bit-identical")
    p.add_argument("--factor", type=float, default=1.0, help="allowed gradient rel-L2 ratio patched / eager")
    p.add_argument("--floor-scale", type=float, default=1.0, help="scales the rounding floor; 0: strict ratio only")
    p.add_argument("--close", type=float, default=0.05, help="rel-L2 limit where bits are not claimed")
    p.add_argument("--seed", type=int, default=20240612)
    p.add_argument("--report", help="markdown report path")
    p.add_argument("--json", help="JSON report path")
    args = p.parse_args()
    groups = check_support.parse_groups(p, args.groups, GROUPS)
    args.repeats = max(args.repeats, 2)

    t0 = time.perf_counter()
    torch.use_deterministic_algorithms(False)
    meta = dict(commit=os.environ.get("EXACTJIT_COMMIT", "unknown"), torch=torch.__version__, groups=groups,
                seq=args.seq, text=args.text, audio=args.audio, timesteps=setup.TIMESTEPS, depth=setup.DEPTH,
                repeats=args.repeats, factor=args.factor, floor_scale=args.floor_scale, close=args.close,
                seed=args.seed)
    try:
        xj = check_support.import_exactjit(meta)
        import diffusers
        from exactjit.integrations import diffusers as xjd
        meta["diffusers"] = diffusers.__version__
        model = setup.build_model(torch.bfloat16, device="cuda", seed=args.seed)
        inputs = setup.packed_inputs(model, args.seq, text=args.text, audio=args.audio, seed=args.seed)
    except Exception as e:
        return Suite(None, args).cannot_run(args, meta, "import exactjit / diffusers, build the model on CUDA", e)
    log(f"exactjit {meta['exactjit']} ({meta['library']}), torch {torch.__version__}, diffusers "
        f"{meta['diffusers']}, {meta['device']}")

    suite = Suite(xj, args)
    ctx = Context(xj, xjd, model, inputs, suite, args)
    parts = {"forward": forward_group, "accuracy": accuracy_group, "repeat": repeat_group,
             "compile": compile_group, "det_linear": det_linear_group}
    check_support.run_groups(suite, xj, {name: functools.partial(part, ctx) for name, part in parts.items()},
                             groups)
    meta["seconds"] = round(time.perf_counter() - t0, 1)
    return suite.finish(args, meta)


if __name__ == "__main__":
    sys.exit(main())
