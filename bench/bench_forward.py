#!/usr/bin/env python3
"""Forward ops: exactjit against PyTorch eager and torch.compile, on the GPU machine.

gate_residual, then adaln_row_gather (vs six eager index_selects), rms_norm (modulated vs eager
and both compile modes; plain vs PyTorch's fused RMSNorm) and gate_residual_rms_norm (the fused op vs
exactjit's gate_residual then rms_norm, eager and both compile modes of the two expressions), each
at every --sizes S.

gate_residual: four implementations of `residual + gate.index_select(0, index) * y`, timed side by side in one
process (PERFORMANCE.md, "Method"):
  exactjit          exactjit.gate_residual (allocates its output, as the others do)
  eager             the expression above
  torch.compile     the same expression, compiled with default settings
  compile+emulate   compiled again, in a fresh dynamo state, with
                    torch._inductor.config.emulate_precision_casts = True
Every output is compared with eager's bit for bit on the first input set.

Timing: CUDA events around a batch of launches, after warm-up; median over --reps batches. Each
batch rotates through enough input sets (residual, y, table, index) that they total more than
256 MB (L2 is 60 MB), so nothing is timed from L2, and no input is zeros. Each batch is preceded
by torch.cuda._sleep long enough for the host to queue the whole batch, so the events time the
GPU, not Python's launch rate; that launch rate is reported separately as host us/call.

Bytes moved, the minimum any implementation must move:
  bytes = 3 * B*S*H * elem  (read residual, read y, write out)  +  R * H * elem  (gate rows once)
with R = 3T rows of the (3T, 6H) table view. GB/s = bytes / median time; "% copy" compares that
with a device-to-device copy measured in the same run (bytes read + written).

  python3 bench/bench_forward.py [--dtypes bf16,fp16,fp32] [--report r.md] [--json r.json]
Exit status: 0 done, 1 an op failed to run, 2 exactjit unavailable (the references are still timed).
"""
import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
import traceback

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "python"))

import torch  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
BITS = {torch.bfloat16: torch.int16, torch.float16: torch.int16, torch.float32: torch.int32}
T, CHUNK = 3, 2  # AdaLN table (T, 18H) viewed as (3T, 6H); chunk 2 = gate_msa
TARGET_CARD = "H200"  # the card the issues' absolute targets are set on: judged only there
WORKING_SET = 256e6  # bytes of inputs rotated through, > 4x L2
BATCH_TARGET_MS = 1.0  # GPU time per timed batch, so event resolution never matters


def log(*args):
    print(*args, flush=True)


# Three separate function objects with the same body: dynamo caches compiled code per code
# object, so the default and the emulate_precision_casts compilations never share an entry.
def gate_residual_eager(residual, gate, index, y):
    return residual + gate.index_select(0, index) * y


def gate_residual_for_compile(residual, gate, index, y):
    return residual + gate.index_select(0, index) * y


def gate_residual_for_compile_emulate(residual, gate, index, y):
    return residual + gate.index_select(0, index) * y


class Timer:
    """Times a callable over rotating argument sets with CUDA events (see the module doc)."""

    def __init__(self, reps):
        self.reps = reps
        self.sleep = getattr(torch.cuda, "_sleep", None)
        self.cycles_per_ms = self._calibrate() if self.sleep else 0.0

    def _calibrate(self):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        self.sleep(1_000_000)
        start.record()
        self.sleep(10_000_000)
        end.record()
        end.synchronize()
        return 10_000_000 / max(start.elapsed_time(end), 1e-3)

    def _hold(self, ms):
        """Keeps the GPU busy for about `ms` so the host can queue ahead of it."""
        if self.sleep:
            self.sleep(int(ms * self.cycles_per_ms))

    def host_us_per_call(self, fn, sets, calls=20):
        self._hold(50.0)
        t0 = time.perf_counter()
        for k in range(calls):
            fn(*sets[k % len(sets)])
        host = (time.perf_counter() - t0) / calls * 1e6
        torch.cuda.synchronize()
        return host

    def batch_ms(self, fn, sets, inner, host_us):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        self._hold(inner * host_us * 1.5e-3 + 0.05)
        start.record()
        for k in range(inner):
            fn(*sets[k % len(sets)])
        end.record()
        return start, end

    def median_ms(self, fn, sets):
        """(median GPU ms per call, host us per call, calls per batch)."""
        for st in sets:  # warm-up: compiles, autotunes, fills caches
            fn(*st)
        torch.cuda.synchronize()
        host_us = self.host_us_per_call(fn, sets)
        start, end = self.batch_ms(fn, sets, len(sets), host_us)
        end.synchronize()
        estimate = start.elapsed_time(end) / len(sets)
        inner = max(1, math.ceil(BATCH_TARGET_MS / max(estimate, 1e-4) / len(sets))) * len(sets)
        inner = min(inner, 64 * len(sets))
        events = [self.batch_ms(fn, sets, inner, host_us) for _ in range(self.reps)]
        torch.cuda.synchronize()
        per_call = [s.elapsed_time(e) / inner for s, e in events]
        return statistics.median(per_call), host_us, inner


def copy_bandwidth(timer):
    """Device-to-device copy, GB/s of bytes read + written (1 GiB each way)."""
    src = torch.randn(1 << 29, device="cuda", dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    ms, _, _ = timer.median_ms(lambda s, d: d.copy_(s), [(src, dst)])
    nbytes = 2 * src.numel() * src.element_size()
    del src, dst
    torch.cuda.empty_cache()
    return nbytes / (ms * 1e-3) / 1e9, ms


def measure_copy(timer, meta):
    """copy_bandwidth's GB/s, also noted in meta["copy bandwidth"] and logged."""
    copy_gbs, copy_ms = copy_bandwidth(timer)
    meta["copy bandwidth"] = f"{copy_gbs:.0f} GB/s (1 GiB copy_, read + write, {copy_ms:.3f} ms)"
    log(f"device-to-device copy: {copy_gbs:.0f} GB/s")
    return copy_gbs


def rotating_sets(per_set, seed, draw):
    """Input sets draw(gen) from one generator seeded with `seed`: at least 2, and enough that at
    per_set bytes each they exceed WORKING_SET."""
    n = max(2, math.ceil(WORKING_SET / per_set))
    gen = torch.Generator(device="cuda").manual_seed(seed)
    return [draw(gen) for _ in range(n)]


def gate_inputs(gen, s, h, dtype):
    """residual (S, H), y (S, H), an AdaLN table (T, 18H) with row 0 scaled by 30 and row 1 by 1e-3,
    and an int64 index into its (3T, 6H) rows, drawn from gen in that order."""
    residual = torch.randn((s, h), generator=gen, device="cuda", dtype=dtype)
    y = torch.randn((s, h), generator=gen, device="cuda", dtype=dtype)
    table = torch.randn((T, 18 * h), generator=gen, device="cuda", dtype=dtype)
    table[0].mul_(30.0)
    table[1].mul_(1e-3)
    index = torch.randint(0, 3 * T, (s,), generator=gen, device="cuda", dtype=torch.int64)
    return residual, y, table, index


def rms_inputs(gen, s, h, dtype):
    """x (S, H), an AdaLN table (T, 18H) and an int64 index into its (3T, 6H) rows, drawn from gen
    in that order."""
    x = torch.randn((s, h), generator=gen, device="cuda", dtype=dtype)
    table = torch.randn((T, 18 * h), generator=gen, device="cuda", dtype=dtype)
    index = torch.randint(0, 3 * T, (s,), generator=gen, device="cuda", dtype=torch.int64)
    return x, table, index


def input_sets(s, h, dtype, seed):
    """Enough (residual, gate view, index, y) sets to exceed WORKING_SET; gate rows scaled in
    part so the data is not uniform, and a fresh table per set."""
    elem = torch.finfo(dtype).bits // 8

    def draw(gen):
        residual, y, table, index = gate_inputs(gen, s, h, dtype)
        return residual, table.view(3 * T, 6 * h)[:, CHUNK * h:(CHUNK + 1) * h], index, y
    return rotating_sets(2 * s * h * elem + T * 18 * h * elem, seed, draw)


def add_timing(row, ms, host_us, inner, nbytes, copy_gbs, **extra):
    """Timer.median_ms's (ms, host_us, inner) into row, with GB/s, then `extra`, then % of copy bandwidth."""
    row.update(ms=ms, gbs=nbytes / (ms * 1e-3) / 1e9, host_us=host_us, batch=inner, **extra)
    row["pct_copy"] = 100.0 * row["gbs"] / copy_gbs


def add_speedups(rows, key, refs):
    """For each timed row and each (reference, field) in refs: row[field] = the ms of the timed row
    whose `key` is reference / this row's ms."""
    by_key = {r[key]: r for r in rows if "ms" in r}
    for r in rows:
        if "ms" in r:
            for ref, field in refs:
                if ref in by_key:
                    r[field] = by_key[ref]["ms"] / r["ms"]


def bitwise_equal(a, b):
    return torch.equal(a.view(BITS[a.dtype]), b.view(BITS[b.dtype]))


def load_exactjit(meta, need_backward=False):
    """The exactjit module, its version and library noted in meta; or None, with the reason noted
    and logged, so the references are still timed. need_backward: a library without the backward
    entry points counts as unavailable."""
    try:
        import exactjit as xj
        from exactjit import _lib
        meta.update(exactjit=xj.version(), library=xj.library_path())
        if need_backward and _lib.missing:
            raise RuntimeError(f"the library lacks {', '.join(sorted(_lib.missing))}")
        return xj
    except Exception as e:
        meta["exactjit"] = f"unavailable: {type(e).__name__}: {e}"
        log(meta["exactjit"])
        return None


def git_commit():
    """EXACTJIT_COMMIT (the campaign sets it to the commit the carried binaries were built from),
    else the checkout's."""
    if os.environ.get("EXACTJIT_COMMIT"):
        return os.environ["EXACTJIT_COMMIT"]
    try:
        out = subprocess.run(["git", "-C", REPO, "describe", "--always", "--dirty"],
                             capture_output=True, text=True, timeout=10)
        return out.stdout.strip() or "unknown"
    except Exception:
        return "unknown"


def make_ops(xj):
    """(name, make) pairs; make() returns the callable after any one-off set-up (compilation
    happens in its warm-up). A failed make is reported, not fatal."""
    import torch._dynamo
    import torch._inductor.config as inductor_config

    def compiled(fn, emulate):
        def make():
            torch._dynamo.reset()
            if emulate and not hasattr(inductor_config, "emulate_precision_casts"):
                raise RuntimeError("this torch has no inductor emulate_precision_casts")
            if hasattr(inductor_config, "emulate_precision_casts"):
                inductor_config.emulate_precision_casts = emulate
            return torch.compile(fn, dynamic=False)
        return make

    ops = [("eager", lambda: gate_residual_eager)]
    if xj is not None:
        ops.append(("exactjit", lambda: xj.gate_residual))
    ops += [("torch.compile", compiled(gate_residual_for_compile, False)),
            ("compile+emulate", compiled(gate_residual_for_compile_emulate, True))]
    return ops


def bench_case(timer, xj, ops, dtype_name, s, h, seed, copy_gbs):
    dtype = DTYPES[dtype_name]
    sets = input_sets(s, h, dtype, seed)
    elem = torch.finfo(dtype).bits // 8
    nbytes = 3 * s * h * elem + 3 * T * h * elem
    floor_ms = nbytes / (copy_gbs * 1e9) * 1e3
    log(f"{dtype_name} S={s}: {len(sets)} input sets, {nbytes / 1e6:.1f} MB per call, "
        f"floor {floor_ms:.3f} ms")
    reference = gate_residual_eager(*sets[0])
    rows = []
    for name, make in ops:
        row = dict(dtype=dtype_name, S=s, B=1, H=h, op=name, bytes=nbytes,
                   floor_ms=round(floor_ms, 4))
        try:
            t0 = time.perf_counter()
            fn = make()
            got = fn(*sets[0])
            if name == "exactjit":
                xj.synchronize()
            row["bitwise"] = bitwise_equal(got, reference)
            del got
            ms, host_us, inner = timer.median_ms(fn, sets)
            if name == "exactjit":
                xj.synchronize()
            add_timing(row, ms, host_us, inner, nbytes, copy_gbs, setup_s=round(time.perf_counter() - t0, 1))
        except Exception as e:
            traceback.print_exc()
            row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
        finally:
            if name == "compile+emulate":
                import torch._inductor.config as inductor_config
                if hasattr(inductor_config, "emulate_precision_casts"):
                    inductor_config.emulate_precision_casts = False
        rows.append(row)
        log("  " + (f"{name:<16} {row['ms']:.4f} ms  {row['gbs']:7.0f} GB/s  "
                    f"{row['pct_copy']:5.1f}% copy  bitwise={row['bitwise']}  "
                    f"host {row['host_us']:.1f} us/call" if "ms" in row
                    else f"{name:<16} ERROR {row['error']}"))
    add_speedups(rows, "op", (("eager", "vs_eager"), ("torch.compile", "vs_compile")))
    del sets, reference
    torch.cuda.empty_cache()
    return rows


def row_gather_eager(rows, ti, tags):
    """The reference: six index_selects of the (3T, 6H) rows (one per AdaLN chunk)."""
    h = rows.shape[1] // 6
    idx = ti * 3 + tags
    return tuple(rows[:, c * h:(c + 1) * h].index_select(0, idx) for c in range(6))


def bench_row_gather(timer, xj, s, h, seed, copy_gbs):
    """adaln_row_gather (bf16) vs six eager index_selects: bytes = the six (S, H) outputs written
    (the table rows stay in L2); floor = bytes / copy bandwidth."""
    dtype, elem = torch.bfloat16, 2

    def draw(gen):
        rows = torch.randn((T, 18 * h), generator=gen, device="cuda", dtype=dtype).view(3 * T, 6 * h)
        ti = torch.randint(0, T, (s,), generator=gen, device="cuda")
        tags = torch.randint(0, 3, (s,), generator=gen, device="cuda")
        return rows, ti, tags
    sets = rotating_sets(6 * s * h * elem, seed, draw)
    nbytes = 6 * s * h * elem
    floor_ms = nbytes / (copy_gbs * 1e9) * 1e3
    reference = row_gather_eager(*sets[0])
    out = []
    for name, fn in (("eager 6x index_select", row_gather_eager),
                     ("exactjit", xj.adaln_row_gather if xj is not None else None)):
        if fn is None:
            continue
        row = dict(dtype="bf16", S=s, B=1, H=h, op=f"adaln_row_gather {name}", bytes=nbytes,
                   floor_ms=round(floor_ms, 4))
        try:
            got = fn(*sets[0])
            if xj is not None:
                xj.synchronize()
            row["bitwise"] = all(bitwise_equal(a, b) for a, b in zip(got, reference))
            ms, host_us, inner = timer.median_ms(fn, sets)
            add_timing(row, ms, host_us, inner, nbytes, copy_gbs)
        except Exception as e:
            traceback.print_exc()
            row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
        out.append(row)
        if "ms" in row:
            log(f"  {row['op']:<34} {ms:.4f} ms  bitwise={row['bitwise']}")
    if len(out) == 2 and all("ms" in r for r in out):
        out[1]["vs_eager"] = out[0]["ms"] / out[1]["ms"]
        out[0]["vs_eager"] = 1.0
    del sets, reference
    torch.cuda.empty_cache()
    return out


EPS = 1e-5


def rms_norm_modulated_eager(x, shift, scale, idx):
    h = x.shape[-1]
    return torch.nn.functional.rms_norm(x, (h,), None, EPS) * (1 + scale.index_select(0, idx)) + \
        shift.index_select(0, idx)


def rms_norm_modulated_for_compile(x, shift, scale, idx):
    h = x.shape[-1]
    return torch.nn.functional.rms_norm(x, (h,), None, EPS) * (1 + scale.index_select(0, idx)) + \
        shift.index_select(0, idx)


def rms_norm_modulated_for_compile_emulate(x, shift, scale, idx):
    h = x.shape[-1]
    return torch.nn.functional.rms_norm(x, (h,), None, EPS) * (1 + scale.index_select(0, idx)) + \
        shift.index_select(0, idx)


def bench_rms_norm(timer, xj, s, h, seed, copy_gbs):
    """rms_norm (bf16): AdaLN-modulated block form vs eager, torch.compile (with and without
    emulate_precision_casts), and the plain weighted norm vs PyTorch's fused RMSNorm.
    bytes = 2*S*H*elem (read x, write out; table rows stay in L2)."""
    import torch._dynamo
    import torch._inductor.config as inductor_config
    dtype, elem = torch.bfloat16, 2

    def draw(gen):  # a modulated set and a plain (x, weight) set over the same x
        x, table, idx = rms_inputs(gen, s, h, dtype)
        rows = table.view(3 * T, 6 * h)
        weight = (1 + 0.1 * torch.randn(h, generator=gen, device="cuda")).to(dtype)
        return (x, rows[:, 0:h], rows[:, h:2 * h], idx), (x, weight)
    sets, plain_sets = (list(part) for part in zip(*rotating_sets(2 * s * h * elem, seed, draw)))
    nbytes = 2 * s * h * elem
    floor_ms = nbytes / (copy_gbs * 1e9) * 1e3

    def compiled(fn, emulate):
        torch._dynamo.reset()
        if hasattr(inductor_config, "emulate_precision_casts"):
            inductor_config.emulate_precision_casts = emulate
        return torch.compile(fn, dynamic=False)

    def xj_modulated(x, shift, scale, idx):
        return xj.rms_norm(x, None, EPS, shift=shift, scale=scale, index=idx)

    cases = [("rms_norm+mod eager", lambda: rms_norm_modulated_eager, sets),
             ("rms_norm+mod exactjit", lambda: xj_modulated, sets),
             ("rms_norm+mod torch.compile", lambda: compiled(rms_norm_modulated_for_compile, False), sets),
             ("rms_norm+mod compile+emulate", lambda: compiled(rms_norm_modulated_for_compile_emulate, True), sets),
             ("rms_norm eager (fused)", lambda: (lambda x, w: torch.nn.functional.rms_norm(x, (h,), w, EPS)),
              plain_sets),
             ("rms_norm exactjit", lambda: (lambda x, w: xj.rms_norm(x, w, EPS)), plain_sets)]
    refs = {id(sets): rms_norm_modulated_eager(*sets[0]),
            id(plain_sets): torch.nn.functional.rms_norm(plain_sets[0][0], (h,), plain_sets[0][1], EPS)}
    out = []
    for name, make, argsets in cases:
        row = dict(dtype="bf16", S=s, B=1, H=h, op=name, bytes=nbytes, floor_ms=round(floor_ms, 4))
        try:
            fn = make()
            got = fn(*argsets[0])
            if xj is not None:
                xj.synchronize()
            row["bitwise"] = bitwise_equal(got, refs[id(argsets)])
            ms, host_us, inner = timer.median_ms(fn, argsets)
            add_timing(row, ms, host_us, inner, nbytes, copy_gbs)
            log(f"  {name:<30} {ms:.4f} ms  bitwise={row['bitwise']}")
        except Exception as e:
            traceback.print_exc()
            row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
        finally:
            if hasattr(inductor_config, "emulate_precision_casts"):
                inductor_config.emulate_precision_casts = False
        out.append(row)
    eager_ms = {r["op"].split(" ")[0]: r["ms"] for r in out if "ms" in r and "eager" in r["op"]}
    for r in out:
        if "ms" in r and r["op"].split(" ")[0] in eager_ms:
            r["vs_eager"] = eager_ms[r["op"].split(" ")[0]] / r["ms"]
    del sets, plain_sets, refs
    torch.cuda.empty_cache()
    return out


def gate_residual_rms_norm_eager(residual, gate, idx, y, weight, shift, scale):
    h = residual + gate.index_select(0, idx) * y
    return h, torch.nn.functional.rms_norm(h, (h.shape[-1],), weight, EPS) * (1 + scale.index_select(0, idx)) + \
        shift.index_select(0, idx)


def gate_residual_rms_norm_for_compile(residual, gate, idx, y, weight, shift, scale):
    h = residual + gate.index_select(0, idx) * y
    return h, torch.nn.functional.rms_norm(h, (h.shape[-1],), weight, EPS) * (1 + scale.index_select(0, idx)) + \
        shift.index_select(0, idx)


def gate_residual_rms_norm_for_compile_emulate(residual, gate, idx, y, weight, shift, scale):
    h = residual + gate.index_select(0, idx) * y
    return h, torch.nn.functional.rms_norm(h, (h.shape[-1],), weight, EPS) * (1 + scale.index_select(0, idx)) + \
        shift.index_select(0, idx)


FUSED = "gate_residual+rms_norm+mod"  # the family of bench_gate_residual_rms_norm's rows


def bench_gate_residual_rms_norm(timer, xj, s, h, seed, copy_gbs):
    """The gated residual and the weighted, modulated rms_norm of its output (bf16), as the block
    writes them (gate, shift and scale chunks 2, 3 and 4 of one table): exactjit's fused op, exactjit's
    gate_residual then rms_norm, and eager and torch.compile (with and without
    emulate_precision_casts) of the two expressions. bytes = 4*S*H*elem (read residual and y, write h
    and out; table rows and weight stay in L2); bitwise: h and out both equal to eager's."""
    import torch._dynamo
    import torch._inductor.config as inductor_config
    dtype, elem = torch.bfloat16, 2

    def draw(gen):
        residual, y, table, index = gate_inputs(gen, s, h, dtype)
        rows = table.view(3 * T, 6 * h)
        weight = (1 + 0.1 * torch.randn(h, generator=gen, device="cuda")).to(dtype)
        return residual, rows[:, 2 * h:3 * h], index, y, weight, rows[:, 3 * h:4 * h], rows[:, 4 * h:5 * h]
    sets = rotating_sets(2 * s * h * elem + T * 18 * h * elem, seed, draw)
    nbytes = 4 * s * h * elem
    floor_ms = nbytes / (copy_gbs * 1e9) * 1e3

    def compiled(fn, emulate):
        torch._dynamo.reset()
        if hasattr(inductor_config, "emulate_precision_casts"):
            inductor_config.emulate_precision_casts = emulate
        return torch.compile(fn, dynamic=False)

    def xj_fused(residual, gate, idx, y, weight, shift, scale):
        return xj.gate_residual_rms_norm(residual, gate, idx, y, weight, EPS, shift=shift, scale=scale)

    def xj_two_ops(residual, gate, idx, y, weight, shift, scale):
        gated = xj.gate_residual(residual, gate, idx, y)
        return gated, xj.rms_norm(gated, weight, EPS, shift=shift, scale=scale, index=idx)

    cases = [(f"{FUSED} eager", lambda: gate_residual_rms_norm_eager),
             (f"{FUSED} exactjit fused", lambda: xj_fused),
             (f"{FUSED} exactjit 2 ops", lambda: xj_two_ops),
             (f"{FUSED} torch.compile", lambda: compiled(gate_residual_rms_norm_for_compile, False)),
             (f"{FUSED} compile+emulate", lambda: compiled(gate_residual_rms_norm_for_compile_emulate, True))]
    reference = gate_residual_rms_norm_eager(*sets[0])
    out = []
    for name, make in cases:
        row = dict(dtype="bf16", S=s, B=1, H=h, op=name, bytes=nbytes, floor_ms=round(floor_ms, 4))
        try:
            fn = make()
            got = fn(*sets[0])
            xj.synchronize()
            row["bitwise"] = all(bitwise_equal(a, b) for a, b in zip(got, reference))
            del got
            ms, host_us, inner = timer.median_ms(fn, sets)
            add_timing(row, ms, host_us, inner, nbytes, copy_gbs)
            log(f"  {name:<44} {ms:.4f} ms  bitwise={row['bitwise']}")
        except Exception as e:
            traceback.print_exc()
            row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
        finally:
            if hasattr(inductor_config, "emulate_precision_casts"):
                inductor_config.emulate_precision_casts = False
        out.append(row)
    add_speedups(out, "op", ((f"{FUSED} eager", "vs_eager"), (f"{FUSED} torch.compile", "vs_compile")))
    del sets, reference
    torch.cuda.empty_cache()
    return out


def markdown(meta, rows):
    lines = [
        "# gate_residual, adaln_row_gather, rms_norm and gate_residual_rms_norm forward: exactjit vs PyTorch eager vs "
        "torch.compile", "",
        *(f"- {k}: {v}" for k, v in meta.items()),
        "- bytes = 3*B*S*H*elem (read residual, read y, write out) + R*H*elem (gate rows once, "
        "R = 3T); floor = bytes / copy bandwidth. adaln_row_gather: bytes = 6*S*H*elem written "
        "(table rows stay in L2), floor = bytes / copy bandwidth. rms_norm: bytes = 2*S*H*elem "
        f"(read x, write out). {FUSED} (h = residual + gate[i] * y, then rms_norm(h, weight) * (1 + scale[i]) + "
        "shift[i]; exactjit fused: one gate_residual_rms_norm call; exactjit 2 ops: gate_residual, then rms_norm): "
        "bytes = 4*S*H*elem (read residual and y, write h and out); bitwise = h and out both equal to eager's",
        "- speedup = reference ms / this op's ms (> 1: this op is faster); bitwise = output equal "
        "to eager bit for bit; host us/call = Python time to issue one call (above median ms, "
        "a real program would be launch-bound at this size)", "",
        "| dtype | S | op | median ms | GB/s | % copy BW | floor ms | speedup vs eager | "
        "speedup vs compile | bitwise = eager | host us/call |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "ms" not in r:
            lines.append(f"| {r['dtype']} | {r['S']} | {r['op']} | error: "
                         f"{r['error'].replace('|', '/')} | | | | | | | |")
            continue
        lines.append(
            f"| {r['dtype']} | {r['S']} | {r['op']} | {r['ms']:.4f} | {r['gbs']:.0f} | "
            f"{r['pct_copy']:.1f} | {r['floor_ms']:.4f} | {r.get('vs_eager', float('nan')):.2f}x | "
            f"{r.get('vs_compile', float('nan')):.2f}x | {'yes' if r['bitwise'] else 'NO'} | "
            f"{r['host_us']:.1f} |")
    return "\n".join(lines) + "\n"


def finish(args, meta, rows, report, xj, **json_extra):
    """Writes the markdown report and the JSON (meta, json_extra, rows) where asked, prints the
    report; the exit status: 2 without exactjit, 1 if a row has an error, else 0."""
    if args.report:
        with open(args.report, "w") as f:
            f.write(report)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(meta, **json_extra, rows=rows), f, indent=1)
    log("")
    log(report)
    if xj is None:
        return 2
    return 1 if any("error" in r for r in rows) else 0


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dtypes", default="bf16", help="comma-separated: bf16,fp16,fp32")
    p.add_argument("--sizes", default="4097,32768,131072", help="comma-separated S values")
    p.add_argument("--hidden", type=int, default=5376)
    p.add_argument("--reps", type=int, default=50, help="timed batches per op (median; fewer than 50 are raised to 50)")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--report", help="markdown report path")
    p.add_argument("--json", help="JSON report path")
    args = p.parse_args()
    args.reps = max(args.reps, 50)
    dtypes = [d for d in args.dtypes.split(",") if d]
    sizes = [int(v) for v in args.sizes.split(",") if v]

    t_start = time.perf_counter()
    meta = dict(commit=git_commit(), torch=torch.__version__,
                device=torch.cuda.get_device_name(), hidden=args.hidden, B=1,
                table=f"(3T, 6H) view of (T, 18H), T={T}, chunk {CHUNK}, index int64",
                reps=args.reps)
    xj = load_exactjit(meta)

    rows = []
    with torch.no_grad():
        timer = Timer(args.reps)
        copy_gbs = measure_copy(timer, meta)
        ops = make_ops(xj)
        for dtype_name in dtypes:
            for s in sizes:
                rows += bench_case(timer, xj, ops, dtype_name, s, args.hidden, args.seed, copy_gbs)
        for s in sizes:
            rows += bench_row_gather(timer, xj, s, args.hidden, args.seed, copy_gbs)
        if xj is not None:
            for s in sizes:
                rows += bench_rms_norm(timer, xj, s, args.hidden, args.seed, copy_gbs)
            for s in sizes:
                rows += bench_gate_residual_rms_norm(timer, xj, s, args.hidden, args.seed, copy_gbs)
    meta["seconds"] = round(time.perf_counter() - t_start, 1)

    return finish(args, meta, rows, markdown(meta, rows), xj, copy_gbs=copy_gbs)


if __name__ == "__main__":
    sys.exit(main())
