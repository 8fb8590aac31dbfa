"""Small rank functions for the hang detector's tests (tests/test_dist_student_mistakes_watch.py)."""

from __future__ import annotations

import time

import torch
import torch.distributed as dist


def late_sender(how: str, seconds: float):
    """Rank 0 posts a receive early (as lab 05's executor does), then sleeps or computes for
    ``seconds`` before it sends; rank 1 waits in ``recv`` all that time."""
    if dist.get_rank() == 0:
        back = torch.zeros(1)
        req = dist.irecv(back, src=1)  # in flight while this rank works
        if how == "sleep":
            time.sleep(seconds)
        else:  # long C calls: the frame hardly moves, the CPU does
            a = torch.randn(1024, 1024) / 32
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                a = torch.tanh(a @ a)
        dist.send(torch.tensor([7.0]), dst=1)
        req.wait()
        return float(back)
    x = torch.zeros(1)
    dist.recv(x, src=0)
    dist.send(x + 1, dst=0)
    return float(x)


def both_recv():
    """Every rank receives first: nobody ever sends."""
    x = torch.zeros(1)
    dist.recv(x, src=1 - dist.get_rank())
    return float(x)


def batched_exchange():
    """``P2POp`` + ``batch_isend_irecv`` and ``group_dst``/``group_src`` through the recorders
    (torch checks ``op in [isend, irecv]`` and ``op is isend``)."""
    rank, other = dist.get_rank(), 1 - dist.get_rank()
    got = torch.zeros(2)
    ops = [
        dist.P2POp(dist.isend, torch.full((2,), float(rank)), other),
        dist.P2POp(dist.irecv, got, other),
    ]
    for req in dist.batch_isend_irecv(ops):
        req.wait()
    back = torch.zeros(1)
    group = dist.group.WORLD
    reqs = [
        dist.isend(torch.tensor([10.0 + rank]), group=group, group_dst=other, tag=3),
        dist.irecv(back, group=group, group_src=other, tag=3),
    ]
    for req in reqs:
        req.wait()
    return [float(got[0]), float(back), type(dist.isend).__name__]  # "_P2P": recorded
