"""Rank functions for tests/test_wire_*.py (spawned ranks import them by name)."""

from __future__ import annotations

NUMEL = 12 * 25_000  # 1.2 MB of fp32; divisible by 2, 3 and 4


def _read_wchar(path: str) -> int:
    with open(path) as f:
        for line in f:
            if line.startswith("wchar:"):
                return int(line.split()[1])
    raise RuntimeError(f"no wchar in {path}")


def _wchar() -> int:
    """Bytes this process wrote, less what the launcher's comm watcher wrote.

    The watcher thread (``shardlab-commwatch``) rewrites its small state file every tick; a
    tick that falls inside the measured window added 222 B to ``wchar`` in one CI run. Its
    own counter (``/proc/self/task/<tid>/io``) is subtracted so the window holds only the
    rank's writes.
    """
    import threading

    total = _read_wchar("/proc/self/io")
    for t in threading.enumerate():
        if t.name == "shardlab-commwatch" and t.native_id is not None:
            total -= _read_wchar(f"/proc/self/task/{t.native_id}/io")
    return total


def collectives(numel=NUMEL):
    """Every collective once, blocking, inside a CommTrace; plus checks of the counter."""
    import torch
    import torch.distributed as dist
    from shardlab.runtime import CommTrace
    from shardlab.runtime.wire import socket_bytes_written

    d, r = dist.get_world_size(), dist.get_rank()
    x = torch.ones(numel)
    out = {}
    with CommTrace() as tr:
        with tr.phase("all_reduce"):
            dist.all_reduce(x)
        with tr.phase("all_gather"):
            dist.all_gather_into_tensor(torch.empty(numel), torch.ones(numel // d))
        with tr.phase("all_gather_list"):
            dist.all_gather([torch.empty(numel // d) for _ in range(d)], torch.ones(numel // d))
        with tr.phase("reduce_scatter"):
            dist.reduce_scatter_tensor(torch.empty(numel // d), x)
        with tr.phase("reduce_scatter_list"):
            dist.reduce_scatter(torch.empty(numel // d), list(x.chunk(d)))
        with tr.phase("all_to_all"):
            dist.all_to_all_single(torch.empty(numel), x)
        for root in range(d):
            with tr.phase(f"broadcast_root{root}"):
                dist.broadcast(x, root)
        with tr.phase("async"):
            works = [dist.all_reduce(torch.ones(numel), async_op=True) for _ in range(2)]
            dist.all_reduce(torch.ones(numel))  # blocking, but two async ones are in flight
            for w in works:
                w.wait()
        dist.barrier()
        # wchar (every write of the process) against the socket counter around one collective
        w0, s0 = _wchar(), socket_bytes_written()
        dist.all_gather_into_tensor(torch.empty(numel), torch.ones(numel // d))
        w1, s1 = _wchar(), socket_bytes_written()
        out["wchar_vs_socket"] = (w1 - w0, s1 - s0)
        w0, s0 = _wchar(), socket_bytes_written()
        print("x" * 1000, flush=True)
        w1, s1 = _wchar(), socket_bytes_written()
        out["print"] = (w1 - w0, s1 - s0)
    out["records"] = tr.records
    out["phases"] = {p: tr.wire_bytes(phase=p) for p in tr._wire.by_phase}
    out["total"] = tr.wire_bytes()
    out["table"] = tr.wire_table()
    out["note"] = tr.wire_note
    out["rank"] = r
    return out


def student_ring(sizes):
    """Lab 01's ring reduce-scatter, all-gather and all-reduce, each traced on its own."""
    import sys
    from pathlib import Path

    import torch
    import torch.distributed as dist

    lab = str(Path(__file__).resolve().parents[1] / "labs" / "01_collectives")
    if lab not in sys.path:
        sys.path.insert(0, lab)
    import collectives as C
    from shardlab.runtime import CommTrace

    d, r = dist.get_world_size(), dist.get_rank()
    out = []
    for numel in sizes:
        x = torch.full((numel,), float(r + 1))
        lo, hi = C.chunk_bounds(numel, d)[r]
        runs = {
            "reduce_scatter": (C.ring_reduce_scatter, (x,)),
            "all_gather": (C.ring_all_gather, (x[lo:hi].clone(), numel)),
            "all_reduce": (C.ring_all_reduce, (x,)),
        }
        for op, (fn, args) in runs.items():
            dist.barrier()
            with CommTrace() as tr:
                fn(*args)
            out.append(
                {
                    "numel": numel,
                    "op": op,
                    "wire": tr.wire_bytes(),
                    "sent": tr.sent_bytes(),
                    "sends": tr.count(op="send"),
                    "recvs": tr.count(op="recv"),
                    "ops": sorted({rec.op for rec in tr.records}),
                }
            )
    return out


def traced_all_reduce(numel=NUMEL):
    """One traced all-reduce: the trace's records, wire total, per-phase wire and table."""
    import torch
    import torch.distributed as dist
    from shardlab.runtime import CommTrace

    with CommTrace() as tr:
        with tr.phase("all_reduce"):
            dist.all_reduce(torch.ones(numel))
    return {"records": tr.records, "total": tr.wire_bytes(), "table": tr.wire_table(),
            "phases": {p: tr.wire_bytes(phase=p) for p in tr._wire.by_phase}}
