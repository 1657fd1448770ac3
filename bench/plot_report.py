#!/usr/bin/env python3
"""Plots of the benchmark reports: for each op family (and dtype), median ms vs S (log-log) and %
of the measured copy bandwidth vs S, one line per implementation. Reads the JSON that
bench_forward.py and bench_backward.py write; writes one PNG per family. bench_det_linear.py's JSON
(--det-linear) gives one PNG: median ms per case (op, T) for each implementation beside the copy
floor, and exactjit's speed against cuBLAS.

  python3 bench/plot_report.py --forward bench.json --backward bench_backward.json --out docs/evidence/plots
  python3 bench/plot_report.py --det-linear det_linear.json --out docs/evidence/plots
"""
import argparse
import collections
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402

FORWARD_FAMILIES = ("adaln_row_gather", "gate_residual+rms_norm+mod", "rms_norm+mod", "rms_norm")


def forward_series(report):
    """{(family, dtype): {impl: [(S, ms, pct)]}} from bench_forward.py rows, whose 'op' is either
    an implementation of gate_residual ('exactjit', 'eager', ...) or '<family> <implementation>'."""
    series = collections.defaultdict(lambda: collections.defaultdict(list))
    for row in report["rows"]:
        if "ms" not in row:
            continue
        family, impl = "gate_residual", row["op"]
        for name in FORWARD_FAMILIES:
            if row["op"].startswith(name + " "):
                family, impl = name, row["op"][len(name) + 1:]
                break
        series[(family, row["dtype"])][impl].append((row["S"], row["ms"], row["pct_copy"]))
    return series


def backward_series(report):
    series = collections.defaultdict(lambda: collections.defaultdict(list))
    for row in report["rows"]:
        if "ms" in row:
            series[(row["op"] + " " + row.get("timed", "fwd+bwd"), row["dtype"])][row["impl"]].append(
                (row["S"], row["ms"], row["pct_copy"]))
    return series


def plot(family, dtype, impls, meta, out_dir):
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for impl, points in sorted(impls.items()):
        points.sort()
        s = [p[0] for p in points]
        style = dict(marker="o", linewidth=2.2 if impl == "exactjit" else 1.2)
        left.plot(s, [p[1] for p in points], label=impl, **style)
        right.plot(s, [p[2] for p in points], label=impl, **style)
    left.set(xscale="log", yscale="log", xlabel="S (tokens)", ylabel="median ms", title=f"{family} ({dtype})")
    right.set(xscale="log", xlabel="S (tokens)", ylabel="% of copy bandwidth", title="bytes moved / time / copy rate")
    right.axhline(100, color="gray", linewidth=0.8, linestyle="--")
    for ax in (left, right):
        ax.grid(True, which="both", alpha=0.3)
    left.legend(fontsize=8)
    fig.suptitle(f"{meta.get('device', '?')}, commit {str(meta.get('commit', '?'))[:10]}", fontsize=9)
    fig.tight_layout()
    name = f"{family.replace('+', '_').replace(' ', '_')}_{dtype}.png"
    path = os.path.join(out_dir, name)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_det_linear(report, out_dir):
    cases = []  # (op, T) in report order
    ms = collections.defaultdict(dict)
    floor = {}
    for row in report["rows"]:
        if "ms" not in row:
            continue
        case = (row["op"], row["T"])
        if case not in ms:
            cases.append(case)
        ms[case][row["impl"]] = row["ms"]
        floor[case] = row["floor_ms"]
    impls = sorted({impl for case in cases for impl in ms[case]})
    labels = [f"{op}\nT={t}" for op, t in cases]
    fig, (left, right) = plt.subplots(1, 2, figsize=(14, 4.8), gridspec_kw={"width_ratios": [3, 2]})
    width = 0.8 / len(impls)
    for i, impl in enumerate(impls):
        left.bar([c + (i - (len(impls) - 1) / 2) * width for c in range(len(cases))],
                 [ms[case].get(impl, 0) for case in cases], width, label=impl)
    left.scatter(range(len(cases)), [floor[case] for case in cases], marker="_", s=300, color="black",
                 label="copy floor", zorder=3)
    left.set(yscale="log", ylabel="median ms", title="det_linear: median ms per case")
    left.set_xticks(range(len(cases)), labels, fontsize=6, rotation=60)
    left.legend(fontsize=8)
    ratios = [ms[case]["cuBLAS (eager)"] / ms[case]["exactjit"] if {"cuBLAS (eager)", "exactjit"} <= ms[case].keys()
              else 0 for case in cases]
    right.bar(range(len(cases)), ratios, color=["tab:green" if r >= 1 else "tab:red" for r in ratios])
    right.axhline(1, color="gray", linewidth=0.8, linestyle="--")
    right.set(ylabel="cuBLAS ms / exactjit ms", title="speed against cuBLAS (> 1: faster)")
    right.set_xticks(range(len(cases)), labels, fontsize=6, rotation=60)
    for ax in (left, right):
        ax.grid(True, axis="y", which="both", alpha=0.3)
    fig.suptitle(f"{report.get('device', '?')}, commit {str(report.get('commit', '?'))[:10]}", fontsize=9)
    fig.tight_layout()
    path = os.path.join(out_dir, "det_linear.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--forward", help="bench_forward.py JSON")
    p.add_argument("--backward", help="bench_backward.py JSON")
    p.add_argument("--det-linear", help="bench_det_linear.py JSON")
    p.add_argument("--out", required=True, help="folder for the PNGs")
    args = p.parse_args()
    if not (args.forward or args.backward or args.det_linear):
        p.error("give --forward, --backward and/or --det-linear")
    os.makedirs(args.out, exist_ok=True)
    written = []
    for path, series_of in ((args.forward, forward_series), (args.backward, backward_series)):
        if not path:
            continue
        with open(path) as f:
            report = json.load(f)
        for (family, dtype), impls in sorted(series_of(report).items()):
            written.append(plot(family, dtype, impls, report, args.out))
    if args.det_linear:
        with open(args.det_linear) as f:
            written.append(plot_det_linear(json.load(f), args.out))
    for path in written:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
