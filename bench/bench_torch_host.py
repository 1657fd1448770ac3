#!/usr/bin/env python3
"""Host cost of exactjit's PyTorch entry points, next to eager, on the GPU machine.

Three numbers per case, each the median over --reps batches of --calls calls:
  host us   Python time to issue one call while the GPU is kept busy by a torch.cuda._sleep queued
            first (so no call ever waits for the GPU): what the call costs the CPU
  GPU us    CUDA events around the same batch: the device time of one call once the host is ahead
  wall us   one call back to back with nothing queued ahead, synchronised once after the batch:
            what a training loop sees, max(host, GPU) when they overlap
Paths (which code the number comes from):
  public    exactjit.<op>(...) as a user calls it: in eager, the eager shortcut (see _ops._direct):
            the implementation called directly, or with grad the op's autograd.Function, no
            dispatcher. The implementation is the C++ kernel of libexactjit_torch.so where it is
            loaded (one hop through the dispatcher's CUDA key), else the Python one over ctypes
  public (ctypes)  the same with the Python implementations, as a build without the extension
            runs (only measured when the extension is loaded)
  operator  torch.ops.exactjit.<op>.default(...): the dispatcher, the registered autograd kernel
            (no grad needed here, so it redispatches) and the implementation, C++ where loaded
            (what compiled graphs call)
  raw       Runtime._<op> alone (the ctypes launch with its DLTensor packing, no torch layer)
  eager     the eager PyTorch expression exactjit replaces
Forward cases run under torch.no_grad at S = 4097 (host cost does not depend on S); fwd+bwd cases
are one forward plus torch.autograd.grad of a fixed upstream gradient at S = 4097, H = 5376,
bf16, with gradients for every trainable input (x or residual and y, the AdaLN table, the norm
weight where the module has one).
Targets (issue 13): forward <= 8 us host; fwd+bwd wall <= 250 us (gate_residual) and <= 300 us
(rms_norm + modulation).

  python3 bench/bench_torch_host.py [--calls 100] [--reps 30] [--report r.md] [--json r.json] [--profile]
"""
import argparse
import contextlib
import json
import os
import statistics
import sys
import time

import torch

H, T, S, EPS = 5376, 3, 4097, 1e-5
TARGETS_US = {"forward": 8.0, "gate_residual fwd+bwd": 250.0, "rms_norm+mod fwd+bwd": 300.0}


@contextlib.contextmanager
def ctypes_path():
    """The public functions on the Python implementations even where the extension is loaded:
    what a build without it runs."""
    from exactjit import _extension
    saved, _extension.path = _extension.path, None
    try:
        yield
    finally:
        _extension.path = saved


def with_ctypes(paths):
    """`paths` plus a "public (ctypes)" entry where the extension is loaded."""
    from exactjit import _extension
    if _extension.path is None or "public" not in paths:
        return paths
    out = {}
    for name, fn in paths.items():
        out[name] = fn
        if name == "public":
            out["public (ctypes)"] = fn
    return out


def timed(path, fn, calls, reps):
    with ctypes_path() if path == "public (ctypes)" else contextlib.nullcontext():
        return measure(fn, calls, reps)


def log(*args):
    print(*args, flush=True)


def measure(fn, calls, reps):
    """(host us, GPU us, wall us) per call of fn, medians over reps batches of `calls` calls."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    host, gpu, wall = [], [], []
    for _ in range(reps):
        torch.cuda._sleep(int(2e7))  # ~10 ms of GPU time queued ahead: the batch below never waits
        start.record()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        host.append((time.perf_counter() - t0) / calls * 1e6)
        end.record()
        torch.cuda.synchronize()
        gpu.append(start.elapsed_time(end) / calls * 1e3)
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        wall.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(host), statistics.median(gpu), statistics.median(wall)


class Inputs:
    def __init__(self, s=S):
        gen = torch.Generator(device="cuda").manual_seed(7)
        self.x = torch.randn((1, s, H), generator=gen, device="cuda", dtype=torch.bfloat16)
        self.y = torch.randn((1, s, H), generator=gen, device="cuda", dtype=torch.bfloat16)
        self.table = torch.randn((T, 18 * H), generator=gen, device="cuda", dtype=torch.bfloat16) * 0.1
        self.weight = 1 + 0.1 * torch.randn((H,), generator=gen, device="cuda", dtype=torch.bfloat16)
        self.index = torch.randint(0, 3 * T, (s,), generator=gen, device="cuda")
        self.t = torch.rand((T,), generator=gen, device="cuda")
        self.grad = torch.randn((1, s, H), generator=gen, device="cuda", dtype=torch.bfloat16)

    def chunks(self, table=None):
        return (self.table if table is None else table).view(3 * T, 6 * H).chunk(6, dim=-1)


def forward_cases(xj, inp):
    rt = xj.runtime()
    shift, scale, gate = inp.chunks()[:3]
    x, y, idx, w = inp.x, inp.y, inp.index, inp.weight
    ops = torch.ops.exactjit
    rows = inp.table.view(3 * T, 6 * H)
    ti, tags = idx // 3, idx % 3
    return {
        "gate_residual": {
            "public": lambda: xj.gate_residual(x, gate, idx, y),
            "operator": lambda: ops.gate_residual.default(x, gate, idx, y),
            "raw": lambda: rt._gate_residual(x, gate, idx, y, None),
            "eager": lambda: x + gate.index_select(0, idx) * y,
        },
        "rms_norm (weight)": {
            "public": lambda: xj.rms_norm(x, w, EPS),
            "operator": lambda: ops.rms_norm.default(x, w, EPS, None, None, None, False),
            "raw": lambda: rt._rms_norm(x, w, EPS, None, None, None, False),
            "eager": lambda: torch.nn.functional.rms_norm(x, (H,), w, EPS),
        },
        "rms_norm+mod (weight)": {
            "public": lambda: xj.rms_norm(x, w, EPS, shift=shift, scale=scale, index=idx),
            "operator": lambda: ops.rms_norm.default(x, w, EPS, shift, scale, idx, False),
            "raw": lambda: rt._rms_norm(x, w, EPS, shift, scale, idx, False),
            "eager": lambda: torch.nn.functional.rms_norm(x, (H,), w, EPS) * (1 + scale.index_select(0, idx))
            + shift.index_select(0, idx),
        },
        "adaln_row_gather": {
            "public": lambda: xj.adaln_row_gather(rows, ti, tags),
            "operator": lambda: ops.adaln_row_gather.default(rows, ti, tags),
            "raw": lambda: rt._adaln_row_gather(rows, ti, tags),
            "eager": lambda: [c.index_select(0, idx) for c in rows.chunk(6, dim=-1)],
        },
        "timestep_sinusoid": {
            "public": lambda: xj.timestep_sinusoid(inp.t, 256),
            "operator": lambda: ops.timestep_sinusoid.default(inp.t, 256, 10000.0, True, 0.0, 1.0, False),
            "raw": lambda: rt._timestep_sinusoid(inp.t, 256, 10000, True, 0, 1.0, False),
        },
        "one eager op (torch.add)": {"eager": lambda: torch.add(x, y)},
    }


def training_cases(xj, inp):
    """fwd+bwd steps: each builds a new autograd graph and takes torch.autograd.grad of it."""
    x = inp.x.clone().requires_grad_()
    y = inp.y.clone().requires_grad_()
    table = inp.table.clone().requires_grad_()
    weight = inp.weight.clone().requires_grad_()
    idx, grad = inp.index, inp.grad

    def gate_step(forward):
        def step():
            gate = table.view(3 * T, 6 * H)[:, 2 * H:3 * H]
            return torch.autograd.grad(forward(x, gate, idx, y), (x, table, y), grad)
        return step

    def rms_step(forward):
        def step():
            shift, scale = table.view(3 * T, 6 * H).chunk(6, dim=-1)[:2]
            return torch.autograd.grad(forward(x, weight, shift, scale), (x, table, weight), grad)
        return step

    def rms_eager(x, w, shift, scale):
        return torch.nn.functional.rms_norm(x, (H,), w, EPS) * (1 + scale.index_select(0, idx)) + shift.index_select(
            0, idx)

    rt = xj.runtime()
    gate = table.view(3 * T, 6 * H)[:, 2 * H:3 * H]
    return {
        "gate_residual fwd+bwd": {
            "public": gate_step(xj.gate_residual),
            "eager": gate_step(lambda x, g, i, y: x + g.index_select(0, i) * y),
        },
        # Where the fwd+bwd time goes: the forward alone (inputs requiring grad, graph recorded and
        # dropped) and the backward launch alone.
        "gate_residual fwd, grad recorded": {
            "public": lambda: xj.gate_residual(x, gate, idx, y),
            "eager": lambda: x + gate.index_select(0, idx) * y,
        },
        "gate_residual_backward": {
            "raw": lambda: rt.gate_residual_backward(grad, gate.detach(), idx, y.detach()),
        },
        # The floor any fwd+bwd step pays here: one eager op and its backward through the autograd
        # engine (which hands CUDA work to its device thread and waits for it).
        "x * 2 fwd+bwd (autograd floor)": {
            "eager": lambda: torch.autograd.grad(x * 2, (x,), grad),
        },
        "rms_norm+mod fwd+bwd": {
            "public": rms_step(lambda x, w, shift, scale: xj.rms_norm(x, w, EPS, shift=shift, scale=scale, index=idx)),
            "eager": rms_step(rms_eager),
        },
    }


def profile_table(step, rows=25):
    """torch.profiler's host-side table (self CPU time) of 20 steps after warm-up."""
    from torch.profiler import ProfilerActivity, profile
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(20):
            step()
        torch.cuda.synchronize()
    return prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--calls", type=int, default=100, help="calls per timed batch")
    p.add_argument("--reps", type=int, default=30, help="batches; medians are reported")
    p.add_argument("--report", help="markdown report path")
    p.add_argument("--json", help="JSON results path")
    p.add_argument("--profile", action="store_true", help="append torch.profiler host tables of the fwd+bwd steps")
    args = p.parse_args()
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python"))
    import exactjit as xj
    from exactjit import _extension, ops  # noqa: F401 - registers the operators, loads the extension
    meta = dict(commit=os.environ.get("EXACTJIT_COMMIT", "unknown"), torch=torch.__version__,
                device=torch.cuda.get_device_name(), library=xj.library_path(),
                extension=_extension.path or f"not loaded ({_extension.reason})", calls=args.calls, reps=args.reps,
                S=S, H=H, dtype="bf16")
    inp = Inputs()
    rows = []
    with torch.no_grad():
        for case, paths in forward_cases(xj, inp).items():
            for path, fn in with_ctypes(paths).items():
                host, gpu, wall = timed(path, fn, args.calls, args.reps)
                rows.append(dict(case=case, path=path, host_us=round(host, 2), gpu_us=round(gpu, 2),
                                 wall_us=round(wall, 2)))
                log(f"{case:<28} {path:<15} host {host:8.2f} us  GPU {gpu:8.2f} us  wall {wall:8.2f} us")
    profiles = {}
    for case, paths in training_cases(xj, inp).items():
        for path, fn in with_ctypes(paths).items():
            host, gpu, wall = timed(path, fn, max(args.calls // 10, 5), args.reps)
            rows.append(dict(case=case, path=path, host_us=round(host, 2), gpu_us=round(gpu, 2),
                             wall_us=round(wall, 2)))
            log(f"{case:<28} {path:<15} host {host:8.2f} us  GPU {gpu:8.2f} us  wall {wall:8.2f} us")
            if args.profile and "fwd+bwd" in case and path != "public (ctypes)":
                profiles[f"{case}, {path}"] = profile_table(fn)

    forward = set(forward_cases(xj, inp)) - {"one eager op (torch.add)"}

    def verdict(row):
        """Forward: host us of a public call; fwd+bwd: wall us back to back."""
        if row["path"] != "public" or (row["case"] not in forward and row["case"] not in TARGETS_US):
            return ""
        target = TARGETS_US.get(row["case"], TARGETS_US["forward"])
        value = row["wall_us"] if row["case"] in TARGETS_US else row["host_us"]
        return f"{'met' if value <= target else 'missed'} (<= {target:g})"

    lines = ["# Host cost of the PyTorch entry points", "", *(f"- {k}: {v}" for k, v in meta.items()), "",
             "| case | path | host us/call | GPU us/call | wall us/call back to back | target |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['case']} | {r['path']} | {r['host_us']:.2f} | {r['gpu_us']:.2f} | {r['wall_us']:.2f} | "
                     f"{verdict(r)} |")
    for name, table in profiles.items():
        lines += ["", f"## Host profile: {name} (20 steps)", "", "```", table, "```"]
    text = "\n".join(lines) + "\n"
    if args.report:
        with open(args.report, "w") as f:
            f.write(text)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(meta, rows=rows), f, indent=1)
    log(text if not args.profile else "\n".join(lines[:len(rows) + 12]))


if __name__ == "__main__":
    main()
