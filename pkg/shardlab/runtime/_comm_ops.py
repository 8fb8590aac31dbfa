"""The communication operators :class:`~shardlab.runtime.trace_comm.CommTrace` recognises, and
how one call becomes a :class:`CommRecord`.

``_C10D`` maps each ``c10d`` dispatcher operator (what ``torch.distributed`` calls reach) and
``_FUNCOL`` each ``_c10d_functional`` operator (DTensor) to the recorded op name and the
argument that holds the *full* tensor. :func:`_build_record` reads the group size, element
count, bytes and peer from a bound call and computes the per-rank sent bytes with
``shardlab.accounting.comm.ring_sent_bytes`` (the only formula; see the trace_comm docstring)
and the bytes of the backend's own algorithm with ``shardlab.accounting.wire``
(``backend_bytes``). ``wire_bytes`` is filled in by the trace from :mod:`shardlab.runtime.wire`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass
class CommRecord:
    """One communication operation seen on this rank."""

    op: str  # all_reduce, all_gather, reduce_scatter, all_to_all, broadcast, send, recv, ...
    group_size: int
    dtype: str  # e.g. "torch.float32"
    numel: int  # elements of the full tensor (see module docstring)
    sent_bytes: float | None  # per-rank sent bytes (ring model for collectives)
    seconds: float  # issue -> completion
    phase: str | None
    c10d: str = ""  # the dispatcher operator, e.g. "c10d.allreduce_"
    nbytes: int = 0  # bytes of the full tensor
    async_op: bool | None = None
    peer: int | None = None  # destination/source rank for send/recv, root for rooted ops
    start: float = 0.0  # seconds since the trace began
    index: int = 0
    # added for the wire column (shardlab.runtime.wire); the fields above are unchanged
    backend: str = ""  # the process group's backend, e.g. "gloo"
    backend_bytes: float | None = None  # payload of the backend's algorithm (accounting.wire)
    wire_bytes: int | None = None  # measured socket bytes of this op alone (blocking ops)
    wire_note: str = ""  # why wire_bytes is None ("async: ...", "not measurable: ...")
    device: str = "cpu"  # device type of the communicated tensors

    def as_dict(self) -> dict:
        return asdict(self)


def _nb(t) -> int:
    return int(t.numel()) * int(t.element_size())


def _flat(x):
    if isinstance(x, (list, tuple)):
        for y in x:
            yield from _flat(y)
    elif x is not None and hasattr(x, "numel"):
        yield x


def _dtype(ts) -> str:
    ds = {str(t.dtype) for t in ts}
    return ds.pop() if len(ds) == 1 else ("mixed" if ds else "")


def _sum(ts) -> tuple[int, int]:
    ts = list(ts)
    return sum(int(t.numel()) for t in ts), sum(_nb(t) for t in ts)


# c10d op name -> (record op, which argument holds the "full" tensor(s))
_C10D = {
    "allreduce_": ("all_reduce", "tensors"),
    "allreduce_coalesced_": ("all_reduce", "tensors"),
    "allgather_": ("all_gather", "output_tensors"),
    "_allgather_base_": ("all_gather", "output_tensor"),
    "allgather_coalesced_": ("all_gather", "output_lists"),
    "allgather_into_tensor_coalesced_": ("all_gather", "outputs"),
    "reduce_scatter_": ("reduce_scatter", "input_tensors"),
    "_reduce_scatter_base_": ("reduce_scatter", "input_tensor"),
    "reduce_scatter_tensor_coalesced_": ("reduce_scatter", "inputs"),
    "broadcast_": ("broadcast", "tensors"),
    "alltoall_": ("all_to_all", "input_tensors"),
    "alltoall_base_": ("all_to_all", "input"),
    "send": ("send", "tensors"),
    "recv_": ("recv", "tensors"),
    "recv_any_source_": ("recv", "tensors"),
    "reduce_": ("reduce", "tensors"),
    "gather_": ("gather", "input_tensors"),
    "scatter_": ("scatter", "input_tensors"),
    "barrier": ("barrier", None),
    "monitored_barrier_": ("barrier", None),
}
_FUNCOL = {
    "all_reduce": ("all_reduce", "input"),
    "all_reduce_": ("all_reduce", "input"),
    "all_reduce_coalesced": ("all_reduce", "inputs"),
    "all_reduce_coalesced_": ("all_reduce", "inputs"),
    "all_gather_into_tensor": ("all_gather", None),  # output = input * group_size
    "all_gather_into_tensor_out": ("all_gather", "out"),
    "all_gather_into_tensor_coalesced": ("all_gather", None),
    "reduce_scatter_tensor": ("reduce_scatter", "input"),
    "reduce_scatter_tensor_coalesced": ("reduce_scatter", "inputs"),
    "all_to_all_single": ("all_to_all", "input"),
    "broadcast": ("broadcast", "input"),
    "broadcast_": ("broadcast", "input"),
}


def _backend_name(pg) -> str:
    try:
        return str(pg.name())
    except Exception:
        return ""


def _default_group() -> tuple[int, int, str]:
    import torch.distributed as dist

    try:
        backend = str(dist.get_backend())
    except Exception:
        backend = ""
    return int(dist.get_world_size()), int(dist.get_rank()), backend


def _group_size_and_rank(pg) -> tuple[int, int, str]:
    import torch.distributed as dist

    try:
        if not isinstance(pg, dist.ProcessGroup):
            pg = dist.ProcessGroup.unbox(pg)
        return int(pg.size()), int(pg.rank()), _backend_name(pg)
    except Exception:
        return _default_group()


def _resolve_group_name(name) -> tuple[int, int, str]:
    try:
        from torch.distributed.distributed_c10d import _resolve_process_group

        pg = _resolve_process_group(name)
        return int(pg.size()), int(pg.rank()), _backend_name(pg)
    except Exception:
        return _default_group()


def _backend_bytes(backend, op, nbytes, d, me, root) -> float | None:
    """Per-rank payload of the backend's own algorithm (``accounting.wire``), or None."""
    from shardlab.accounting.wire import BACKENDS, backend_sent_bytes

    if backend not in BACKENDS:
        return None
    if op in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast"):
        if op == "broadcast" and root is None:
            return None
        return float(backend_sent_bytes(backend, op, nbytes, d, me, root or 0))
    return None


def _build_record(ns, name, op, full_arg, bound, out, phase, index) -> CommRecord:
    """The :class:`CommRecord` of one call (``bound``: its arguments by name)."""
    from shardlab.accounting.comm import ring_sent_bytes

    if ns == "c10d":
        d, me, backend = _group_size_and_rank(bound.get("process_group"))
    else:
        gname = bound.get("group_name")
        d, me, backend = _resolve_group_name(gname)
        if bound.get("group_size") is not None:
            d = int(bound["group_size"])
    peer = None
    async_op = bound.get("async_op") if ns == "c10d" else True
    if full_arg is None and op == "all_gather":  # functional all-gather: output is D x input
        ts = list(_flat(bound.get("input", bound.get("inputs"))))
        numel, nbytes = _sum(ts)
        numel, nbytes = numel * d, nbytes * d
    elif full_arg is None:
        ts, numel, nbytes = [], 0, 0
    else:
        ts = list(_flat(bound.get(full_arg)))
        numel, nbytes = _sum(ts)
    if op in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast"):
        sent = float(ring_sent_bytes(op, nbytes, d)) if d >= 1 else 0.0
        if op == "broadcast":
            peer = bound.get("root_rank", bound.get("src"))
    elif op == "send":
        sent, peer = float(nbytes), bound.get("dst")
    elif op == "recv":
        sent, peer = 0.0, bound.get("src")
    elif op == "gather":
        peer = bound.get("root_rank")
        sent = 0.0 if peer == me else float(nbytes)
    elif op == "scatter":
        peer = bound.get("root_rank")
        if peer == me:
            chunks = list(_flat(bound.get("input_tensors")))
            numel, nbytes = _sum(chunks)
            sent = float(sum(_nb(t) for i, t in enumerate(chunks) if i != me))
        else:
            ts = list(_flat(bound.get("output_tensors")))
            numel, nbytes = _sum(ts)
            sent = 0.0
    elif op == "reduce":
        peer, sent = bound.get("root_rank"), None
    else:  # barrier
        sent = 0.0
    if not ts and op not in ("barrier",):
        ts = list(_flat(out))
    if op in ("send", "recv", "gather", "scatter", "barrier"):
        algo = sent  # what the transport is handed (point-to-point) or nothing (barrier)
    else:
        algo = _backend_bytes(backend, op, nbytes, d, me, peer)
    return CommRecord(
        op=op,
        group_size=d,
        dtype=_dtype(ts),
        numel=int(numel),
        sent_bytes=sent,
        seconds=0.0,
        phase=phase,
        c10d=f"{ns}.{name}",
        nbytes=int(nbytes),
        async_op=None if async_op is None else bool(async_op),
        peer=None if peer is None else int(peer),
        index=index,
        backend=backend,
        backend_bytes=algo,
        device=ts[0].device.type if ts else "cpu",
    )
