#!/usr/bin/env python3
"""End to end: diffusers' MiniMax-H3 transformer with and without exactjit, on the GPU machine.

The model and inputs are bench/minimax_h3_setup.py's (full width H 5376, 2 blocks, 1 refiner block,
bf16 with the fp32 modules of the checkpoint; one packed sequence of S rows, T = 3). Variants:
  eager            the model as diffusers runs it
  patched          exactjit.integrations.diffusers.apply(model), default options (bitwise equal to eager)
  eager det        eager under torch.use_deterministic_algorithms(True) (CUBLAS_WORKSPACE_CONFIG set;
                   as shipped, that mode also fills every torch.empty, which is part of its cost)
  patched det      patched, the same
  compile          torch.compile(model, dynamic=False)
  compile+patched  apply(model), then torch.compile(model, dynamic=False)
each in two modes: forward (torch.no_grad) and train (forward, then backward of a fixed upstream
gradient into every parameter, with .grad set to None at the start of each step). Compiled variants
run at --compile-sizes only (default: the first size), so that the default run, compilation
included, stays within about 5 minutes; each compiles afresh (torch._dynamo.reset()).

Timing: --warmup steps (the first, compilation included, is reported as "first step s"), then --reps
reps of N back-to-back steps between two CUDA events, N such that a rep lasts about 0.2 s (1 to
100); the median ms per step. Nothing hides the host: a step whose launches cannot keep ahead of the GPU shows it.
Peak memory: torch.cuda.max_memory_allocated over one step after reset_peak_memory_stats, weights
included (their size is in the header). A variant that fails (out of memory, a compile error, an op
without a deterministic implementation) is a failed row; the next one runs.

--profile: torch.profiler over one eager and one patched forward step at the first size, after
warm-up; the report gets the top 25 ops by self CPU time, to show where host time goes.

  python3 bench/bench_e2e.py [--sizes 4097,32768] [--compile-sizes 4097] [--reps 5] [--compile-reps 3]
      [--report e2e.md] [--json e2e.json] [--plot e2e.png] [--profile]
Exit status: 0 every variant ran, 1 a variant failed, 2 exactjit, diffusers or CUDA unavailable.
"""
import os

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # before torch initialises cuBLAS

import argparse  # noqa: E402
import contextlib  # noqa: E402
import gc  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))
sys.path.insert(0, HERE)  # minimax_h3_setup.py

import torch  # noqa: E402

import minimax_h3_setup as setup  # noqa: E402

VARIANTS = ("eager", "patched", "eager det", "patched det", "compile", "compile+patched")
MODES = ("forward", "train")
REP_SECONDS = 0.2


def log(*args):
    print(*args, flush=True)


@contextlib.contextmanager
def variant(name, model, xjd):
    """model set up as variant `name` runs it; yields what to call. Undone on exit."""
    patch, det, compiled = "patched" in name, name.endswith(" det"), name.startswith("compile")
    if patch:
        xjd.apply(model)
    torch.use_deterministic_algorithms(det)
    try:
        if compiled:
            torch._dynamo.reset()
            yield torch.compile(model, dynamic=False)
        else:
            yield model
    finally:
        torch.use_deterministic_algorithms(False)
        model.zero_grad(set_to_none=True)
        if compiled:
            torch._dynamo.reset()
        if patch:
            xjd.remove(model)


def make_step(fn, model, inputs, mode, upstream):
    if mode == "forward":
        def step():
            with torch.no_grad():
                fn(**inputs)
    else:
        def step():
            model.zero_grad(set_to_none=True)
            torch.autograd.backward(fn(**inputs), upstream)
    return step


def measure(step, reps, warmup):
    """{ms (median per step), ms_min, steps_per_rep, peak_gib, first_step_s} (see the module doc)."""
    t0 = time.perf_counter()
    step()
    torch.cuda.synchronize()
    first = time.perf_counter() - t0
    for _ in range(warmup - 1):
        step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    step()
    torch.cuda.synchronize()
    one = time.perf_counter() - t0
    peak = torch.cuda.max_memory_allocated()
    n = min(100, max(1, round(REP_SECONDS / one)))
    per_step = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(n):
            step()
        end.record()
        end.synchronize()
        per_step.append(start.elapsed_time(end) / n)
    return dict(ms=statistics.median(per_step), ms_min=min(per_step), steps_per_rep=n, peak_gib=peak / 2 ** 30,
                first_step_s=first)


def run_variant(name, model, xjd, inputs, mode, upstream, reps, warmup):
    """One row: the measurement, or status "failed: ..." (e.g. out of memory)."""
    t0 = time.perf_counter()
    try:
        with variant(name, model, xjd) as fn:
            row = dict(status="ok", **measure(make_step(fn, model, inputs, mode, upstream), reps, warmup))
    except Exception as e:
        if not isinstance(e, torch.OutOfMemoryError):
            traceback.print_exc()
        row = dict(status=f"failed: {type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}")
    gc.collect()
    torch.cuda.empty_cache()
    row["seconds"] = round(time.perf_counter() - t0, 1)
    return row


def profile(model, xjd, inputs, warmup):
    """{variant: top-25 table by self CPU time} of one forward step, eager and patched."""
    tables = {}
    for name in ("eager", "patched"):
        with variant(name, model, xjd) as fn:
            step = make_step(fn, model, inputs, "forward", None)
            for _ in range(warmup):
                step()
            torch.cuda.synchronize()
            activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
            with torch.profiler.profile(activities=activities) as prof:
                step()
                torch.cuda.synchronize()
        tables[name] = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25)
        log(f"\nprofile, {name} forward:\n{tables[name]}")
    return tables


def add_ratios(rows):
    """vs_eager: ms / eager's ms at the same size and mode."""
    eager = {(r["S"], r["mode"]): r["ms"] for r in rows if r["variant"] == "eager" and "ms" in r}
    for r in rows:
        base = eager.get((r["S"], r["mode"]))
        if "ms" in r and base:
            r["vs_eager"] = r["ms"] / base


def write_report(path, meta, rows, tables):
    lines = ["# MiniMax-H3 end to end (diffusers, 2 blocks, H 5376, bf16): eager vs exactjit", "",
             *(f"- {k}: {v}" for k, v in meta.items()), "",
             "| S | mode | variant | ms/step | vs eager | steps/rep | peak GiB | first step s | status |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        def f(key, spec):
            return format(r[key], spec) if key in r else ""
        lines.append(f"| {r['S']} | {r['mode']} | {r['variant']} | {f('ms', '.2f')} | {f('vs_eager', '.3f')} | "
                     f"{f('steps_per_rep', 'd')} | {f('peak_gib', '.2f')} | {f('first_step_s', '.1f')} | "
                     f"{r['status']} |")
    for name, table in tables.items():
        lines += ["", f"## Host-side profile: one {name} forward step, S = {meta['sizes'][0]}, top 25 by self CPU time",
                  "", "```", table, "```"]
    with open(path, "w") as out:
        out.write("\n".join(lines) + "\n")


def plot(path, meta, rows):
    import matplotlib
    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    sizes = meta["sizes"]
    fig, axes = plt.subplots(2, len(MODES), figsize=(6 * len(MODES), 8), squeeze=False)
    width = 0.8 / len(VARIANTS)
    for col, mode in enumerate(MODES):
        for k, name in enumerate(VARIANTS):
            points = [(sizes.index(r["S"]), r) for r in rows
                      if r["mode"] == mode and r["variant"] == name and "ms" in r]
            if not points:
                continue
            xs = [i + (k - (len(VARIANTS) - 1) / 2) * width for i, _ in points]
            axes[0][col].bar(xs, [r["ms"] for _, r in points], width, label=name)
            axes[1][col].bar(xs, [r["peak_gib"] for _, r in points], width, label=name)
        for row, ylabel in ((0, "ms per step (median)"), (1, "peak GiB")):
            ax = axes[row][col]
            ax.set_xticks(range(len(sizes)), [f"S={s}" for s in sizes])
            ax.set(ylabel=ylabel, title=f"{mode}")
            ax.grid(True, axis="y", alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.suptitle(f"MiniMax-H3 2 blocks, {meta.get('device', '?')}, commit {str(meta.get('commit', '?'))[:10]}",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", default="4097,32768", help="comma-separated S values")
    p.add_argument("--compile-sizes", default=None, help="S values for the compiled variants (default: the first)")
    p.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated: " + ",".join(VARIANTS))
    p.add_argument("--reps", type=int, default=5, help="timed reps per variant (median)")
    p.add_argument("--compile-reps", type=int, default=3, help="timed reps of the compiled variants")
    p.add_argument("--warmup", type=int, default=3, help="steps before timing (the first compiles)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--profile", action="store_true", help="host-side profile of one eager and one patched forward")
    p.add_argument("--report", help="markdown report path")
    p.add_argument("--json", help="JSON report path")
    p.add_argument("--plot", help="PNG path (needs matplotlib)")
    args = p.parse_args()
    sizes = [int(v) for v in args.sizes.split(",") if v]
    compile_sizes = [int(v) for v in args.compile_sizes.split(",") if v] if args.compile_sizes else sizes[:1]
    variants = [v for v in args.variants.split(",") if v]
    unknown = set(variants) - set(VARIANTS)
    if unknown:
        p.error(f"unknown variants {sorted(unknown)}; choose from {', '.join(VARIANTS)}")

    t0 = time.perf_counter()
    meta = dict(commit=os.environ.get("EXACTJIT_COMMIT", "unknown"), torch=torch.__version__, sizes=sizes,
                compile_sizes=compile_sizes, reps=args.reps, compile_reps=args.compile_reps, warmup=args.warmup,
                depth=setup.DEPTH, timesteps=setup.TIMESTEPS)
    try:
        import diffusers

        import exactjit
        from exactjit.integrations import diffusers as xjd
        if not torch.cuda.is_available():
            raise RuntimeError("torch sees no CUDA device")
        from exactjit import _extension, ops  # noqa: F401 - registers the operators, loads the extension
        meta.update(diffusers=diffusers.__version__, exactjit=exactjit.version(), device=torch.cuda.get_device_name(),
                    extension=_extension.path or f"not loaded ({_extension.reason})")
        model = setup.build_model(torch.bfloat16, device="cuda", seed=args.seed)
    except Exception as e:
        log(f"cannot run: {type(e).__name__}: {e}")
        return 2
    meta["weights_gib"] = round(sum(p.numel() * p.element_size() for p in model.parameters()) / 2 ** 30, 2)
    log(", ".join(f"{k} {v}" for k, v in meta.items()))

    rows, tables = [], {}
    for size in sizes:
        inputs = setup.packed_inputs(model, size, seed=args.seed)
        with torch.no_grad():
            upstream = setup.upstream(model(**inputs))
        if args.profile and size == sizes[0]:
            tables = profile(model, xjd, inputs, args.warmup)
        for mode in MODES:
            model.requires_grad_(mode == "train")
            for name in variants:
                compiled = name.startswith("compile")
                if compiled and size not in compile_sizes:
                    continue
                row = dict(S=size, mode=mode, variant=name)
                row.update(run_variant(name, model, xjd, inputs, mode, upstream,
                                       args.compile_reps if compiled else args.reps, args.warmup))
                rows.append(row)
                result = (f"{row['ms']:9.2f} ms/step  peak {row['peak_gib']:6.2f} GiB  first step "
                          f"{row['first_step_s']:.1f} s" if "ms" in row else row["status"])
                log(f"S={size:<6} {mode:<8} {name:<16} {result}  ({row['seconds']} s)")
        del inputs, upstream
        torch.cuda.empty_cache()
    add_ratios(rows)
    meta["seconds"] = round(time.perf_counter() - t0, 1)

    if args.json:
        with open(args.json, "w") as out:
            json.dump(dict(meta, rows=rows, profile=tables), out, indent=1)
    if args.report:
        write_report(args.report, meta, rows, tables)
    if args.plot:
        plot(args.plot, meta, rows)
    log(f"\n{'S':>6} {'mode':<8} {'variant':<16} {'ms/step':>9} {'vs eager':>8} {'peak GiB':>9}  status")
    for r in rows:
        ms = f"{r['ms']:9.2f} {r.get('vs_eager', float('nan')):8.3f} {r['peak_gib']:9.2f}" if "ms" in r else " " * 28
        log(f"{r['S']:>6} {r['mode']:<8} {r['variant']:<16} {ms}  {r['status']}")
    log(f"\nbench_e2e.py took {meta['seconds']} s")
    return 1 if any(r["status"] != "ok" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
