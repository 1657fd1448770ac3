#!/usr/bin/env python3
"""Where the GPU time of a forward + backward step goes, kernel by kernel (GPU machine).

For each case (bf16, H = 5376, the AdaLN table (T, 18H) viewed (3T, 6H)), runs --steps training
steps (one forward, one torch.autograd.grad of a fixed upstream gradient) under torch.profiler
with CUDA activity, and lists every kernel's mean GPU time per step and its share of the step:
  rms_norm+mod+w   rms_norm(x, weight) * (1 + scale[i]) + shift[i]: gradients for x, weight, table
  rms_norm+mod     the same without a weight (the DiT block's norm1/norm2)
  rms_norm+w       plain rms_norm with a weight: gradients for x and weight
  gate_residual    residual + gate[i] * y: gradients for residual, y and the table
  gate_residual+rms_norm+mod+w
                   the fused op (h = residual + gate[i] * y, out = the modulated, weighted norm of h),
                   upstream gradients for out and h: gradients for residual, y, the table, weight
exactjit's kernels carry their entry names (op, dtype, shape), PyTorch's their own: the autograd
glue around the ops (the table view's slice backward, zero fills) shows up beside them. A kernel
under its floor share is what docs/perf-notes.md's next step names.

  python3 bench/profile_backward_kernels.py [--sizes 4097,131072] [--steps 20] [--cases a,b] [--report r.md]
"""
import argparse
import os
import sys
from collections import defaultdict

BENCH = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, BENCH)

import torch  # noqa: E402

from bench_forward import EPS, T, git_commit, log  # noqa: E402


def cases(xj, s, h, dtype, gen):
    x = torch.randn((s, h), generator=gen, device="cuda", dtype=dtype)
    y = torch.randn((s, h), generator=gen, device="cuda", dtype=dtype)
    table = torch.randn((T, 18 * h), generator=gen, device="cuda", dtype=dtype)
    weight = (1 + 0.1 * torch.randn((h,), generator=gen, device="cuda")).to(dtype)
    index = torch.randint(0, 3 * T, (s,), generator=gen, device="cuda", dtype=torch.int64)
    grad = torch.randn((s, h), generator=gen, device="cuda", dtype=dtype)
    grad_h = torch.randn((s, h), generator=gen, device="cuda", dtype=dtype)

    def rms(with_weight, modulated):
        def step():
            xr = x.detach().requires_grad_()
            tr = table.detach().requires_grad_()
            wr = weight.detach().requires_grad_() if with_weight else None
            rows = tr.view(3 * T, 6 * h)
            kwargs = dict(shift=rows[:, :h], scale=rows[:, h:2 * h], index=index) if modulated else {}
            out = xj.rms_norm(xr, wr, EPS, **kwargs)
            inputs = [t for t in (xr, wr, tr if modulated else None) if t is not None]
            return torch.autograd.grad(out, inputs, grad)
        return step

    def gate():
        residual = x.detach().requires_grad_()
        yr = y.detach().requires_grad_()
        tr = table.detach().requires_grad_()
        out = xj.gate_residual(residual, tr.view(3 * T, 6 * h)[:, 2 * h:3 * h], index, yr)
        return torch.autograd.grad(out, (residual, yr, tr), grad)

    def fused():
        # The block's case: h flows on (its gradient given) and feeds the modulated, weighted norm.
        # grad_h is a tensor of its own: were it y, a kernel reading both would find half in L2.
        residual = x.detach().requires_grad_()
        yr = y.detach().requires_grad_()
        tr = table.detach().requires_grad_()
        wr = weight.detach().requires_grad_()
        rows = tr.view(3 * T, 6 * h)
        h_out, out = xj.gate_residual_rms_norm(residual, rows[:, 2 * h:3 * h], index, yr, wr, EPS,
                                               shift=rows[:, 3 * h:4 * h], scale=rows[:, 4 * h:5 * h])
        return torch.autograd.grad((out, h_out), (residual, yr, tr, wr), (grad, grad_h))

    return {"rms_norm+mod+w": rms(True, True), "rms_norm+mod": rms(False, True), "rms_norm+w": rms(True, False),
            "gate_residual": gate, "gate_residual+rms_norm+mod+w": fused}


def kernel_times(step, steps):
    """{kernel name: (mean GPU us per step, launches per step)} over `steps` steps."""
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    total, count = defaultdict(float), defaultdict(int)
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            total[event.name] += event.device_time
            count[event.name] += 1
    return {name: (total[name] / steps, count[name] / steps) for name in total}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="4097,131072")
    p.add_argument("--hidden", type=int, default=5376)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--cases", help="comma-separated case names (default: all)")
    p.add_argument("--report")
    args = p.parse_args()
    import exactjit as xj
    lines = ["# Kernel time per forward + backward step", "", f"- commit: {git_commit()}",
             f"- device: {torch.cuda.get_device_name()}", f"- H: {args.hidden}, bf16, T = {T}, {args.steps} steps", ""]
    gen = torch.Generator(device="cuda").manual_seed(99)
    for s in (int(v) for v in args.sizes.split(",")):
        for name, step in cases(xj, s, args.hidden, torch.bfloat16, gen).items():
            if args.cases and name not in args.cases.split(","):
                continue
            times = kernel_times(step, args.steps)
            step_us = sum(us for us, _ in times.values())
            lines += [f"## {name}, S = {s}: {step_us:.1f} us of kernels per step", "",
                      "| kernel | us per step | launches | share |", "|---|---|---|---|"]
            for kernel, (us, n) in sorted(times.items(), key=lambda kv: -kv[1][0]):
                lines.append(f"| `{kernel[:90]}` | {us:.1f} | {n:g} | {100 * us / step_us:.1f} % |")
            lines.append("")
            log(f"{name} S={s}: {step_us:.1f} us")
    text = "\n".join(lines) + "\n"
    if args.report:
        with open(args.report, "w") as f:
            f.write(text)
    print(text)


if __name__ == "__main__":
    main()
