"""What a rank needs to know about itself (internal): its threads, its group, its device.

Used on the rank side by ``_child`` (a rank :func:`shardlab.runtime.launch` started) and by
``python -m shardlab.run`` under ``torchrun``, and on the caller side by ``launch`` (how many
threads each rank gets, which backend ``backend=None`` means). It imports nothing of the
launcher, so a rank's entry point and the launcher do not import each other; ``launch``
re-exports :func:`device` and :func:`init_from_env`. Importing it imports no torch.
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any

__all__ = ["device", "init_from_env", "threads_per_rank"]


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - macOS
        return os.cpu_count() or 1


def threads_per_rank(nprocs: int) -> int:
    """Intra-op threads each of ``nprocs`` ranks on this machine gets: its share of the CPU
    set, at least one (2 cores, 2 ranks: 1 each; 16 cores, 4 ranks: 4 each). Sharing the
    cores evenly keeps ranks from preempting each other."""
    return max(1, _cores() // max(1, nprocs))


def init_from_env(backend: str | None = None, timeout: float = 1800.0) -> None:
    """Initialise the default process group from torchrun-style environment variables.

    Used by ranks started by :func:`launch` (they join the caller's TCPStore) and by
    ``python -m shardlab.run`` under ``torchrun`` (plain ``env://``). Sets the thread count
    and, for nccl, the rank's CUDA device. Does nothing if a group already exists."""
    import torch
    import torch.distributed as dist

    if dist.is_initialized():
        return
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    torch.set_num_threads(threads_per_rank(local_world))
    if backend is None:
        backend = _auto_backend(local_world)
    os.environ["SHARDLAB_BACKEND"] = backend
    kwargs: dict[str, Any] = {"timeout": timedelta(seconds=timeout)}
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
        kwargs["device_id"] = torch.device("cuda", local_rank)
    if os.environ.get("SHARDLAB_STORE") == "client":
        store = dist.TCPStore(
            os.environ["MASTER_ADDR"],
            int(os.environ["MASTER_PORT"]),
            world,
            is_master=False,
            timeout=timedelta(seconds=timeout),
        )
        dist.init_process_group(backend, store=store, rank=rank, world_size=world, **kwargs)
    else:
        dist.init_process_group(
            backend, init_method="env://", rank=rank, world_size=world, **kwargs
        )


def device():
    """This rank's ``torch.device``: ``cuda:LOCAL_RANK`` under nccl, else ``cpu``."""
    import torch

    backend = os.environ.get("SHARDLAB_BACKEND")
    if backend is None:
        try:
            import torch.distributed as dist

            backend = dist.get_backend() if dist.is_initialized() else "gloo"
        except Exception:
            backend = "gloo"
    if "nccl" in str(backend):
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device("cpu")


def _auto_backend(nprocs: int) -> str:
    try:
        import torch

        if torch.cuda.is_available() and nprocs <= torch.cuda.device_count():
            return "nccl"
    except Exception:
        pass
    return "gloo"
