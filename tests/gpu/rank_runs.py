"""What the torch.distributed checks (sequence_parallel_torch.py, tensor_parallel_torch.py) share:
spawning a process group per world size, each rank's results gathered on rank 0, and the markdown
and JSON reports with one row per check and the ranks passing it."""
import json
import os
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from check_support import compare


def join(rank, world, backend, init_file):
    """This process as `rank` of the group; its device: cuda:rank % count (every rank on cuda:0 on
    a one-GPU machine)."""
    device = torch.device("cuda", rank % torch.cuda.device_count())
    torch.cuda.set_device(device)
    dist.init_process_group(backend, init_method=f"file://{init_file}", rank=rank, world_size=world)
    return device


def leave(world, results, result_file):
    """Gathers every rank's result rows (dicts) on rank 0, which writes them with their rank."""
    gathered = [None] * world
    dist.all_gather_object(gathered, results)
    if dist.get_rank() == 0:
        rows = [dict(r, rank=q) for q, rank_results in enumerate(gathered) for r in rank_results]
        with open(result_file, "w") as f:
            json.dump(rows, f)
    dist.destroy_process_group()


def naive_split_differs(quantity, part, ref, group, what):
    """The control every check has: each rank's own one-GPU result over its part, summed over the
    ranks (through the host: gloo), must NOT equal the one-GPU `ref`, or the comparison could not
    tell a broken order. (quantity, ok, detail)."""
    staged = part.cpu()
    dist.all_reduce(staged, group=group)
    equal, _ = compare(staged.to(ref.device), ref)
    return (quantity, not equal, "the naive split gave the single-GPU bits: the comparison cannot tell" if equal else
            f"the naive split's {what} differs from the single-GPU one, as it must")


def run_worlds(worker, worlds, args):
    """worker(rank, world, args, init_file, result_file) on `world` processes for each world size;
    the result rows of all of them."""
    rows = []
    for world in worlds:
        with tempfile.TemporaryDirectory() as tmp:
            result_file = os.path.join(tmp, "results.json")
            mp.spawn(worker, args=(world, args, os.path.join(tmp, "init"), result_file), nprocs=world)
            with open(result_file) as f:
                rows += json.load(f)
    return rows


def report(name, title, intro, columns, rows, meta, args):
    """Writes the markdown (args.report) and JSON (args.json) reports: one row per check, keyed by
    `columns`, with the ranks passing it and the first failing rank's detail (else rank 0's);
    prints the markdown and the summary. The exit status: 0 all pass, 1 a check failed."""
    lines = [f"# {title}", "", *[f"- {k}: {v}" for k, v in meta.items()], "", intro, "",
             "| " + " | ".join(columns) + " | ranks passing | detail (first failing rank, else rank 0) |",
             "|" + "---|" * (len(columns) + 2)]
    keyed = {}
    for r in rows:
        keyed.setdefault(tuple(r[c] for c in columns), []).append(r)
    for key, group in keyed.items():
        shown = next((r for r in group if not r["ok"]), group[0])
        lines.append("| " + " | ".join(key) + f" | {sum(r['ok'] for r in group)}/{len(group)} | {shown['detail']} |")
    text = "\n".join(lines) + "\n"
    if args.report:
        with open(args.report, "w") as f:
            f.write(text)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(meta=meta, results=rows), f, indent=1)
    failed = [r for r in rows if not r["ok"]]
    print(f"{name}: {len(rows) - len(failed)}/{len(rows)} checks pass")
    return 1 if failed else 0
