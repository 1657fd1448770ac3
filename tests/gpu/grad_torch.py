#!/usr/bin/env python3
"""Backward passes of exactjit through torch.autograd, against PyTorch eager and fp64, on the GPU machine.

What each backward must do (NUMERICS.md; include/exactjit/exactjit.h):
  * d_y of gate_residual is bitwise equal to eager's VJP, d_residual is grad itself;
  * every other gradient (the segment sums d_gate, dshift, dscale, d_rows; dx, dweight; d_t) is
    repeatable bit for bit (--repeats runs, fresh autograd graphs each time), batch-invariant where
    it is row-local (dx of a row alone equals dx of that row in a batch of 4097), and at least as
    accurate against an fp64 reference (the same expression run by autograd in float64 on the same
    inputs) as eager PyTorch is (eager run with torch.use_deterministic_algorithms off, as shipped);
  * gradients reach the AdaLN table through the views the ops are given (table.grad is nonzero
    only in the view's columns and equals the low-level *_backward output there);
  * gate_residual_rms_norm's gradients (grad of h given, or None when only out is used) are those of
    exactjit's gate_residual followed by rms_norm, bit for bit, and meet the rules above; its d_y is
    eager's VJP rT(d_residual * gate[i]) of its d_residual, bit for bit (in the accuracy rule its
    error is d_residual's, plus eager's one rounding);
  * ctx.needs_input_grad decides what the library computes, and a bad index in a backward is
    reported by synchronize() (or at the call with EXACTJIT_CHECK_AFTER_LAUNCH) without a crash;
  * forward + backward can be captured in a CUDA graph and replayed with identical results.

Accuracy rule. For each output: rel-L2 = ||got - ref|| / ||ref|| and max abs error against the
fp64 reference, for exactjit and for eager. A case FAILS if exactjit's rel-L2 exceeds --factor
(default 1.0) times eager's, unless exactjit's rel-L2 is at the rounding floor of the output dtype
(--floor-scale x FLOOR_ULPS unit roundoffs: 1 for bf16/fp16, where one final rounding dominates; 8 for
fp32, where the fp32 rstd and a few fp32 roundings do). NOTE: the floor exists because two
equivalent algorithms at the rounding limit compare as a coin flip; the detail says when a case
passed only by it, and --floor-scale 0 gives the strict rule. timestep_sinusoid's d_t is a sum of
C terms with cancellation, so its rule is an error bound instead: |d_t - ref| <= (C + 64) u *
sum_k |grad_k| * |d out_k / d t|-scale (the a-priori bound of a C-term sum plus the forward's own
fp32 frequency and phase rounding), with both rel-L2s reported.

Inputs: seeded, randn with about 1/8 of the rows scaled by 1e-3 and 1/8 by 30 (row 1 of x is scaled
by 1e-3 and row 2 by 30 explicitly), never zeros. fp16 upstream gradients are scaled by 2^-8 so no
gradient overflows fp16 (eager and exactjit alike would give inf where fp64 does not).

Usage: PYTHONPATH is set up from this file's location; EXACTJIT_LIBRARY picks the library.
  python3 tests/gpu/grad_torch.py [--groups gate,rms,fused,gather,sinusoid,needs,bad_index,graph]
      [--hiddens 1024,5376] [--sizes 1,7,4097,32768] [--report grad.md] [--json grad.json]
Exit status: 0 all cases pass, 1 a case failed, 2 exactjit, its backward or CUDA unavailable.
"""
import argparse
import math
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)  # check_support.py
sys.path.insert(0, os.path.join(REPO, "python"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import check_support  # noqa: E402
from check_support import DTYPES, compare, expect_error, log  # noqa: E402
from check_support import diffusers_timestep_embedding as sinusoid_eager  # noqa: E402

T = 3  # timesteps in the AdaLN tables
EPS = 1e-5
UNIT_ROUNDOFF = {torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11, torch.float32: 2.0 ** -24}
FLOOR_ULPS = {torch.bfloat16: 1.0, torch.float16: 1.0, torch.float32: 8.0}
GROUPS = ("gate", "rms", "fused", "gather", "sinusoid", "needs", "bad_index", "graph")


class Data(check_support.Data):
    def upstream(self, shape, dtype):
        """A fixed upstream gradient; fp16 ones scaled by 2^-8 (exact) so sums stay finite."""
        g = self.rows(shape, dtype)
        return g.mul_(2.0 ** -8) if dtype == torch.float16 else g


def act_shape(b, s, h):
    return (s, h) if b == 1 else (b, s, h)


# ---------------------------------------------------------------------------------------------
# comparisons (compare: check_support's, shape and dtype checked)

def all_equal(pairs):
    """(ok, detail) over named (got, want) pairs; None pairs are skipped."""
    names = []
    for name, got, want in pairs:
        if got is None and want is None:
            continue
        if got is None or want is None:
            return False, f"{name}: one side is None"
        ok, detail = compare(got, want)
        if not ok:
            return False, f"{name}: {detail}"
        names.append(name)
    return True, "bitwise equal: " + ", ".join(names)


def repeat_check(run, names, repeats):
    """Runs `run` (returning a tuple of tensors or None) `repeats` times; all bit-identical."""
    first = run()
    for k in range(1, repeats):
        again = run()
        for name, a, b in zip(names, first, again):
            if a is None and b is None:
                continue
            if a is None or b is None:
                return False, f"run {k}: {name} is None in one run only", first
            ok, detail = compare(b, a)
            if not ok:
                return False, f"run {k}: {name} differs from run 0: {detail}", first
        del again
    present = [n for n, a in zip(names, first) if a is not None]
    return True, f"{repeats} runs bit-identical ({', '.join(present)})", first


def errors(got, ref):
    """(max abs error, rel-L2 error) of got against the fp64 reference; inf when not finite."""
    d = got.double() - ref
    if d.numel() == 0:
        return 0.0, 0.0
    max_abs = d.abs().max().item()
    dn, rn = d.norm().item(), ref.norm().item()
    rel = dn / rn if rn > 0 else dn
    if not math.isfinite(max_abs) or not math.isfinite(rel):
        return math.inf, math.inf
    return max_abs, rel


class Accuracy:
    """The accuracy rule of the module doc, applied per output; keeps the table rows."""

    def __init__(self, factor, floor_scale):
        self.factor, self.floor_scale = factor, floor_scale

    def check(self, outputs):
        """outputs: (name, ours, eager, ref64). Returns (ok, detail, rows)."""
        rows, parts, ok_all = [], [], True
        for name, ours, eager, ref in outputs:
            o_max, o_rel = errors(ours, ref)
            e_max, e_rel = errors(eager, ref)
            floor = FLOOR_ULPS[ours.dtype] * UNIT_ROUNDOFF[ours.dtype] * self.floor_scale
            ratio = o_rel / e_rel if e_rel > 0 else (1.0 if o_rel == 0 else math.inf)
            by_ratio = o_rel <= self.factor * e_rel
            by_floor = o_rel <= floor
            ok = math.isfinite(o_rel) and (by_ratio or by_floor)
            ok_all &= ok
            note = "" if by_ratio else (" (passes only at the rounding floor)" if ok else " (WORSE than eager)")
            if o_max > e_max and ok:
                note += " (max abs worse than eager)"
            parts.append(f"{name}: rel-L2 {o_rel:.3g} vs eager {e_rel:.3g} (x{ratio:.2f}), "
                         f"max abs {o_max:.3g} vs {e_max:.3g}{note}")
            rows.append(dict(output=name, dtype=str(ours.dtype).replace("torch.", ""), ours_rel=o_rel,
                             eager_rel=e_rel, ratio=ratio, ours_max=o_max, eager_max=e_max,
                             floor=floor, ok=ok, by_floor=ok and not by_ratio))
        return ok_all, "; ".join(parts), rows


def fmt(v):
    return "" if v is None else (f"{v:.3g}" if isinstance(v, float) else str(v))


class Suite(check_support.Suite):
    """check_support.Suite with the accuracy rule: a case may also return accuracy rows, which the
    report tabulates after the cases."""

    script = "grad_torch.py"
    title = ("# exactjit backward through torch.autograd: gate_residual, rms_norm, gate_residual_rms_norm, "
             "adaln_row_gather, timestep_sinusoid")
    skip_label = "SKIP"
    name_width = 78
    summary_width = 100

    def __init__(self, xj, args):
        super().__init__(xj)
        self.args = args
        self.accuracy = Accuracy(args.factor, args.floor_scale)

    def call(self, fn, params):
        """fn returns (ok, detail) or (ok, detail, accuracy rows)."""
        result = fn()
        ok, detail = result[0], result[1]
        if len(result) > 2:
            params["accuracy"] = result[2]
        return ok, detail

    def settle(self, ok, detail):
        """A device error after the case fails it (and is not raised)."""
        try:
            torch.cuda.synchronize()
        except Exception as e:
            ok, detail = False, f"{detail}; then torch.cuda.synchronize() raised {type(e).__name__}: {e}"
        return ok, detail

    def notes(self, args):
        return [f"- accuracy rule: FAIL if exactjit's rel-L2 error vs fp64 > {args.factor} x eager's, unless it "
                f"is at the rounding floor ({args.floor_scale} x FLOOR_ULPS unit roundoffs: bf16/fp16 1, fp32 8); "
                "sinusoid d_t: within (C+64) u of the summation bound"]

    def appendix(self):
        rows = [a for c in self.cases for a in c.get("accuracy", []) if a.get("floor") is not None]
        worse = [a for a in rows if a["ours_rel"] > a["eager_rel"]]
        lines = ["", "## Accuracy against fp64 (exactjit vs eager)", "",
                 f"{len(rows)} comparisons of a gradient's rel-L2 error; exactjit's is larger than eager's in "
                 f"{len(worse)}" + (f" (largest ratio x{max(a['ratio'] for a in worse):.3f})" if worse else "")
                 + ".", "",
                 "| output | dtype | comparisons | worse than eager | largest exactjit / eager |",
                 "|---|---|---|---|---|"]
        for key in sorted({(a["output"], a["dtype"]) for a in rows}):
            group = [a for a in rows if (a["output"], a["dtype"]) == key]
            lines.append(f"| {key[0]} | {key[1]} | {len(group)} | "
                         f"{sum(a['ours_rel'] > a['eager_rel'] for a in group)} | "
                         f"{fmt(max(a['ratio'] for a in group))} |")
        lines += ["",
                  "| case | output | dtype | rel-L2 exactjit | rel-L2 eager | exactjit / eager | max abs exactjit | "
                  "max abs eager | floor | verdict |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for c in self.cases:
            for a in c.get("accuracy", []):
                verdict = ("PASS (floor)" if a["by_floor"] else "PASS") if a["ok"] else "FAIL"
                lines.append(f"| {c['case']} | {a['output']} | {a['dtype']} | {fmt(a['ours_rel'])} | "
                             f"{fmt(a['eager_rel'])} | {fmt(a['ratio'])} | {fmt(a['ours_max'])} | "
                             f"{fmt(a['eager_max'])} | {fmt(a['floor'])} | {verdict} |")
        return lines

    def cannot_run(self, args, meta, what, e):
        status = super().cannot_run(args, meta, what, e)
        log("0 passed, 1 failed, 0 skipped")
        return status


def leaf(t, need=True, dtype=None):
    """A fresh autograd leaf over t's storage (a cast copy when dtype is given)."""
    t = t.to(dtype) if dtype is not None else t
    return t.detach().requires_grad_(need)


def cuda_still_works(xj, redo):
    """(ok, detail): plain torch work, a second synchronize that must not raise, then `redo`
    (ok, detail) of a good exactjit call."""
    z = torch.ones(1024, device="cuda").mul_(3).sum().item()
    if z != 3072.0:
        return False, f"torch after the error computed {z}"
    try:
        xj.synchronize()
    except xj.Error as e:
        return False, f"a second synchronize() raised again: {e}"
    return redo()


# ---------------------------------------------------------------------------------------------
# gate_residual

def gate_table(data, kind, h, dtype):
    """(table, view): the tensor that takes the gradient and the function that cuts the (R, H)
    gate view from it, as the model does."""
    if kind == "6H":  # block table (T, 18H) -> rows (3T, 6H), chunk 2 (gate_msa): row stride 6H
        table = data.rows((T, 18 * h), dtype, row_len=6 * h)
        return table, (lambda t: t.view(3 * T, 6 * h)[:, 2 * h:3 * h])
    if kind == "2H":  # final-norm table (T, 2H), chunk 1: row stride 2H
        return data.rows((T, 2 * h), dtype), (lambda t: t[:, h:2 * h])
    raise ValueError(kind)


def gate_eager(residual, gate, index, y):
    s, h = index.shape[0], residual.shape[-1]
    return (residual.view(-1, s, h) + gate.index_select(0, index) * y.view(-1, s, h)).view(residual.shape)


def gate_run(fn, c, index, dtype=None, need=("residual", "table", "y")):
    """Forward fn and backward of the fixed upstream grad over fresh leaves: a dict with out,
    d_residual, d_table (table-shaped, from table.grad) and d_y (None where not required)."""
    r = leaf(c.residual, "residual" in need, dtype)
    tab = leaf(c.table, "table" in need, dtype)
    y = leaf(c.y, "y" in need, dtype)
    out = fn(r, c.view(tab), index, y)
    out.backward(c.grad.to(dtype) if dtype is not None else c.grad)
    return dict(out=out.detach(), d_residual=r.grad, d_table=tab.grad, d_y=y.grad)


class GateCase:
    def __init__(self, data, dtype, h, s, b, kind):
        self.h, self.s, self.b = h, s, b
        self.residual = data.rows(act_shape(b, s, h), dtype)
        self.y = data.rows(act_shape(b, s, h), dtype)
        self.grad = data.upstream(act_shape(b, s, h), dtype)
        self.table, self.view = gate_table(data, kind, h, dtype)
        self.index = data.index(s, self.view(self.table).shape[0])


def outside_zero(d_table, view):
    """(ok, detail): d_table is zero outside view's columns."""
    rest = d_table.clone()
    view(rest).zero_()
    n = int(torch.count_nonzero(rest))
    return (True, "zero outside the view") if n == 0 else (False, f"{n} nonzero elements outside the view")


def gate_group(suite, data, hiddens, sizes):
    xj, args = suite.xj, suite.args
    ours_fn = xj.gate_residual
    log(f"gate_residual backward: H in {hiddens}, S in {sizes}, B in (1, 2), tables 6H/2H, index int64/int32")
    for dname, dtype in DTYPES.items():
        for h in hiddens:
            for s in sizes:
                for b in (1, 2):
                    for kind in ("6H", "2H"):
                        c = GateCase(data, dtype, h, s, b, kind)
                        eager = gate_run(gate_eager, c, c.index)
                        ref = gate_run(gate_eager, c, c.index, torch.float64, need=("residual", "table"))
                        label = f"{dname} H={h} S={s} B={b} gate={kind}"
                        params = dict(dtype=dname, H=h, S=s, B=b, gate=kind)
                        state = {}

                        def vjp(index, iname):
                            got = gate_run(ours_fn, c, index)
                            if iname == "int64":
                                state["ours"] = got
                            return all_equal([("out (forward)", got["out"], eager["out"]),
                                              ("d_y vs eager VJP", got["d_y"], eager["d_y"]),
                                              ("d_residual vs grad", got["d_residual"], c.grad)])

                        def repeat_and_view():
                            def run():
                                g = gate_run(ours_fn, c, c.index)
                                return g["d_residual"], g["d_table"], g["d_y"]
                            ok, detail, first = repeat_check(run, ("d_residual", "d_table", "d_y"), args.repeats)
                            if not ok:
                                return ok, detail
                            ok, where = outside_zero(first[1], c.view)
                            if not ok:
                                return False, f"table.grad {where}"
                            d_y, d_gate = xj.runtime().gate_residual_backward(c.grad, c.view(c.table), c.index, c.y)
                            ok, low = all_equal([("d_gate (table.grad through the view) vs gate_residual_backward",
                                                  c.view(first[1]), d_gate),
                                                 ("d_y vs gate_residual_backward", first[2], d_y)])
                            return ok, f"{detail}; table.grad {where}; {low}"

                        def accuracy():
                            ours = state.get("ours") or gate_run(ours_fn, c, c.index)
                            return suite.accuracy.check([
                                ("d_gate", c.view(ours["d_table"]), c.view(eager["d_table"]), c.view(ref["d_table"])),
                                ("d_residual", ours["d_residual"], eager["d_residual"], ref["d_residual"])])

                        def int32_same():
                            ours = state.get("ours") or gate_run(ours_fn, c, c.index)
                            got = gate_run(ours_fn, c, c.index.int())
                            keys = ("out", "d_residual", "d_table", "d_y")
                            ok, detail = all_equal([(k, got[k], ours[k]) for k in keys])
                            return ok, f"int32 index vs int64 index: {detail}"

                        suite.run("gate_residual", f"{label} index=int64: out, d_y = eager, d_residual = grad",
                                  lambda: vjp(c.index, "int64"), index="int64", **params)
                        suite.run("gate_residual", f"{label}: repeatable, table.grad through the view",
                                  repeat_and_view, **params)
                        suite.run("gate_residual", f"{label}: accuracy vs fp64 (d_gate, d_residual)",
                                  accuracy, **params)
                        suite.run("gate_residual", f"{label} index=int32: out, d_y = eager, d_residual = grad",
                                  lambda: vjp(c.index.int(), "int32"), index="int32", **params)
                        suite.run("gate_residual", f"{label}: int32 index gives the int64 gradients",
                                  int32_same, **params)
                        c = eager = ref = state = None  # drop the case's tensors before the next is drawn
                    torch.cuda.empty_cache()


# ---------------------------------------------------------------------------------------------
# rms_norm

RMS_FORMS = ("plain weight", "plain no-weight", "modulated 6H", "final 2H")


class RmsCase:
    def __init__(self, data, form, dtype, h, s, b):
        self.form, self.h, self.s, self.b = form, h, s, b
        self.x = data.rows(act_shape(b, s, h), dtype)
        rows = self.x.view(-1, h)
        if rows.shape[0] >= 3:  # one tiny row (eps matters) and one large row for sure
            rows[1].mul_(1e-3)
            rows[2].mul_(30)
        self.grad = data.upstream(act_shape(b, s, h), dtype)
        self.weight = None
        self.table = self.shift = self.scale = self.index = None
        self.chunks = None  # columns of the (R, ...) table view the gradient may touch
        if form == "plain weight":
            self.weight = (1 + 0.1 * torch.randn(h, device="cuda", generator=data.gen())).to(dtype)
        elif form == "modulated 6H":  # block table (T, 18H) as rows (3T, 6H): chunks 0 (shift) and 1 (scale)
            self.table = data.rows((T, 18 * h), dtype, row_len=6 * h)
            self.shift = lambda t: t.view(3 * T, 6 * h)[:, 0:h]
            self.scale = lambda t: t.view(3 * T, 6 * h)[:, h:2 * h]
            self.chunks = lambda t: t.view(3 * T, 6 * h)[:, 0:2 * h]
            self.index = data.index(s, 3 * T)
        elif form == "final 2H":  # final-norm table (T, 2H): shift chunk 0, scale chunk 1
            self.table = data.rows((T, 2 * h), dtype)
            self.shift = lambda t: t[:, 0:h]
            self.scale = lambda t: t[:, h:2 * h]
            self.chunks = lambda t: t
            self.index = data.index(s, T)

    @property
    def modulated(self):
        return self.table is not None


def rms_eager(x, weight, shift, scale, index):
    out = F.rms_norm(x, (x.shape[-1],), weight, EPS)
    if shift is not None:
        out = out * (1 + scale.index_select(0, index)) + shift.index_select(0, index)
    return out


def rms_ours(xj):
    return lambda x, weight, shift, scale, index: xj.rms_norm(x, weight, EPS, shift=shift, scale=scale, index=index)


def rms_run(fn, c, index, dtype=None, need=("x", "weight", "table")):
    x = leaf(c.x, "x" in need, dtype)
    w = leaf(c.weight, "weight" in need, dtype) if c.weight is not None else None
    tab = leaf(c.table, "table" in need, dtype) if c.modulated else None
    shift, scale = (c.shift(tab), c.scale(tab)) if c.modulated else (None, None)
    out = fn(x, w, shift, scale, index)
    out.backward(c.grad.to(dtype) if dtype is not None else c.grad)
    return dict(out=out.detach(), dx=x.grad, dweight=w.grad if w is not None else None,
                d_table=tab.grad if tab is not None else None)


def rms_outputs(c, run):
    """Named gradients of one run: dx, dweight, dshift, dscale (present ones)."""
    named = [("dx", run["dx"])]
    if c.weight is not None:
        named.append(("dweight", run["dweight"]))
    if c.modulated:
        named += [("dshift", c.shift(run["d_table"])), ("dscale", c.scale(run["d_table"]))]
    return named


def rms_group(suite, data, hiddens, sizes):
    xj, args = suite.xj, suite.args
    ours_fn = rms_ours(xj)
    log(f"rms_norm backward: forms {RMS_FORMS}, H in {hiddens}, S in {sizes}, B in (1, 2)")
    for dname, dtype in DTYPES.items():
        for h in hiddens:
            for s in sizes:
                for b in (1, 2):
                    for form in RMS_FORMS:
                        c = RmsCase(data, form, dtype, h, s, b)
                        eager = rms_run(rms_eager, c, c.index)
                        ref = rms_run(rms_eager, c, c.index, torch.float64)
                        label = f"{dname} H={h} S={s} B={b} {form}"
                        params = dict(dtype=dname, H=h, S=s, B=b, form=form)
                        state = {}

                        def repeat_and_view():
                            def run():
                                g = rms_run(ours_fn, c, c.index)
                                state.setdefault("ours", g)
                                return g["out"], g["dx"], g["dweight"], g["d_table"]
                            ok, detail, first = repeat_check(run, ("out", "dx", "dweight", "d_table"), args.repeats)
                            if not ok:
                                return ok, detail
                            with torch.no_grad():  # the forward contract parity_torch.py checks
                                shift = c.shift(c.table) if c.modulated else None
                                scale = c.scale(c.table) if c.modulated else None
                                want = rms_eager(c.x, c.weight, shift, scale, c.index)
                                _, rstd = xj.rms_norm(c.x, c.weight, EPS, shift=shift, scale=scale, index=c.index,
                                                      return_rstd=True)
                            ok, fwd = compare(first[0], want)
                            if not ok:
                                return False, f"forward through autograd differs from eager (no_grad): {fwd}"
                            parts = [detail, "forward = eager bitwise"]
                            dx, dw, dsh, dsc = xj.runtime().rms_norm_backward(c.grad, c.x, c.weight, rstd, EPS,
                                                                               scale=scale, index=c.index)
                            pairs = [("dx vs rms_norm_backward", first[1], dx),
                                     ("dweight vs rms_norm_backward", first[2], dw)]
                            if c.modulated:
                                ok, where = outside_zero(first[3], c.chunks)
                                if not ok:
                                    return False, f"table.grad {where} (shift/scale chunks)"
                                parts.append(f"table.grad {where}")
                                # autograd adds the two views' scattered gradients (zeros elsewhere), and
                                # -0 + 0 = +0: compare with the direct gradients plus zero.
                                pairs += [("dshift (through the view) vs rms_norm_backward + 0", c.shift(first[3]),
                                           dsh + 0),
                                          ("dscale (through the view) vs rms_norm_backward + 0", c.scale(first[3]),
                                           dsc + 0)]
                            ok, low = all_equal(pairs)
                            return ok, "; ".join(parts + [low])

                        def batch_invariant():
                            got = state.get("ours") or rms_run(ours_fn, c, c.index)
                            rows = c.x.view(-1, h)
                            m = rows.shape[0]
                            table = c.table
                            for r in sorted({0, 1, 2, m // 2, m - 1}):
                                x1 = rows[r:r + 1].detach().requires_grad_(True)
                                idx = c.index[r % s:r % s + 1] if c.modulated else None
                                out = xj.rms_norm(x1, c.weight, EPS, shift=c.shift(table) if c.modulated else None,
                                                  scale=c.scale(table) if c.modulated else None, index=idx)
                                out.backward(c.grad.view(-1, h)[r:r + 1])
                                ok, detail = compare(x1.grad, got["dx"].view(-1, h)[r:r + 1])
                                if not ok:
                                    return False, f"row {r} alone vs in the batch of {m}: {detail}"
                            return True, (f"dx of rows 0, 1 (x1e-3), 2 (x30), {m // 2}, {m - 1} alone = in the batch "
                                          f"of {m}")

                        def accuracy():
                            got = state.get("ours") or rms_run(ours_fn, c, c.index)
                            outs = [(n, o, e, r) for (n, o), (_, e), (_, r) in
                                    zip(rms_outputs(c, got), rms_outputs(c, eager), rms_outputs(c, ref))]
                            return suite.accuracy.check(outs)

                        def int32_same():
                            got = state.get("ours") or rms_run(ours_fn, c, c.index)
                            again = rms_run(ours_fn, c, c.index.int())
                            ok, detail = all_equal([(k, again[k], got[k]) for k in ("out", "dx", "d_table")])
                            return ok, f"int32 index vs int64 index: {detail}"

                        suite.run("rms_norm", f"{label}: repeatable, forward = eager, table.grad through the views",
                                  repeat_and_view, **params)
                        if s == 4097:
                            suite.run("rms_norm", f"{label}: dx batch-invariant", batch_invariant, **params)
                        suite.run("rms_norm", f"{label}: accuracy vs fp64", accuracy, **params)
                        if c.modulated:
                            suite.run("rms_norm", f"{label}: int32 index gives the int64 gradients", int32_same,
                                      **params)
                        c = eager = ref = state = None  # drop the case's tensors before the next is drawn
                    torch.cuda.empty_cache()


# ---------------------------------------------------------------------------------------------
# gate_residual_rms_norm

# (form, whether h's gradient is given: else only out feeds the loss and grad_h is None)
FUSED_FORMS = (("weight modulated", True), ("weight modulated", False), ("no-weight modulated", True),
               ("weight plain", True))


class FusedCase:
    """h = residual + gate[i] * y, out = norm(h) (weighted and/or modulated): gate, shift and scale
    are the block's chunks 2, 3 and 4 of one (T, 18H) table; fixed upstream gradients of out and h."""

    def __init__(self, data, form, dtype, h, s, b):
        self.h = h
        self.residual = data.rows(act_shape(b, s, h), dtype)
        self.y = data.rows(act_shape(b, s, h), dtype)
        self.grad_out = data.upstream(act_shape(b, s, h), dtype)
        self.grad_h = data.upstream(act_shape(b, s, h), dtype)
        self.table = data.rows((T, 18 * h), dtype, row_len=6 * h)
        self.weight = (1 + 0.1 * torch.randn(h, device="cuda", generator=data.gen())).to(dtype) \
            if form.startswith("weight") else None
        self.modulated = "modulated" in form
        self.index = data.index(s, 3 * T)

    def chunk(self, t, c):
        return t.view(3 * T, 6 * self.h)[:, c * self.h:(c + 1) * self.h]

    def chunks(self, t):
        """The columns of the table the gradient may touch: gate (and shift, scale)."""
        return t.view(3 * T, 6 * self.h)[:, 2 * self.h:(5 if self.modulated else 3) * self.h]


def fused_eager(residual, gate, index, y, weight, shift, scale):
    h = gate_eager(residual, gate, index, y)
    return h, rms_eager(h, weight, shift, scale, index)


def fused_ours(xj):
    return lambda residual, gate, index, y, weight, shift, scale: xj.gate_residual_rms_norm(
        residual, gate, index, y, weight, EPS, shift=shift, scale=scale)


def fused_two_ops(xj):
    """exactjit's two ops, one after the other: what the fused op's gradients must equal."""
    def run(residual, gate, index, y, weight, shift, scale):
        h = xj.gate_residual(residual, gate, index, y)
        return h, xj.rms_norm(h, weight, EPS, shift=shift, scale=scale, index=index if shift is not None else None)
    return run


def fused_run(fn, c, with_grad_h, dtype=None, need=("residual", "y", "table", "weight"), used=("h", "out")):
    """Forward fn and backward of the fixed upstream gradients of the outputs in `used` (h's only
    with with_grad_h) over fresh leaves: h, out and the gradients (None where not required)."""
    r = leaf(c.residual, "residual" in need, dtype)
    y = leaf(c.y, "y" in need, dtype)
    tab = leaf(c.table, "table" in need, dtype)
    w = leaf(c.weight, "weight" in need, dtype) if c.weight is not None else None
    shift, scale = (c.chunk(tab, 3), c.chunk(tab, 4)) if c.modulated else (None, None)
    h, out = fn(r, c.chunk(tab, 2), c.index, y, w, shift, scale)
    pairs = [(t, g) for name, t, g in (("out", out, c.grad_out), ("h", h, c.grad_h))
             if name in used and (name == "out" or with_grad_h)]
    torch.autograd.backward([t for t, _ in pairs], [g.to(dtype) if dtype is not None else g for _, g in pairs])
    return dict(h=h.detach(), out=out.detach(), d_residual=r.grad, d_y=y.grad, d_table=tab.grad,
                d_weight=w.grad if w is not None else None)


def fused_outputs(c, run):
    """Named gradients of one run for the accuracy rule: d_residual, d_gate, d_weight, d_shift, d_scale
    (present ones)."""
    named = [("d_residual", run["d_residual"]), ("d_gate", c.chunk(run["d_table"], 2))]
    if c.weight is not None:
        named.append(("d_weight", run["d_weight"]))
    if c.modulated:
        named += [("d_shift", c.chunk(run["d_table"], 3)), ("d_scale", c.chunk(run["d_table"], 4))]
    return named


FUSED_KEYS = ("h", "out", "d_residual", "d_y", "d_table", "d_weight")


def fused_group(suite, data, hiddens, sizes):
    xj, args = suite.xj, suite.args
    ours_fn, two_fn = fused_ours(xj), fused_two_ops(xj)
    log(f"gate_residual_rms_norm backward: forms {FUSED_FORMS}, H in {hiddens}, S in {sizes}, B in (1, 2)")
    for dname, dtype in DTYPES.items():
        for h in hiddens:
            for s in sizes:
                for b in (1, 2):
                    for form, with_grad_h in FUSED_FORMS:
                        c = FusedCase(data, form, dtype, h, s, b)
                        eager = fused_run(fused_eager, c, with_grad_h)
                        ref = fused_run(fused_eager, c, with_grad_h, torch.float64)
                        label = f"{dname} H={h} S={s} B={b} {form} grad_h={'given' if with_grad_h else 'None'}"
                        params = dict(dtype=dname, H=h, S=s, B=b, form=form, grad_h=with_grad_h)
                        state = {}

                        def repeat_and_view():
                            def run():
                                g = fused_run(ours_fn, c, with_grad_h)
                                state.setdefault("ours", g)
                                return tuple(g[k] for k in FUSED_KEYS)
                            ok, detail, first = repeat_check(run, FUSED_KEYS, args.repeats)
                            if not ok:
                                return ok, detail
                            ok, fwd = all_equal([("h", first[0], eager["h"]), ("out", first[1], eager["out"])])
                            if not ok:
                                return False, f"forward through autograd differs from eager: {fwd}"
                            ok, where = outside_zero(first[4], c.chunks)
                            return ok, f"{detail}; h and out = eager bitwise; table.grad {where}"

                        def as_two_ops():
                            got = state.get("ours") or fused_run(ours_fn, c, with_grad_h)
                            two = fused_run(two_fn, c, with_grad_h)
                            return all_equal([(k, got[k], two[k]) for k in FUSED_KEYS])

                        def accuracy():
                            got = state.get("ours") or fused_run(ours_fn, c, with_grad_h)
                            d_res, gate_rows = got["d_residual"], c.chunk(c.table, 2).index_select(0, c.index)
                            vjp = (d_res.view(-1, s, h) * gate_rows).view(d_res.shape)
                            ok, detail = compare(got["d_y"], vjp)
                            if not ok:
                                return False, f"d_y vs eager's VJP of d_residual: {detail}"
                            outs = [(n, o, e, r) for (n, o), (_, e), (_, r) in
                                    zip(fused_outputs(c, got), fused_outputs(c, eager), fused_outputs(c, ref))]
                            ok, detail, rows = suite.accuracy.check(outs)
                            return ok, f"d_y = eager's VJP of d_residual, bitwise; {detail}", rows

                        suite.run("gate_residual_rms_norm", f"{label}: repeatable, forward = eager, table.grad "
                                  "through the views", repeat_and_view, **params)
                        suite.run("gate_residual_rms_norm", f"{label}: = gate_residual then rms_norm (exactjit), "
                                  "bitwise", as_two_ops, **params)
                        suite.run("gate_residual_rms_norm", f"{label}: accuracy vs fp64, d_y = VJP of d_residual",
                                  accuracy, **params)
                        c = eager = ref = state = None  # drop the case's tensors before the next is drawn
                    torch.cuda.empty_cache()
        s, b, h = 4097, 2, max(hiddens)
        c = FusedCase(data, "weight modulated", dtype, h, s, b)

        def only_h():
            """out unused: gate_residual's backward of grad_h alone, as eager's autograd runs it."""
            got = fused_run(ours_fn, c, True, used=("h",))
            eager = fused_run(fused_eager, c, True, used=("h",))
            if got["d_weight"] is not None:
                return False, "weight got a gradient although out was not used"
            ok, where = outside_zero(got["d_table"], lambda t: c.chunk(t, 2))
            if not ok:
                return False, f"table.grad {where} (gate chunk)"
            ok, detail = all_equal([("d_residual vs grad_h", got["d_residual"], c.grad_h),
                                    ("d_y vs eager VJP", got["d_y"], eager["d_y"])])
            return ok, f"{detail}; table.grad {where} (gate chunk)"
        suite.run("gate_residual_rms_norm", f"{dname} H={h} S={s} B={b}: only h used: d_residual = grad_h, d_y = "
                  "eager, no norm gradient", only_h, dtype=dname, H=h, S=s, B=b)
        c = None
        torch.cuda.empty_cache()


# ---------------------------------------------------------------------------------------------
# adaln_row_gather

def gather_eager(rows, ti, tags):
    h = rows.shape[1] // 6
    idx = ti * 3 + tags
    return tuple(rows[:, c * h:(c + 1) * h].index_select(0, idx) for c in range(6))


def gather_group(suite, data, hiddens, sizes):
    xj, args = suite.xj, suite.args
    log(f"adaln_row_gather backward: bf16/fp32, H in {hiddens}, S in {sizes}, rows (3T, 6H) and a wider view")
    for dname in ("bf16", "fp32"):
        dtype = DTYPES[dname]
        for h in hiddens:
            for s in sizes:
                for stride in ("6H", "6H+8"):
                    if stride == "6H":  # the block's AdaLN table (T, 18H) viewed as (3T, 6H)
                        table = data.rows((T, 18 * h), dtype, row_len=6 * h)
                        view = lambda t, h=h: t.view(3 * T, 6 * h)  # noqa: E731
                    else:  # rows view of a wider buffer: row stride 6H + 8, 8 columns never gathered
                        table = data.rows((3 * T, 6 * h + 8), dtype)
                        view = lambda t, h=h: t[:, :6 * h]  # noqa: E731
                    ti = torch.randint(0, T, (s,), device="cuda", generator=data.gen())
                    tags = torch.randint(0, 3, (s,), device="cuda", generator=data.gen())
                    grads = [data.upstream((s, h), dtype) for _ in range(6)]
                    label = f"{dname} H={h} S={s} rows stride={stride}"
                    params = dict(dtype=dname, H=h, S=s, stride=stride)

                    def run(fn, a, b, cast=None, used=range(6), table=table, view=view, grads=grads):
                        tab = leaf(table, True, cast)
                        chunks = fn(view(tab), a, b)
                        gs = [g.to(cast) if cast is not None else g for g in grads]
                        torch.autograd.backward([chunks[k] for k in used], [gs[k] for k in used])
                        return [ch.detach() for ch in chunks], tab.grad

                    eager_chunks, eager_d = run(gather_eager, ti, tags)
                    _, ref_d = run(gather_eager, ti, tags, torch.float64)
                    state = {}

                    def repeatable(view=view, table=table, ti=ti, tags=tags, eager_chunks=eager_chunks):
                        def once():
                            chunks, d = run(xj.adaln_row_gather, ti, tags)
                            state.setdefault("ours", (chunks, d))
                            return (d,)
                        ok, detail, first = repeat_check(once, ("d_table",), args.repeats)
                        if not ok:
                            return ok, detail
                        ok, fwd = all_equal([(f"chunk {k}", a, e) for k, (a, e) in
                                             enumerate(zip(state["ours"][0], eager_chunks))])
                        if not ok:
                            return False, f"forward through autograd: {fwd}"
                        ok, where = outside_zero(first[0], view)
                        if not ok:
                            return False, f"table.grad {where}"
                        low = xj.runtime().adaln_row_gather_backward(torch.stack(grads), ti, tags, 3 * T)
                        ok, same = compare(view(first[0]), low)
                        return ok, (f"{detail}; forward = eager; table.grad {where}; through the view vs "
                                    f"adaln_row_gather_backward: {same}")

                    def accuracy(view=view):
                        d = state["ours"][1] if "ours" in state else run(xj.adaln_row_gather, ti, tags)[1]
                        return suite.accuracy.check([("d_rows", view(d), view(eager_d), view(ref_d))])

                    def int32_and_unused_chunks(view=view, table=table, ti=ti, tags=tags):
                        d = state["ours"][1] if "ours" in state else run(xj.adaln_row_gather, ti, tags)[1]
                        _, d32 = run(xj.adaln_row_gather, ti.int(), tags.int())
                        ok, detail = compare(d32, d)
                        if not ok:
                            return False, f"int32 indices vs int64: {detail}"
                        # Only the two gate chunks used: the other four chunks' columns get exact zeros.
                        _, dg = run(xj.adaln_row_gather, ti, tags, used=(2, 5))
                        rows = view(dg).view(3 * T, 6, h)
                        n = int(torch.count_nonzero(rows[:, [0, 1, 3, 4]]))
                        if n:
                            return False, f"{n} nonzero gradients in chunks no output of which was used"
                        ok, detail = all_equal([("gate_msa columns", rows[:, 2], view(d).view(3 * T, 6, h)[:, 2]),
                                                ("gate_mlp columns", rows[:, 5], view(d).view(3 * T, 6, h)[:, 5])])
                        return ok, f"int32 = int64; unused chunks give zeros, used ones unchanged ({detail})"

                    suite.run("adaln_row_gather", f"{label}: repeatable, forward = eager, table.grad through the view",
                              repeatable, **params)
                    suite.run("adaln_row_gather", f"{label}: accuracy vs fp64 (d_rows)", accuracy, **params)
                    suite.run("adaln_row_gather", f"{label}: int32 indices; unused chunks", int32_and_unused_chunks,
                              **params)
                    if dtype != torch.float32:
                        def one_rounding(ti=ti, tags=tags, grads=grads, dtype=dtype):
                            rt = xj.runtime()
                            g = torch.stack(grads)
                            d = rt.adaln_row_gather_backward(g, ti, tags, 3 * T)
                            d32 = rt.adaln_row_gather_backward(g, ti, tags, 3 * T, dtype=torch.float32)
                            ok, detail = compare(d32.to(dtype), d)
                            return ok, f"fp32 output rounded once = {dname} output: {detail}"
                        suite.run("adaln_row_gather", f"{label}: fp32 output, one rounding", one_rounding, **params)
                    # drop the case's tensors before the next is drawn
                    table = grads = eager_chunks = eager_d = ref_d = state = None
                torch.cuda.empty_cache()


# ---------------------------------------------------------------------------------------------
# timestep_sinusoid

# sinusoid_eager: check_support.diffusers_timestep_embedding (float32 as diffusers runs it, or float64)

def sinusoid_bound_scale(t, grad, c, shift, scale, max_period):
    """Per t: sum over channels of |grad| * |scale| * f_k * (1 + |a_k|) in fp64, the scale of the
    error bound (a_k = scale * t * f_k; the (1 + |a|) covers phase rounding)."""
    half = c // 2
    f = torch.exp(-math.log(max_period) * torch.arange(half, dtype=torch.float64, device=t.device) / (half - shift))
    a = scale * t.double()[:, None] * f[None, :]
    w = abs(scale) * f[None, :] * (1 + a.abs())
    g = grad.double().abs()
    return ((g[:, :half] + g[:, half:2 * half]) * w).sum(dim=1)


def sinusoid_group(suite, data):
    xj, args = suite.xj, suite.args
    c = 256
    log("timestep_sinusoid backward: C = 256, t float32 in [0, 1)")
    variants = ((True, 0, 1.0, 10000), (False, 1, 1.0, 10000), (True, 0, 1000.0, 10000))
    for n in (1, 3, 8, 1000):
        for flip, shift, scale, period in variants:
            t0 = torch.rand(n, device="cuda", generator=data.gen())
            grad = torch.randn((n, c), device="cuda", generator=data.gen())
            label = f"T={n} flip={flip} shift={shift} scale={scale} max_period={period}"
            params = dict(T=n, C=c)

            def run(fn, t_in, dtype=None):
                t = leaf(t_in, True, dtype)
                out = fn(t)
                out.backward(grad.to(out.dtype))
                return t.grad

            def ours(t, flip=flip, shift=shift, scale=scale, period=period):
                return xj.timestep_sinusoid(t, c, period, flip, shift, scale)

            def eager(t, flip=flip, shift=shift, scale=scale, period=period, dtype=torch.float32):
                return sinusoid_eager(t, c, flip, shift, scale, period, dtype)

            def repeatable(t0=t0, ours=ours):
                ok, detail, first = repeat_check(lambda: (run(ours, t0),), ("d_t",), args.repeats)
                if ok and first[0].dtype != torch.float32:
                    return False, f"d_t is {first[0].dtype}, want float32"
                return ok, detail

            def accuracy(t0=t0, grad=grad, ours=ours, eager=eager, shift=shift, scale=scale, period=period):
                d = run(ours, t0)
                e = run(eager, t0)
                ref = run(lambda t: eager(t, dtype=torch.float64), t0, torch.float64)
                bound = (c + 64) * UNIT_ROUNDOFF[torch.float32] * sinusoid_bound_scale(t0, grad, c, shift, scale,
                                                                                        period)
                worst = ((d.double() - ref).abs() / bound).max().item()
                worst_eager = ((e.double() - ref).abs() / bound).max().item()
                _, o_rel = errors(d, ref)
                _, e_rel = errors(e, ref)
                ok = math.isfinite(worst) and worst <= 1.0
                row = dict(output="d_t", dtype="float32", ours_rel=o_rel, eager_rel=e_rel,
                           ratio=o_rel / e_rel if e_rel > 0 else 1.0, ours_max=errors(d, ref)[0],
                           eager_max=errors(e, ref)[0], floor=None, ok=ok, by_floor=False)
                return ok, (f"max |d_t - fp64| / bound = {worst:.3g} (eager {worst_eager:.3g}; bound = (C+64) u "
                            f"sum|g| |d out/dt|-scale); rel-L2 {o_rel:.3g} vs eager {e_rel:.3g}"), [row]

            suite.run("sinusoid", f"{label}: d_t repeatable", repeatable, **params)
            suite.run("sinusoid", f"{label}: d_t accuracy vs fp64 (bound)", accuracy, **params)
    t16 = torch.rand(1000, device="cuda", generator=data.gen()).to(torch.bfloat16)
    grad = torch.randn((1000, c), device="cuda", generator=data.gen())

    def bf16_t():
        t = t16.detach().requires_grad_(True)
        xj.timestep_sinusoid(t, c).backward(grad)
        t32 = t16.float().requires_grad_(True)
        xj.timestep_sinusoid(t32, c).backward(grad)
        if t.grad.dtype != torch.bfloat16:
            return False, f"t.grad is {t.grad.dtype}, want bfloat16 (t's dtype)"
        ok, detail = compare(t.grad, t32.grad.to(torch.bfloat16))
        return ok, f"t bf16: grad in bf16 = the float32 d_t rounded: {detail}"
    suite.run("sinusoid", "T=1000 t bf16: d_t cast back to t's dtype", bf16_t, T=1000, C=c)


# ---------------------------------------------------------------------------------------------
# ctx.needs_input_grad

class Recorder:
    """Wraps one backward method of a Runtime instance and records the need_* keyword arguments
    of each call (the autograd Functions call them through ctx.rt)."""

    def __init__(self, rt, name):
        self.rt, self.name, self.calls = rt, name, []

    def __enter__(self):
        original = getattr(self.rt, self.name)

        def wrapped(*a, **k):
            self.calls.append({name: value for name, value in k.items() if name.startswith("need_")})
            return original(*a, **k)
        setattr(self.rt, self.name, wrapped)
        return self

    def __exit__(self, *exc):
        delattr(self.rt, self.name)


def needs_group(suite, data, h):
    """The Recorder sees the Python implementations' calls, so this group runs on the ctypes path
    even where libexactjit_torch.so is loaded (there the backward operator's C++ kernel takes the
    same need_* arguments, decided by the same autograd Functions, without passing through Python)."""
    from exactjit import _extension
    saved, _extension.path = _extension.path, None
    try:
        needs_cases(suite, data, h)
    finally:
        _extension.path = saved


def needs_cases(suite, data, h):
    xj = suite.xj
    rt = xj.runtime()
    s, b, dtype = 4097, 2, torch.bfloat16
    log("needs_input_grad: only the needed gradients are computed, none -> no call; values unchanged")
    c = GateCase(data, dtype, h, s, b, "6H")
    full = gate_run(xj.gate_residual, c, c.index)
    cases = [  # (requires grad, expected flags or None for no call, outputs to compare)
        (("y",), dict(need_d_y=True, need_d_gate=False), ("d_y",)),
        (("table",), dict(need_d_y=False, need_d_gate=True), ("d_table",)),
        (("residual",), None, ("d_residual",)),
        (("residual", "y"), dict(need_d_y=True, need_d_gate=False), ("d_residual", "d_y")),
    ]
    for need, flags, outs in cases:
        def case(need=need, flags=flags, outs=outs):
            with Recorder(rt, "gate_residual_backward") as rec:
                got = gate_run(xj.gate_residual, c, c.index, need=need)
            if flags is None and rec.calls:
                return False, f"backward called although no gate/y gradient is needed: {rec.calls}"
            if flags is not None and (len(rec.calls) != 1 or any(rec.calls[0].get(k) != v for k, v in flags.items())):
                return False, f"calls {rec.calls}, want one with {flags}"
            for k in ("d_residual", "d_table", "d_y"):
                if k not in outs and got[k] is not None:
                    return False, f"{k} computed although not required"
            ok, detail = all_equal([(k, got[k], full[k]) for k in outs])
            return ok, f"{len(rec.calls)} backward call(s) {rec.calls}; {detail}"
        suite.run("needs_input_grad", f"gate_residual, grad for {'+'.join(need)}", case)
    c = full = None  # drop the case's tensors before the next is drawn
    for form, cases in (("modulated 6H", [(("x",), dict(need_dx=True, need_dweight=False, need_dshift=False,
                                                        need_dscale=False), ("dx",)),
                                          (("table",), dict(need_dx=False, need_dweight=False, need_dshift=True,
                                                            need_dscale=True), ("d_table",))]),
                        ("plain weight", [(("weight",), dict(need_dx=False, need_dweight=True), ("dweight",)),
                                          (("x",), dict(need_dx=True, need_dweight=False), ("dx",))])):
        c = RmsCase(data, form, dtype, h, s, b)
        full = rms_run(rms_ours(xj), c, c.index)
        for need, flags, outs in cases:
            def case(need=need, flags=flags, outs=outs, c=c, full=full):
                with Recorder(rt, "rms_norm_backward") as rec:
                    got = rms_run(rms_ours(xj), c, c.index, need=need)
                if len(rec.calls) != 1 or any(rec.calls[0].get(k) != v for k, v in flags.items()):
                    return False, f"calls {rec.calls}, want one with {flags}"
                ok, detail = all_equal([(k, got[k], full[k]) for k in outs])
                return ok, f"flags {rec.calls[0]}; {detail}"
            suite.run("needs_input_grad", f"rms_norm {form}, grad for {'+'.join(need)}", case)
        c = full = None  # drop the case's tensors before the next is drawn
    torch.cuda.empty_cache()


# ---------------------------------------------------------------------------------------------
# bad indices (expect_error: check_support's; a blank message passes here, as it always has)

def bad_index_group(suite, data, h):
    xj = suite.xj
    rt = xj.runtime()
    s, dtype = 4097, torch.bfloat16
    log("bad indices in backward: code 5 at synchronize() (or at the call), the context stays usable")

    c = GateCase(data, dtype, h, s, 1, "6H")
    gate = c.view(c.table)
    good = rt.gate_residual_backward(c.grad, gate, c.index, c.y)
    xj.synchronize()
    for name, pos, value, idtype in (("index = R", s // 2, 3 * T, torch.int64), ("index = -1", 0, -1, torch.int64),
                                     ("int32 index = R", s - 1, 3 * T, torch.int32)):
        bad = c.index.clone().to(idtype)
        bad[pos] = value

        def case(bad=bad):
            ok, detail = expect_error(xj, 5, lambda: rt.gate_residual_backward(c.grad, gate, bad, c.y), "gate_residual")
            if not ok:
                return ok, detail

            def redo():
                again = rt.gate_residual_backward(c.grad, gate, c.index, c.y)
                xj.synchronize()
                return all_equal([("d_y", again[0], good[0]), ("d_gate", again[1], good[1])])
            ok2, detail2 = cuda_still_works(xj, redo)
            return ok2, f"{detail}; then a good backward: {detail2}"
        suite.run("bad_index", f"gate_residual_backward {name}", case)

    def through_autograd():
        bad = c.index.clone()
        bad[7] = 3 * T

        def call():
            r = leaf(c.residual)
            tab = leaf(c.table)
            y = leaf(c.y)
            xj.gate_residual(r, c.view(tab), bad, y).backward(c.grad)
        ok, detail = expect_error(xj, 5, call, "gate_residual")
        if not ok:
            return ok, detail
        ok2, detail2 = cuda_still_works(xj, lambda: (True, "ok"))
        return ok2, f"{detail}; context usable: {detail2}"
    suite.run("bad_index", "gate_residual forward + backward through autograd, index = R", through_autograd)

    def check_after_launch():
        bad = c.index.clone()
        bad[3] = -5
        own = xj.Runtime(check_after_launch=True)
        try:
            try:
                own.gate_residual_backward(c.grad, gate, bad, c.y)
            except xj.Error as e:
                if e.code != 5 or "gate_residual" not in str(e):
                    return False, f"raised code {int(e.code)}: {e}"
                again = own.gate_residual_backward(c.grad, gate, c.index, c.y)
                ok, detail = all_equal([("d_y", again[0], good[0]), ("d_gate", again[1], good[1])])
                return ok, f"code 5 at the call: {str(e)[:160]}; then a good backward: {detail}"
            return False, "no exactjit.Error at the call with check_after_launch"
        finally:
            torch.cuda.synchronize()
            own.close()
    suite.run("bad_index", "gate_residual_backward index = -5, Runtime(check_after_launch=True)", check_after_launch)
    c = gate = good = None  # drop the case's tensors before the next is drawn

    c = RmsCase(data, "modulated 6H", dtype, h, s, 1)
    with torch.no_grad():
        shift, scale = c.shift(c.table), c.scale(c.table)
        _, rstd = xj.rms_norm(c.x, None, EPS, shift=shift, scale=scale, index=c.index, return_rstd=True)
    good = rt.rms_norm_backward(c.grad, c.x, None, rstd, EPS, scale=scale, index=c.index)
    xj.synchronize()
    for name, pos, value in (("index = 3T", 11, 3 * T), ("index = -1", s - 1, -1)):
        bad = c.index.clone()
        bad[pos] = value

        def case(bad=bad):
            ok, detail = expect_error(xj, 5, lambda: rt.rms_norm_backward(c.grad, c.x, None, rstd, EPS,
                                                                          scale=scale, index=bad), "rms_norm")
            if not ok:
                return ok, detail

            def redo():
                again = rt.rms_norm_backward(c.grad, c.x, None, rstd, EPS, scale=scale, index=c.index)
                xj.synchronize()
                return all_equal([(k, a, g) for k, a, g in zip(("dx", "dweight", "dshift", "dscale"), again, good)])
            ok2, detail2 = cuda_still_works(xj, redo)
            return ok2, f"{detail}; then a good backward: {detail2}"
        suite.run("bad_index", f"rms_norm_backward (modulated) {name}", case)
    c = good = rstd = None  # drop the case's tensors before the next is drawn

    c = FusedCase(data, "weight modulated", dtype, h, s, 1)
    gate, shift, scale = (c.chunk(c.table, k) for k in (2, 3, 4))
    with torch.no_grad():
        fused_h, _, rstd = rt.gate_residual_rms_norm(c.residual, gate, c.index, c.y, c.weight, EPS, shift=shift,
                                                     scale=scale, return_rstd=True)

    def fused_backward(index):
        return rt.gate_residual_rms_norm_backward(c.grad_out, c.grad_h, fused_h, c.y, gate, index, c.weight, rstd, EPS,
                                                  scale=scale)
    good = fused_backward(c.index)
    xj.synchronize()
    bad = c.index.clone()
    bad[s // 3] = 3 * T

    def fused_case():
        ok, detail = expect_error(xj, 5, lambda: fused_backward(bad), "gate_residual_rms_norm")
        if not ok:
            return ok, detail

        def redo():
            again = fused_backward(c.index)
            xj.synchronize()
            names = ("d_residual", "d_y", "d_gate", "d_weight", "d_shift", "d_scale")
            return all_equal([(k, a, g) for k, a, g in zip(names, again, good)])
        ok2, detail2 = cuda_still_works(xj, redo)
        return ok2, f"{detail}; then a good backward: {detail2}"
    suite.run("bad_index", "gate_residual_rms_norm_backward index = 3T", fused_case)
    c = good = rstd = fused_h = None  # drop the case's tensors before the next is drawn

    grad = data.upstream((6, s, h), dtype)
    ti = torch.randint(0, T, (s,), device="cuda", generator=data.gen())
    tags = torch.randint(0, 3, (s,), device="cuda", generator=data.gen())
    good = rt.adaln_row_gather_backward(grad, ti, tags, 3 * T)
    xj.synchronize()
    for name, arg, value in (("timestep = T", "timestep_indices", T), ("tag = 3", "token_tags", 3),
                             ("timestep = 2^62 (t*3 would wrap)", "timestep_indices", 1 << 62)):
        bad_ti, bad_tags = ti.clone(), tags.clone()
        (bad_ti if arg == "timestep_indices" else bad_tags)[9] = value

        def case(bad_ti=bad_ti, bad_tags=bad_tags):
            ok, detail = expect_error(xj, 5, lambda: rt.adaln_row_gather_backward(grad, bad_ti, bad_tags, 3 * T),
                                      "adaln_row_gather")
            if not ok:
                return ok, detail

            def redo():
                again = rt.adaln_row_gather_backward(grad, ti, tags, 3 * T)
                xj.synchronize()
                return compare(again, good)
            ok2, detail2 = cuda_still_works(xj, redo)
            return ok2, f"{detail}; then a good backward: {detail2}"
        suite.run("bad_index", f"adaln_row_gather_backward {name}", case)
    torch.cuda.empty_cache()


# ---------------------------------------------------------------------------------------------
# CUDA graphs

def graph_case(suite, make, refill, step):
    """Eager-mode exactjit results on inputs A; warm-up on a side stream; capture step(); replay
    twice against A; refill the static inputs with B in place, replay, compare with eager-mode
    exactjit on B. All bitwise."""
    xj = suite.xj
    inputs = make()
    want_a = [t.detach().clone() for t in step(inputs)]
    xj.synchronize()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step(inputs)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static = step(inputs)
    names = [f"output {k}" for k in range(len(static))]
    for replay in (1, 2):
        graph.replay()
        torch.cuda.synchronize()
        ok, detail = all_equal([(n, s, w) for n, s, w in zip(names, static, want_a)])
        if not ok:
            return False, f"replay {replay} on inputs A: {detail}"
    refill(inputs)
    want_b = [t.detach().clone() for t in step(inputs)]
    xj.synchronize()
    if all(torch.equal(a, b) for a, b in zip(want_a, want_b)):
        return False, "inputs B gave the same results as A: the refill did not change the inputs"
    graph.replay()
    torch.cuda.synchronize()
    xj.synchronize()
    ok, detail = all_equal([(n, s, w) for n, s, w in zip(names, static, want_b)])
    if not ok:
        return False, f"replay on inputs B: {detail}"
    return True, f"2 replays on A and 1 on B (refilled in place) = eager-mode exactjit: {detail}"


def graph_group(suite, data, h):
    xj = suite.xj
    if not hasattr(torch.cuda, "graph") or not hasattr(torch.cuda, "CUDAGraph"):
        suite.record("cuda_graph", "capture", None, "this torch has no torch.cuda.graph", 0.0)
        return
    log("CUDA graph capture: forward + backward, replayed, = eager-mode exactjit")
    s, b, dtype = 4097, 2, torch.bfloat16

    def gate_make():
        return dict(residual=leaf(data.rows((b, s, h), dtype)), y=leaf(data.rows((b, s, h), dtype)),
                    table=leaf(data.rows((T, 18 * h), dtype, row_len=6 * h)), index=data.index(s, 3 * T),
                    grad=data.upstream((b, s, h), dtype))

    def gate_step(inp):
        gate = inp["table"].view(3 * T, 6 * h)[:, 2 * h:3 * h]
        out = xj.gate_residual(inp["residual"], gate, inp["index"], inp["y"])
        d_r, d_tab, d_y = torch.autograd.grad(out, (inp["residual"], inp["table"], inp["y"]), inp["grad"])
        return out, d_r, d_tab, d_y

    def refill(inp):
        fresh = gate_make() if "residual" in inp else rms_make()
        with torch.no_grad():
            for k, v in fresh.items():
                inp[k].copy_(v)

    def rms_make():
        return dict(x=leaf(data.rows((b, s, h), dtype)), table=leaf(data.rows((T, 18 * h), dtype, row_len=6 * h)),
                    index=data.index(s, 3 * T), grad=data.upstream((b, s, h), dtype))

    def rms_step(inp):
        rows = inp["table"].view(3 * T, 6 * h)
        out = xj.rms_norm(inp["x"], None, EPS, shift=rows[:, 0:h], scale=rows[:, h:2 * h], index=inp["index"])
        dx, d_tab = torch.autograd.grad(out, (inp["x"], inp["table"]), inp["grad"])
        return out, dx, d_tab

    suite.run("cuda_graph", f"gate_residual forward + backward, bf16 S={s} B={b} H={h}",
              lambda: graph_case(suite, gate_make, refill, gate_step))
    suite.run("cuda_graph", f"rms_norm modulated 6H forward + backward, bf16 S={s} B={b} H={h}",
              lambda: graph_case(suite, rms_make, refill, rms_step))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--groups", default=",".join(GROUPS), help="comma-separated: " + ",".join(GROUPS))
    p.add_argument("--hiddens", default="1024,5376", help="comma-separated H values")
    p.add_argument("--sizes", default="1,7,4097,32768", help="comma-separated S values")
    p.add_argument("--repeats", type=int, default=10, help="runs that must be bit-identical")
    p.add_argument("--factor", type=float, default=1.0, help="allowed rel-L2 ratio exactjit / eager")
    p.add_argument("--floor-scale", type=float, default=1.0, help="scales the rounding floor; 0: strict ratio only")
    p.add_argument("--seed", type=int, default=20240612)
    p.add_argument("--report", help="markdown report path")
    p.add_argument("--json", help="JSON report path")
    args = p.parse_args()
    groups = check_support.parse_groups(p, args.groups, GROUPS)
    hiddens = [int(v) for v in args.hiddens.split(",") if v]
    sizes = [int(v) for v in args.sizes.split(",") if v]
    args.repeats = max(args.repeats, 2)

    t0 = time.perf_counter()
    torch.use_deterministic_algorithms(False)  # eager as shipped: atomics in index_add
    meta = dict(commit=os.environ.get("EXACTJIT_COMMIT", "unknown"), torch=torch.__version__, groups=groups,
                hiddens=hiddens, sizes=sizes, repeats=args.repeats, factor=args.factor,
                floor_scale=args.floor_scale, seed=args.seed,
                check_after_launch=os.environ.get("EXACTJIT_CHECK_AFTER_LAUNCH", "unset"))
    try:
        xj = check_support.import_exactjit(meta)
    except Exception as e:
        return Suite(None, args).cannot_run(args, meta, "import exactjit / backward entry points / CUDA", e)
    log(f"exactjit {meta['exactjit']} ({meta['library']}), torch {torch.__version__}, {meta['device']}")

    suite = Suite(xj, args)
    data = Data(args.seed)
    h_big = max(hiddens)
    parts = {"gate": lambda: gate_group(suite, data, hiddens, sizes),
             "rms": lambda: rms_group(suite, data, hiddens, sizes),
             "fused": lambda: fused_group(suite, data, hiddens, sizes),
             "gather": lambda: gather_group(suite, data, hiddens, sizes),
             "sinusoid": lambda: sinusoid_group(suite, data),
             "needs": lambda: needs_group(suite, data, h_big),
             "bad_index": lambda: bad_index_group(suite, data, h_big),
             "graph": lambda: graph_group(suite, data, h_big)}
    check_support.run_groups(suite, xj, parts, groups)
    meta["seconds"] = round(time.perf_counter() - t0, 1)
    return suite.finish(args, meta)


if __name__ == "__main__":
    sys.exit(main())
