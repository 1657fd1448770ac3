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
import unittest

from package_under_test import REPO  # noqa: F401  (puts the package on sys.path)

HAS_TORCH = importlib.util.find_spec("torch") is not None
HAS_GLOO = False
if HAS_TORCH:
    import torch
    import torch.distributed as dist
    from gloo_ranks import problems_of_ranks, write_problems
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

    # rms_norm: out = x * rstd * w * (1 + scale[k]) + shift[k]; its parameter sums over tiles of the
    # index's plan (modulated: dshift += g, dscale += g * n, n = w * xhat, dweight's tiles += g * m *
    # xhat, every tile folded in order into one row) or of 256 consecutive rows (plain: g * xhat).
    def _rms_norm(self, x, weight, eps, shift, scale, index, return_rstd):
        flat = x.reshape(-1, x.shape[-1])
        rstd = torch.rsqrt(flat.pow(2).mean(1) + eps)
        out = flat * rstd[:, None] * (1 if weight is None else weight)
        if scale is not None:
            keys = index.repeat(flat.shape[0] // index.shape[0])
            out = out * (1 + scale[keys]) + shift[keys]
        return out.view(x.shape), rstd

    def _norm_terms(self, grad, x, weight, rstd, scale, index):
        """Per row: (dshift, dscale, dweight) terms and dx, and each row's table row (plain: 0)."""
        g, v = grad.reshape(-1, x.shape[-1]), x.reshape(-1, x.shape[-1])
        xhat = v * rstd.reshape(-1, 1)
        w = 1 if weight is None else weight
        keys = (torch.zeros(g.shape[0], dtype=torch.int64) if scale is None
                else index.repeat(g.shape[0] // index.shape[0]))
        m = 1 if scale is None else 1 + scale[keys]
        gw = g * m * w  # the gradient at the normalized row; dx is RMSNorm's backward of it
        dx = rstd.reshape(-1, 1) * (gw - xhat * (gw * xhat).mean(1, keepdim=True))
        return (g, g * (w * xhat), g * m * xhat), dx, keys

    def _norm_tiles(self, x, scale, index):
        rows = x.numel() // x.shape[-1]
        if scale is None:
            return [list(range(a, min(a + TILE, rows))) for a in range(0, rows, TILE)]
        return [t for tiles in tiles_of(index, rows, scale.shape[0]) for t in tiles]

    def rms_norm_backward(self, grad, x, weight, rstd, eps, scale=None, index=None, need_dx=True, need_dweight=None,
                          need_dshift=None, need_dscale=None):
        terms, dx, _ = self._norm_terms(grad, x, weight, rstd, scale, index)
        p_shift, p_scale, p_weight = self.rms_norm_backward_tile_partials(grad, x, weight, rstd, scale=scale,
                                                                          index=index)
        dshift = dscale = None
        if scale is not None:
            dshift, dscale = (self.segment_fold(p, index, scale.shape[0], rows=grad.numel() // x.shape[-1],
                                                dtype=scale.dtype) for p in (p_shift, p_scale))
        tiles = len(self._norm_tiles(x, scale, index))
        dweight = None if weight is None else add_in_order(p_weight[:tiles], x.shape[-1])
        return dx.view(x.shape) if need_dx else None, dweight, dshift, dscale

    def rms_norm_backward_tile_partials(self, grad, x, weight, rstd, scale=None, index=None, need_dweight=None,
                                        need_dshift=None, need_dscale=None):
        terms, _, _ = self._norm_terms(grad, x, weight, rstd, scale, index)
        tiles = self._norm_tiles(x, scale, index)
        bound = -(-(x.numel() // x.shape[-1]) // TILE) + (0 if scale is None else scale.shape[0])
        wanted = (scale is not None and need_dshift is not False, scale is not None and need_dscale is not False,
                  weight is not None and need_dweight is not False)
        out = []
        for term, want in zip(terms, wanted):
            partials = torch.full((bound, x.shape[-1]), float("nan")) if want else None  # past the tiles: unwritten
            for t, tile in enumerate(tiles if want else []):
                partials[t] = add_in_order(term[tile], x.shape[-1])
            out.append(partials)
        return tuple(out)

    def _gate_residual_rms_norm(self, residual, gate, index, y, weight, eps, shift, scale, return_rstd):
        h = self._gate_residual(residual, gate, index, y, None)
        return (h, *self._rms_norm(h, weight, eps, shift, scale, index, return_rstd))

    def gate_residual_rms_norm_backward(self, grad_out, grad_h, h, y, gate, index, weight, rstd, eps, scale=None,
                                        need_d_y=True, need_d_gate=True, need_d_weight=None, need_d_shift=None,
                                        need_d_scale=None):
        dx, dweight, dshift, dscale = self.rms_norm_backward(grad_out, h, weight, rstd, eps, scale=scale, index=index)
        d_residual = dx if grad_h is None else dx + grad_h
        d_y, d_gate = self.gate_residual_backward(d_residual, gate, index, y, need_d_y, need_d_gate)
        return d_residual, d_y, d_gate, dweight, dshift, dscale

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
    problems += norm_problems(model, xd, plan, keys, table, batch, hidden)
    write_problems(folder, rank, problems)
    dist.destroy_process_group()


def norm_problems(model, xd, plan, keys, table, batch, hidden):
    """rms_norm (modulated and plain) and gate_residual_rms_norm on this rank's shard against the
    model's single-GPU backward, and the naive split of dweight as the control."""
    problems, eps, seq = [], 1e-6, keys.shape[0]
    a, b = plan.start, plan.start + plan.size
    x, residual, y, grad_out, grad_h = (torch.randn(batch, seq, hidden) for _ in range(5))
    weight = torch.randn(hidden)
    shift, scale, gate = (table[:, i * hidden:(i + 1) * hidden] for i in range(3))

    def shard(t):
        return t[:, a:b].contiguous()

    def leaves():
        return table.clone().requires_grad_(), weight.clone().requires_grad_()

    def compare(name, got, want):
        if got is None or not torch.equal(got.view(torch.int32), want.view(torch.int32)):
            problems.append(f"{name} differs from the single-GPU sums")

    for modulated in (True, False):
        form = "modulated" if modulated else "plain"
        _, rstd = model._rms_norm(x, weight, eps, shift, scale, keys, True) if modulated else \
            model._rms_norm(x, weight, eps, None, None, None, True)
        dx, dweight, dshift, dscale = model.rms_norm_backward(grad_out, x, weight, rstd, eps,
                                                              scale=scale if modulated else None, index=keys)
        leaf, leaf_weight = leaves()
        x_shard = shard(x).requires_grad_()
        views = dict(shift=leaf[:, :hidden], scale=leaf[:, hidden:2 * hidden]) if modulated else {}
        xd.rms_norm(x_shard, leaf_weight, eps, plan, **views).backward(shard(grad_out))
        compare(f"rms_norm ({form}) dweight", leaf_weight.grad, dweight)
        compare(f"rms_norm ({form}) dx", x_shard.grad, shard(dx))
        if modulated:
            compare("rms_norm dshift", leaf.grad[:, :hidden], dshift)
            compare("rms_norm dscale", leaf.grad[:, hidden:2 * hidden], dscale)
            naive = (model.rms_norm_backward(shard(grad_out), shard(x), weight, rstd.view(batch, seq)[:, a:b], eps,
                                             scale=scale, index=keys[a:b])[1] if b > a else torch.zeros(hidden))
            dist.all_reduce(naive)
            moved = torch.tensor([sum(plan.receive_counts)])
            dist.all_reduce(moved)
            if int(moved) > 0 and torch.equal(naive, dweight):
                problems.append("the naive split of dweight gave the single-GPU bits: the check cannot fail")

    h, _, rstd = model._gate_residual_rms_norm(residual, gate, keys, y, weight, eps, shift, scale, True)
    d_residual, d_y, d_gate, dweight, dshift, dscale = model.gate_residual_rms_norm_backward(
        grad_out, grad_h, h, y, gate, keys, weight, rstd, eps, scale=scale)
    leaf, leaf_weight = leaves()
    residual_shard, y_shard = shard(residual).requires_grad_(), shard(y).requires_grad_()
    outputs = xd.gate_residual_rms_norm(residual_shard, leaf[:, 2 * hidden:3 * hidden], y_shard, leaf_weight, eps,
                                        plan, shift=leaf[:, :hidden], scale=leaf[:, hidden:2 * hidden])
    torch.autograd.backward(outputs, (shard(grad_h), shard(grad_out)))
    for name, got, want in (("d_residual", residual_shard.grad, shard(d_residual)), ("d_y", y_shard.grad, shard(d_y)),
                            ("d_gate", leaf.grad[:, 2 * hidden:3 * hidden], d_gate), ("dweight", leaf_weight.grad,
                                                                                      dweight),
                            ("dshift", leaf.grad[:, :hidden], dshift), ("dscale", leaf.grad[:, hidden:2 * hidden],
                                                                        dscale)):
        compare(f"gate_residual_rms_norm {name}", got, want)
    return problems


@unittest.skipUnless(HAS_GLOO, "needs torch with gloo")
class SequenceParallelOnCpuRanks(unittest.TestCase):
    def test_every_rank_gets_the_single_gpu_sums(self):
        layouts = [([355, 1000 - 355], 1), ([1, 999], 2), ([1000, 0], 1), ([0, 300, 700], 1),
                   ([260, 40, 700], 2), ([100, 150, 5, 745], 1)]
        for sizes, batch in layouts:
            with self.subTest(sizes=sizes, batch=batch):
                self.assertEqual(problems_of_ranks(rank_main, len(sizes), sizes, batch), {})


if __name__ == "__main__":
    unittest.main()
