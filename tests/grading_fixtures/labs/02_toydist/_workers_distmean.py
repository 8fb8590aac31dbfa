"""Rank functions for the distmean tests (importable, so shardlab.runtime.launch can run them)."""

import distmean
import torch
import torch.distributed as dist


def mean_worker(n):
    torch.set_num_threads(1)
    t = torch.arange(n, dtype=torch.float32) + dist.get_rank()
    return distmean.all_reduce_mean(t).tolist()
