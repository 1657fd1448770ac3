"""Tensor parallelism over det_linear's outputs (column shards), byte-equal to one GPU's.

Rank r of a process group of P ranks holds rows [r * N / P, (r + 1) * N / P) of the weight (N, K)
and of the bias: the outputs (columns of out) of its shard. N / P is a multiple of the backward's
d_input chunk (256 outputs for bfloat16 weights, 64 for float32), so every chunk lies whole on one
rank. The AdaLN projection (bfloat16 weights, SiLU on temb) is the layer this is for.

- Forward: each rank runs det_linear on its shard; an all-gather (copies) rebuilds the (T, N)
  output on every rank. An output column's arithmetic involves only its own weight row, its bias
  and x, whatever N (docs/det_linear.md), so these are the single-GPU bits.
- Backward, from the (T, N) upstream gradient, the same on every rank (the output was gathered and
  the work after it is replicated): d_weight and d_bias are row-local, the shard's rows on its
  rank. d_input sums over all N outputs: each rank computes its chunks' partials
  (Runtime.det_linear_backward_partials), an all-gather (copies, no arithmetic in the collective)
  puts every chunk's partials in chunk order, and every rank folds them (Runtime.det_linear_input_fold):
  the single-GPU d_input, whole, on every rank. Do not all-reduce it again
  (docs/tensor-parallel.md).

    shards = exactjit.tensor_parallel.ColumnShards(weight.shape[0])
    table = exactjit.tensor_parallel.det_linear(temb, shards.rows(weight), shards.rows(bias), silu=True)

NCCL takes the CUDA tensors as they are; a backend without CUDA collectives (gloo) gets host copies.
"""
import torch
import torch.distributed as dist

from ._errors import invalid_argument
from ._runtime import _import_torch, default_runtime

__all__ = ["ColumnShards", "det_linear"]
_import_torch()  # the runtime's raw launches below use the torch it imported


class ColumnShards:
    """This rank's column shard of det_linear's out_features N over `group` (default: the world):
    outputs [start, start + size), size = N / ranks, a multiple of the d_input chunk of
    weight_dtype's backward, the same on every rank."""

    def __init__(self, out_features, *, weight_dtype=torch.bfloat16, group=None):
        if not dist.is_initialized():
            raise invalid_argument("ColumnShards: torch.distributed is not initialized")
        self.group = group
        self.rank, self.ranks = dist.get_rank(group), dist.get_world_size(group)
        chunk = default_runtime().det_linear_input_chunk(weight_dtype)
        self.out_features = int(out_features)
        if self.out_features < 1 or self.out_features % (self.ranks * chunk) != 0:
            raise invalid_argument(
                f"ColumnShards: out_features N must be a positive multiple of {self.ranks} ranks x {chunk} (each "
                f"shard whole d_input chunks of {chunk} outputs for {weight_dtype} weights; got {self.out_features})")
        self.weight_dtype = weight_dtype
        self.size = self.out_features // self.ranks
        self.start = self.rank * self.size
        self.staged = dist.get_backend(group) != dist.Backend.NCCL

    def rows(self, tensor):
        """This rank's rows of a whole weight (N, K) or bias (N,): a view."""
        if tensor.dim() not in (1, 2) or tensor.shape[0] != self.out_features:
            raise invalid_argument(f"ColumnShards.rows: the tensor must be (N, K) or (N,) with N = {self.out_features} "
                                   f"(got {tuple(tensor.shape)})")
        return tensor[self.start:self.start + self.size]

    def columns(self, tensor):
        """This rank's columns of a whole output or its gradient (T, N), contiguous."""
        if tensor.dim() != 2 or tensor.shape[1] != self.out_features:
            raise invalid_argument(f"ColumnShards.columns: the tensor must be (T, N) with N = {self.out_features} "
                                   f"(got {tuple(tensor.shape)})")
        return tensor[:, self.start:self.start + self.size].contiguous()

    def _gather(self, local, dim):
        """Every rank's `local` concatenated along dim in rank order: copies only."""
        wire = local.contiguous().cpu() if self.staged else local.contiguous()
        parts = [torch.empty_like(wire) for _ in range(self.ranks)]
        dist.all_gather(parts, wire, group=self.group)
        return torch.cat(parts, dim).to(local.device)

    def gather_columns(self, local):
        """The whole (T, N) output from every rank's (T, N / ranks) columns."""
        return self._gather(local, 1)

    def gather_chunks(self, partials):
        """The (C, T, K) d_input partials of every chunk, in chunk order, from every rank's own
        (C / ranks, T, K)."""
        return self._gather(partials, 0)


class _ColumnParallelLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, silu, shards):
        # float32 weights with SiLU: its derivative needs the pre-activation, as on one GPU.
        with_pre = bool(silu) and weight.dtype == torch.float32
        out, pre = default_runtime()._det_linear(x, weight, bias, silu, with_pre)
        ctx.shards, ctx.silu, ctx.has_bias, ctx.x_dtype = shards, bool(silu), bias is not None, x.dtype
        ctx.save_for_backward(x, weight, pre)
        return shards.gather_columns(out)

    @staticmethod
    def backward(ctx, grad):
        need_x, need_weight, need_bias = ctx.needs_input_grad[:3]
        need_bias = need_bias and ctx.has_bias
        if not (need_x or need_weight or need_bias):
            return None, None, None, None, None
        x, weight, pre = ctx.saved_tensors
        runtime, shards = default_runtime(), ctx.shards
        grad = shards.columns(grad)
        if not need_x:
            _, d_weight, d_bias = runtime.det_linear_backward(grad, x, weight, pre, silu=ctx.silu, need_input=False,
                                                              need_weight=need_weight, need_bias=need_bias)
            return None, d_weight, d_bias, None, None
        partials, d_weight, d_bias = runtime.det_linear_backward_partials(
            grad, x, weight, pre, silu=ctx.silu, need_weight=need_weight, need_bias=need_bias)
        d_x = runtime.det_linear_input_fold(shards.gather_chunks(partials), x, weight_dtype=weight.dtype,
                                            silu=ctx.silu)
        return d_x.to(ctx.x_dtype), d_weight, d_bias, None, None


def det_linear(x, weight_shard, bias_shard=None, *, silu=False, group=None):
    """exactjit.det_linear over column shards of `group` (default: the world): x (T, K) replicated,
    weight_shard (N / P, K) and bias_shard (N / P,) or None this rank's rows (ColumnShards.rows),
    the same size on every rank. Returns the whole (T, N) output on every rank, the single-GPU bits.
    Backward (T <= 8), from an upstream gradient replicated on every rank: d_x whole and identical
    on every rank, d_weight_shard and d_bias_shard this rank's rows, each the single-GPU bits."""
    if not isinstance(weight_shard, torch.Tensor) or weight_shard.dim() != 2:
        raise invalid_argument("tensor_parallel.det_linear: weight_shard must be a (N / P, K) torch.Tensor")
    ranks = dist.get_world_size(group) if dist.is_initialized() else 1
    shards = ColumnShards(weight_shard.shape[0] * ranks, weight_dtype=weight_shard.dtype, group=group)
    return _ColumnParallelLinear.apply(x, weight_shard, bias_shard, silu, shards)
