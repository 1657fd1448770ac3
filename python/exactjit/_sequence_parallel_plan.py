"""One rank's share of a sequence-parallel segment sum (xj_sequence_parallel_plan; the rules in
docs/sequence-parallel.md), as plain Python lists: no torch, so it is testable anywhere."""
import ctypes
from dataclasses import dataclass

from . import _lib
from ._errors import invalid_argument


@dataclass(frozen=True)
class RankPlan:
    tiles: int                 # tiles of the single-GPU plan
    max_tiles: int             # the most tiles one rank computes: the all-gather's stride
    local_rows: int            # rows this rank holds, B * S_r
    tile_start: list           # (rank_tiles + 1,) offsets of this rank's tiles in `rows`
    rows: list                 # its tiles' rows in summation order, ids into its extended buffer
    receive_counts: list       # (ranks,) rows it receives from each rank
    send_counts: list          # (ranks,) rows it sends to each rank
    send_rows: list            # its local rows it sends, grouped by receiver, in the receiver's order
    gathered_slot: list        # (tiles,) where each tile's partial lies after the all-gather


def _array(values):
    return (ctypes.c_longlong * max(len(values), 1))(*values)


def rank_plan(keys, table_rows, shard_start, rank, batch=1):
    """The plan of `rank` for the replicated keys (S,) (table rows in [0, table_rows), or -1),
    `batch` copies and shard bounds shard_start (ranks + 1,) from 0 to S. InvalidArgumentError
    names the broken rule."""
    keys, shard_start = [int(k) for k in keys], [int(s) for s in shard_start]
    if len(shard_start) < 2:
        raise invalid_argument("sequence_parallel_plan: shard_start must hold ranks + 1 >= 2 bounds")
    fn = _lib.function("xj_sequence_parallel_plan")
    sizes = _lib.SequenceParallelSizes()
    ranks = len(shard_start) - 1
    args = (_array(keys), len(keys), int(table_rows), int(batch), _array(shard_start), ranks, int(rank))
    _lib.check(fn(*args, ctypes.byref(sizes), *[None] * 6), "xj_sequence_parallel_plan")
    lengths = (sizes.rank_tiles + 1, sizes.rank_rows, ranks, ranks, sizes.sent_rows, sizes.tiles)
    arrays = [(ctypes.c_longlong * max(n, 1))() for n in lengths]
    _lib.check(fn(*args, ctypes.byref(sizes), *arrays), "xj_sequence_parallel_plan")
    tile_start, rows, receive_counts, send_counts, send_rows, gathered_slot = (
        list(a[:n]) for a, n in zip(arrays, lengths))
    return RankPlan(sizes.tiles, sizes.max_tiles, sizes.local_rows, tile_start, rows, receive_counts, send_counts,
                    send_rows, gathered_slot)
