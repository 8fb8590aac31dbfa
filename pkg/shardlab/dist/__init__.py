"""Multi-process runtime: launch N ranks, and instruments that count bytes sent and held.

* :func:`launch`, :func:`device`, :class:`RankError`, :class:`LaunchTimeout`,
  :func:`report_progress`, :func:`init_from_env` — see :mod:`shardlab.dist.launch`.
* :class:`CommTrace`, :class:`CommRecord` — see :mod:`shardlab.dist.trace_comm`.
* bytes each rank really writes to its sockets (the trace's wire column) — see
  :mod:`shardlab.dist.wire`; probes for chapter 1 in :mod:`shardlab.dist.wire_probe`.
* :class:`MemoryTrace`, :class:`MemoryTimeline` — see :mod:`shardlab.dist.trace_memory`.
* :func:`plot_memory` — see :mod:`shardlab.dist.plot`.

Importing this package does not import torch or matplotlib.
"""

from __future__ import annotations

# Eager imports (none of these modules imports torch at import time). They also make the
# package attribute ``launch`` the function, not the submodule ``shardlab.dist.launch``;
# import helpers from the submodule with ``from shardlab.dist.launch import ...``.
from shardlab.dist._phase import phase
from shardlab.dist.launch import (
    LaunchError,
    LaunchTimeout,
    RankError,
    device,
    init_from_env,
    launch,
    report_progress,
)
from shardlab.dist.trace_comm import CommRecord, CommTrace
from shardlab.dist.trace_memory import MemoryTimeline, MemoryTrace

__all__ = [
    "launch",
    "device",
    "RankError",
    "LaunchTimeout",
    "LaunchError",
    "report_progress",
    "init_from_env",
    "CommTrace",
    "CommRecord",
    "phase",
    "MemoryTrace",
    "MemoryTimeline",
    "plot_memory",
]


def __getattr__(name):
    if name == "plot_memory":  # matplotlib is imported only when plotting
        from shardlab.dist.plot import plot_memory

        return plot_memory
    raise AttributeError(f"module 'shardlab.dist' has no attribute {name!r}")
