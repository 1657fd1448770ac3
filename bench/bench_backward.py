#!/usr/bin/env python3
"""Forward + backward: exactjit against PyTorch eager and deterministic eager, on the GPU machine.

Four training steps of the DiT block's conditioning chain (the default --ops), each timed as one
forward plus one torch.autograd.grad of fixed upstream gradients (a new autograd graph per call, as
in training):
  gate_residual     out = residual + gate[index] * y, gate the strided chunk-2 view of a (T, 18H)
                    AdaLN table viewed (3T, 6H); gradients for residual, y and the table
  rms_norm+mod      norm(x) * (1 + scale[index]) + shift[index], the block form (no weight),
                    shift/scale chunks 0/1 of the same table; gradients for x and the table
  rms_norm+mod+w    the same with nn.RMSNorm's trainable weight, norm(x) * weight, as the real
                    module trains it (norm1/norm2/norm_out); gradients for x, the table and the weight
  gate_residual+rms_norm+mod
                    h = residual + gate[index] * y, then out = rms_norm(h, weight) * (1 + scale[index])
                    + shift[index] (the first gated residual and norm2 of a block: gate, shift, scale
                    chunks 2, 3, 4 of one table); upstream gradients for both h and out (h is the next
                    residual); gradients for residual, y, the table and the norm weight
and two plain norms, only when --ops names them (--ops rms_norm+w,qk_norm):
  rms_norm+w        nn.RMSNorm with its trainable weight, no modulation: F.rms_norm(x, (H,), weight)
                    on x (1, S, H); gradients for x and the weight
  qk_norm           MiniMax-H3's attention q/k norm: the same per head, over the head dim, on x
                    (1, S, heads, 128), heads = --qk-heads (56, the model's: q and k are 56 x 128 = 7168
                    wide, not H), weight (128,); gradients for x and the weight. exactjit takes the 4-D x
                    as it is (its rms_norm normalises the last dimension of any contiguous (..., D) x)
each timed twice: "fwd", the forward alone as training runs it (x and weight require grad, so
the autograd graph is built, then dropped with the output), and "fwd+bwd" as above.

Three implementations of the first two, side by side in one process (four of rms_norm+mod+w:
torch.compile of the eager expression too):
  exactjit          exactjit's op (an autograd Function over its deterministic backward)
  eager             the eager expression (index_select backward = index_add_ with atomics)
  eager det         the same with torch.use_deterministic_algorithms(True) (CUBLAS_WORKSPACE_CONFIG
                    is set, as that mode requires; torch then also fills new tensors from
                    torch.empty, torch.utils.deterministic.fill_uninitialized_memory, as shipped)
five of the fourth: exactjit fused (gate_residual_rms_norm), exactjit 2 ops (gate_residual, then
rms_norm), eager, eager det, and torch.compile of the two eager expressions (default settings); and
three of the plain norms: exactjit (xj.rms_norm(x, weight, eps)), eager and torch.compile.

Timing is bench_forward.py's Timer: CUDA events around batches of calls after warm-up, input sets
rotated so they exceed 256 MB (nothing timed from L2), the host queued ahead by torch.cuda._sleep;
median over --reps batches. Minimum bytes moved (the floor at the measured copy bandwidth):
  gate_residual  6*S*H*elem  (forward reads residual and y and writes out; backward reads grad and y
                              and writes d_y; d_residual is grad itself)
  rms_norm+mod   5*S*H*elem  (forward reads x, writes out; backward reads grad and x, writes dx;
                              the same with the weight)
  gate_residual+rms_norm+mod
                 10*S*H*elem (forward reads residual and y, writes h and out; backward reads both
                              upstream gradients, h and y, writes d_residual and d_y)
  rms_norm+w, qk_norm
                 fwd 2*S*W*elem (reads x, writes out), fwd+bwd 5*S*W*elem (as rms_norm+mod), W the
                 elements of x per position: H, or heads*128 for qk_norm (its rows' H column)
Checks on the first input set (not timed): forward outputs and, for gate_residual, d_y bitwise equal
to eager's; "repeatable": two runs give bit-identical gradients (eager's table gradient, summed
with atomics, usually does not; for a "fwd" row, bit-identical outputs).

Targets at S = 131072, H = 5376, bf16, B = 1: gate_residual fwd+bwd <= 2.5 ms, rms_norm+mod
fwd+bwd <= 2.0 ms, rms_norm+mod+w <= 2.1 ms; rms_norm+w and qk_norm faster than eager, fwd and
fwd+bwd, at every S (issue 17).

  python3 bench/bench_backward.py [--ops OP,...] [--sizes 4097,32768,131072] [--reps 50] [--report r.md]
                                  [--json r.json]
  python3 bench/bench_backward.py --ops rms_norm+w,qk_norm [--qk-heads 56]   (the plain norms alone)
Exit status: 0 done, 1 an op failed to run, 2 exactjit unavailable (the references are still timed).
"""
import argparse
import math
import os
import sys
import time
import traceback

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # before torch initialises cuBLAS

BENCH = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, BENCH)

import torch  # noqa: E402

from bench_forward import (BITS, CHUNK, EPS, FUSED, T, TARGET_CARD, Timer, add_speedups, add_timing,  # noqa: E402
                           finish, gate_inputs, gate_residual_eager, gate_residual_rms_norm_eager,
                           gate_residual_rms_norm_for_compile, git_commit, load_exactjit, log, measure_copy,
                           rms_inputs, rms_norm_modulated_eager, rotating_sets)

OPS = ("gate_residual", "rms_norm+mod", "rms_norm+mod+w", FUSED)  # the default run
PLAIN_OPS = ("rms_norm+w", "qk_norm")  # only when --ops names them; "faster than eager" is their target
HEAD_DIM, QK_HEADS = 128, 56  # qk_norm's x: MiniMax-H3's attention heads x head dim (q, k 7168 wide)
# At S = TARGET_S: issue 17's, and issue 16's for the fused op (stated there without the weight
# gradient; this case computes it).
TARGETS_MS = {"gate_residual": 2.5, "rms_norm+mod": 2.0, "rms_norm+mod+w": 2.1, FUSED: 3.8}
TARGET_S = 131072
IMPLS = ("exactjit", "eager", "eager det")
FUSED_IMPLS = ("exactjit fused", "exactjit 2 ops", "eager", "eager det", "torch.compile")
PLAIN_IMPLS = ("exactjit", "eager", "torch.compile")


def gate_step(forward):
    """One forward + backward of gate_residual: returns (out, (d_residual, d_table, d_y))."""
    def step(residual, table, index, y, grad):
        h = table.shape[1] // 18
        gate = table.view(3 * T, 6 * h)[:, CHUNK * h:(CHUNK + 1) * h]
        out = forward(residual, gate, index, y)
        return out, torch.autograd.grad(out, (residual, table, y), grad)
    return step


def rms_step(forward):
    """One forward + backward of the modulated rms_norm: returns (out, (dx, d_table))."""
    def step(x, table, index, grad):
        h = table.shape[1] // 18
        rows = table.view(3 * T, 6 * h)
        out = forward(x, rows[:, 0:h], rows[:, h:2 * h], index)
        return out, torch.autograd.grad(out, (x, table), grad)
    return step


def rms_weight_step(forward):
    """One forward + backward of the modulated rms_norm with its weight: returns (out, (dx, d_table, d_weight))."""
    def step(x, table, index, weight, grad):
        h = table.shape[1] // 18
        rows = table.view(3 * T, 6 * h)
        out = forward(x, weight, rows[:, 0:h], rows[:, h:2 * h], index)
        return out, torch.autograd.grad(out, (x, table, weight), grad)
    return step


def rms_norm_weighted_modulated(x, weight, shift, scale, idx):
    """nn.RMSNorm with its weight, then the AdaLN modulation (the eager expression)."""
    h = x.shape[-1]
    return torch.nn.functional.rms_norm(x, (h,), weight, EPS) * (1 + scale.index_select(0, idx)) + \
        shift.index_select(0, idx)


def plain_step(forward, backward=True):
    """One forward + backward of the plain weighted rms_norm: returns (out, (dx, d_weight)). backward=False:
    the forward alone, as training runs it (x and weight require grad: the graph is built, then dropped with
    out), returning (out, (out,)) so that "repeatable" compares two outputs."""
    def step(x, weight, grad):
        out = forward(x, weight)
        return out, (torch.autograd.grad(out, (x, weight), grad) if backward else (out,))
    return step


def rms_norm_weighted(x, weight):
    """nn.RMSNorm with its weight over the last dimension, no modulation (the eager expression)."""
    return torch.nn.functional.rms_norm(x, (x.shape[-1],), weight, EPS)


def fused_step(forward):
    """One forward + backward of the gated residual and the norm of its output, upstream gradients
    for both: returns ((h, out), (d_residual, d_table, d_y, d_weight))."""
    def step(residual, table, index, y, weight, grad_h, grad_out):
        hidden = table.shape[1] // 18
        rows = table.view(3 * T, 6 * hidden)
        gate, shift, scale = (rows[:, c * hidden:(c + 1) * hidden] for c in (2, 3, 4))
        h, out = forward(residual, gate, index, y, weight, shift, scale)
        return (h, out), torch.autograd.grad((h, out), (residual, table, y, weight), (grad_h, grad_out))
    return step


def timed(step):
    """The callable the Timer runs: the step, results dropped."""
    def call(*args):
        step(*args)
    return call


def norm_weight(gen, n, dtype):
    """An (n,) norm weight near 1, drawn from gen."""
    return (1 + 0.1 * torch.randn(n, generator=gen, device="cuda")).to(dtype)


def gate_sets(s, h, dtype, seed):
    """(residual, table, index, y, grad) sets, leaves requiring grad, > WORKING_SET in total."""
    elem = torch.finfo(dtype).bits // 8

    def draw(gen):
        residual, y, table, index = gate_inputs(gen, s, h, dtype)
        grad = torch.randn((s, h), generator=gen, device="cuda", dtype=dtype)
        return residual.requires_grad_(True), table.requires_grad_(True), index, y.requires_grad_(True), grad
    return rotating_sets(3 * s * h * elem + T * 18 * h * elem, seed, draw)


def rms_sets(s, h, dtype, seed):
    """(x, table, index, grad) sets, leaves requiring grad, > WORKING_SET in total."""
    elem = torch.finfo(dtype).bits // 8

    def draw(gen):
        x, table, index = rms_inputs(gen, s, h, dtype)
        grad = torch.randn((s, h), generator=gen, device="cuda", dtype=dtype)
        return x.requires_grad_(True), table.requires_grad_(True), index, grad
    return rotating_sets(2 * s * h * elem + T * 18 * h * elem, seed, draw)


def rms_weight_sets(s, h, dtype, seed):
    """(x, table, index, weight, grad) sets, leaves requiring grad, > WORKING_SET in total."""
    elem = torch.finfo(dtype).bits // 8

    def draw(gen):
        x, table, index = rms_inputs(gen, s, h, dtype)
        weight = norm_weight(gen, h, dtype)
        grad = torch.randn((s, h), generator=gen, device="cuda", dtype=dtype)
        return x.requires_grad_(True), table.requires_grad_(True), index, weight.requires_grad_(True), grad
    return rotating_sets(2 * s * h * elem + T * 18 * h * elem, seed, draw)


def fused_sets(s, h, dtype, seed):
    """(residual, table, index, y, weight, grad_h, grad_out) sets, leaves requiring grad, > WORKING_SET in total."""
    elem = torch.finfo(dtype).bits // 8

    def draw(gen):
        residual, y, table, index = gate_inputs(gen, s, h, dtype)
        weight = norm_weight(gen, h, dtype)
        grad_h, grad_out = (torch.randn((s, h), generator=gen, device="cuda", dtype=dtype) for _ in range(2))
        return (residual.requires_grad_(True), table.requires_grad_(True), index, y.requires_grad_(True),
                weight.requires_grad_(True), grad_h, grad_out)
    return rotating_sets(4 * s * h * elem + T * 18 * h * elem, seed, draw)


def plain_shape(op, s, h, heads):
    """x's shape: (1, S, H) for rms_norm+w, (1, S, heads, HEAD_DIM) for qk_norm."""
    return (1, s, heads, HEAD_DIM) if op == "qk_norm" else (1, s, h)


def plain_sets(shape, dtype, seed):
    """(x, weight, grad) sets of rms_norm+w or qk_norm (x of `shape`), x and weight requiring grad,
    > WORKING_SET in total."""
    elem = torch.finfo(dtype).bits // 8

    def draw(gen):
        x = torch.randn(shape, generator=gen, device="cuda", dtype=dtype)
        weight = norm_weight(gen, shape[-1], dtype)
        grad = torch.randn(shape, generator=gen, device="cuda", dtype=dtype)
        return x.requires_grad_(True), weight.requires_grad_(True), grad
    return rotating_sets(2 * math.prod(shape) * elem, seed, draw)


def bitwise_equal(a, b):
    """Tensors, or tuples of them (the fused op's (h, out)), equal bit for bit."""
    if isinstance(a, tuple):
        return len(a) == len(b) and all(bitwise_equal(x, y) for x, y in zip(a, b))
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(a.view(BITS[a.dtype]), b.view(BITS[b.dtype]))


class deterministic:
    """torch.use_deterministic_algorithms(flag) for a block, restored after."""

    def __init__(self, flag):
        self.flag = flag

    def __enter__(self):
        self.before = torch.are_deterministic_algorithms_enabled()
        torch.use_deterministic_algorithms(self.flag)

    def __exit__(self, *exc):
        torch.use_deterministic_algorithms(self.before)


def bench_op(timer, xj, op, s, h, seed, copy_gbs, heads=QK_HEADS):
    """Rows for the implementations of `op` at sequence length s (bf16, B = 1): fwd+bwd, and for the
    plain norms fwd first (qk_norm: `heads` heads)."""
    dtype, elem = torch.bfloat16, 2
    impls = IMPLS
    if op == FUSED:
        sets = fused_sets(s, h, dtype, seed)
        nbytes = 10 * s * h * elem
        impls = FUSED_IMPLS
        forwards = {"eager": gate_residual_rms_norm_eager, "eager det": gate_residual_rms_norm_eager,
                    "torch.compile": torch.compile(gate_residual_rms_norm_for_compile, dynamic=False)}
        if xj is not None:
            def fused(residual, gate, index, y, weight, shift, scale):
                return xj.gate_residual_rms_norm(residual, gate, index, y, weight, EPS, shift=shift, scale=scale)

            def two_ops(residual, gate, index, y, weight, shift, scale):
                gated = xj.gate_residual(residual, gate, index, y)
                return gated, xj.rms_norm(gated, weight, EPS, shift=shift, scale=scale, index=index)
            forwards.update({"exactjit fused": fused, "exactjit 2 ops": two_ops})
        make_step = fused_step
        grad_names = ("d_residual", "d_table", "d_y", "d_weight")
    elif op == "gate_residual":
        sets = gate_sets(s, h, dtype, seed)
        nbytes = 6 * s * h * elem
        forwards = {"exactjit": (lambda r, g, i, y: xj.gate_residual(r, g, i, y)) if xj is not None else None,
                    "eager": gate_residual_eager, "eager det": gate_residual_eager}
        make_step = gate_step
        grad_names = ("d_residual", "d_table", "d_y")
    elif op == "rms_norm+mod+w":
        sets = rms_weight_sets(s, h, dtype, seed)
        nbytes = 5 * s * h * elem
        impls = IMPLS + ("torch.compile",)
        xj_fwd = (lambda x, w, sh, sc, i: xj.rms_norm(x, w, EPS, shift=sh, scale=sc, index=i)) if xj is not None \
            else None
        forwards = {"exactjit": xj_fwd, "eager": rms_norm_weighted_modulated, "eager det": rms_norm_weighted_modulated,
                    "torch.compile": torch.compile(rms_norm_weighted_modulated, dynamic=False)}
        make_step = rms_weight_step
        grad_names = ("dx", "d_table", "d_weight")
    elif op in PLAIN_OPS:
        torch.compiler.reset()  # one code object for both ops and every S: keep it under dynamo's recompile limit
        shape = plain_shape(op, s, h, heads)
        h = math.prod(shape) // s  # elements per position: H, or heads x head dim (the rows' H)
        sets = plain_sets(shape, dtype, seed)
        nbytes = 5 * s * h * elem
        impls = PLAIN_IMPLS
        forwards = {"exactjit": (lambda x, w: xj.rms_norm(x, w, EPS)) if xj is not None else None,
                    "eager": rms_norm_weighted, "torch.compile": torch.compile(rms_norm_weighted, dynamic=False)}
        make_step = plain_step
        grad_names = ("dx", "d_weight")
    else:
        sets = rms_sets(s, h, dtype, seed)
        nbytes = 5 * s * h * elem
        xj_fwd = (lambda x, sh, sc, i: xj.rms_norm(x, None, EPS, shift=sh, scale=sc, index=i)) if xj is not None \
            else None
        forwards = {"exactjit": xj_fwd, "eager": rms_norm_modulated_eager, "eager det": rms_norm_modulated_eager}
        make_step = rms_step
        grad_names = ("dx", "d_table")
    passes = [("fwd+bwd", nbytes, make_step, grad_names)]
    if op in PLAIN_OPS:
        passes.insert(0, ("fwd", 2 * s * h * elem, lambda forward: plain_step(forward, backward=False), ("out",)))
    rows = []
    for timed_as, pass_bytes, make, names in passes:
        base = dict(op=op, timed=timed_as, dtype="bf16", S=s, B=1, H=h, bytes=pass_bytes)
        if op in PLAIN_OPS:
            base["x"] = list(shape)
        rows += time_impls(timer, xj, base, impls, forwards, make, sets, names, copy_gbs)
    del sets
    torch.cuda.empty_cache()
    return rows


def time_impls(timer, xj, base, impls, forwards, make_step, sets, grad_names, copy_gbs):
    """One row per implementation: base (op, timed, S, bytes, ...), the checks against eager on sets[0],
    the timing of make_step(forward) over sets, speedups, and the op's target where it has one."""
    op, s, nbytes = base["op"], base["S"], base["bytes"]
    floor_ms = nbytes / (copy_gbs * 1e9) * 1e3
    log(f"{op} {base['timed']} bf16 S={s}: {len(sets)} input sets, {nbytes / 1e6:.1f} MB minimum per call, "
        f"floor {floor_ms:.3f} ms")
    reference = make_step(forwards["eager"])(*sets[0])
    rows = []
    for impl in impls:
        forward = forwards.get(impl)
        if forward is None:
            continue
        row = dict(base, impl=impl, floor_ms=round(floor_ms, 4))
        step = make_step(forward)
        try:
            with deterministic(impl == "eager det"):
                out, grads = step(*sets[0])
                _, again = step(*sets[0])
                if xj is not None:
                    xj.synchronize()
                row["out_bitwise"] = bitwise_equal(out, reference[0])
                if op == "gate_residual":
                    row["d_y_bitwise"] = bitwise_equal(grads[2], reference[1][2])
                differ = [n for n, a, b in zip(grad_names, grads, again) if not bitwise_equal(a, b)]
                row["repeatable"] = not differ
                row["not_repeatable"] = differ
                del out, grads, again
                ms, host_us, inner = timer.median_ms(timed(step), sets)
                if xj is not None:
                    xj.synchronize()
            add_timing(row, ms, host_us, inner, nbytes, copy_gbs)
            row.update(target_fields(op, s, impl, ms, torch.cuda.get_device_name()))
        except Exception as e:
            traceback.print_exc()
            row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
        rows.append(row)
        log("  " + (f"{impl:<14} {row['ms']:.4f} ms  {row['gbs']:6.0f} GB/s  {row['pct_copy']:5.1f}% copy  "
                    f"out bitwise={row['out_bitwise']}  repeatable={row['repeatable']}  "
                    f"host {row['host_us']:.1f} us/call" if "ms" in row else f"{impl:<14} ERROR {row['error']}"))
    add_speedups(rows, "impl", (("eager", "vs_eager"), ("eager det", "vs_eager_det")))
    if op in PLAIN_OPS:
        for r in rows:
            if r["impl"] == "exactjit" and "vs_eager" in r:
                r["faster_than_eager"] = r["vs_eager"] > 1
    return rows


def yes_no(v):
    return "" if v is None else ("yes" if v else "NO")


def met(v):
    return "met" if v else "MISSED"


def target_fields(op, s, impl, ms, device):
    """A row's target (exactjit's at TARGET_S, where the op has one) and, on the card the targets
    are set on, whether it is met."""
    if impl not in ("exactjit", "exactjit fused") or s != TARGET_S or op not in TARGETS_MS:
        return {}
    fields = {"target_ms": TARGETS_MS[op]}
    if TARGET_CARD in device:
        fields["target_met"] = ms <= TARGETS_MS[op]
    return fields


def judged(r):
    """A timed target's verdict, or why it has none (the targets are the H200's)."""
    if "target_met" in r:
        return met(r["target_met"])
    return f"not judged on this card (an {TARGET_CARD} target)"


def speedup(r, field):
    """The speedup cell: empty where the reference was not timed."""
    return f"{r[field]:.2f}x" if field in r else ""


def markdown(meta, rows):
    lines = [
        "# Forward + backward: exactjit vs PyTorch eager vs deterministic eager (gate_residual, rms_norm+mod, "
        f"{FUSED}; plain rms_norm+w, qk_norm)", "",
        *(f"- {k}: {v}" for k, v in meta.items()),
        "- one call = forward + torch.autograd.grad of fixed upstream gradients (gate_residual: for residual, y "
        "and the AdaLN table; rms_norm+mod, block form without weight: for x and the table; rms_norm+mod+w, "
        "with nn.RMSNorm's weight: for x, the table and the weight; "
        f"{FUSED}, h = residual + gate[i] * y then rms_norm(h, weight) * (1 + scale[i]) + shift[i], upstream "
        "gradients for both h and out: for residual, y, the table (gate, shift, scale chunks) and the weight; "
        "exactjit fused = gate_residual_rms_norm, exactjit 2 ops = gate_residual then rms_norm, torch.compile = "
        "the two eager expressions compiled, default settings); rms_norm+w, nn.RMSNorm with its weight, no "
        "modulation, x (1, S, H): for x and the weight; qk_norm, the same per head over the head dim, x (1, S, heads, "
        "128), weight (128,), passed to exactjit as is: for x and the weight (its H column = heads*128)",
        "- timed: fwd+bwd = one call as above; fwd (rms_norm+w, qk_norm) = the forward alone as training runs it "
        "(x and weight require grad: the autograd graph is built, then dropped with the output)",
        f"- bytes = the minimum a fused forward + backward moves: gate_residual 6*S*H*elem, rms_norm+mod(+w), "
        f"rms_norm+w and qk_norm 5*S*H*elem, {FUSED} 10*S*H*elem; fwd rows 2*S*H*elem (read x, write out); "
        "floor = bytes / copy bandwidth",
        "- speedup = the reference's ms / this row's ms (> 1: this row is faster); out = eager: forward output(s) "
        "bitwise equal to eager's; d_y = eager: gate_residual's d_y bitwise equal to eager's; repeatable: two runs "
        "give bit-identical gradients (else the gradients that differed; fwd rows: outputs)",
        f"- targets (exactjit at S={TARGET_S}, on the {TARGET_CARD}): " +
        ", ".join(f"{op} <= {ms} ms" for op, ms in TARGETS_MS.items()) +
        "; rms_norm+w and qk_norm: exactjit faster than eager at every S, fwd and fwd+bwd",
        "",
    ]
    for op, target in TARGETS_MS.items():
        hit = [r for r in rows if r["op"] == op and "target_ms" in r]
        if hit:
            r = hit[0]
            lines.append(f"- **{op} fwd+bwd at S={TARGET_S}: {r['ms']:.3f} ms, target <= {target} ms: "
                         f"{judged(r)}**")
    for op in PLAIN_OPS:
        for s in sorted({r["S"] for r in rows if r["op"] == op}):
            hit = [r for r in rows if r["op"] == op and r["S"] == s and "faster_than_eager" in r]
            if hit:
                lines.append(f"- **{op} at S={s}, faster than eager: " + "; ".join(
                    f"{r['timed']} {r['ms']:.3f} ms ({r['vs_eager']:.2f}x): {met(r['faster_than_eager'])}"
                    for r in hit) + "**")
    lines += [
        "",
        "| op | timed | S | impl | median ms | GB/s | % copy BW | floor ms | speedup vs eager | speedup vs eager det | "
        "out = eager | d_y = eager | repeatable | target | host us/call |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "ms" not in r:
            lines.append(f"| {r['op']} | {r['timed']} | {r['S']} | {r['impl']} | error: {r['error'].replace('|', '/')} "
                         "| | | | | | | | | | |")
            continue
        repeat = "yes" if r["repeatable"] else "NO (" + ", ".join(r["not_repeatable"]) + ")"
        target = ""
        if "target_ms" in r:
            target = f"<= {r['target_ms']} ms: {judged(r)}"
        elif "faster_than_eager" in r:
            target = f"faster than eager: {met(r['faster_than_eager'])}"
        lines.append(
            f"| {r['op']} | {r['timed']} | {r['S']} | {r['impl']} | {r['ms']:.4f} | {r['gbs']:.0f} | "
            f"{r['pct_copy']:.1f} | {r['floor_ms']:.4f} | {speedup(r, 'vs_eager')} | "
            f"{speedup(r, 'vs_eager_det')} | {yes_no(r['out_bitwise'])} | "
            f"{yes_no(r.get('d_y_bitwise'))} | {repeat} | {target} | {r['host_us']:.1f} |")
    return "\n".join(lines) + "\n"


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", default="4097,32768,131072", help="comma-separated S values")
    p.add_argument("--hidden", type=int, default=5376)
    p.add_argument("--ops", default=",".join(OPS),
                   help="comma-separated, of " + ",".join(OPS + PLAIN_OPS) + " (default: the first four)")
    p.add_argument("--qk-heads", type=int, default=QK_HEADS, help="qk_norm's heads (x is (1, S, heads, 128))")
    p.add_argument("--reps", type=int, default=50,
                   help="timed batches per implementation (median; fewer than 50 are raised to 50)")
    p.add_argument("--seed", type=int, default=4321)
    p.add_argument("--report", help="markdown report path")
    p.add_argument("--json", help="JSON report path")
    args = p.parse_args()
    args.reps = max(args.reps, 50)
    sizes = [int(v) for v in args.sizes.split(",") if v]
    ops = [o for o in args.ops.split(",") if o]
    unknown = set(ops) - set(OPS + PLAIN_OPS)
    if unknown:
        p.error(f"unknown ops {sorted(unknown)}")

    t_start = time.perf_counter()
    try:
        import torch.utils.deterministic as deterministic_utils
        fill = deterministic_utils.fill_uninitialized_memory
    except (ImportError, AttributeError):
        fill = "n/a"
    meta = dict(commit=git_commit(), torch=torch.__version__, device=torch.cuda.get_device_name(),
                hidden=args.hidden, B=1, dtype="bf16",
                table=f"(3T, 6H) view of (T, 18H), T={T}; gate chunk {CHUNK}, shift/scale chunks 0/1 ({FUSED}: gate, "
                      "shift, scale chunks 2, 3, 4); index int64",
                reps=args.reps, CUBLAS_WORKSPACE_CONFIG=os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
                deterministic_fill_uninitialized_memory=fill)
    if "qk_norm" in ops:
        meta["qk_norm x"] = f"(1, S, {args.qk_heads}, {HEAD_DIM}), weight ({HEAD_DIM},)"
    xj = load_exactjit(meta, need_backward=True)

    torch.use_deterministic_algorithms(False)
    timer = Timer(args.reps)
    with torch.no_grad():
        copy_gbs = measure_copy(timer, meta)
    rows = []
    for op in ops:
        for s in sizes:
            rows += bench_op(timer, xj, op, s, args.hidden, args.seed, copy_gbs, args.qk_heads)
    meta["seconds"] = round(time.perf_counter() - t_start, 1)

    return finish(args, meta, rows, markdown(meta, rows), xj, copy_gbs=copy_gbs, targets_ms=TARGETS_MS,
                  target_S=TARGET_S)


if __name__ == "__main__":
    sys.exit(main())
