"""Compute something once per pytest run, shared by every pytest-xdist worker.

A lab's public tests check many numbers of one multi-rank launch. Under ``pytest -n 2`` each
worker runs a module-scoped fixture itself, so the same ranks would start once per worker.
:func:`once_per_run` lets the first worker compute and store the (picklable) value in the
run's shared temporary folder while the others wait on a file lock and read it —
pytest-xdist's documented pattern for session-wide data. Without xdist, or without ``fcntl``
(Windows), it simply computes.
"""

from __future__ import annotations

import os
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any


def once_per_run(tmp_path_factory, key: str, compute: Callable[[], Any]) -> Any:
    """``compute()`` once per test run (``key`` names it; ``tmp_path_factory`` is pytest's)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows: every worker computes
        return compute()
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return compute()
    root = Path(tmp_path_factory.getbasetemp()).parent  # this run's folder, shared by workers
    data = root / f"{key}.pkl"
    with open(root / f"{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if data.is_file():
            return pickle.loads(data.read_bytes())
        value = compute()
        data.write_bytes(pickle.dumps(value))
        return value
