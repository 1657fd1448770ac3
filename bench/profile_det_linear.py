#!/usr/bin/env python3
"""det_linear's GPU time kernel by kernel, next to cuBLAS's (GPU machine).

Under torch.profiler with CUDA activity, --steps calls of each case, every kernel's mean GPU time
per call (us), exactjit's and eager's (F.linear, cuBLAS) in the same process:
  the memory floors of the 18H projection's weight bytes (520 MB bf16): a write (`fill_`), a
  read (`sum`) and a copy (`clone`: the bytes the backward's one pass moves);
  the AdaLN projections (rT(silu(temb)) @ W^T + b, bf16 W: 18H = 96768 and 2H = 10752 outputs,
  K = 2688) forward at T = 1, 3, 8, and the 18H projection's forward + backward
  (torch.autograd.grad for temb, W and b from a bf16 table gradient);
  the timestep MLP (fp32, 256 -> 5376 + SiLU -> 2688) forward at T = 1, 3, 8.

  python3 bench/profile_det_linear.py [--steps 20] [--only-backward] > profile.txt
"""
import argparse
import sys

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

H, D, C = 5376, 2688, 256


def kernels(fn, steps, label):
    """Prints each CUDA kernel's mean time per call of fn (after 3 warm-up calls) and their sum."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            fn()
        torch.cuda.synchronize()
    totals = {}
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            name = event.name[:90]
            time, count = totals.get(name, (0.0, 0))
            totals[name] = (time + event.device_time_total, count + 1)
    print(f"== {label}")
    for name, (time, count) in sorted(totals.items(), key=lambda kv: -kv[1][0]):
        print(f"   {time / steps:9.1f} us/iter  x{count / steps:.0f}  {name}")
    print(f"   {sum(t for t, _ in totals.values()) / steps:9.1f} us/iter total", flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=20, help="profiled calls per case")
    p.add_argument("--only-backward", action="store_true", help="the floors and the 18H projection only")
    args = p.parse_args()
    import exactjit as xj

    gen = torch.Generator(device="cuda").manual_seed(1)
    floor = torch.empty(18 * H, D, device="cuda", dtype=torch.bfloat16)
    kernels(lambda: floor.fill_(1.0), args.steps, "write 520 MB (fill_)")
    kernels(lambda: floor.sum(dtype=torch.float32), args.steps, "read 520 MB (sum)")
    kernels(lambda: floor.clone(), args.steps, "copy 520 MB (clone)")
    del floor

    for n in (18 * H,) if args.only_backward else (18 * H, 2 * H):
        w = (torch.randn(n, D, generator=gen, device="cuda") / D ** 0.5).to(torch.bfloat16).requires_grad_()
        b = (torch.randn(n, generator=gen, device="cuda") * 0.1).to(torch.bfloat16).requires_grad_()
        for t in (1, 3, 8):
            temb = torch.randn(t, D, generator=gen, device="cuda").requires_grad_()
            g = torch.randn(t, n, generator=gen, device="cuda").to(torch.bfloat16)
            eager = lambda temb, w, b: F.linear(F.silu(temb).to(torch.bfloat16), w, b)  # noqa: E731
            for impl, proj in (("xj", xj.adaln_projection), ("eager", eager)):
                with torch.no_grad():
                    kernels(lambda: proj(temb, w, b), args.steps, f"{impl} fwd N={n} T={t}")
                if n == 18 * H:
                    kernels(lambda: torch.autograd.grad(proj(temb, w, b), (temb, w, b), g), args.steps,
                            f"{impl} fwd+bwd N={n} T={t}")
    if args.only_backward:
        return 0

    w1 = torch.randn(2 * D, C, generator=gen, device="cuda") / C ** 0.5
    w2 = torch.randn(D, 2 * D, generator=gen, device="cuda") / (2 * D) ** 0.5
    b1 = torch.randn(2 * D, generator=gen, device="cuda") * 0.1
    b2 = torch.randn(D, generator=gen, device="cuda") * 0.1
    for t in (1, 3, 8):
        x = torch.randn(t, C, generator=gen, device="cuda")
        with torch.no_grad():
            kernels(lambda: xj.timestep_mlp(x, w1, b1, w2, b2), args.steps, f"xj mlp T={t}")
            kernels(lambda: F.linear(F.silu(F.linear(x, w1, b1)), w2, b2), args.steps, f"eager mlp T={t}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
