"""Sequence parallelism over torch.distributed with table gradients byte-equal to one GPU's.

Rank r of a process group holds positions [start_r, start_r + S_r) of the packed sequence (its
(B, S_r, H) shard); the AdaLN tables and the index are replicated. Row-local work (the forwards,
d_y, d_residual) runs on the shard as on one GPU. A table gradient is a segment sum
(docs/backward.md): every table row's positions cut into tiles of 256, each tile summed in order,
the tiles folded in order. So each tile's partial is computed whole by the rank holding its first
row (its other rows are sent there first, one all-to-all of rows), with the op's own backward
kernel over a layout where each owned tile is one segment; the partials are all-gathered (copies,
no arithmetic in the collective) and every rank folds all of them in the single-GPU order
(Runtime.segment_fold). Every rank ends with the whole gradient, bit for bit the single-GPU one;
do not all-reduce it again (docs/sequence-parallel.md).

    plan = exactjit.distributed.SequencePlan(index, table_rows=gate.shape[0], shard_sizes=sizes)
    out = exactjit.distributed.gate_residual(residual_shard, gate, y_shard, plan)

Build a plan once per index layout (it copies the index to the host once); a step then needs no
host synchronisation beyond the collectives. NCCL takes the CUDA tensors as they are; a backend
without CUDA collectives (gloo) gets host copies.
"""
import torch
import torch.distributed as dist

from ._errors import invalid_argument
from ._runtime import _import_torch, default_runtime
from ._sequence_parallel_plan import rank_plan

__all__ = ["SequencePlan", "adaln_row_gather", "adaln_row_gather_table_grad", "gate_residual",
           "gate_residual_rms_norm", "gate_residual_table_grad", "rms_norm", "rms_norm_param_grads"]
_import_torch()  # the runtime's raw launches below use the torch it imported

# The backward kernels' plan holds at most this many table rows, so owned tiles go to them in
# groups (a multiple of 3: adaln_row_gather's rows come as 3T).
_TILES_PER_CALL = 4095
_TILE = 256  # positions a segment-sum tile holds (docs/backward.md)


class SequencePlan:
    """Who computes which tile of a segment sum, for this rank of `group` (default: the world).

    keys: the replicated (S,) index whose rows the gradient sums over (gate_residual: its index;
    adaln_row_gather: timestep_indices * 3 + token_tags), on any device; table_rows: R;
    shard_sizes: S_r of every rank in group-rank order, summing to S (zeros allowed); batch: B
    copies of the sequence (rows b * S_r + s of a shard). Tensors the step needs live on `device`
    (default: the current CUDA device). rms_norm without modulation sums over every row: its plan
    is SequencePlan.plain."""

    def __init__(self, keys, table_rows, shard_sizes, *, batch=1, group=None, device=None):
        if not dist.is_initialized():
            raise invalid_argument("SequencePlan: torch.distributed is not initialized")
        self.group = group
        self.rank, self.ranks = dist.get_rank(group), dist.get_world_size(group)
        sizes = [int(s) for s in shard_sizes]
        if len(sizes) != self.ranks or min(sizes) < 0:
            raise invalid_argument(f"SequencePlan: shard_sizes must give {self.ranks} sizes >= 0, one per rank "
                                   f"(got {sizes})")
        host_keys = keys.detach().to("cpu", torch.int64)
        if host_keys.dim() != 1 or sum(sizes) != host_keys.shape[0]:
            raise invalid_argument(f"SequencePlan: shard_sizes must sum to the S = {host_keys.shape[0]} keys "
                                   f"(got {sum(sizes)})")
        start = [0]
        for s in sizes:
            start.append(start[-1] + s)
        self.device = torch.device("cuda", torch.cuda.current_device()) if device is None else torch.device(device)
        self.table_rows, self.batch, self.seq = int(table_rows), int(batch), host_keys.shape[0]
        self.start, self.size, self.shard_sizes = start[self.rank], sizes[self.rank], sizes
        self._rows_plan = self if table_rows == 1 and not host_keys.any() else None
        key_list = host_keys.tolist()
        plan = rank_plan(key_list, table_rows, start, self.rank, batch)
        self.local_rows, self.max_tiles, self.tiles = plan.local_rows, plan.max_tiles, plan.tiles
        self.tile_start = plan.tile_start
        self.send_counts, self.receive_counts = plan.send_counts, plan.receive_counts
        self.fold_tiles = default_runtime().segment_fold_tiles(self.batch * self.seq, self.seq, self.table_rows)

        def on_device(values):
            return torch.tensor(values, dtype=torch.int64).to(self.device)
        self.keys = host_keys.to(self.device)
        self.local_keys = self.local(self.keys)  # the forward's index on this rank's shard
        self.rows = on_device(plan.rows)
        self.send_rows = on_device(plan.send_rows)
        self.gathered_slot = on_device(plan.gathered_slot)
        counts = torch.tensor([b - a for a, b in zip(plan.tile_start, plan.tile_start[1:])], dtype=torch.int64)
        self.tile_keys = torch.repeat_interleave(torch.arange(len(counts)), counts).to(self.device)
        # Each owned tile's table row: its first row's key (the owner holds that row).
        self.tile_table_rows = on_device([key_list[self.start + plan.rows[a] % max(self.size, 1)]
                                          for a in plan.tile_start[:-1]])
        # The whole fold's index: one table row of 256 positions, every key 0 (fold_all).
        self.one_row_keys = torch.zeros(_TILE, dtype=torch.int64, device=self.device)
        self.staged = dist.get_backend(group) != dist.Backend.NCCL

    @classmethod
    def plain(cls, shard_sizes, *, batch=1, group=None, device=None):
        """The plan of a sum over every row in order (rms_norm's weight gradient without
        modulation: tiles of 256 consecutive rows of the (B * S) rows): one table row, every key 0."""
        return cls(torch.zeros(sum(int(s) for s in shard_sizes), dtype=torch.int64), 1, shard_sizes, batch=batch,
                   group=group, device=device)

    def rows_plan(self):
        """SequencePlan.plain over the same shards (this plan if it is one), built once: the plan of
        rms_norm's weight gradient without modulation."""
        if self._rows_plan is None:
            self._rows_plan = SequencePlan.plain(self.shard_sizes, batch=self.batch, group=self.group,
                                                 device=self.device)
        return self._rows_plan

    def local(self, index):
        """This rank's slice of a replicated (S,) index tensor: the forward's index on the shard."""
        return index[self.start:self.start + self.size]

    def _collective(self, tensor):
        return tensor.cpu() if self.staged else tensor

    def owned_rows(self, *local):
        """For each (local_rows, W_i) tensor of this rank's rows: (rank_rows, W_i), the rows of its
        tiles in summation order, from its own rows and the rows the other ranks send it. One
        all-to-all for all of them (their rows side by side, as bytes)."""
        widths = [t.shape[1] * t.element_size() for t in local]
        rows = torch.cat([t.contiguous().view(torch.uint8) for t in local], dim=1)
        send = self._collective(rows.index_select(0, self.send_rows))
        received = send.new_empty((sum(self.receive_counts), rows.shape[1]))
        dist.all_to_all_single(received, send, self.receive_counts, self.send_counts, group=self.group)
        owned = torch.cat([rows, received.to(rows.device)]).index_select(0, self.rows)
        return tuple(part.contiguous().view(t.dtype) for part, t in zip(owned.split(widths, dim=1), local))

    def owned_groups(self):
        """(first tile, end tile, first row, end row, tile keys from 0) of each group of owned tiles
        one backward call takes."""
        tiles = len(self.tile_start) - 1
        for first in range(0, tiles, _TILES_PER_CALL):
            end = min(first + _TILES_PER_CALL, tiles)
            a, b = self.tile_start[first], self.tile_start[end]
            yield first, end, a, b, self.tile_keys[a:b] - first

    def gather(self, partials, rows):
        """(rows, W) float32: every rank's owned tiles' fp32 partials (rank_tiles, W), all-gathered
        (copies only) into the single-GPU tile order; rows past the plan's tiles are zero."""
        width = partials.shape[1]
        padded = partials.new_zeros((self.max_tiles, width))
        padded[:partials.shape[0]] = partials
        padded = self._collective(padded)
        gathered = [torch.empty_like(padded) for _ in range(self.ranks)]
        dist.all_gather(gathered, padded, group=self.group)
        gathered = torch.cat(gathered).to(partials.device)
        ordered = partials.new_zeros((rows, width))
        ordered[:self.tiles] = gathered.index_select(0, self.gathered_slot)
        return ordered

    def fold(self, partials, dtype):
        """The gradient (R, W) in dtype from this rank's owned tiles' fp32 partials (rank_tiles, W):
        every rank's partials gathered into the single-GPU tile order, each table row's folded."""
        return self.fold_all([(partials, dtype, False)])[0]

    def fold_all(self, parts):
        """The gradients of several sums over this plan's tiles with one all-gather: parts is a list
        of (this rank's owned tiles' fp32 partials (rank_tiles, W_i), dtype, whole); each gives
        (R, W_i) in dtype, each table row's tiles folded, or with whole (W_i,): every tile folded in
        order into one row (the modulated rms_norm's dweight)."""
        widths = [partials.shape[1] for partials, _, _ in parts]
        # fold_tiles >= tiles + 1: the whole fold's bound too.
        ordered = self.gather(torch.cat([partials for partials, _, _ in parts], dim=1), self.fold_tiles)
        runtime, out = default_runtime(), []
        for gathered, (_, dtype, whole) in zip(ordered.split(widths, dim=1), parts):
            if whole:
                # segment_fold over the plan of one table row whose tiles are these, in order: P batch
                # copies of 256 positions, every key 0 (its bound for P tiles: P + 1 rows).
                out.append(runtime.segment_fold(gathered[:self.tiles + 1].contiguous(), self.one_row_keys, 1,
                                                rows=self.tiles * _TILE, dtype=dtype)[0])
            else:
                out.append(runtime.segment_fold(gathered.contiguous(), self.keys, self.table_rows,
                                                rows=self.batch * self.seq, dtype=dtype))
        return out


def _check_shard(op, plan, rows, name):
    if rows != plan.local_rows:
        raise invalid_argument(f"{op}: {name} must hold this rank's B * S_r = {plan.local_rows} rows "
                               f"(got {rows})")


class _GateResidual(torch.autograd.Function):
    @staticmethod
    def forward(ctx, residual, gate, y, plan, index):
        ctx.plan = plan
        ctx.save_for_backward(gate, index, y)
        if y.numel() == 0:  # an empty shard
            return residual.clone(memory_format=torch.contiguous_format)
        return default_runtime()._gate_residual(residual, gate, index, y, None)

    @staticmethod
    def backward(ctx, grad):
        plan = ctx.plan
        gate, index, y = ctx.saved_tensors
        runtime = default_runtime()
        grad = grad.contiguous()
        d_y = d_gate = None
        if ctx.needs_input_grad[2]:
            d_y = (torch.empty_like(y, memory_format=torch.contiguous_format) if y.numel() == 0 else
                   runtime.gate_residual_backward(grad, gate, index, y, need_d_gate=False)[0])
        if ctx.needs_input_grad[1]:
            d_gate = gate_residual_table_grad(grad, y, plan, gate.dtype)
        return grad if ctx.needs_input_grad[0] else None, d_gate, d_y, None, None


def gate_residual_table_grad(grad, y, plan, dtype):
    """gate_residual's d_gate (R, H) in dtype (torch.float32 keeps the fp32 sums) from this rank's
    shard of the upstream gradient and of y: the single-GPU bits, on every rank."""
    return plan.fold(_gate_partials(plan, *plan.owned_rows(*_gate_rows(grad, y))), dtype)


def _gate_rows(grad, y):
    """The rows gate_residual's table sum reads: grad and y as (B * S_r, H)."""
    hidden = y.shape[-1]
    return grad.contiguous().view(-1, hidden), y.contiguous().view(-1, hidden)


def _gate_partials(plan, grad_rows, y_rows):
    """(rank_tiles, H) fp32: gate_residual's d_gate partials of this rank's tiles from their rows."""
    partials = y_rows.new_empty((len(plan.tile_start) - 1, y_rows.shape[1]), dtype=torch.float32)
    for first, end, a, b, keys in plan.owned_groups():
        # Each owned tile is one segment here; the table (unread without d_y) has one row each.
        unread_table = y_rows.new_zeros((end - first, y_rows.shape[1]))
        partials[first:end] = default_runtime().gate_residual_backward(
            grad_rows[a:b], unread_table, keys, y_rows[a:b], need_d_y=False, dtype=torch.float32)[1]
    return partials


def gate_residual(residual, gate, y, plan):
    """out = residual + gate.index_select(0, index) * y on this rank's shard (residual, y: (B, S_r,
    H) or (B * S_r, H)), index = plan's keys at its positions; bitwise the single-GPU op's rows.
    Backward: d_residual and d_y on the shard; d_gate (R, H), the whole table gradient, byte-equal
    to the single-GPU backward's on every rank."""
    _check_shard("gate_residual", plan, y.numel() // max(y.shape[-1], 1), "y")
    return _GateResidual.apply(residual, gate, y, plan, plan.local_keys)


class _AdalnRowGather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, rows, plan, timestep_indices, token_tags):
        ctx.plan, ctx.rows_dtype = plan, rows.dtype
        if timestep_indices.shape[0] == 0:  # an empty shard
            return rows.new_empty((6, 0, rows.shape[1] // 6))
        return default_runtime()._adaln_row_gather(rows, timestep_indices, token_tags)

    @staticmethod
    def backward(ctx, grad):
        return adaln_row_gather_table_grad(grad, ctx.plan, ctx.rows_dtype), None, None, None


def adaln_row_gather_table_grad(grad, plan, dtype):
    """adaln_row_gather's d_rows (3T, 6H) in dtype (torch.float32 keeps the fp32 sums) from this
    rank's (6, S_r, H) upstream gradient: the single-GPU bits, on every rank."""
    runtime = default_runtime()
    chunks, seq, hidden = grad.shape
    owned, = plan.owned_rows(grad.permute(1, 0, 2).reshape(seq, chunks * hidden))
    partials = grad.new_empty((len(plan.tile_start) - 1, chunks * hidden), dtype=torch.float32)
    for first, end, a, b, keys in plan.owned_groups():
        # Each owned tile is one segment (table row keys = step * 3 + tag); rows come as 3T.
        table_rows = 3 * -(-(end - first) // 3)
        owned_grad = owned[a:b].view(b - a, chunks, hidden).permute(1, 0, 2).contiguous()
        partials[first:end] = runtime.adaln_row_gather_backward(
            owned_grad, torch.div(keys, 3, rounding_mode="floor"), keys % 3, table_rows,
            dtype=torch.float32)[:end - first]
    return plan.fold(partials, dtype)


def adaln_row_gather(rows, timestep_indices, token_tags, plan):
    """The six (S_r, H) AdaLN chunks of this rank's positions (timestep_indices, token_tags: its
    (S_r,) slices), bitwise the single-GPU op's. plan: a SequencePlan over the keys
    timestep_indices * 3 + token_tags of the whole sequence, table_rows = 3T, batch 1. Backward:
    d_rows (3T, 6H), the whole gradient, byte-equal to the single-GPU backward's on every rank."""
    if plan.batch != 1 or plan.table_rows != rows.shape[0]:
        raise invalid_argument(f"adaln_row_gather: the plan must have batch 1 and table_rows = the {rows.shape[0]} "
                               f"rows (got batch {plan.batch}, table_rows {plan.table_rows})")
    _check_shard("adaln_row_gather", plan, timestep_indices.shape[0], "timestep_indices")
    return tuple(_AdalnRowGather.apply(rows, plan, timestep_indices, token_tags).unbind(0))


def rms_norm_param_grads(grad, x, rstd, weight, scale, plan, *, need_dweight=True, need_dshift=True,
                         need_dscale=True, dtype=None):
    """rms_norm's (dweight, dshift, dscale) from this rank's shard of the upstream gradient, of x and
    of the forward's rstd: the single-GPU bits on every rank, each None when not asked for (or
    without its parameter). plan: over the index; modulated (scale given), dshift and dscale (R, H)
    in scale's dtype; plain, dweight's sum takes plan.rows_plan(). dweight (H,) in weight's dtype.
    dtype (torch.float32) keeps the fp32 sums instead."""
    modulated = scale is not None
    needs = (need_dweight and weight is not None, need_dshift and modulated, need_dscale and modulated)
    if not any(needs):
        return None, None, None
    if not modulated:
        plan = plan.rows_plan()
    rows = plan.owned_rows(*_norm_rows(grad, x, rstd))
    parts, wanted = _norm_fold_parts(plan, rows, weight, scale, needs, dtype)
    return _placed(plan.fold_all(parts), wanted)


def _norm_grads(needs, grad, x, rstd, weight, scale, plan):
    """rms_norm_param_grads for autograd's (dweight, dshift, dscale) needs."""
    need_dweight, need_dshift, need_dscale = needs
    return rms_norm_param_grads(grad, x, rstd, weight, scale, plan, need_dweight=need_dweight,
                                need_dshift=need_dshift, need_dscale=need_dscale)


def _norm_rows(grad, x, rstd):
    """The rows rms_norm's parameter sums read: grad, x (B * S_r, H) and rstd (B * S_r, 1)."""
    hidden = x.shape[-1]
    return grad.contiguous().view(-1, hidden), x.contiguous().view(-1, hidden), rstd.reshape(-1, 1)


def _norm_fold_parts(plan, rows, weight, scale, needs, dtype):
    """fold_all's parts for rms_norm's (dweight, dshift, dscale) partials of this rank's tiles, and
    which of the three they are. needs: (dweight, dshift, dscale) asked for; plain (scale None),
    plan is rows_plan()."""
    grad_rows, x_rows, rstd_rows = rows
    modulated = scale is not None
    need_dweight, need_dshift, need_dscale = needs
    tiles, hidden = len(plan.tile_start) - 1, x_rows.shape[1]
    partials = [x_rows.new_empty((tiles, hidden), dtype=torch.float32) if need else None
                for need in (need_dshift, need_dscale, need_dweight)]
    for first, end, a, b, keys in plan.owned_groups():
        # Each owned tile is one segment here, its table row the tile's scale row; plain, the owned
        # tiles are runs of 256 consecutive rows, as the single-GPU tiles.
        table = scale.index_select(0, plan.tile_table_rows[first:end]) if modulated else None
        got = default_runtime().rms_norm_backward_tile_partials(
            grad_rows[a:b], x_rows[a:b], weight, rstd_rows[a:b].view(-1), scale=table,
            index=keys if modulated else None, need_dweight=need_dweight, need_dshift=need_dshift,
            need_dscale=need_dscale)
        for mine, part in zip(partials, got):
            if mine is not None:
                mine[first:end] = part[:end - first]
    shift_p, scale_p, weight_p = partials
    # dweight folds every tile in order into one row: modulated, the one-GPU fold's whole-table
    # form; plain, the plan's one table row, the same fold.
    parts, wanted = [], []
    for place, (p, param, whole) in enumerate(((weight_p, weight, True), (shift_p, scale, False),
                                               (scale_p, scale, False))):
        if p is not None:
            parts.append((p, dtype or param.dtype, whole))
            wanted.append(place)
    return parts, wanted


def _placed(grads, wanted, count=3):
    """The folded gradients at their places among `count`, None elsewhere."""
    out = [None] * count
    for grad, place in zip(grads, wanted):
        out[place] = grad
    return tuple(out)


def _fused_table_grads(plan, grad_out, h, rstd, d_residual, y, gate, weight, scale, need_gate, norm_needs):
    """gate_residual_rms_norm's (d_gate, dweight, dshift, dscale), None where not needed: gate_residual's
    table sum of d_residual and rms_norm's sums over (grad_out, h, rstd). Modulated, both are sums
    over the index's plan: one exchange of their rows and one gather of their partials; plain, the
    norm's dweight takes the rows plan, so the two go separately."""
    if scale is None or not any(norm_needs):
        d_gate = gate_residual_table_grad(d_residual, y, plan, gate.dtype) if need_gate else None
        return (d_gate, *_norm_grads(norm_needs, grad_out, h, rstd, weight, scale, plan))
    rows = plan.owned_rows(*_norm_rows(grad_out, h, rstd), *(_gate_rows(d_residual, y) if need_gate else ()))
    parts, wanted = _norm_fold_parts(plan, rows[:3], weight, scale, norm_needs, None)
    if need_gate:
        parts.append((_gate_partials(plan, *rows[3:]), gate.dtype, False))
        wanted.append(3)
    dweight, dshift, dscale, d_gate = _placed(plan.fold_all(parts), wanted, 4)
    return d_gate, dweight, dshift, dscale


class _RmsNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, shift, scale, plan, index, eps):
        ctx.plan, ctx.eps = plan, eps
        if x.numel() == 0:  # an empty shard
            out, rstd = (torch.empty_like(x, memory_format=torch.contiguous_format),
                         x.new_empty((0,), dtype=torch.float32))
        else:
            out, rstd = default_runtime()._rms_norm(x, weight, eps, shift, scale, index, True)
        ctx.save_for_backward(x, weight, scale, index, rstd)
        return out

    @staticmethod
    def backward(ctx, grad):
        x, weight, scale, index, rstd = ctx.saved_tensors
        need_x, need_weight, need_shift, need_scale = ctx.needs_input_grad[:4]
        dx = None
        if need_x:
            dx = (torch.empty_like(x, memory_format=torch.contiguous_format) if x.numel() == 0 else
                  default_runtime().rms_norm_backward(grad, x, weight, rstd, ctx.eps, scale=scale, index=index,
                                                      need_dweight=False, need_dshift=False, need_dscale=False)[0])
        dweight, dshift, dscale = _norm_grads((need_weight, need_shift, need_scale), grad, x, rstd, weight, scale,
                                              ctx.plan)
        return dx, dweight, dshift, dscale, None, None, None


def _eps(eps):
    return torch.finfo(torch.float32).eps if eps is None else float(eps)


def rms_norm(x, weight, eps, plan, *, shift=None, scale=None):
    """F.rms_norm(x, (H,), weight, eps) [* (1 + scale[index]) + shift[index]] on this rank's shard x
    ((B, S_r, H) or (B * S_r, H)), index = plan's keys at its positions: bitwise the single-GPU op's
    rows. plan: a SequencePlan over the index (modulated) or SequencePlan.plain (not; any plan over
    the same shards serves). Backward: dx
    on the shard; dweight, dshift, dscale (the whole gradients) byte-equal to the single-GPU
    backward's on every rank."""
    if (shift is None) != (scale is None):
        raise invalid_argument("rms_norm: shift and scale must be given together (the modulated form)")
    if scale is not None and plan.table_rows != scale.shape[0]:
        raise invalid_argument(f"rms_norm: the plan must have table_rows = scale's {scale.shape[0]} rows "
                               f"(got {plan.table_rows})")
    _check_shard("rms_norm", plan, x.numel() // max(x.shape[-1], 1), "x")
    return _RmsNorm.apply(x, weight, shift, scale, plan, plan.local_keys if scale is not None else None, _eps(eps))


class _GateResidualRmsNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, residual, gate, y, weight, shift, scale, plan, index, eps):
        ctx.plan, ctx.eps = plan, eps
        ctx.set_materialize_grads(False)
        if y.numel() == 0:  # an empty shard
            h = residual.clone(memory_format=torch.contiguous_format)
            out, rstd = torch.empty_like(h), h.new_empty((0,), dtype=torch.float32)
        else:
            h, out, rstd = default_runtime()._gate_residual_rms_norm(residual, gate, index, y, weight, eps, shift,
                                                                     scale, True)
        ctx.save_for_backward(h, y, gate, index, weight, scale, rstd)
        return h, out

    @staticmethod
    def backward(ctx, grad_h, grad_out):
        h, y, gate, index, weight, scale, rstd = ctx.saved_tensors
        need_residual, need_gate, need_y, need_weight, need_shift, need_scale = ctx.needs_input_grad[:6]
        plan, runtime = ctx.plan, default_runtime()
        if grad_out is None and grad_h is None:
            return (None,) * 9
        norm_needs = (need_weight, need_shift, need_scale) if grad_out is not None else (False,) * 3
        if grad_out is None:  # only h was used: the norm adds nothing
            d_residual = grad_h
        else:
            grad_out = grad_out.contiguous()
            d_residual = torch.empty_like(h) if y.numel() == 0 else runtime.gate_residual_rms_norm_backward(
                grad_out, grad_h, h, y, gate, index, weight, rstd, ctx.eps, scale=scale, need_d_y=False,
                need_d_gate=False, need_d_weight=False, need_d_shift=False, need_d_scale=False)[0]
        d_y = None
        if need_y:
            d_y = (torch.empty_like(y, memory_format=torch.contiguous_format) if y.numel() == 0 else
                   runtime.gate_residual_backward(d_residual, gate, index, y, need_d_gate=False)[0])
        d_gate, dweight, dshift, dscale = _fused_table_grads(plan, grad_out, h, rstd, d_residual, y, gate, weight,
                                                             scale, need_gate, norm_needs)
        return (d_residual if need_residual else None, d_gate, d_y, dweight, dshift, dscale, None, None, None)


def gate_residual_rms_norm(residual, gate, y, weight, eps, plan, *, shift=None, scale=None):
    """(h, out) of gate_residual_rms_norm on this rank's shard (residual, y: (B, S_r, H) or
    (B * S_r, H)), index = plan's keys at its positions: bitwise the single-GPU op's rows. plan: a
    SequencePlan over the index with table_rows = the gate's rows (the shift/scale views have them
    too). Backward: d_residual and d_y on the shard; d_gate, dweight, dshift, dscale (the whole
    gradients) byte-equal to the single-GPU backward's on every rank."""
    if (shift is None) != (scale is None):
        raise invalid_argument("gate_residual_rms_norm: shift and scale must be given together (the modulated form)")
    if plan.table_rows != gate.shape[0] or (scale is not None and scale.shape[0] != gate.shape[0]):
        raise invalid_argument(f"gate_residual_rms_norm: the plan, the gate and scale must have the same table rows "
                               f"(got {plan.table_rows}, {gate.shape[0]}"
                               f"{'' if scale is None else f', {scale.shape[0]}'})")
    _check_shard("gate_residual_rms_norm", plan, y.numel() // max(y.shape[-1], 1), "y")
    return _GateResidualRmsNorm.apply(residual, gate, y, weight, shift, scale, plan, plan.local_keys, _eps(eps))
