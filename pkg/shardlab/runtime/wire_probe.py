"""Rank functions that show what a backend really sends and how long it takes (chapter 1).

``launch("shardlab.runtime.wire_probe:collective_wire", D, numel)`` runs every collective once
on an fp32 tensor (blocking, each in its own phase of a :class:`CommTrace`) and returns one
row per collective with the ring model (``accounting.comm.ring_sent_bytes``), the backend's
own algorithm (``accounting.wire.backend_sent_bytes``) and the bytes this rank really wrote
to its sockets (:mod:`shardlab.runtime.wire`; None where not measurable, e.g. nccl).

``launch("shardlab.runtime.wire_probe:time_collectives", D, sizes)`` times ``all_reduce`` and
``reduce_scatter_tensor`` over the same full-tensor sizes (the fastest of ``reps`` after
``warmup``: on a shared machine other processes only ever add time), for fitting α and β per
collective.
"""

from __future__ import annotations

__all__ = ["collective_wire", "time_collectives", "OPS"]

OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast")


def _calls(numel: int, d: int, dev):
    import torch
    import torch.distributed as dist

    x = torch.ones(numel, device=dev)
    part = torch.ones(numel // d, device=dev)
    return {
        "all_reduce": lambda: dist.all_reduce(x),
        "all_gather": lambda: dist.all_gather_into_tensor(torch.empty_like(x), part),
        "reduce_scatter": lambda: dist.reduce_scatter_tensor(torch.empty_like(part), x),
        "all_to_all": lambda: dist.all_to_all_single(torch.empty_like(x), x),
        "broadcast": lambda: dist.broadcast(x, 0),
    }


def collective_wire(numel: int = 1 << 20) -> list[dict]:
    """On each rank: ring model, backend algorithm and wire bytes of every collective."""
    import torch.distributed as dist

    from shardlab.runtime import CommTrace, device

    d, r = dist.get_world_size(), dist.get_rank()
    if numel % d:
        raise ValueError(f"numel={numel} must be divisible by the group size D={d}")
    calls = _calls(numel, d, device())
    with CommTrace() as tr:
        for op in OPS:
            dist.barrier()
            with tr.phase(op):
                calls[op]()
    rows = []
    for op in OPS:
        (rec,) = tr.select(phase=op, op=op)
        rows.append(
            {
                "op": op,
                "D": d,
                "rank": r,
                "nbytes": rec.nbytes,
                "ring": rec.sent_bytes,
                "backend": rec.backend,
                "backend_bytes": rec.backend_bytes,
                "wire": rec.wire_bytes,
                "wire_note": rec.wire_note,
            }
        )
    return rows


def time_collectives(
    sizes: list[int], reps: int = 5, warmup: int = 1, ops=("all_reduce", "reduce_scatter")
) -> dict:
    """On each rank: fastest seconds of each op for each full-tensor size in bytes."""
    import torch
    import torch.distributed as dist

    from shardlab.runtime import device
    from shardlab.testing import interleaved_times

    dev = device()
    d = dist.get_world_size()
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    out: dict = {"sizes": list(sizes), "group_size": d, "backend": dist.get_backend()}
    for op in ops:
        medians = []
        for nbytes in sizes:
            call = _calls(nbytes // 4 // d * d, d, dev)[op]
            medians.append(min(interleaved_times({op: call}, reps, warmup, sync)[op]))
        out[op] = medians
    return out
