#!/usr/bin/env python3
"""exactjit's PyTorch operators on the GPU machine: opcheck, torch.compile, CUDA graphs.

Groups (--groups):
  opcheck   torch.library.opcheck of every operator (schema and mutation annotations, fake kernel
            against the real one, autograd registration, AOT dispatch with dynamic shapes) on CUDA
            tensors, forward and backward operators, gate_residual_out included
  direct    the eager shortcut (the implementation called without the dispatcher) gives the bits
            the operator gives, for every forward
  extension libexactjit_torch.so is loaded; its C++ kernel of every operator gives the bits of
            the Python implementation over ctypes; a bad index it launched fails the next exactjit
            call on the stream, with no exactjit synchronize (one shared runtime, the report in
            host-mapped memory); its argument errors are the ctypes path's
            (fails when the extension is not loaded: leave the group out to test a build without it)
  compile   the conditioning chain of one block (sinusoid, modulated norm1, gated residual,
            modulated norm2, gated residual) written with exactjit ops: torch._dynamo.explain finds
            0 graph breaks; torch.compile(fullgraph=True) forward output and every gradient bitwise
            equal to the uncompiled chain; mode="reduce-overhead" (CUDA graphs) forward and backward
            over several replays, bitwise; S marked dynamic: a second sequence length compiles no
            new graph; the chain with the first gated residual and norm2 fused
            (gate_residual_rms_norm): 0 graph breaks, fullgraph bitwise equal to it uncompiled
  capture   torch.cuda.graph capture of forward + backward without torch.compile, after the one
            warm-up call that loads the kernels (compiling or loading a module cannot be captured),
            replayed with new inputs copied in, bitwise equal to eager calls
  block     a diffusers MiniMaxH3TransformerBlock (hidden 5376) patched by
            exactjit.integrations.diffusers: 0 graph breaks under torch.compile(fullgraph=True);
            compiled patched output no farther from the uncompiled patched block than compiled
            unpatched is from unpatched (skips without diffusers)

  python3 tests/gpu/ops_torch.py [--groups ...] [--report r.md] [--json r.json]
Exit status: 0 all passed, 1 a case failed, 2 set-up failed.
"""
import argparse
import functools
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import check_support  # noqa: E402
from check_support import Data, compare, log  # noqa: E402

GROUPS = ("opcheck", "direct", "extension", "compile", "capture", "block")
H, T, EPS = 5376, 3, 1e-5


class Suite(check_support.Suite):
    script = "ops_torch.py"
    title = "# exactjit operators: opcheck, torch.compile, CUDA graphs"
    name_width = 64


def all_equal(pairs):
    """(ok, detail) over named (got, want) pairs: every one that differs, else bitwise equal."""
    bad = []
    for name, got, want in pairs:
        ok, detail = compare(got, want)
        if not ok:
            bad.append(f"{name}: {detail}")
    return not bad, "; ".join(bad) if bad else f"{len(pairs)} tensors bitwise equal"


class ChainInputs:
    """One block's conditioning-chain inputs at sequence length s: the (T, 18H) bf16 AdaLN table,
    the row index (S,), x, the attention and feed-forward outputs (1, S, H), the timesteps and the
    upstream gradients; the trainable ones require grad."""

    def __init__(self, data, s, dtype=torch.bfloat16):
        self.table = (data.rows((T, 18 * H), dtype) * 0.1).requires_grad_()
        self.index = data.index(s, 3 * T)
        self.x = data.rows((1, s, H), dtype).requires_grad_()
        self.attn = data.rows((1, s, H), dtype).requires_grad_()
        self.ff = data.rows((1, s, H), dtype).requires_grad_()
        self.weight = (1 + 0.1 * data.rows((H,), dtype)).requires_grad_()
        self.t = torch.rand(T, device="cuda", generator=data.gen()).requires_grad_()
        self.grads = [data.rows((1, s, H), dtype) for _ in range(3)] + [torch.randn(T, 256, device="cuda")]

    def leaves(self):
        return [self.table, self.x, self.attn, self.ff, self.weight, self.t]

    def args(self):
        return self.x, self.table, self.index, self.attn, self.ff, self.weight, self.t


def chain(x, table, index, attn, ff, weight, t):
    """The conditioning chain of one MiniMax-H3 block with exactjit ops (the attention and the
    feed-forward outputs come in as inputs): returns norm1's output, norm2's output, the block
    output and the timestep embedding."""
    import exactjit
    h = table.shape[1] // 18
    shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = table.view(-1, 6 * h).chunk(6, dim=-1)
    n1 = exactjit.rms_norm(x, weight, EPS, shift=shift_msa, scale=scale_msa, index=index)
    x = exactjit.gate_residual(x, gate_msa, index, attn)
    n2 = exactjit.rms_norm(x, weight, EPS, shift=shift_mlp, scale=scale_mlp, index=index)
    out = exactjit.gate_residual(x, gate_mlp, index, ff)
    temb = exactjit.timestep_sinusoid(t, 256)
    return n1, n2, out, temb


def fused_chain(x, table, index, attn, ff, weight, t):
    """chain with its first gated residual and the modulated norm2 it feeds in one exactjit op."""
    import exactjit
    h = table.shape[1] // 18
    shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = table.view(-1, 6 * h).chunk(6, dim=-1)
    n1 = exactjit.rms_norm(x, weight, EPS, shift=shift_msa, scale=scale_msa, index=index)
    x, n2 = exactjit.gate_residual_rms_norm(x, gate_msa, index, attn, weight, EPS, shift=shift_mlp, scale=scale_mlp)
    out = exactjit.gate_residual(x, gate_mlp, index, ff)
    temb = exactjit.timestep_sinusoid(t, 256)
    return n1, n2, out, temb


def run_step(fn, inputs):
    """Outputs and gradients (every leaf) of one forward + backward of fn."""
    for leaf in inputs.leaves():
        leaf.grad = None
    outs = fn(*inputs.args())
    torch.autograd.backward(outs, inputs.grads)
    return [o.detach() for o in outs] + [leaf.grad for leaf in inputs.leaves()]


NAMES = ["n1", "n2", "out", "temb", "d_table", "d_x", "d_attn", "d_ff", "d_weight", "d_t"]


def operator_cases(data):
    """name -> (OpOverload, args): one small call of every operator on CUDA tensors."""
    import exactjit
    s, h = 64, 256
    rows = (data.rows((T, 18 * h), torch.bfloat16)).view(3 * T, 6 * h)
    gate, shift, scale = rows[:, 2 * h:3 * h], rows[:, :h], rows[:, h:2 * h]
    index = data.index(s, 3 * T)
    x = data.rows((2, s, h), torch.bfloat16)
    weight = 1 + 0.1 * data.rows((h,), torch.bfloat16)
    t = torch.rand(T, device="cuda")
    temb = torch.randn(T, 64, device="cuda")
    w_bf16 = data.rows((6 * h, 64), torch.bfloat16) * 0.05
    w_fp32 = torch.randn(96, 64, device="cuda") * 0.05
    rstd = exactjit.rms_norm(x, weight, EPS, return_rstd=True)[1]
    grad_x = data.rows((2, s, h), torch.bfloat16)
    fused_h, _, fused_rstd = torch.ops.exactjit.gate_residual_rms_norm(x, gate, index, x, weight, EPS,
                                                                       rows[:, 3 * h:4 * h], rows[:, 4 * h:5 * h], True)
    ops = torch.ops.exactjit
    cases = {
        "gate_residual": (ops.gate_residual.default, (x, gate, index, x)),
        "gate_residual_out": (ops.gate_residual_out.default, (x, gate, index, x, torch.empty_like(x))),
        "gate_residual_backward": (ops.gate_residual_backward.default, (grad_x, gate, index, x, True, True)),
        "adaln_row_gather": (ops.adaln_row_gather.default, (rows, index // 3, index % 3)),
        "adaln_row_gather_backward": (ops.adaln_row_gather_backward.default,
                                      (data.rows((6, s, h), torch.bfloat16), index // 3, index % 3, 3 * T,
                                       torch.float32)),
        "rms_norm": (ops.rms_norm.default, (x, weight, EPS, shift, scale, index, True)),
        "rms_norm_backward": (ops.rms_norm_backward.default,
                              (grad_x, x, weight, scale, index, rstd, EPS, True, True, True, True)),
        "gate_residual_rms_norm": (ops.gate_residual_rms_norm.default,
                                   (x, gate, index, x, weight, EPS, rows[:, 3 * h:4 * h], rows[:, 4 * h:5 * h], True)),
        "gate_residual_rms_norm plain": (ops.gate_residual_rms_norm.default,
                                         (x, gate, index, x, None, EPS, None, None, False)),
        "gate_residual_rms_norm_backward": (ops.gate_residual_rms_norm_backward.default,
                                            (grad_x, grad_x, fused_h, x, gate, index, weight, rows[:, 4 * h:5 * h],
                                             fused_rstd, EPS, True, True, True, True, True)),
        "gate_residual_rms_norm_backward grad_h None": (ops.gate_residual_rms_norm_backward.default,
                                                        (grad_x, None, fused_h, x, gate, index, None,
                                                         rows[:, 4 * h:5 * h], fused_rstd, EPS, False, True, False,
                                                         False, True)),
        "timestep_sinusoid": (ops.timestep_sinusoid.default, (t, 256, 10000.0, True, 0.0, 1.0, False)),
        "timestep_sinusoid_backward": (ops.timestep_sinusoid_backward.default,
                                       (t, torch.randn(T, 256, device="cuda"), 10000.0, True, 0.0, 1.0)),
        "det_linear": (ops.det_linear.default, (temb, w_bf16, None, True, False)),
        "det_linear_backward": (ops.det_linear_backward.default,
                                (data.rows((T, 6 * h), torch.bfloat16), temb, w_bf16, None, True, True, True, True)),
        "det_linear fp32": (ops.det_linear.default, (temb, w_fp32, None, True, True)),
    }
    return cases


def opcheck_group(suite, data):
    import exactjit
    cases = operator_cases(data)
    differentiable = {"gate_residual": (0, 1, 3), "rms_norm": (0, 1, 3, 4),
                      "gate_residual_rms_norm": (0, 1, 3, 4, 6, 7), "adaln_row_gather": (0,),
                      "timestep_sinusoid": (0,), "det_linear": (0, 1), "det_linear fp32": (0, 1)}
    missing = set(exactjit.ops.OPERATORS) - {name.split()[0] for name in cases}
    suite.run("opcheck", "every operator has a case", lambda: (not missing, f"missing {sorted(missing)}"))
    for name, (overload, args) in cases.items():
        def check(overload=overload, args=args, name=name):
            args = list(args)
            for k in differentiable.get(name, ()):  # opcheck's autograd checks need inputs that require grad
                args[k] = args[k].detach().clone().requires_grad_()
            results = torch.library.opcheck(overload, tuple(args))
            bad = {k: v for k, v in results.items() if v != "SUCCESS"}
            return not bad, f"{', '.join(results)}: SUCCESS" if not bad else str(bad)
        suite.run("opcheck", name, check)


def outputs(result):
    return list(result) if isinstance(result, (tuple, list)) else [result]


def extension_group(suite, data):
    import exactjit
    from exactjit import _extension, _ops
    suite.run("extension", "libexactjit_torch.so loaded",
              lambda: (_extension.path is not None, _extension.path or f"not loaded: {_extension.reason}"))
    if _extension.path is None:
        return
    for name, (overload, args) in operator_cases(data).items():
        def check(overload=overload, args=args, name=name):
            op = name.split()[0]
            impl = _ops.IMPLEMENTATIONS[op]
            if op == "gate_residual_out":  # the result is the out argument
                ext_out, py_out = torch.full_like(args[4], float("nan")), torch.full_like(args[4], float("nan"))
                _ops._run(overload, impl, args[:4] + (ext_out,))
                impl(*args[:4], py_out)
                got, want = [ext_out], [py_out]
            else:
                got, want = outputs(_ops._run(overload, impl, args)), outputs(impl(*args))
            return all_equal([(f"output {k}", g, w) for k, (g, w) in enumerate(zip(got, want))])
        suite.run("extension", f"C++ kernel == ctypes: {name}", check)

    def bad_index():
        """A bad index launched by the C++ kernel fails the next exactjit call on the stream after
        a plain torch.cuda.synchronize() (no exactjit one): the runtimes are one."""
        s, h = 64, 256
        rows = data.rows((3 * T, 6 * h), torch.bfloat16)
        x = data.rows((1, s, h), torch.bfloat16)
        index = data.index(s, 3 * T)
        bad = index.clone()
        bad[5] = 3 * T + 4
        gate = rows[:, :h]
        _ops._run(_ops.GATE_RESIDUAL, _ops._gate_residual_impl, (x, gate, bad, x))
        torch.cuda.synchronize()
        try:
            _ops._run(_ops.GATE_RESIDUAL, _ops._gate_residual_impl, (x, gate, index, x))
            return False, "the next call on the stream raised nothing"
        except exactjit.BadIndexError as e:
            reported = str(e)
        _ops._run(_ops.GATE_RESIDUAL, _ops._gate_residual_impl, (x, gate, index, x))
        exactjit.synchronize()  # reported once; the stream is usable
        return "gate_residual: index[5]" in reported, f"next call: {reported[:160]}"
    suite.run("extension", "bad index from the C++ kernel fails the next call on its stream", bad_index)

    def same_error():
        x = data.rows((1, 64, 256), torch.bfloat16)
        rows = data.rows((3 * T, 6 * 256), torch.bfloat16)
        args = (x, rows[:, :256], data.index(64, 3 * T), x[:, :32])  # y's shape is not the residual's
        errors = []
        for call in (lambda: _ops._run(_ops.GATE_RESIDUAL, _ops._gate_residual_impl, args),
                     lambda: _ops._gate_residual_impl(*args)):
            try:
                call()
                errors.append(None)
            except exactjit.Error as e:
                errors.append(e)
        ext, py = errors
        ok = (isinstance(ext, exactjit.InvalidArgumentError) and type(ext) is type(py) and str(ext) == str(py))
        return ok, f"C++: {ext!r}; ctypes: {py!r}"
    suite.run("extension", "argument error == ctypes path's (type and message)", same_error)


def direct_group(suite, data):
    """The eager shortcut and the operator give the same bits (the shortcut is taken under
    no_grad with plain CUDA tensors; a TorchFunctionMode forces the operator path)."""
    import exactjit

    class Through(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    inputs = ChainInputs(data, 4097)
    with torch.no_grad():
        direct = chain(*inputs.args())
        with Through():
            via_op = chain(*inputs.args())
        fused = fused_chain(*inputs.args())
        with Through():
            fused_op = fused_chain(*inputs.args())
        rows = inputs.table.view(3 * T, 6 * H)
        six = exactjit.adaln_row_gather(rows, inputs.index // 3, inputs.index % 3)
        with Through():
            six_op = exactjit.adaln_row_gather(rows, inputs.index // 3, inputs.index % 3)
    pairs = [(n, a, b) for n, a, b in zip(NAMES, direct, via_op)] + [("gather", torch.stack(six),
                                                                        torch.stack(six_op))]
    suite.run("direct", "shortcut == operator (chain + gather, S = 4097)", lambda: all_equal(pairs))
    suite.run("direct", "shortcut == operator (chain with gate_residual_rms_norm, S = 4097)",
              lambda: all_equal([(n, a, b) for n, a, b in zip(NAMES, fused, fused_op)]))


def compile_group(suite, data):
    """x's gradient is the sum of three contributions (norm1, the residual path, norm2 through the
    first gated residual), added by autograd in bf16, one rounding per add; Inductor fuses those
    adds in fp32 and rounds once unless emulate_precision_casts is set. That is torch's add, not an
    exactjit op, so the group compiles with the emulation on, and the first case shows the
    difference without it."""
    import torch._inductor.config as inductor_config
    inputs = ChainInputs(data, 4097)
    want = run_step(chain, inputs)

    def explain():
        torch._dynamo.reset()
        e = torch._dynamo.explain(chain)(*inputs.args())
        return e.graph_break_count == 0 and e.graph_count == 1, (
            f"{e.graph_count} graph(s), {e.graph_break_count} break(s) {e.break_reasons}")
    suite.run("compile", "explain: chain has 0 graph breaks", explain)

    def default_casts():
        torch._dynamo.reset()
        compiled = torch.compile(chain, fullgraph=True)
        got = run_step(compiled, inputs)
        differ = [n for n, g, w in zip(NAMES, got, want) if not compare(g, w)[0]]
        return differ in ([], ["d_x"]), f"without emulate_precision_casts these differ: {differ or 'none'}"
    suite.run("compile", "fullgraph, default Inductor casts: only d_x may differ", default_casts)
    inductor_config.emulate_precision_casts = True

    def fullgraph():
        torch._dynamo.reset()
        compiled = torch.compile(chain, fullgraph=True)
        return all_equal([(n, g, w) for n, g, w in zip(NAMES, run_step(compiled, inputs), want)])
    suite.run("compile", "fullgraph fwd + bwd bitwise == uncompiled", fullgraph)

    def reduce_overhead():
        torch._dynamo.reset()
        compiled = torch.compile(chain, fullgraph=True, mode="reduce-overhead")
        for step in range(4):  # warm-up, recording, then replays
            got = [g.clone() for g in run_step(compiled, inputs)]
            ok, detail = all_equal([(n, g, w) for n, g, w in zip(NAMES, got, want)])
            if not ok:
                return False, f"step {step}: {detail}"
        return True, f"4 steps (warm-up, record, 2 replays): {detail}"
    suite.run("compile", "reduce-overhead fwd + bwd bitwise, 4 steps", reduce_overhead)

    def dynamic():
        torch._dynamo.reset()
        compiles = []

        def counting(gm, example_inputs):
            compiles.append(len(gm.graph.nodes))
            from torch._inductor.compile_fx import compile_fx
            return compile_fx(gm, example_inputs)
        compiled = torch.compile(chain, fullgraph=True, backend=counting)
        for s in (4097, 2049, 8191):
            other = ChainInputs(data, s)
            for tensor in (other.x, other.attn, other.ff, other.index):
                torch._dynamo.mark_dynamic(tensor, tensor.dim() - 1 if tensor.dim() == 1 else 1)
            got = run_step(compiled, other)
            ok, detail = all_equal([(n, g, w) for n, g, w in zip(NAMES, got, run_step(chain, other))])
            if not ok:
                return False, f"S = {s}: {detail}"
        return len(compiles) == 1, f"S = 4097, 2049, 8191: {len(compiles)} compile(s), outputs bitwise"
    suite.run("compile", "dynamic S: one compile for 3 lengths", dynamic)

    def fused_explain():
        torch._dynamo.reset()
        e = torch._dynamo.explain(fused_chain)(*inputs.args())
        return e.graph_break_count == 0 and e.graph_count == 1, (
            f"{e.graph_count} graph(s), {e.graph_break_count} break(s) {e.break_reasons}")
    suite.run("compile", "explain: chain with gate_residual_rms_norm has 0 graph breaks", fused_explain)

    def fused_fullgraph():
        want_fused = run_step(fused_chain, inputs)
        torch._dynamo.reset()
        compiled = torch.compile(fused_chain, fullgraph=True)
        return all_equal([(n, g, w) for n, g, w in zip(NAMES, run_step(compiled, inputs), want_fused)])
    suite.run("compile", "chain with gate_residual_rms_norm: fullgraph fwd + bwd bitwise == uncompiled",
              fused_fullgraph)
    inductor_config.emulate_precision_casts = False


def capture_group(suite, data):
    inputs = ChainInputs(data, 4097)
    run_step(chain, inputs)  # the warm-up: kernels compiled or loaded before capture

    def capture():
        graph = torch.cuda.CUDAGraph()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            run_step(chain, inputs)  # one more eager step on the side stream, as torch's docs ask
        torch.cuda.current_stream().wait_stream(stream)
        with torch.cuda.graph(graph):
            captured = run_step(chain, inputs)
        for trial in range(3):
            fresh = ChainInputs(data, 4097)
            with torch.no_grad():  # every input the graph reads, the index too
                for old, new in zip(inputs.leaves() + inputs.grads + [inputs.index],
                                    fresh.leaves() + fresh.grads + [fresh.index]):
                    old.copy_(new)
            graph.replay()
            want = run_step(chain, fresh)
            ok, detail = all_equal([(n, g, w) for n, g, w in zip(NAMES, captured, want)])
            if not ok:
                return False, f"replay {trial}: {detail}"
        return True, f"3 replays with new inputs: {detail}"
    suite.run("capture", "torch.cuda.graph fwd + bwd, no compile", capture)


def block_group(suite, data):
    try:
        from diffusers.models.transformers.transformer_minimax_h3 import MiniMaxH3TransformerBlock
    except ImportError as e:
        suite.record("block", "diffusers MiniMaxH3TransformerBlock", None, f"diffusers not importable: {e}", 0.0)
        return
    from exactjit.integrations import diffusers as patch
    torch.manual_seed(1)
    s = 4097
    block = MiniMaxH3TransformerBlock(hidden_size=H, num_attention_heads=56, attention_head_dim=128, ffn_dim=14336,
                                      time_embed_dim=2688, norm_eps=EPS, qk_norm_eps=EPS).cuda().to(torch.bfloat16)
    with torch.no_grad():
        for norm in (block.norm1, block.norm2):
            norm.weight.copy_(1 + 0.1 * torch.randn_like(norm.weight))
    x = data.rows((1, s, H), torch.bfloat16)
    temb = torch.randn(T, 2688, device="cuda")
    index = data.index(s, 3 * T)
    position = torch.randn(s, 96, device="cuda")
    rotary = (position.cos(), position.sin())

    def forward(module):
        with torch.no_grad():
            return module(x, temb, index, rotary)

    eager = forward(block)
    torch._dynamo.reset()
    compiled_eager = forward(torch.compile(block, fullgraph=True))
    patch.apply(block)
    try:
        patched = forward(block)
        suite.run("block", "patched block forward bitwise == unpatched", lambda: compare(patched, eager))

        def explain():
            torch._dynamo.reset()
            e = torch._dynamo.explain(block)(x, temb, index, rotary)
            return e.graph_break_count == 0, f"{e.graph_count} graph(s), {e.graph_break_count} break(s) " \
                                             f"{e.break_reasons}"
        suite.run("block", "explain: patched block has 0 graph breaks", explain)

        def distance():
            torch._dynamo.reset()
            compiled_patched = forward(torch.compile(block, fullgraph=True))

            def rel(a, b):
                return float((a.double() - b.double()).norm() / b.double().norm())
            d_patched, d_unpatched = rel(compiled_patched, patched), rel(compiled_eager, eager)
            return d_patched <= d_unpatched, (f"rel-L2 compiled patched vs patched {d_patched:.3e}, compiled "
                                              f"unpatched vs unpatched {d_unpatched:.3e}")
        suite.run("block", "compiled patched no farther than compiled unpatched", distance)
    finally:
        patch.remove(block)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--groups", default=",".join(GROUPS), help="comma-separated: " + ",".join(GROUPS))
    p.add_argument("--seed", type=int, default=20261203)
    p.add_argument("--report", help="markdown report path")
    p.add_argument("--json", help="JSON report path")
    args = p.parse_args()
    groups = check_support.parse_groups(p, args.groups, GROUPS)
    t0 = time.perf_counter()
    meta = dict(commit=os.environ.get("EXACTJIT_COMMIT", "unknown"), torch=torch.__version__, groups=groups,
                seed=args.seed)
    try:
        xj = check_support.import_exactjit(meta)
    except Exception as e:
        return Suite(None).cannot_run(args, meta, "import exactjit / CUDA", e)
    log(f"exactjit {meta['exactjit']} ({meta['library']}), torch {torch.__version__}, {meta['device']}")
    suite = Suite(xj)
    data = Data(args.seed)
    parts = {"opcheck": opcheck_group, "direct": direct_group, "extension": extension_group,
             "compile": compile_group, "capture": capture_group, "block": block_group}
    check_support.run_groups(suite, xj, {name: functools.partial(part, suite, data) for name, part in parts.items()},
                             groups)
    meta["seconds"] = round(time.perf_counter() - t0, 1)
    return suite.finish(args, meta)


if __name__ == "__main__":
    sys.exit(main())
