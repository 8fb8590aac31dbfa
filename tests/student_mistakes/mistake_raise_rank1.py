"""Student mistake: an exception on rank 1 only (an index computed from the rank)."""

from __future__ import annotations

import torch.distributed as dist
from _mistakes_base import reference

_ref = reference()
chunk_bounds, ring_all_gather, all_to_all = _ref.chunk_bounds, _ref.ring_all_gather, _ref.all_to_all


def ring_reduce_scatter(x, group=None):
    if dist.get_rank(group) == 1:
        raise IndexError("student's chunk index 7 is out of range for rank 1")
    return _ref.ring_reduce_scatter(x, group)


def ring_all_reduce(x, group=None):
    return ring_all_gather(ring_reduce_scatter(x, group), x.numel(), group)
