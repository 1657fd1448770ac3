#!/usr/bin/env python3
"""exactjit.distributed's plumbing on a machine without a GPU: ranks of a gloo group on the CPU.

The kernels need CUDA, so the runtime is replaced by a model of their contracts in torch: a
segment sum cuts each table row's positions (b-major, s ascending) into tiles of 256, sums each
tile's terms from 0 in order (plain fp32 adds, which any change of order or grouping shows in the
bits), and folds each row's tiles from 0 in order. Over that model the sharded backward must give
every rank the single-GPU table gradient bit for bit, for shards that cut segments, a segment over
three ranks, an empty shard, batch 2, and adaln_row_gather's six chunks; and where a tile spans
shards, the naive split (each rank's own single-GPU sums, all-reduced) must not, which shows the
check can fail. The real
kernels run in tests/gpu/sequence_parallel_torch.py. Tests that need torch skip without it.
"""
import importlib.util
import os
import tempfile
import unittest

from package_under_test import REPO  # noqa: F401  (puts the package on sys.path)

HAS_TORCH = importlib.util.find_spec("torch") is not None
HAS_GLOO = False
if HAS_TORCH:
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp
    HAS_GLOO = dist.is_available() and dist.is_gloo_available()

TILE = 256


def tiles_of(keys, rows, table_rows):
    """Each table row's tiles: lists of flattened rows b * S + s in summation order."""
    seq = keys.shape[0]
    out = []
    for k in range(table_rows):
        positions = [b * seq + s for b in range(rows // seq) for s in range(seq) if int(keys[s]) == k]
        out.append([positions[i:i + TILE] for i in range(0, len(positions), TILE)])
    return out


def add_in_order(terms, width):
    total = torch.zeros(width, dtype=torch.float32)
    for term in terms:
        total = total + term
    return total


class ModelRuntime:
    """The contracts of the kernels exactjit.distributed calls, on CPU tensors."""

    def segment_fold_tiles(self, rows, seq, table_rows):
        return -(-rows // TILE) + table_rows

    def _gate_residual(self, residual, gate, index, y, out):
        flat = y.reshape(-1, y.shape[-1])
        return (residual.reshape(flat.shape) + gate[index.repeat(flat.shape[0] // index.shape[0])] * flat).view(y.shape)

    def gate_residual_backward(self, grad, gate, index, y, need_d_y=True, need_d_gate=True, dtype=None):
        hidden = y.shape[-1]
        g, v = grad.reshape(-1, hidden).float(), y.reshape(-1, hidden).float()
        d_y = (g * gate[index.repeat(g.shape[0] // index.shape[0])]).view(y.shape).to(y.dtype) if need_d_y else None
        d_gate = None
        if need_d_gate:
            rows = [add_in_order([add_in_order(g[t] * v[t], hidden) for t in tiles], hidden)
                    for tiles in tiles_of(index, g.shape[0], gate.shape[0])]
            d_gate = torch.stack(rows).to(dtype or gate.dtype)
        return d_y, d_gate

    def _adaln_row_gather(self, rows, steps, tags):
        return rows[steps * 3 + tags].view(steps.shape[0], 6, -1).permute(1, 0, 2).contiguous()

    def adaln_row_gather_backward(self, grad, steps, tags, table_rows, dtype=None):
        chunks, seq, hidden = grad.shape
        flat = grad.permute(1, 0, 2).reshape(seq, chunks * hidden).float()
        rows = [add_in_order([add_in_order(flat[t], chunks * hidden) for t in tiles], chunks * hidden)
                for tiles in tiles_of(steps * 3 + tags, seq, table_rows)]
        return torch.stack(rows).to(dtype or grad.dtype)

    def segment_fold(self, partials, index, table_rows, rows=None, dtype=None):
        at, out = 0, []
        for tiles in tiles_of(index, rows or index.shape[0], table_rows):
            out.append(add_in_order(partials[at:at + len(tiles)], partials.shape[1]))
            at += len(tiles)
        return torch.stack(out).to(dtype or torch.float32)


def keys_of(seq):
    """Three modality blocks per timestep row key, as a packed H3 sequence has them."""
    pattern = [0] * 300 + [1] * 10 + [2] * 400 + [4] * 90 + [3] * 200
    return torch.tensor((pattern * (seq // len(pattern) + 1))[:seq], dtype=torch.int64)


def rank_main(rank, world, sizes, batch, folder):
    """One rank: its problems, if any, go to folder/rank<r>.txt."""
    dist.init_process_group("gloo", init_method=f"file://{folder}/init", rank=rank, world_size=world)
    from exactjit import distributed as xd
    model = ModelRuntime()
    xd.default_runtime = lambda: model
    torch.manual_seed(0)
    seq, hidden, table_rows = sum(sizes), 8, 6
    keys = keys_of(seq)
    table = torch.randn(table_rows, 6 * hidden)
    y, residual, grad = (torch.randn(batch, seq, hidden) for _ in range(3))
    gate = table[:, 2 * hidden:3 * hidden]
    ref = model.gate_residual_backward(grad, gate, keys, y, need_d_y=False, dtype=torch.float32)[1]
    plan = xd.SequencePlan(keys, table_rows, sizes, batch=batch, device="cpu")
    a, b = plan.start, plan.start + plan.size
    leaf = table.clone().requires_grad_()
    out = xd.gate_residual(residual[:, a:b].contiguous(), leaf[:, 2 * hidden:3 * hidden], y[:, a:b].contiguous(),
                           plan)
    out.backward(grad[:, a:b].contiguous())
    problems = []
    if not torch.equal(leaf.grad[:, 2 * hidden:3 * hidden], ref):
        problems.append("gate_residual d_gate differs from the single-GPU sums")
    sums = xd.gate_residual_table_grad(grad[:, a:b], y[:, a:b], plan, torch.float32)
    if not torch.equal(sums.view(torch.int32), ref.view(torch.int32)):
        problems.append("gate_residual_table_grad's fp32 sums differ from the single-GPU sums")
    naive = model.gate_residual_backward(grad[:, a:b], gate, keys[a:b], y[:, a:b], need_d_y=False,
                                         dtype=torch.float32)[1] if b > a else torch.zeros_like(ref)
    dist.all_reduce(naive)
    moved = torch.tensor([sum(plan.receive_counts)])
    dist.all_reduce(moved)
    if int(moved) > 0 and torch.equal(naive, ref):  # where a tile spans shards, the naive split must differ
        problems.append("the naive split gave the single-GPU bits: the check cannot fail")
    if batch == 1:
        steps, tags = torch.div(keys, 3, rounding_mode="floor"), keys % 3
        rows_grad = torch.randn(6, seq, hidden)
        ref_rows = model.adaln_row_gather_backward(rows_grad, steps, tags, table_rows, dtype=torch.float32)
        gather_plan = xd.SequencePlan(keys, table_rows, sizes, device="cpu")
        leaf = table.clone().requires_grad_()
        chunks = xd.adaln_row_gather(leaf, steps[a:b], tags[a:b], gather_plan)
        torch.autograd.backward(chunks, rows_grad[:, a:b].unbind(0))
        if not torch.equal(leaf.grad, ref_rows):
            problems.append("adaln_row_gather d_rows differs from the single-GPU sums")
    if problems:
        with open(os.path.join(folder, f"rank{rank}.txt"), "w") as f:
            f.write("; ".join(problems))
    dist.destroy_process_group()


@unittest.skipUnless(HAS_GLOO, "needs torch with gloo")
class SequenceParallelOnCpuRanks(unittest.TestCase):
    def test_every_rank_gets_the_single_gpu_sums(self):
        layouts = [([355, 1000 - 355], 1), ([1, 999], 2), ([1000, 0], 1), ([0, 300, 700], 1),
                   ([260, 40, 700], 2), ([100, 150, 5, 745], 1)]
        for sizes, batch in layouts:
            with self.subTest(sizes=sizes, batch=batch), tempfile.TemporaryDirectory() as tmp:
                mp.spawn(rank_main, args=(len(sizes), sizes, batch, tmp), nprocs=len(sizes))
                found = {}
                for name in sorted(os.listdir(tmp)):
                    if name.startswith("rank"):
                        with open(os.path.join(tmp, name)) as f:
                            found[name[:-4]] = f.read()
                self.assertEqual(found, {})


if __name__ == "__main__":
    unittest.main()
