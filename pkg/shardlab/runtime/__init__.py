"""Multi-process runtime: launch N ranks, and instruments that count bytes sent and held.

* :func:`launch`, :func:`device`, :class:`RankError`, :class:`LaunchTimeout`,
  :class:`LaunchDeadlock`,
  :func:`report_progress`, :func:`init_from_env` — see :mod:`shardlab.runtime.launch`.
* :class:`CommTrace`, :class:`CommRecord` — see :mod:`shardlab.runtime.trace_comm`.
* bytes each rank really writes to its sockets (the trace's wire column) — see
  :mod:`shardlab.runtime.wire`; probes for chapter 1 in :mod:`shardlab.runtime.wire_probe`.
* :class:`MemoryTrace`, :class:`MemoryTimeline` — see :mod:`shardlab.runtime.trace_memory`.
* :func:`plot_memory` — see :mod:`shardlab.runtime.plot`.
* profiling a step: :class:`~shardlab.runtime.profile.StepProfiler` (``torch.profiler``
  traces per rank, ``shardlab train --profile``), compute / communication / exposed
  communication per rank in :mod:`shardlab.runtime.trace_timeline`, the figure in
  :mod:`shardlab.runtime.plot_timeline`.

Importing this package does not import torch or matplotlib.
"""

from __future__ import annotations

# Eager imports (none of these modules imports torch at import time). They also make the
# package attribute ``launch`` the function, not the submodule ``shardlab.runtime.launch``;
# import helpers from the submodule with ``from shardlab.runtime.launch import ...``.
from shardlab.runtime._phase import phase
from shardlab.runtime.launch import (
    LaunchDeadlock,
    LaunchError,
    LaunchTimeout,
    RankError,
    device,
    init_from_env,
    launch,
    report_progress,
)
from shardlab.runtime.trace_comm import CommRecord, CommTrace
from shardlab.runtime.trace_memory import MemoryTimeline, MemoryTrace

__all__ = [
    "launch",
    "device",
    "RankError",
    "LaunchTimeout",
    "LaunchDeadlock",
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
        from shardlab.runtime.plot import plot_memory

        return plot_memory
    raise AttributeError(f"module 'shardlab.runtime' has no attribute {name!r}")
