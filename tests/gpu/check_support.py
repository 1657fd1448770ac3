"""What parity_torch.py and grad_torch.py share: logging, seeded inputs, the bitwise comparison,
the expected-error check, diffusers' timestep embedding (the sinusoid reference), and the Suite that
runs cases, writes the markdown and JSON reports and prints the closing summary.

Each script subclasses Suite for its own report title, column widths and extras; the text each
prints and writes is the script's own (see the class attributes)."""
import json
import math
import time
import traceback

import torch

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
BITS = {torch.bfloat16: torch.int16, torch.float16: torch.int16, torch.float32: torch.int32,
        torch.float64: torch.int64}


def log(*args):
    print(*args, flush=True)


class Data:
    """Seeded random inputs on the device; a new generator per draw keeps cases independent."""

    def __init__(self, seed):
        self.seed = seed

    def gen(self):
        self.seed += 1
        return torch.Generator(device="cuda").manual_seed(self.seed)

    def rows(self, shape, dtype, row_len=None):
        """randn of `shape` with about 1/8 of its rows (row_len elements, default the last dim)
        scaled by 1e-3 and 1/8 by 30; a tail shorter than a row is left as drawn."""
        gen = self.gen()
        x = torch.randn(shape, generator=gen, device="cuda", dtype=dtype)
        row_len = row_len or shape[-1]
        n = x.numel() // row_len
        pick = torch.randint(0, 8, (n,), generator=gen, device="cuda")
        scale = torch.where(pick == 0, 1e-3, torch.where(pick == 1, 30.0, 1.0))
        x.view(-1)[:n * row_len].view(n, row_len).mul_(scale.to(dtype)[:, None])
        return x

    def index(self, s, r):
        return torch.randint(0, r, (s,), generator=self.gen(), device="cuda", dtype=torch.int64)


def import_exactjit(meta):
    """exactjit with every C entry point and a CUDA device; notes its version, library, torch
    extension (or why it is not loaded) and the device in meta; raises with the reason when one
    is missing."""
    import exactjit as xj
    from exactjit import _extension, _lib, ops  # noqa: F401 - ops registers the operators, loads the extension
    meta.update(exactjit=xj.version(), library=xj.library_path(),
                extension=_extension.path or f"not loaded ({_extension.reason})")
    if _lib.missing:
        raise RuntimeError(f"the library lacks {', '.join(sorted(_lib.missing))}")
    if not torch.cuda.is_available():
        raise RuntimeError("torch sees no CUDA device")
    meta["device"] = torch.cuda.get_device_name()
    return xj


def compare(got, ref, want="want", check_shape=True, count_poisoned=False):
    """(ok, detail): bitwise equality of two tensors of one dtype and shape. `want` names ref in
    the detail; check_shape: a shape or dtype mismatch fails before the bits are compared;
    count_poisoned: the detail also counts elements of got still all-ones bits (the poison)."""
    if check_shape and (got.shape != ref.shape or got.dtype != ref.dtype):
        return False, f"got {tuple(got.shape)} {got.dtype}, want {tuple(ref.shape)} {ref.dtype}"
    bits = BITS[ref.dtype]
    g, r = got.reshape(-1).view(bits), ref.reshape(-1).view(bits)
    if torch.equal(g, r):
        return True, "bitwise equal"
    diff = g != r
    n = int(diff.sum())
    poisoned = f" ({int((g == -1).sum())} still poisoned)" if count_poisoned else ""
    first = int(diff.nonzero()[0, 0])
    mask = (1 << torch.finfo(ref.dtype).bits) - 1
    return False, (f"{n}/{g.numel()} elements differ{poisoned}; first at flat {first}: got "
                   f"0x{int(g[first]) & mask:x}, {want} 0x{int(r[first]) & mask:x}")


def expect_error(xj, code, call, mention=None, nonempty=False):
    """(ok, detail) for a call that must raise exactjit.Error with `code`, at the call or at the
    synchronize() after it (a runtime created with EXACTJIT_CHECK_AFTER_LAUNCH reports a bad
    index at the call; the detail says which), with a message that mentions `mention` and, with
    nonempty, is not blank."""
    where = "call"
    try:
        call()
        where = "synchronize"
        xj.synchronize()
    except xj.Error as e:
        msg = str(e)
        if e.code != code:
            return False, f"raised at {where} with code {int(e.code)}, want {code}: {msg}"
        if nonempty and not msg.strip():
            return False, f"code {code} at {where} but an empty message"
        if mention and mention not in msg:
            return False, f"code {code} at {where}, message lacks {mention!r}: {msg}"
        return True, f"code {code} at {where}: {msg[:200]}"
    return False, "no exactjit.Error raised"


def diffusers_timestep_embedding(t, c, flip, shift, scale, max_period, dtype=torch.float32):
    """diffusers get_timestep_embedding, written out as diffusers writes it (dtype=float32, eager on
    the GPU), or in another dtype (float64 for an accuracy reference)."""
    half = c // 2
    exponent = -math.log(max_period) * torch.arange(start=0, end=half, dtype=dtype, device=t.device)
    exponent = exponent / (half - shift)
    emb = torch.exp(exponent)
    emb = t[:, None].to(dtype) * emb[None, :]
    emb = scale * emb
    emb = torch.cat([torch.sin(emb), torch.cos(emb)], dim=-1)
    if flip:
        emb = torch.cat([emb[:, half:], emb[:, :half]], dim=-1)
    if c % 2 == 1:
        emb = torch.nn.functional.pad(emb, (0, 1, 0, 0))
    return emb


def parse_groups(parser, value, known):
    """The comma-separated groups of --groups, each one of `known` (else a usage error)."""
    groups = [g for g in value.split(",") if g]
    unknown = set(groups) - set(known)
    if unknown:
        parser.error(f"unknown groups {sorted(unknown)}; choose from {', '.join(known)}")
    return groups


def run_groups(suite, xj, parts, groups):
    """Runs parts[name]() for each group in order; a group that raises is one failed case and the
    next still runs; a bad-index record left by one must not leak into the next."""
    for name in groups:
        try:
            parts[name]()
        except Exception as e:  # set-up of a group failed (e.g. out of memory)
            traceback.print_exc()
            suite.setup_failed(f"group {name} aborted", e)
        try:
            torch.cuda.synchronize()
            xj.synchronize()
        except Exception as e:
            suite.setup_failed(f"group {name}: synchronize after it", e)
        torch.cuda.empty_cache()


class Suite:
    """Runs cases (a crash is a failed case; the next case still runs), keeps their records and
    writes the reports. Subclasses set the class attributes below and may override call(),
    settle(), notes() and appendix()."""

    script = None  # the script's file name in the closing summary
    title = None  # the markdown report's first line
    skip_label = "skip"  # the result of a skipped case
    name_width = 58  # case-name column of the per-case log line
    summary_width = 70  # "group: case" column of the closing summary

    def __init__(self, xj):
        self.xj = xj
        self.cases = []

    def record(self, group, name, ok, detail, seconds, **params):
        status = self.skip_label if ok is None else ("PASS" if ok else "FAIL")
        self.cases.append(dict(group=group, case=name, result=status, detail=detail,
                               seconds=round(seconds, 3), **params))
        log(f"  [{status}] {name:<{self.name_width}} {seconds:6.2f}s  {'' if ok else detail}")

    def setup_failed(self, what, e):
        """A failed case `what` in group "setup" for exception e (not a case of its own)."""
        self.record("setup", what, False, f"{type(e).__name__}: {e}", 0.0)

    def call(self, fn, params):
        """(ok, detail) of one case's fn; may add to the case's params."""
        ok, detail = fn()
        return ok, detail

    def settle(self, ok, detail):
        """Waits for the device after a case; (ok, detail) as they then stand."""
        torch.cuda.synchronize()
        return ok, detail

    def run(self, group, name, fn, **params):
        t0 = time.perf_counter()
        try:
            ok, detail = self.call(fn, params)
        except Exception as e:  # a crash is a failed case; the next case still runs
            ok, detail = False, f"{type(e).__name__}: {str(e)[:400]}"
            traceback.print_exc()
        ok, detail = self.settle(ok, detail)
        self.record(group, name, ok, detail, time.perf_counter() - t0, **params)

    def notes(self, args):
        """Report lines between the meta lines and the result line."""
        return []

    def appendix(self):
        """Report lines after the case table."""
        return []

    def write_reports(self, args, meta):
        """Sets meta["summary"]; writes args.json and args.report where given."""
        fails = [c for c in self.cases if c["result"] == "FAIL"]
        passes = [c for c in self.cases if c["result"] == "PASS"]
        meta["summary"] = dict(passed=len(passes), failed=len(fails),
                               skipped=len(self.cases) - len(passes) - len(fails))
        if args.json:
            with open(args.json, "w") as f:
                json.dump(dict(meta, cases=self.cases), f, indent=1)
        if args.report:
            lines = [
                self.title, "",
                *(f"- {k}: {v}" for k, v in meta.items() if k != "summary"),
                *self.notes(args),
                f"- result: {len(passes)} passed, {len(fails)} failed, {meta['summary']['skipped']} skipped", "",
                "| group | case | result | detail |", "|---|---|---|---|",
            ]
            for c in self.cases:
                detail = c["detail"].replace("|", "\\|").replace("\n", " ")
                lines.append(f"| {c['group']} | {c['case']} | {c['result']} | {detail} |")
            lines += self.appendix()
            with open(args.report, "w") as f:
                f.write("\n".join(lines) + "\n")

    def cannot_run(self, args, meta, what, e):
        """Set-up failed (exactjit, its entry points or CUDA): one failed case `what`, the reports;
        exit status 2."""
        log(f"cannot run: {type(e).__name__}: {e}")
        self.setup_failed(what, e)
        self.write_reports(args, meta)
        return 2

    def finish(self, args, meta):
        """The reports, then every case's result and the totals; exit status 1 if a case failed."""
        self.write_reports(args, meta)
        log("")
        log(f"{'case':<{self.summary_width}} result")
        for c in self.cases:
            log(f"{c['group'] + ': ' + c['case']:<{self.summary_width}} {c['result']}")
        n = meta["summary"]
        log(f"\n{self.script} took {meta['seconds']} s")
        log(f"{n['passed']} passed, {n['failed']} failed, {n['skipped']} skipped")
        return 1 if n["failed"] else 0
