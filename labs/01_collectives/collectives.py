"""Lab 01 — ring collectives built from point-to-point messages.

You implement the two ring collectives that every sharded training layout rests on,
using nothing but ``dist.isend`` / ``dist.irecv`` between neighbouring ranks:

* ``ring_reduce_scatter(x)``: every rank holds a full-length 1-D tensor ``x``; afterwards
  rank ``r`` holds chunk ``r`` of the element-wise sum over ranks.
* ``ring_all_gather(shard, numel)``: rank ``r`` holds chunk ``r``; afterwards every rank
  holds the full tensor.
* ``ring_all_reduce(x)``: the sum on every rank, composed as reduce-scatter then all-gather.
* ``all_to_all(x, in_splits, out_splits)``: every rank sends a different block of rows to
  every other rank (what ``dist.all_to_all_single`` does; the expert-parallel dispatch of
  lab 08 is one). Not a ring: ``D-1`` steps, in step ``s`` rank ``r`` sends straight to
  ``r+s`` and receives from ``r-s`` (mod ``D``); rank ``r`` sends
  ``sum_{d != r} in_splits[d]`` rows, ``V(D-1)/D`` when the splits are even
  (``shardlab.accounting.comm.ring_sent_bytes("all_to_all", V, D)``).

Chunking. A tensor of ``numel`` elements is cut into ``D`` chunks exactly as
``torch.tensor_split(x, D)`` cuts it: the first ``numel % D`` chunks have one element more
than the others, and chunks may be empty when ``numel < D``. No padding is used, so the
bytes on the wire are exactly the bytes of the tensor. ``chunk_bounds`` gives the offsets.

Ring schedule. Ranks form a ring ``r -> r+1 (mod D)``. Each of the ``D-1`` steps of a phase
sends one chunk to the right neighbour and receives one chunk from the left neighbour.
Post the send *and* the receive before waiting on either (``isend`` + ``irecv``): if every
rank first did a blocking ``send``, every rank could wait for a receiver that is itself
stuck in ``send`` (a deadlock once messages exceed the transport's buffering).

Bytes. Per rank, each phase sends ``D-1`` chunks, i.e. ``V(D-1)/D`` bytes when ``D``
divides the element count (``V`` = tensor bytes); the all-reduce sends twice that,
``2V(D-1)/D`` — ``shardlab.accounting.comm.ring_sent_bytes``. With uneven chunks, rank ``r``
sends every chunk except chunk ``r`` in the reduce-scatter and every chunk except chunk
``r+1`` in the all-gather, so per-rank bytes differ slightly but their sum over ranks is
exactly ``2V(D-1)``.

In production, ``dist.all_reduce`` / ``dist.reduce_scatter_tensor`` /
``dist.all_gather_into_tensor`` call NCCL (GPU) or gloo (CPU), which pick ring, tree or
other algorithms and pipeline each chunk in smaller slices.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

__all__ = [
    "chunk_bounds",
    "ring_reduce_scatter",
    "ring_all_gather",
    "ring_all_reduce",
    "all_to_all",
]


def chunk_bounds(numel: int, world_size: int) -> list[tuple[int, int]]:
    """``[(start, stop), ...]`` of the ``world_size`` chunks, same cut as ``torch.tensor_split``.

    >>> chunk_bounds(10, 4)
    [(0, 3), (3, 6), (6, 8), (8, 10)]
    >>> chunk_bounds(2, 3)
    [(0, 1), (1, 2), (2, 2)]
    """
    if numel < 0 or world_size < 1:
        raise ValueError(
            f"need numel >= 0 and world_size >= 1, got numel={numel}, world_size={world_size}"
        )
    base, extra = divmod(numel, world_size)
    bounds, start = [], 0
    for i in range(world_size):
        stop = start + base + (1 if i < extra else 0)
        bounds.append((start, stop))
        start = stop
    return bounds


def _ring(group: dist.ProcessGroup | None) -> tuple[int, int, int, int]:
    """(rank, world size, global rank of the right neighbour, of the left neighbour)."""
    rank, size = dist.get_rank(group), dist.get_world_size(group)
    right = (
        dist.get_global_rank(group, (rank + 1) % size) if group is not None else (rank + 1) % size
    )
    left = (
        dist.get_global_rank(group, (rank - 1) % size) if group is not None else (rank - 1) % size
    )
    return rank, size, right, left


def _exchange(send_buf: torch.Tensor, recv_buf: torch.Tensor, right: int, left: int, group) -> None:
    """Send ``send_buf`` to ``right`` while receiving ``recv_buf`` from ``left``; wait for both."""
    reqs = [
        dist.isend(send_buf.contiguous(), dst=right, group=group),
        dist.irecv(recv_buf, src=left, group=group),
    ]
    for req in reqs:
        req.wait()


def ring_reduce_scatter(x: torch.Tensor, group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """Sum ``x`` over ranks and return this rank's chunk (``torch.tensor_split(sum, D)[rank]``).

    ``x`` is a 1-D tensor of the same length and dtype on every rank; it is not modified.
    Uses ``D-1`` ring steps; in step ``s`` rank ``r`` sends its partial sum of chunk
    ``(r-1-s) mod D`` and adds the received partial sum of chunk ``(r-2-s) mod D``.
    """
    if x.dim() != 1:
        raise ValueError(f"ring_reduce_scatter expects a 1-D tensor, got shape {tuple(x.shape)}")
    # BEGIN SOLUTION hint: clone x, then D-1 steps: send partial chunk (r-1-s)%D right, receive chunk (r-2-s)%D from the left and add it
    rank, size, right, left = _ring(group)
    bounds = chunk_bounds(x.numel(), size)
    buf = x.detach().clone()  # partial sums accumulate here; x stays untouched
    for step in range(size - 1):
        send_idx = (rank - 1 - step) % size  # chunk completed up to this rank so far
        recv_idx = (rank - 2 - step) % size  # the left neighbour's partial sum of this chunk
        s0, s1 = bounds[send_idx]
        r0, r1 = bounds[recv_idx]
        incoming = torch.empty(r1 - r0, dtype=buf.dtype, device=buf.device)
        _exchange(buf[s0:s1], incoming, right, left, group)
        buf[r0:r1] += incoming  # after the last step chunk `rank` holds the full sum
    lo, hi = bounds[rank]
    return buf[lo:hi].clone()
    # END SOLUTION


def ring_all_gather(
    shard: torch.Tensor, numel: int, group: dist.ProcessGroup | None = None
) -> torch.Tensor:
    """Gather every rank's chunk into the full 1-D tensor of ``numel`` elements.

    ``shard`` is chunk ``rank`` of the result (its length is fixed by ``chunk_bounds``).
    Uses ``D-1`` ring steps; in step ``s`` rank ``r`` forwards chunk ``(r-s) mod D`` to the
    right and receives chunk ``(r-1-s) mod D`` from the left.
    """
    size = dist.get_world_size(group)
    lo, hi = chunk_bounds(numel, size)[dist.get_rank(group)]
    if shard.dim() != 1 or shard.numel() != hi - lo:
        raise ValueError(
            f"rank {dist.get_rank(group)} expects a 1-D shard of {hi - lo} elements "
            f"(numel={numel}, world size={size}), got shape {tuple(shard.shape)}"
        )
    # BEGIN SOLUTION hint: allocate the output, copy shard into chunk r, then D-1 steps: send chunk (r-s)%D right, receive chunk (r-1-s)%D from the left
    rank, size, right, left = _ring(group)
    bounds = chunk_bounds(numel, size)
    out = torch.empty(numel, dtype=shard.dtype, device=shard.device)
    out[lo:hi] = shard
    for step in range(size - 1):
        send_idx = (rank - step) % size  # our own chunk first, then what we just received
        recv_idx = (rank - 1 - step) % size
        s0, s1 = bounds[send_idx]
        r0, r1 = bounds[recv_idx]
        _exchange(out[s0:s1], out[r0:r1], right, left, group)  # receive straight into place
    return out
    # END SOLUTION


def ring_all_reduce(x: torch.Tensor, group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """Element-wise sum of ``x`` over ranks, returned on every rank (``x`` is not modified).

    Composed as ``ring_all_gather(ring_reduce_scatter(x), x.numel())``: ``2(D-1)`` rounds and
    ``2V(D-1)/D`` bytes sent per rank (when ``D`` divides the element count).
    """
    # BEGIN SOLUTION hint: reduce-scatter, then all-gather the reduced shard
    return ring_all_gather(ring_reduce_scatter(x, group), x.numel(), group)
    # END SOLUTION


def _offsets(splits: list[int]) -> list[int]:
    """Start row of every block: ``[0, s0, s0+s1, ...]``."""
    out = [0]
    for n in splits:
        out.append(out[-1] + n)
    return out


def all_to_all(
    x: torch.Tensor,
    in_splits: list[int],
    out_splits: list[int],
    group: dist.ProcessGroup | None = None,
) -> torch.Tensor:
    """Exchange blocks of rows with every rank, like ``dist.all_to_all_single``.

    ``x`` has ``sum(in_splits)`` rows (first dimension): the first ``in_splits[0]`` go to rank
    0, the next ``in_splits[1]`` to rank 1, and so on. The result has ``sum(out_splits)`` rows:
    ``out_splits[s]`` rows from rank ``s``, in rank order. ``out_splits[s]`` on this rank must
    equal ``in_splits[r]`` on rank ``s`` (the caller agrees on the sizes beforehand). Block
    ``r`` never leaves rank ``r``; empty blocks are not sent.
    """
    size = dist.get_world_size(group)
    if len(in_splits) != size or len(out_splits) != size:
        raise ValueError(
            f"in_splits={list(in_splits)} and out_splits={list(out_splits)} need one entry "
            f"per rank (world size {size})"
        )
    if x.dim() < 1 or sum(in_splits) != x.shape[0] or min(*in_splits, *out_splits) < 0:
        raise ValueError(
            f"x has shape {tuple(x.shape)} but in_splits={list(in_splits)} sums to "
            f"{sum(in_splits)} (splits must be >= 0 and sum to x.shape[0])"
        )
    # BEGIN SOLUTION hint: allocate the output, copy your own block locally, then D-1 steps: isend block (r+s)%D to rank r+s and irecv block (r-s)%D from rank r-s into its place; skip empty blocks; wait for both
    rank = dist.get_rank(group)
    src_off, dst_off = _offsets(in_splits), _offsets(out_splits)
    out = x.new_empty((dst_off[-1], *x.shape[1:]))
    out[dst_off[rank] : dst_off[rank + 1]] = x[src_off[rank] : src_off[rank + 1]]  # stays home

    def peer(i):
        return dist.get_global_rank(group, i) if group is not None else i

    for step in range(1, size):
        to, frm = (rank + step) % size, (rank - step) % size
        reqs = []
        if in_splits[to]:  # the receiver computes the same size and posts a matching irecv
            block = x[src_off[to] : src_off[to + 1]].contiguous()
            reqs.append(dist.isend(block, dst=peer(to), group=group))
        if out_splits[frm]:
            reqs.append(
                dist.irecv(out[dst_off[frm] : dst_off[frm + 1]], src=peer(frm), group=group)
            )
        for req in reqs:  # both posted before waiting: no rank blocks on an unposted peer
            req.wait()
    return out
    # END SOLUTION
