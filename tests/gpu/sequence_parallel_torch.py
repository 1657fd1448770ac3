#!/usr/bin/env python3
"""exactjit.distributed against one GPU, byte for byte (issue 18 item 1), on the GPU machine.

For each world size in --ranks, that many processes form a torch.distributed group (--backend,
default gloo: NCCL refuses two ranks on one device, so on a one-GPU machine every rank shares
cuda:0; with more GPUs rank r takes cuda:r % count). Every rank draws the same inputs: a packed
MiniMax-H3 sequence of --seq positions (257 text, 320 audio, the rest video, at scattered
positions; T = 3, keys timestep_index * 3 + token_tag), an AdaLN table (3T, 6H) with its gate
chunk as a strided view, y, residual and upstream gradients (B, S, H). The single-GPU reference is
exactjit's own autograd over the whole sequence on one rank's device; the sharded run gives rank r
positions [start_r, start_r + S_r) of every batch copy.

Cases, for each shard layout (even; one position on rank 0; the last rank empty; and batch 2):
  gate_residual     exactjit.distributed.gate_residual under autograd: the shard's output and d_y
                    equal the reference's rows, and the table's gradient (through the gate view)
                    equals the single-GPU one byte for byte on every rank; so do the fp32 sums
                    before their rounding (gate_residual_table_grad with float32), where a
                    summation-order mistake cannot hide behind the bf16 rounding.
  adaln_row_gather  exactjit.distributed.adaln_row_gather (batch 1): the six chunks' rows, the
                    (3T, 6H) table gradient and its fp32 sums, byte for byte.
  rms_norm          exactjit.distributed.rms_norm, modulated (shift/scale views of the table) and
                    plain, with a trainable weight: out and dx rows, dweight and the table gradient.
  gate_residual_rms_norm  the fused op (modulated, weighted; h and out both used): h, out,
                    d_residual and d_y rows, dweight and the table gradient (gate, shift, scale).
  control           (first layout only) the naive split, each rank's own single-GPU backward of its
                    shard (fp32 sums) summed over ranks, must NOT give the single-GPU sums: it shows
                    that the comparison fails where the summation order is not kept.

Usage: python3 tests/gpu/sequence_parallel_torch.py [--ranks 2,3] [--seq 4097] [--hidden 5376]
    [--dtype bf16] [--backend gloo] [--report sp.md] [--json sp.json]
Exit status: 0 every case passes, 1 a case failed, 2 exactjit, CUDA or torch.distributed unavailable.
"""
import argparse
import os
import sys
import time

import torch
import torch.distributed as dist

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "..", "python"))
sys.path.insert(0, HERE)
from check_support import DTYPES, compare  # noqa: E402
from rank_runs import join, leave, naive_split_differs, report, run_worlds  # noqa: E402

TIMESTEPS = 3


def packed_keys(seq, device, seed=0):
    """(timestep_indices, token_tags) of a packed sequence: 257 text rows (tag 1, step 0), 320
    audio rows (tag 2, step 2), the rest video (tag 0; the first quarter step 0, the rest 1), each
    modality at sorted random positions."""
    gen = torch.Generator().manual_seed(seed)
    order = torch.randperm(seq, generator=gen)
    text, audio = order[:257].sort().values, order[257:577].sort().values
    video = order[577:].sort().values
    tags = torch.zeros(seq, dtype=torch.int64)
    tags[text], tags[audio] = 1, 2
    steps = torch.zeros(seq, dtype=torch.int64)
    steps[video[video.shape[0] // 4:]] = 1
    steps[audio] = 2
    return steps.to(device), tags.to(device)


def layouts(world, seq):
    """(name, shard sizes, batch) of the shard layouts every world size runs."""
    even = [seq // world + (1 if r < seq % world else 0) for r in range(world)]
    rest = seq - 1
    first_one = [1] + [rest // (world - 1) + (1 if r < rest % (world - 1) else 0) for r in range(world - 1)]
    last_empty = [seq // (world - 1) + (1 if r < seq % (world - 1) else 0) for r in range(world - 1)] + [0]
    return [("even", even, 1), ("one position on rank 0", first_one, 1), ("last rank empty", last_empty, 1),
            ("even, batch 2", even, 2)]


def draw(shape, dtype, device, seed):
    gen = torch.Generator(device=device).manual_seed(seed)
    return torch.randn(shape, generator=gen, device=device, dtype=torch.float32).to(dtype)


def gate_residual_case(xj, xd, sizes, batch, hidden, dtype, device, seed):
    """[(quantity, ok, detail)] for one layout."""
    steps, tags = packed_keys(sum(sizes), device)
    keys = steps * 3 + tags
    seq, rank = keys.shape[0], dist.get_rank()
    table = draw((3 * TIMESTEPS, 6 * hidden), dtype, device, seed)
    residual, y, grad = (draw((batch, seq, hidden), dtype, device, seed + i) for i in (1, 2, 3))

    def gate_of(t):
        return t[:, 2 * hidden:3 * hidden]

    ref_table, ref_y = table.clone().requires_grad_(), y.clone().requires_grad_()
    ref_out = xj.gate_residual(residual, gate_of(ref_table), keys, ref_y)
    ref_out.backward(grad)

    plan = xd.SequencePlan(keys, 3 * TIMESTEPS, sizes, batch=batch)
    a, b = plan.start, plan.start + plan.size
    table_sp, y_sp = table.clone().requires_grad_(), y[:, a:b].contiguous().requires_grad_()
    out = xd.gate_residual(residual[:, a:b].contiguous(), gate_of(table_sp), y_sp, plan)
    out.backward(grad[:, a:b].contiguous())
    # The fp32 sums before their rounding to the table's dtype: where an order mistake shows.
    ref_sums = xj.runtime().gate_residual_backward(grad, gate_of(table), keys, y, need_d_y=False,
                                                   dtype=torch.float32)[1]
    sums = xd.gate_residual_table_grad(grad[:, a:b], y[:, a:b], plan, torch.float32)
    torch.cuda.synchronize()
    checks = [("out", *compare(out, ref_out[:, a:b].contiguous())),
              ("d_y", *compare(y_sp.grad, ref_y.grad[:, a:b].contiguous())),
              ("d_table (via the gate view)", *compare(table_sp.grad, ref_table.grad)),
              ("d_gate as fp32 sums", *compare(sums, ref_sums))]
    return checks, (table, y, grad, keys, ref_sums, plan)


def adaln_row_gather_case(xj, xd, sizes, hidden, dtype, device, seed):
    steps, tags = packed_keys(sum(sizes), device)
    table = draw((3 * TIMESTEPS, 6 * hidden), dtype, device, seed)
    grad = draw((6, steps.shape[0], hidden), dtype, device, seed + 1)
    ref_rows = table.clone().requires_grad_()
    ref_chunks = xj.adaln_row_gather(ref_rows, steps, tags)
    torch.autograd.backward(ref_chunks, grad.unbind(0))

    plan = xd.SequencePlan(steps * 3 + tags, 3 * TIMESTEPS, sizes)
    a, b = plan.start, plan.start + plan.size
    rows_sp = table.clone().requires_grad_()
    chunks = xd.adaln_row_gather(rows_sp, steps[a:b], tags[a:b], plan)
    torch.autograd.backward(chunks, grad[:, a:b].contiguous().unbind(0))
    ref_sums = xj.runtime().adaln_row_gather_backward(grad, steps, tags, 3 * TIMESTEPS, dtype=torch.float32)
    sums = xd.adaln_row_gather_table_grad(grad[:, a:b], plan, torch.float32)
    torch.cuda.synchronize()
    return [("chunks", *compare(torch.stack(chunks), torch.stack(ref_chunks)[:, a:b].contiguous())),
            ("d_rows", *compare(rows_sp.grad, ref_rows.grad)),
            ("d_rows as fp32 sums", *compare(sums, ref_sums))]


def norm_inputs(sizes, batch, hidden, dtype, device, seed, rows):
    """The norm cases' keys (step * 3 + tag), AdaLN table, norm weight and `rows` (B, S, H) tensors."""
    steps, tags = packed_keys(sum(sizes), device)
    keys = steps * 3 + tags
    table = draw((3 * TIMESTEPS, 6 * hidden), dtype, device, seed)
    weight = draw((hidden,), dtype, device, seed + 1)
    return keys, table, weight, [draw((batch, keys.shape[0], hidden), dtype, device, seed + 2 + i) for i in range(rows)]


def rms_norm_case(xj, xd, sizes, batch, hidden, dtype, device, seed):
    eps = 1e-6
    keys, table, weight, (x, grad) = norm_inputs(sizes, batch, hidden, dtype, device, seed, 2)
    plan = xd.SequencePlan(keys, 3 * TIMESTEPS, sizes, batch=batch)
    a, b = plan.start, plan.start + plan.size
    checks = []
    for modulated in (True, False):
        def views(t):
            return dict(shift=t[:, :hidden], scale=t[:, hidden:2 * hidden]) if modulated else {}
        ref_table, ref_weight, ref_x = (t.clone().requires_grad_() for t in (table, weight, x))
        ref_out = xj.rms_norm(ref_x, ref_weight, eps, index=keys if modulated else None, **views(ref_table))
        ref_out.backward(grad)
        sp_table, sp_weight = table.clone().requires_grad_(), weight.clone().requires_grad_()
        sp_x = x[:, a:b].contiguous().requires_grad_()
        out = xd.rms_norm(sp_x, sp_weight, eps, plan, **views(sp_table))
        out.backward(grad[:, a:b].contiguous())
        torch.cuda.synchronize()
        form = "modulated" if modulated else "plain"
        checks += [(f"{form}: out", *compare(out, ref_out[:, a:b].contiguous())),
                   (f"{form}: dx", *compare(sp_x.grad, ref_x.grad[:, a:b].contiguous())),
                   (f"{form}: dweight", *compare(sp_weight.grad, ref_weight.grad))]
        if modulated:
            checks.append((f"{form}: d_table (via shift, scale)", *compare(sp_table.grad, ref_table.grad)))
    return checks


def fused_case(xj, xd, sizes, batch, hidden, dtype, device, seed):
    eps = 1e-6
    keys, table, weight, (residual, y, grad_h, grad_out) = norm_inputs(sizes, batch, hidden, dtype, device, seed, 4)

    def views(t):
        return t[:, 2 * hidden:3 * hidden], dict(shift=t[:, :hidden], scale=t[:, hidden:2 * hidden])

    ref = [t.clone().requires_grad_() for t in (table, weight, residual, y)]
    gate, modulation = views(ref[0])
    ref_h, ref_out = xj.gate_residual_rms_norm(ref[2], gate, keys, ref[3], ref[1], eps, **modulation)
    torch.autograd.backward((ref_h, ref_out), (grad_h, grad_out))
    plan = xd.SequencePlan(keys, 3 * TIMESTEPS, sizes, batch=batch)
    a, b = plan.start, plan.start + plan.size

    def shard(t):
        return t[:, a:b].contiguous()
    sp = [table.clone().requires_grad_(), weight.clone().requires_grad_(), shard(residual).requires_grad_(),
          shard(y).requires_grad_()]
    gate, modulation = views(sp[0])
    h, out = xd.gate_residual_rms_norm(sp[2], gate, sp[3], sp[1], eps, plan, **modulation)
    torch.autograd.backward((h, out), (shard(grad_h), shard(grad_out)))
    torch.cuda.synchronize()
    return [("h", *compare(h, shard(ref_h))), ("out", *compare(out, shard(ref_out))),
            ("d_residual", *compare(sp[2].grad, shard(ref[2].grad))), ("d_y", *compare(sp[3].grad, shard(ref[3].grad))),
            ("dweight", *compare(sp[1].grad, ref[1].grad)),
            ("d_table (gate, shift, scale)", *compare(sp[0].grad, ref[0].grad))]


def naive_control(xj, inputs, hidden):
    """Each rank's single-GPU backward of its own shard (fp32 sums), all-reduced: must differ from
    the single-GPU fp32 sums."""
    table, y, grad, keys, ref_sums, plan = inputs
    a, b = plan.start, plan.start + plan.size
    part = torch.zeros_like(ref_sums)
    if b > a:
        part = xj.runtime().gate_residual_backward(grad[:, a:b].contiguous(), table[:, 2 * hidden:3 * hidden],
                                                   keys[a:b], y[:, a:b].contiguous(), need_d_y=False,
                                                   dtype=torch.float32)[1]
    return [naive_split_differs("naive per-rank sums differ (control)", part, ref_sums, plan.group, "fp32 d_gate")]


def worker(rank, world, args, init_file, result_file):
    device = join(rank, world, args.backend, init_file)
    import exactjit as xj
    from exactjit import distributed as xd
    results = []
    dtype = DTYPES[args.dtype]
    for n, (name, sizes, batch) in enumerate(layouts(world, args.seq)):
        layout = f"{world} ranks, {name}: S_r = {sizes}, B = {batch}"
        start = time.perf_counter()
        checks, inputs = gate_residual_case(xj, xd, sizes, batch, args.hidden, dtype, device, seed=10 * n)
        results += [dict(layout=layout, op="gate_residual", quantity=q, ok=ok, detail=d) for q, ok, d in checks]
        if n == 0:
            results += [dict(layout=layout, op="gate_residual", quantity=q, ok=ok, detail=d)
                         for q, ok, d in naive_control(xj, inputs, args.hidden)]
        if batch == 1:
            results += [dict(layout=layout, op="adaln_row_gather", quantity=q, ok=ok, detail=d)
                        for q, ok, d in adaln_row_gather_case(xj, xd, sizes, args.hidden, dtype, device, 10 * n + 5)]
        for op, case in (("rms_norm", rms_norm_case), ("gate_residual_rms_norm", fused_case)):
            results += [dict(layout=layout, op=op, quantity=q, ok=ok, detail=d)
                        for q, ok, d in case(xj, xd, sizes, batch, args.hidden, dtype, device, 10 * n + 7)]
        print(f"rank {rank}: {layout}: {time.perf_counter() - start:.2f} s", flush=True)
    leave(world, results, result_file)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", default="2,3", help="world sizes to run, comma-separated")
    parser.add_argument("--seq", type=int, default=4097)
    parser.add_argument("--hidden", type=int, default=5376)
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    parser.add_argument("--backend", default="gloo")
    parser.add_argument("--report")
    parser.add_argument("--json")
    args = parser.parse_args()
    if not torch.cuda.is_available() or not dist.is_available():
        print("sequence_parallel_torch: needs CUDA and torch.distributed", file=sys.stderr)
        return 2
    meta = dict(device=torch.cuda.get_device_name(), devices=torch.cuda.device_count(), backend=args.backend,
                torch=torch.__version__, commit=os.environ.get("EXACTJIT_COMMIT", "unknown"), seq=args.seq,
                hidden=args.hidden, dtype=args.dtype)
    rows = run_worlds(worker, [int(w) for w in args.ranks.split(",")], args)
    return report("sequence_parallel_torch", "exactjit.distributed: sequence-parallel backward against one GPU",
                  "Every rank checks its own shard's rows and the whole table gradient it ends with.",
                  ("layout", "op", "quantity"), rows, meta, args)


if __name__ == "__main__":
    sys.exit(main())
