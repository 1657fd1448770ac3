#!/usr/bin/env python3
"""SHA-256 digests of exactjit's backward gradients at full size, on the GPU machine: run it with
two builds (EXACTJIT_LIBRARY) or two kernel paths and compare the JSON, so a change that must keep
the bits (a faster kernel for the same order) is checked where it runs, not only at test sizes.
Cases (bf16, H = --hidden, B = 1, T = 3 timesteps of a (T, 18H) AdaLN table viewed (3T, 6H), a
packed index of video/text/audio positions, fixed seeds):
  rms_norm+mod      norm(x) * (1 + scale[index]) + shift[index]; grads of x and the table
  rms_norm+mod+w    the same with the norm weight; grads of x, the table and the weight
  gate_residual+rms_norm+mod
                    gate_residual_rms_norm with upstream gradients for h and out; grads of
                    residual, the table, y and the weight
  python3 tests/gpu/backward_digest.py [--sizes 4097,131072] [--hidden 5376] [--out digests.json]
  python3 tests/gpu/backward_digest.py --compare a.json b.json     (exit 1 if any digest differs)
"""
import argparse
import hashlib
import json
import os
import sys

torch = xj = None  # imported by main() where it runs cases (--compare needs neither)

T = 3
EPS = 1e-6


def digest(t):
    return hashlib.sha256(t.detach().contiguous().view(-1).view(torch.uint8).cpu().numpy().tobytes()).hexdigest()


def inputs(gen, s, h):
    def randn(*shape):
        return torch.randn(shape, generator=gen, device="cuda", dtype=torch.bfloat16)
    table = randn(T, 18 * h)
    index = torch.randint(0, 3 * T, (s,), generator=gen, device="cuda")
    return table, index, randn(h).mul_(0.1).add_(1), randn(s, h), randn(s, h), randn(s, h), randn(s, h)


def chunks(table, h):
    rows = table.view(3 * T, 6 * h)
    return [rows[:, c * h:(c + 1) * h] for c in range(6)]


def run_case(case, s, h, seed):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    table, index, weight, x, y, grad_out, grad_h = inputs(gen, s, h)
    table.requires_grad_(True)
    x.requires_grad_(True)
    weighted = case != "rms_norm+mod"
    if weighted:
        weight.requires_grad_(True)
    if case == "gate_residual+rms_norm+mod":
        y.requires_grad_(True)
        _, _, gate, shift, scale, _ = chunks(table, h)
        h_out, out = xj.gate_residual_rms_norm(x, gate, index, y, weight, EPS, shift=shift, scale=scale)
        leaves = {"d_residual": x, "d_table": table, "d_y": y, "d_weight": weight}
        grads = torch.autograd.grad((h_out, out), tuple(leaves.values()), (grad_h, grad_out))
    else:
        shift, scale = chunks(table, h)[:2]
        out = xj.rms_norm(x, weight if weighted else None, EPS, shift=shift, scale=scale, index=index)
        leaves = {"dx": x, "d_table": table}
        if weighted:
            leaves["d_weight"] = weight
        grads = torch.autograd.grad(out, tuple(leaves.values()), grad_out)
    return {name: digest(g) for name, g in zip(leaves, grads)}


def compare(a_path, b_path):
    with open(a_path) as f:
        a = json.load(f)
    with open(b_path) as f:
        b = json.load(f)
    differ = 0
    for key in sorted(set(a["digests"]) | set(b["digests"])):
        same = a["digests"].get(key) == b["digests"].get(key)
        differ += not same
        print(f"{'same' if same else 'DIFFERS'}  {key}")
    print(f"{a_path} ({a['library']}) vs {b_path} ({b['library']}): {differ} of "
          f"{len(set(a['digests']) | set(b['digests']))} differ")
    return 1 if differ else 0


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="4097,131072")
    p.add_argument("--hidden", type=int, default=5376)
    p.add_argument("--out")
    p.add_argument("--compare", nargs=2, metavar=("A", "B"))
    args = p.parse_args()
    if args.compare:
        return compare(*args.compare)
    global torch, xj
    import torch
    import exactjit as xj
    digests = {}
    for s in (int(v) for v in args.sizes.split(",")):
        for seed, case in enumerate(("rms_norm+mod", "rms_norm+mod+w", "gate_residual+rms_norm+mod")):
            for name, value in run_case(case, s, args.hidden, 1000 * s + seed).items():
                digests[f"{case} S={s} {name}"] = value
            torch.cuda.empty_cache()
    result = {"library": os.environ.get("EXACTJIT_LIBRARY", "default"), "digests": digests}
    text = json.dumps(result, indent=1, sort_keys=True)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
