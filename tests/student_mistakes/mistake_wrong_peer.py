"""Student mistake: receives from the right neighbour instead of the left one (correct on two
ranks, where left = right; a hang on three or more)."""

from __future__ import annotations

import torch
import torch.distributed as dist
from _mistakes_base import reference

_ref = reference()
chunk_bounds, ring_all_gather, all_to_all = _ref.chunk_bounds, _ref.ring_all_gather, _ref.all_to_all


def ring_reduce_scatter(x, group=None):
    rank, size = dist.get_rank(), dist.get_world_size()
    right = (rank + 1) % size
    bounds = chunk_bounds(x.numel(), size)
    buf = x.clone()
    for step in range(size - 1):
        s0, s1 = bounds[(rank - 1 - step) % size]
        r0, r1 = bounds[(rank - 2 - step) % size]
        incoming = torch.empty(r1 - r0, dtype=buf.dtype)
        reqs = [dist.isend(buf[s0:s1].contiguous(), dst=right), dist.irecv(incoming, src=right)]
        for req in reqs:
            req.wait()
        buf[r0:r1] += incoming
    lo, hi = bounds[rank]
    return buf[lo:hi].clone()


def ring_all_reduce(x, group=None):
    return ring_all_gather(ring_reduce_scatter(x, group), x.numel(), group)
