"""Toy multi-process lab module: mean of a tensor over ranks (gloo on CPU)."""

import torch.distributed as dist


def all_reduce_mean(t):
    """Replace t by its mean over all ranks, in place, and return it."""
    # BEGIN SOLUTION hint: all_reduce with SUM, then divide by the world size
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    t /= dist.get_world_size()
    # END SOLUTION
    return t
