#!/usr/bin/env python3
"""det_linear forward and backward through torch.autograd on the GPU machine: the timestep MLP (fp32)
and the AdaLN projections (bf16 weights, 18H and 2H), against fp64 and eager/cuBLAS (F.linear).

For each case (T = 1, 3, 8 rows):
  * forward and every gradient (d_input, d_weight, d_bias) against an fp64 reference of the same
    expression (autograd in float64 on the same inputs; the projection's input is rT(silu(temb))
    as the forward computes it, so both sides see the same bf16 x); rel-L2 and max abs error for
    exactjit and for eager (F.linear in the weights' dtype, as shipped). A case FAILS if exactjit's
    rel-L2 exceeds --factor x eager's, unless it is at the rounding floor of the output dtype
    (--floor-scale x 1 unit roundoff for bf16, 8 for fp32; --floor-scale 0: strict);
  * batch invariance: the forward output and d_input of row 0 alone equal row 0 inside T rows, bitwise;
  * repeatability: two runs (fresh graphs) give identical bits for every output and gradient;
  * the chain timestep_sinusoid -> timestep_mlp -> adaln_projection -> adaln_row_gather forward and
    backward (d_t, every weight and bias) against the same chain in fp64, next to the eager chain;
  * the fp32 table gradient of adaln_row_gather_backward(dtype=float32) fed to det_linear_backward
    without rounding, against fp64 and against the bf16-rounded path.

Usage: python3 tests/gpu/det_linear_torch.py [--hidden 5376] [--rows 1,3,8] [--report r.md] [--json r.json]
Exit status: 0 all cases pass, 1 a case failed, 2 exactjit, its bf16 backward or CUDA unavailable.
"""
import argparse
import json
import math
import os
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "python"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import check_support  # noqa: E402
from check_support import log  # noqa: E402

UNIT_ROUNDOFF = {torch.bfloat16: 2.0 ** -8, torch.float32: 2.0 ** -24}
FLOOR_ULPS = {torch.bfloat16: 1.0, torch.float32: 8.0}
D = 2688  # time-embedding width
C = 256   # sinusoid channels



def errors(got, ref):
    got64, ref64 = got.double(), ref.double()
    norm = ref64.norm().item()
    diff = (got64 - ref64)
    return (diff.norm().item() / norm if norm > 0 else diff.norm().item()), diff.abs().max().item()


class Suite:
    def __init__(self, args):
        self.args = args
        self.rows = []
        self.failed = 0

    def record(self, case, ok, detail, **numbers):
        self.rows.append(dict(case=case, ok=bool(ok), detail=detail, **numbers))
        if not ok:
            self.failed += 1
        log(f"{'PASS' if ok else 'FAIL'} {case}: {detail}")

    def accuracy(self, case, ours, eager, ref, dtype):
        ours_rel, ours_max = errors(ours, ref)
        eager_rel, eager_max = errors(eager, ref)
        floor = self.args.floor_scale * FLOOR_ULPS[dtype] * UNIT_ROUNDOFF[dtype]
        ok = ours_rel <= self.args.factor * eager_rel or ours_rel <= floor
        by_floor = ok and ours_rel > self.args.factor * eager_rel
        self.record(case, ok, f"rel-L2 ours {ours_rel:.3e} eager {eager_rel:.3e} max ours {ours_max:.3e} eager "
                    f"{eager_max:.3e}{' (at the rounding floor)' if by_floor else ''}",
                    ours_rel=ours_rel, eager_rel=eager_rel, ours_max=ours_max, eager_max=eager_max)

    def bitwise(self, case, a, b):
        same = (a.dtype == b.dtype and a.shape == b.shape and
                torch.equal(a.contiguous().view(-1).view(torch.uint8), b.contiguous().view(-1).view(torch.uint8)))
        self.record(case, same, "bitwise equal" if same else "bits differ")

    def cannot_run(self, meta, what, error):
        log(f"cannot run: {what}: {error}")
        meta.update(cannot_run=f"{what}: {error}")
        self.write(meta)
        return 2

    def write(self, meta):
        if self.args.json:
            with open(self.args.json, "w") as f:
                json.dump(dict(meta=meta, cases=self.rows), f, indent=1)
        if self.args.report:
            with open(self.args.report, "w") as f:
                f.write(f"# det_linear through autograd\n\n{json.dumps(meta)}\n\n"
                        "| case | ok | detail |\n|---|---|---|\n")
                for r in self.rows:
                    f.write(f"| {r['case']} | {'yes' if r['ok'] else '**NO**'} | {r['detail']} |\n")

    def finish(self, meta):
        meta.update(cases=len(self.rows), failed=self.failed)
        self.write(meta)
        log(f"{len(self.rows) - self.failed}/{len(self.rows)} passed")
        return 1 if self.failed else 0


def leaf(t):
    return t.detach().clone().requires_grad_(True)


def grads_of(out, upstream, inputs):
    return torch.autograd.grad(out, inputs, upstream)


# ---- the timestep MLP (fp32 weights) ----

def mlp_params(gen, h):
    dev = "cuda"
    w1 = torch.randn(2 * D, C, generator=gen, device=dev) / math.sqrt(C)
    b1 = torch.randn(2 * D, generator=gen, device=dev) * 0.1
    w2 = torch.randn(D, 2 * D, generator=gen, device=dev) / math.sqrt(2 * D)
    b2 = torch.randn(D, generator=gen, device=dev) * 0.1
    return w1, b1, w2, b2


def mlp_eager(x, w1, b1, w2, b2):
    return F.linear(F.silu(F.linear(x, w1, b1)), w2, b2)


def mlp_group(suite, xj, gen, rows_list):
    params = mlp_params(gen, None)
    for T in rows_list:
        x = torch.randn(T, C, generator=gen, device="cuda")
        up = torch.randn(T, D, generator=gen, device="cuda")
        runs = []
        for _ in range(2):
            ins = [leaf(x)] + [leaf(p) for p in params]
            out = xj.timestep_mlp(*ins)
            runs.append((out.detach(),) + grads_of(out, up, ins))
        ins = [leaf(x)] + [leaf(p) for p in params]
        eager = mlp_eager(*ins)
        eager_g = (eager.detach(),) + grads_of(eager, up, ins)
        ins64 = [leaf(t.double()) for t in [x, *params]]
        ref = mlp_eager(*ins64)
        ref_g = (ref.detach(),) + grads_of(ref, up.double(), ins64)
        names = ("out", "d_x", "d_w1", "d_b1", "d_w2", "d_b2")
        for name, ours, e, r in zip(names, runs[0], eager_g, ref_g):
            suite.accuracy(f"mlp T={T} {name}", ours, e, r, torch.float32)
        for name, a, b in zip(names, runs[0], runs[1]):
            suite.bitwise(f"mlp T={T} {name} repeat", a, b)
        if T > 1:  # row 0 alone
            ins1 = [leaf(x[:1])] + [leaf(p) for p in params]
            out1 = xj.timestep_mlp(*ins1)
            d1 = grads_of(out1, up[:1], ins1)[0]
            suite.bitwise(f"mlp T={T} out row 0 alone", out1.detach(), runs[0][0][:1])
            suite.bitwise(f"mlp T={T} d_x row 0 alone", d1, runs[0][1][:1])


# ---- the AdaLN projections (bf16 weights) ----

def proj_eager(temb, w, b, silu):
    x = (F.silu(temb) if silu else temb).to(torch.bfloat16)
    return F.linear(x, w, b)


def proj_ref(temb, w, b, silu):
    """fp64 reference of the same expression: x = rT(silu_fp32(temb)) (as the kernel rounds it; its
    gradient through the cast is the identity, as autograd's .to()), W and b widened."""
    if silu:
        x = F.silu(temb)
        x = x + (F.silu(temb.detach().float()).to(torch.bfloat16).double() - x.detach())  # value rT(silu32), grad silu'
    else:
        x = temb + (temb.detach().float().to(torch.bfloat16).double() - temb.detach())
    return F.linear(x, w, b)


def projection_group(suite, xj, gen, rows_list, hidden, silu_modes):
    for mult in (18, 2):
        n = mult * hidden
        w = (torch.randn(n, D, generator=gen, device="cuda") * 0.02).to(torch.bfloat16)
        b = (torch.randn(n, generator=gen, device="cuda") * 0.1).to(torch.bfloat16)
        for silu in silu_modes:
            for T in rows_list:
                tag = f"proj {mult}H silu={silu} T={T}"
                temb = torch.randn(T, D, generator=gen, device="cuda") * 2
                up = torch.randn(T, n, generator=gen, device="cuda").to(torch.bfloat16)
                runs = []
                for _ in range(2):
                    ins = [leaf(temb), leaf(w), leaf(b)]
                    out = xj.adaln_projection(*ins, silu=silu)
                    runs.append((out.detach(),) + grads_of(out, up, ins))
                ins = [leaf(temb), leaf(w), leaf(b)]
                eager = proj_eager(*ins, silu)
                eager_g = (eager.detach(),) + grads_of(eager, up, ins)
                ins64 = [leaf(temb.double()), leaf(w.double()), leaf(b.double())]
                ref = proj_ref(*ins64, silu)
                ref_g = (ref.detach(),) + grads_of(ref, up.double(), ins64)
                names = ("out", "d_temb", "d_weight", "d_bias")
                dtypes = (torch.bfloat16, torch.float32, torch.bfloat16, torch.bfloat16)
                for name, ours, e, r, dt in zip(names, runs[0], eager_g, ref_g, dtypes):
                    suite.accuracy(f"{tag} {name}", ours, e, r, dt)
                for name, a, c in zip(names, runs[0], runs[1]):
                    suite.bitwise(f"{tag} {name} repeat", a, c)
                if T > 1:
                    ins1 = [leaf(temb[:1]), leaf(w), leaf(b)]
                    out1 = xj.adaln_projection(*ins1, silu=silu)
                    (d1,) = torch.autograd.grad(out1, [ins1[0]], up[:1])
                    suite.bitwise(f"{tag} out row 0 alone", out1.detach(), runs[0][0][:1])
                    suite.bitwise(f"{tag} d_temb row 0 alone", d1, runs[0][1][:1])
                # needs_input_grad: only d_weight
                ins = [temb, leaf(w), b]
                out = xj.adaln_projection(*ins, silu=silu)
                (dw,) = torch.autograd.grad(out, [ins[1]], up)
                suite.bitwise(f"{tag} d_weight alone", dw, runs[0][2])
        del w, b
        torch.cuda.empty_cache()


# ---- the whole chain ----

CHAIN_DRAWS = 16  # timestep draws pooled for the chain's d_t


def chain_group(suite, xj, gen, hidden, rows_list):
    from check_support import diffusers_timestep_embedding as sinusoid_eager  # noqa: E402
    params = mlp_params(gen, None)
    n = 18 * hidden
    w = (torch.randn(n, D, generator=gen, device="cuda") * 0.02).to(torch.bfloat16)
    b = (torch.randn(n, generator=gen, device="cuda") * 0.1).to(torch.bfloat16)
    seq = 37
    for T in rows_list:
        d_t = ([], [], [])  # ours, eager, fp64 over the draws
        for draw in range(CHAIN_DRAWS):
            t = torch.rand(T, generator=gen, device="cuda")
            ti = torch.randint(0, T, (seq,), generator=gen, device="cuda")
            tag = torch.randint(0, 3, (seq,), generator=gen, device="cuda")
            up = torch.randn(6, seq, hidden, generator=gen, device="cuda").to(torch.bfloat16)

            def run_ours():
                ins = [leaf(t)] + [leaf(p) for p in params] + [leaf(w), leaf(b)]
                temb = xj.timestep_mlp(xj.timestep_sinusoid(ins[0]), *ins[1:5])
                table = xj.adaln_projection(temb, ins[5], ins[6])
                chunks = torch.stack(list(xj.adaln_row_gather(table.view(3 * T, 6 * hidden), ti, tag)))
                return (chunks.detach(),) + grads_of(chunks, up, ins)

            def run_ref(dtype):
                ins = [leaf(t.to(dtype))] + [leaf(p.to(dtype)) for p in params] + [
                    leaf(w.to(dtype) if dtype == torch.float64 else w),
                    leaf(b.to(dtype) if dtype == torch.float64 else b)]
                temb = mlp_eager(sinusoid_eager(ins[0], C, True, 0, 1.0, 10000, dtype=dtype), *ins[1:5])
                table = (proj_ref(temb, ins[5], ins[6], True) if dtype == torch.float64
                         else proj_eager(temb, ins[5], ins[6], True))
                rows = table.view(3 * T, 6 * hidden)[ti * 3 + tag]
                chunks = torch.stack(rows.view(seq, 6, hidden).unbind(1))
                return (chunks.detach(),) + grads_of(chunks, up.to(chunks.dtype), ins)

            ours = run_ours()
            eager = run_ref(torch.float32)
            ref = run_ref(torch.float64)
            for acc, g in zip(d_t, (ours[1], eager[1], ref[1])):
                acc.append(g)
            if draw > 0:
                continue
            again = run_ours()
            names = ("chunks", "d_t", "d_w1", "d_b1", "d_w2", "d_b2", "d_proj_w", "d_proj_b")
            dtypes = (torch.bfloat16, torch.float32, torch.float32, torch.float32, torch.float32, torch.float32,
                      torch.bfloat16, torch.bfloat16)
            for name, o, e, r, dt in zip(names, ours, eager, ref, dtypes):
                if name != "d_t":
                    suite.accuracy(f"chain T={T} {name}", o, e, r, dt)
            for name, a, c in zip(names, ours, again):
                suite.bitwise(f"chain T={T} {name} repeat", a, c)
            del ours, eager, ref, again
        # d_t has T values per draw: its error against fp64 is one shared rounding (the table
        # gradient arrives in bf16 on both sides) plus noise, so one draw's rel-L2 over 1 to 8
        # numbers says little; the comparison pools CHAIN_DRAWS draws.
        suite.accuracy(f"chain T={T} d_t ({CHAIN_DRAWS} draws, {CHAIN_DRAWS * T} values)",
                       *(torch.cat(v) for v in d_t), torch.float32)

        # The fp32 table gradient straight into the projection backward (no bf16 rounding between).
        temb = xj.timestep_mlp(xj.timestep_sinusoid(t), *params)
        d_rows32 = xj.runtime().adaln_row_gather_backward(up, ti, tag, 3 * T, dtype=torch.float32)
        d_rows16 = xj.runtime().adaln_row_gather_backward(up, ti, tag, 3 * T)
        g32 = d_rows32.view(T, n)
        g16 = d_rows16.view(T, n)
        suite.bitwise(f"chain T={T} fp32 table grad rounds to the bf16 one", g32.to(torch.bfloat16), g16)
        rt = xj.runtime()
        d32 = rt.det_linear_backward(g32, temb, w, None, silu=True)
        d16 = rt.det_linear_backward(g16, temb, w, None, silu=True)
        ins64 = [leaf(temb.double()), leaf(w.double()), leaf(b.double())]
        ref_tab = proj_ref(*ins64, True)
        ref_g = grads_of(ref_tab, g32.double(), ins64)
        for name, a, c, r, dt in zip(("d_temb", "d_weight", "d_bias"), d32, d16, ref_g,
                                     (torch.float32, torch.bfloat16, torch.bfloat16)):
            # vs fp64 of the fp32 gradient: the fp32 path must be no worse than the rounded one
            suite.accuracy(f"chain T={T} fp32-grad {name} (vs bf16-grad path)", a, c, r, dt)
    del w, b


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--hidden", type=int, default=5376)
    p.add_argument("--rows", default="1,3,8")
    p.add_argument("--groups", default="mlp,projection,chain")
    p.add_argument("--factor", type=float, default=1.0)
    p.add_argument("--floor-scale", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=20241205)
    p.add_argument("--report")
    p.add_argument("--json")
    args = p.parse_args()
    rows_list = [int(v) for v in args.rows.split(",") if v]
    groups = [g for g in args.groups.split(",") if g]
    suite = Suite(args)
    meta = dict(commit=os.environ.get("EXACTJIT_COMMIT", "unknown"), torch=torch.__version__, hidden=args.hidden,
                rows=rows_list, groups=groups, factor=args.factor, floor_scale=args.floor_scale, seed=args.seed)
    t0 = time.perf_counter()
    try:
        xj = check_support.import_exactjit(meta)
        # The bf16 backward must exist: a tiny call.
        w = torch.zeros(64, 16, dtype=torch.bfloat16, device="cuda")
        xj.runtime().det_linear_backward(torch.zeros(1, 64, device="cuda"), torch.zeros(1, 16, device="cuda"), w)
        torch.cuda.synchronize()
    except Exception as e:
        return suite.cannot_run(meta, "import exactjit / bf16 det_linear backward / CUDA", e)
    torch.backends.cuda.matmul.allow_tf32 = False
    gen = torch.Generator(device="cuda")
    gen.manual_seed(args.seed)
    parts = {"mlp": lambda: mlp_group(suite, xj, gen, rows_list),
             "projection": lambda: projection_group(suite, xj, gen, rows_list, args.hidden, (True, False)),
             "chain": lambda: chain_group(suite, xj, gen, args.hidden, rows_list)}
    for name in groups:
        try:
            parts[name]()
            torch.cuda.synchronize()
            xj.synchronize()
        except Exception as e:
            traceback.print_exc()
            suite.record(f"group {name}", False, f"aborted: {type(e).__name__}: {e}")
        torch.cuda.empty_cache()
    meta["seconds"] = round(time.perf_counter() - t0, 1)
    return suite.finish(meta)


if __name__ == "__main__":
    sys.exit(main())
