#!/usr/bin/env python3
"""Bit-for-bit parity of exactjit's forward ops with PyTorch eager, on the GPU machine.

The reference is eager `residual + gate.index_select(0, index) * y`, and the check is
torch.equal on the raw bits (.view(int16 / int32)), never a tolerance: the op's contract
(NUMERICS.md, gate_residual) is bitwise equality in bf16, fp16 and fp32.

Inputs are random (seeded torch.Generator, never zeros) with rows scaled by 1e-3 and 30 in part,
so products land in every rounding regime, fp16 subnormals included. `out` is filled with 0xFFFF
(a NaN pattern the reference never produces) before each call, so an element the kernel skips
shows up. The gate is always a strided table view, as the model passes it: chunk 2 of an AdaLN
table (T, 18H) viewed as (3T, 6H), or chunk 1 of a final-norm table (T, 2H).

Groups: the grid (dtype x S x B x table x index dtype at --hidden), scalar-path and misaligned
cases (odd H, odd row stride, odd base offsets), a small H, argument errors (code 1), and bad
indices (synchronize() must raise code 5 naming gate_residual, and the context must stay usable);
then adaln_row_gather, rms_norm, gate_residual_rms_norm (h and out against the two eager
expressions it fuses) and timestep_sinusoid, each against its eager expression.

Usage: PYTHONPATH is set up from this file's location; EXACTJIT_LIBRARY picks the library.
  python3 tests/gpu/parity_torch.py [--hidden 5376] [--report parity.md] [--json parity.json]
Exit status: 0 all cases pass, 1 a case failed, 2 exactjit or CUDA unavailable.
"""
import argparse
import os
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)  # check_support.py
sys.path.insert(0, os.path.join(REPO, "python"))

import torch  # noqa: E402

import check_support  # noqa: E402
from check_support import BITS, DTYPES, Data, diffusers_timestep_embedding, log  # noqa: E402

T = 3  # timesteps in the AdaLN table
SIZES = (1, 7, 4097, 32768, 131072)


def table_view(data, kind, h, dtype):
    """An (R, H) gate view with unit column stride, cut from a wider table as the model does."""
    if kind == "6H":  # block table (T, 18H) -> (3T, 6H), chunk 2 (gate_msa)
        table = data.rows((T, 18 * h), dtype, row_len=6 * h).view(3 * T, 6 * h)
        return table[:, 2 * h:3 * h]
    if kind == "2H":  # final-norm table (T, 2H), chunk 1
        return data.rows((T, 2 * h), dtype)[:, h:2 * h]
    if kind == "6H+1":  # odd row stride from a wider flat buffer: forces the scalar path
        flat = data.rows((3 * T, 6 * h + 1), dtype)
        return flat[:, 2 * h:3 * h]
    if kind == "6H,base+1":  # odd base offset: the view starts one element into the chunk
        table = data.rows((T, 18 * h), dtype, row_len=6 * h).view(3 * T, 6 * h)
        return table[:, 2 * h + 1:3 * h + 1]
    raise ValueError(kind)


def activations(data, b, s, h, dtype, layout="natural"):
    """residual and y: (S, H) for B = 1, (B, S, H) otherwise; 'flat' gives (B*S, H); 'base+1'
    makes contiguous tensors whose data pointer is one element past an aligned address."""
    shape = (s, h) if b == 1 else (b, s, h)
    if layout == "flat":
        shape = (b * s, h)
    if layout == "base+1":
        def make():
            flat = data.rows((b * s * h + 1,), dtype, row_len=h)
            return flat[1:].view(shape)
        return make(), make()
    return data.rows(shape, dtype), data.rows(shape, dtype)


def eager(residual, gate, index, y):
    s, h = index.shape[0], residual.shape[-1]
    r3 = residual.view(-1, s, h)
    y3 = y.view(-1, s, h)
    return (r3 + gate.index_select(0, index) * y3).view(residual.shape)


def poisoned_like(t):
    out = torch.empty_like(t, memory_format=torch.contiguous_format)
    out.view(BITS[t.dtype]).fill_(-1)  # 0xFFFF / 0xFFFFFFFF: a NaN eager never produces here
    return out


def compare(got, ref):
    """(ok, detail): the bits of got against eager's ref, flattened (the shapes are not checked
    here); the detail counts elements still poisoned."""
    return check_support.compare(got, ref, want="eager", check_shape=False, count_poisoned=True)


class Suite(check_support.Suite):
    script = "parity_torch.py"
    title = ("# exactjit parity with PyTorch eager (bitwise): gate_residual, adaln_row_gather, rms_norm, "
             "gate_residual_rms_norm, timestep_sinusoid")
    skip_label = "skip"
    name_width = 58
    summary_width = 70

    def checked_call(self, residual, gate, index, y, ref, use_out=True):
        """One call (into a poisoned out), synchronize (a false bad-index report fails the
        case), then the bitwise comparison."""
        out = poisoned_like(residual) if use_out else None
        got = self.xj.gate_residual(residual, gate, index, y, out=out) if use_out else \
            self.xj.gate_residual(residual, gate, index, y)
        self.xj.synchronize()
        if use_out and got is not out:
            return False, "returned tensor is not the out= tensor"
        if got.shape != residual.shape or got.dtype != residual.dtype:
            return False, f"returned {tuple(got.shape)} {got.dtype}"
        return compare(got, ref)


def grid(suite, data, h, sizes):
    log(f"grid: H={h}, S in {sizes}, B in (1, 2), tables 6H/2H, index int64/int32")
    for dname, dtype in DTYPES.items():
        for s in sizes:
            for b in (1, 2):
                residual, y = activations(data, b, s, h, dtype)
                for kind in ("6H", "2H"):
                    gate = table_view(data, kind, h, dtype)
                    index = data.index(s, gate.shape[0])
                    ref = eager(residual, gate, index, y)
                    for iname, idx in (("int64", index), ("int32", index.to(torch.int32))):
                        suite.run("grid", f"{dname} S={s} B={b} gate={kind} index={iname}",
                                  lambda: suite.checked_call(residual, gate, idx, y, ref),
                                  dtype=dname, S=s, B=b, H=h, gate=kind, index=iname)
                    del ref, gate, index
                del residual, y
                if s * b * h >= (1 << 27):
                    torch.cuda.empty_cache()


def layouts(suite, data, h):
    log("layouts: scalar path, odd strides and offsets, flat (M, H), default allocation")
    specs = [  # (name, H, layout, gate kind, S, B)
        ("odd H", h + 1, "natural", "6H", 4097, 2),
        ("odd H, S=7", h + 1, "natural", "6H", 7, 1),
        ("gate row stride 6H+1", h, "natural", "6H+1", 4097, 2),
        ("gate base +1 element", h, "natural", "6H,base+1", 4097, 1),
        ("residual/y base +1 element", h, "base+1", "6H", 4097, 1),
        ("flat (B*S, H), B=2", h, "flat", "6H", 4097, 2),
        ("small H=64", 64, "natural", "6H", 4097, 2),
        ("small H=64, S=7", 64, "natural", "2H", 7, 1),
        ("small H=64, S=1, B=2", 64, "natural", "6H", 1, 2),
    ]
    for dname, dtype in DTYPES.items():
        for name, hh, layout, kind, s, b in specs:
            residual, y = activations(data, b, s, hh, dtype, layout)
            gate = table_view(data, kind, hh, dtype)
            index = data.index(s, gate.shape[0])
            ref = eager(residual, gate, index, y)
            for iname, idx in (("int64", index), ("int32", index.to(torch.int32))):
                suite.run("layout", f"{dname} {name} S={s} B={b} index={iname}",
                          lambda: suite.checked_call(residual, gate, idx, y, ref),
                          dtype=dname, S=s, B=b, H=hh, gate=kind, index=iname, layout=layout)
        residual, y = activations(data, 2, 4097, h, dtype)
        gate = table_view(data, "6H", h, dtype)
        index = data.index(4097, gate.shape[0])
        ref = eager(residual, gate, index, y)
        suite.run("layout", f"{dname} default out allocation S=4097 B=2",
                  lambda: suite.checked_call(residual, gate, index, y, ref, use_out=False),
                  dtype=dname, S=4097, B=2, H=h, gate="6H", index="int64")


def expect_error(xj, code, call, mention=None):
    """check_support.expect_error, where a blank message also fails."""
    return check_support.expect_error(xj, code, call, mention, nonempty=True)


def invalid_arguments(suite, data, h):
    log("invalid arguments: each must raise exactjit.Error code 1 with a message")
    s, dtype = 4097, torch.bfloat16
    residual, y = activations(data, 1, s, h, dtype)
    gate = table_view(data, "6H", h, dtype)
    index = data.index(s, gate.shape[0])
    f64 = [t.double() for t in (residual, y)]
    cases = [  # (name, args, the word the message should contain or None)
        ("residual on the CPU", (residual.cpu(), gate, index, y), "residual"),
        ("index on the CPU", (residual, gate, index.cpu(), y), "index"),
        ("fp64 tensors", (f64[0], gate.double(), index, f64[1]), None),
        ("y fp16, residual bf16", (residual, gate, index, y.half()), None),
        ("gate fp32, residual bf16", (residual, gate.float(), index, y), None),
        ("index float32", (residual, gate, index.float(), y), "index"),
        ("index int16", (residual, gate, index.to(torch.int16), y), "index"),
        ("index 2-D", (residual, gate, index.view(1, s), y), "index"),
        ("residual not contiguous",
         (data.rows((h, s), dtype).t(), gate, index, y), "residual"),
        ("y shape (S, H-1)", (residual, gate, index, y[:, :h - 1]), None),
        ("gate column stride 2", (residual, data.rows((3 * T, 2 * h), dtype)[:, ::2],
                                  index, y), "gate"),
        ("gate width H+8", (residual, table_view(data, "6H", h + 8, dtype), index, y), None),
        ("rows not a multiple of S", (residual[:s - 1], gate, index, y[:s - 1]), None),
        ("residual is a list", ([1.0], gate, index, y), "residual"),
    ]
    for name, args, mention in cases:
        suite.run("invalid", name,
                  lambda: expect_error(suite.xj, 1, lambda: suite.xj.gate_residual(*args), mention))
    suite.run("invalid", "out fp32, residual bf16",
              lambda: expect_error(suite.xj, 1, lambda: suite.xj.gate_residual(
                  residual, gate, index, y, out=torch.empty_like(residual, dtype=torch.float32)),
                  "out"))
    if torch.cuda.device_count() >= 2:
        suite.run("invalid", "gate on cuda:1", lambda: expect_error(
            suite.xj, 1, lambda: suite.xj.gate_residual(residual, gate.to("cuda:1"), index, y),
            "gate"))
    else:
        suite.record("invalid", "gate on cuda:1", None, "one GPU: skipped", 0.0)
    ref = eager(residual, gate, index, y)
    suite.run("invalid", "good call after the argument errors",
              lambda: suite.checked_call(residual, gate, index, y, ref))


def bad_indices(suite, data, h):
    log("bad indices: synchronize() must raise code 5 naming gate_residual; context stays usable")
    s, dtype = 4097, torch.bfloat16
    gate = table_view(data, "6H", h, dtype)
    r = gate.shape[0]
    variants = [  # (name, B, position, value, index dtype)
        ("int64 index = R", 1, s // 2, r, torch.int64),
        ("int64 index = -1", 1, 0, -1, torch.int64),
        ("int64 index = 2^32 + 1 (wraps to 1 if truncated)", 1, s - 1, (1 << 32) + 1, torch.int64),
        ("int64 index = -2^33", 1, 17, -(1 << 33), torch.int64),
        ("int32 index = R", 1, s // 3, r, torch.int32),
        ("int32 index = -1", 1, s - 1, -1, torch.int32),
        ("int32 index = 2^31 - 1", 1, 5, (1 << 31) - 1, torch.int32),
        ("int64 index = R at the last row, B=2", 2, s - 1, r, torch.int64),
    ]
    for name, b, pos, value, idtype in variants:
        residual, y = activations(data, b, s, h, dtype)
        good = data.index(s, r)
        bad = good.clone().to(idtype)
        bad[pos] = value
        ref = eager(residual, gate, good, y)  # eager only ever sees the good index

        def case():
            ok, detail = expect_error(suite.xj, 5, lambda: suite.xj.gate_residual(
                residual, gate, bad, y, out=poisoned_like(residual)), "gate_residual")
            if not ok:
                return ok, detail
            try:
                suite.xj.synchronize()
            except suite.xj.Error as e:
                return False, f"{detail}; a second synchronize() raised again: {e}"
            ok2, detail2 = suite.checked_call(residual, gate, good.to(idtype), y, ref)
            return ok2, f"{detail}; then a good call: {detail2}"

        suite.run("bad_index", name, case, B=b, index=str(idtype).replace("torch.", ""))


def row_gather(suite, data, h):
    """adaln_row_gather against six eager index_selects of the (3T, 6H) rows, bit for bit, then
    its bad-index paths (each index checked before t * 3 + tag is formed)."""
    log("adaln_row_gather: six index_selects of the (3T, 6H) view, bitwise; bad timesteps and tags")
    t = 3
    for dname, dtype in DTYPES.items():
        for s in (1, 7, 4097, 32768, 131072):
            for wide in (False, True):
                if wide:  # rows view of a wider buffer: row stride 6H + 8 elements
                    rows = data.rows((3 * t, 6 * h + 8), dtype)[:, :6 * h]
                else:  # the block's AdaLN table (T, 18H) viewed as (3T, 6H)
                    rows = data.rows((t, 18 * h), dtype).view(3 * t, 6 * h)
                ti = torch.randint(0, t, (s,), device="cuda", generator=data.gen())
                tags = torch.randint(0, 3, (s,), device="cuda", generator=data.gen())
                for iname, (a, b) in (("int64", (ti, tags)), ("int32", (ti.int(), tags.int()))):
                    def case(rows=rows, a=a, b=b, ti=ti, tags=tags):
                        got = suite.xj.adaln_row_gather(rows, a, b)
                        suite.xj.synchronize()
                        idx = ti * 3 + tags
                        for c in range(6):
                            ok, detail = compare(got[c], rows[:, c * h:(c + 1) * h].index_select(0, idx))
                            if not ok:
                                return False, f"chunk {c}: {detail}"
                        return True, "bitwise equal (6 chunks)"
                    stride = "6H+8" if wide else "6H"
                    suite.run("row_gather", f"{dname} S={s} stride={stride} index={iname}", case,
                              dtype=dname, S=s, index=iname, stride=stride)
                del rows
            torch.cuda.empty_cache()
    rows = data.rows((3 * t, 6 * h), torch.bfloat16)
    for name, tv, gv, arg in (("timestep = T", t, 0, "timestep_indices"),
                              ("timestep = 2^62 (t*3 would wrap)", 1 << 62, 0, "timestep_indices"),
                              ("tag = 3", 0, 3, "token_tags"), ("tag = -1", 0, -1, "token_tags")):
        ti = torch.zeros(64, dtype=torch.int64, device="cuda")
        tags = torch.zeros(64, dtype=torch.int64, device="cuda")
        ti[9], tags[9] = tv, gv

        def case(ti=ti, tags=tags, arg=arg):
            ok, detail = expect_error(suite.xj, 5, lambda: suite.xj.adaln_row_gather(rows, ti, tags),
                                      f"adaln_row_gather: {arg}[9]")
            if not ok:
                return ok, detail
            good = suite.xj.adaln_row_gather(rows, torch.zeros_like(ti), torch.zeros_like(tags))
            suite.xj.synchronize()
            ok2, detail2 = compare(good[0], rows[:1, :h].expand(64, h))
            return ok2, f"{detail}; then a good call: {detail2}"

        suite.run("row_gather_bad_index", name, case)


def rms_norms(suite, data):
    """rms_norm plain (with and without weight) against F.rms_norm, and with AdaLN modulation
    against norm(x) * (1 + scale.index_select(0, i)) + shift.index_select(0, i), bit for bit;
    rows scaled by 1e-3 and 30, a NaN and an Inf row, a row alone vs in a batch."""
    log("rms_norm: plain, weighted, block (6H) and final (2H) modulation vs eager, bitwise")
    import torch.nn.functional as F
    eps = 1e-5
    for dname, dtype in DTYPES.items():
        for h in (1024, 3072, 4096, 5376):
            for s in (1, 3, 4097, 32768):
                for b in (1, 2):
                    x = data.rows((b, s, h), dtype)
                    if s >= 2:
                        x[0, 0, 5] = float("nan")
                        x[0, 1, 7] = float("inf")
                    w = (1 + 0.1 * torch.randn(h, device="cuda", generator=data.gen())).to(dtype)
                    t = 3
                    block = data.rows((t, 18 * h), dtype).view(3 * t, 6 * h)
                    final = data.rows((t, 2 * h), dtype)
                    tables = {"6H": (block[:, 0:h], block[:, h:2 * h], 3 * t),
                              "2H": (final[:, 0:h], final[:, h:2 * h], t)}
                    base = dict(dtype=dname, H=h, S=s, B=b)

                    def plain(weight):
                        got = suite.xj.rms_norm(x, weight, eps)
                        suite.xj.synchronize()
                        return compare(got, F.rms_norm(x, (h,), weight, eps))

                    suite.run("rms_norm", f"{dname} H={h} S={s} B={b} plain weight", lambda: plain(w), **base)
                    suite.run("rms_norm", f"{dname} H={h} S={s} B={b} plain no-weight", lambda: plain(None), **base)
                    for kind, (shift, scale, r) in tables.items():
                        idx = torch.randint(0, r, (s,), device="cuda", generator=data.gen())
                        for iname, index in (("int64", idx), ("int32", idx.int())):
                            def modulated(shift=shift, scale=scale, index=index, idx=idx):
                                got = suite.xj.rms_norm(x, None, eps, shift=shift, scale=scale, index=index)
                                suite.xj.synchronize()
                                ref = F.rms_norm(x, (h,), None, eps) * (1 + scale.index_select(0, idx)) + \
                                    shift.index_select(0, idx)
                                ok, detail = compare(got, ref)
                                if ok and b == 2:  # a row alone vs in a batch
                                    alone = suite.xj.rms_norm(x[1, -1:].contiguous(), None, eps, shift=shift,
                                                              scale=scale, index=index[-1:])
                                    suite.xj.synchronize()
                                    ok, detail = compare(alone, got[1, -1:])
                                    detail = "bitwise equal; a row alone equals it in the batch" if ok else detail
                                return ok, detail
                            suite.run("rms_norm", f"{dname} H={h} S={s} B={b} modulated {kind} index={iname}",
                                      modulated, table=kind, index=iname, **base)
                    del x, block, final
                torch.cuda.empty_cache()


def fused_eager(residual, gate, index, y, weight, shift, scale, eps):
    """(h, out): the gated residual, then the RMSNorm of h (modulated when shift is given), as a DiT
    block writes them one after the other."""
    import torch.nn.functional as F
    h = eager(residual, gate, index, y)
    out = F.rms_norm(h, (h.shape[-1],), weight, eps)
    if shift is not None:
        out = out * (1 + scale.index_select(0, index)) + shift.index_select(0, index)
    return h, out


def fused_norms(suite, data):
    """gate_residual_rms_norm's h and out against the gated residual and rms_norm of eager, bit for
    bit: with and without weight and modulation (shift, scale and gate the block's chunks 3, 4 and 2
    of one table), a 2H gate for the plain norm, a NaN and an Inf element, the rstd it saves equal to
    rms_norm's of h, a row alone vs in a batch, argument errors and a bad index."""
    log("gate_residual_rms_norm: h and (modulated) norm of h vs eager, bitwise")
    eps = 1e-5
    for dname, dtype in DTYPES.items():
        for h in (64, 1024, 5376):
            for s in (1, 3, 4097, 32768):
                for b in (1, 2):
                    residual, y = activations(data, b, s, h, dtype)
                    if s >= 2:  # non-finite values reach h and the norm of their rows
                        residual.view(-1, h)[0, 5] = float("nan")
                        y.view(-1, h)[1, 7] = float("inf")
                    w = (1 + 0.1 * torch.randn(h, device="cuda", generator=data.gen())).to(dtype)
                    rows = data.rows((T, 18 * h), dtype, row_len=6 * h).view(3 * T, 6 * h)
                    gate, shift, scale = (rows[:, c * h:(c + 1) * h] for c in (2, 3, 4))
                    idx = data.index(s, 3 * T)
                    forms = [("weight modulated", w, gate, shift, scale, idx, "int64"),
                             ("weight modulated", w, gate, shift, scale, idx.int(), "int32"),
                             ("no-weight modulated", None, gate, shift, scale, idx, "int64"),
                             ("weight plain", w, gate, None, None, idx, "int64"),
                             ("no-weight plain", None, gate, None, None, idx, "int64"),
                             ("weight plain, gate 2H", w, table_view(data, "2H", h, dtype), None, None,
                              data.index(s, T), "int64")]
                    for form, weight, g, sh, sc, index, iname in forms:
                        def case(weight=weight, g=g, sh=sh, sc=sc, index=index, form=form, iname=iname):
                            got = suite.xj.gate_residual_rms_norm(residual, g, index, y, weight, eps, shift=sh,
                                                                  scale=sc)
                            suite.xj.synchronize()
                            want = fused_eager(residual, g, index.long(), y, weight, sh, sc, eps)
                            for name, a, e in zip(("h", "out"), got, want):
                                ok, detail = check_support.compare(a, e, want="eager", count_poisoned=False)
                                if not ok:
                                    return False, f"{name}: {detail}"
                            details = ["h and out bitwise equal"]
                            if form == "weight modulated" and iname == "int64":
                                _, _, rstd = suite.xj.runtime().gate_residual_rms_norm(
                                    residual, g, index, y, weight, eps, shift=sh, scale=sc, return_rstd=True)
                                _, want_rstd = suite.xj.rms_norm(want[0], weight, eps, shift=sh, scale=sc,
                                                                 index=index, return_rstd=True)
                                suite.xj.synchronize()
                                ok, detail = check_support.compare(rstd, want_rstd)
                                if not ok:
                                    return False, f"rstd vs rms_norm's of h: {detail}"
                                details.append("rstd = rms_norm's of h")
                                if b == 2:  # a row alone vs in the batch
                                    alone = suite.xj.gate_residual_rms_norm(
                                        residual[1, -1:].contiguous(), g, index[-1:], y[1, -1:].contiguous(), weight,
                                        eps, shift=sh, scale=sc)
                                    suite.xj.synchronize()
                                    for name, a, e in zip(("h", "out"), alone, got):
                                        ok, detail = check_support.compare(a, e[1, -1:])
                                        if not ok:
                                            return False, f"a row alone, {name}: {detail}"
                                    details.append("a row alone equals it in the batch")
                            return True, "; ".join(details)
                        suite.run("fused", f"{dname} H={h} S={s} B={b} {form} index={iname}", case, dtype=dname,
                                  H=h, S=s, B=b, form=form, index=iname)
                    del residual, y, rows, gate, shift, scale
                torch.cuda.empty_cache()

    h, s, dtype = 1024, 4097, torch.bfloat16
    residual, y = activations(data, 1, s, h, dtype)
    rows = data.rows((T, 18 * h), dtype, row_len=6 * h).view(3 * T, 6 * h)
    gate, shift, scale = (rows[:, c * h:(c + 1) * h] for c in (2, 3, 4))
    index = data.index(s, 3 * T)
    final = data.rows((T, 2 * h), dtype)
    cases = [  # (name, gate, shift, scale) that the library must refuse with code 1
        ("shift without scale", gate, shift, None),
        ("gate rows and row stride differ from shift's", final[:, :h], shift, scale),
    ]
    for name, g, sh, sc in cases:
        suite.run("fused_invalid", name, lambda g=g, sh=sh, sc=sc: expect_error(
            suite.xj, 1, lambda: suite.xj.gate_residual_rms_norm(residual, g, index, y, None, eps, shift=sh,
                                                                 scale=sc)))
    bad = index.clone()
    bad[s // 2] = 3 * T

    def bad_index():
        ok, detail = expect_error(suite.xj, 5, lambda: suite.xj.gate_residual_rms_norm(
            residual, gate, bad, y, None, eps, shift=shift, scale=scale), "gate_residual_rms_norm")
        if not ok:
            return ok, detail
        got = suite.xj.gate_residual_rms_norm(residual, gate, index, y, None, eps, shift=shift, scale=scale)
        suite.xj.synchronize()
        want = fused_eager(residual, gate, index, y, None, shift, scale, eps)
        ok2, detail2 = compare(torch.stack(got), torch.stack(want))
        return ok2, f"{detail}; then a good call: {detail2}"
    suite.run("fused_invalid", "bad index: code 5 naming gate_residual_rms_norm, then a good call", bad_index)


def sinusoids(suite, data):
    log("timestep_sinusoid: diffusers get_timestep_embedding, bitwise; check_range")
    for c in (256, 320, 255):
        for n in (1, 3, 8, 1000):
            gen = data.gen()
            kinds = {"t in [0,1)": torch.rand(n, device="cuda", generator=gen),
                     "t in 0..999": torch.randint(0, 1000, (n,), device="cuda", generator=gen).float(),
                     "t bf16": torch.rand(n, device="cuda", generator=gen).to(torch.bfloat16)}
            for kind, t in kinds.items():
                for flip, shift, scale, period in ((True, 0, 1.0, 10000), (False, 1, 1.0, 10000),
                                                   (True, 0, 1000.0, 10000), (True, 1, 1.0, 100)):
                    def case(t=t, c=c, flip=flip, shift=shift, scale=scale, period=period):
                        got = suite.xj.timestep_sinusoid(t, c, period, flip, shift, scale)
                        suite.xj.synchronize()
                        return compare(got, diffusers_timestep_embedding(t, c, flip, shift, scale, period))
                    suite.run("sinusoid", f"C={c} T={n} {kind} flip={flip} shift={shift} scale={scale} "
                              f"max_period={period}", case, C=c, T=n)
    for name, bad in (("t = nan", float("nan")), ("t = 1.5", 1.5), ("t = -0.25", -0.25)):
        t = torch.rand(16, device="cuda", generator=data.gen())
        t[4] = bad

        def case(t=t):
            ok, detail = expect_error(suite.xj, 5, lambda: suite.xj.timestep_sinusoid(t, check_range=True),
                                      "timestep_sinusoid: t[4]")
            if not ok:
                return ok, detail
            suite.xj.timestep_sinusoid(t)  # without check_range a bad t is computed like eager
            suite.xj.synchronize()
            return True, detail
        suite.run("sinusoid_range", name, case)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--hidden", type=int, default=5376)
    p.add_argument("--sizes", default=",".join(map(str, SIZES)), help="comma-separated S values")
    p.add_argument("--seed", type=int, default=20240611)
    p.add_argument("--report", help="markdown report path")
    p.add_argument("--json", help="JSON report path")
    args = p.parse_args()
    sizes = [int(v) for v in args.sizes.split(",") if v]

    t0 = time.perf_counter()
    meta = dict(commit=os.environ.get("EXACTJIT_COMMIT", "unknown"), torch=torch.__version__, hidden=args.hidden,
                sizes=sizes, seed=args.seed)
    try:
        import exactjit as xj
        meta.update(exactjit=xj.version(), library=xj.library_path())
        if not torch.cuda.is_available():
            raise RuntimeError("torch sees no CUDA device")
        meta["device"] = torch.cuda.get_device_name()
    except Exception as e:
        return Suite(None).cannot_run(args, meta, "import exactjit / CUDA", e)
    log(f"exactjit {meta['exactjit']} ({meta['library']}), torch {torch.__version__}, "
        f"{meta['device']}")

    suite = Suite(xj)
    data = Data(args.seed)
    with torch.no_grad():
        for part in (lambda: grid(suite, data, args.hidden, sizes),
                     lambda: layouts(suite, data, args.hidden),
                     lambda: invalid_arguments(suite, data, args.hidden),
                     lambda: bad_indices(suite, data, args.hidden),
                     lambda: row_gather(suite, data, args.hidden),
                     lambda: rms_norms(suite, data),
                     lambda: fused_norms(suite, data),
                     lambda: sinusoids(suite, data)):
            try:
                part()
            except Exception as e:  # setup of a group failed (e.g. out of memory)
                traceback.print_exc()
                suite.setup_failed("group aborted", e)
            torch.cuda.empty_cache()
    meta["seconds"] = round(time.perf_counter() - t0, 1)
    return suite.finish(args, meta)


if __name__ == "__main__":
    sys.exit(main())
