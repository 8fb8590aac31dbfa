"""Phase labels shared by the communication and memory traces (internal)."""

from __future__ import annotations

import contextlib
import threading

_lock = threading.Lock()
_active: list = []  # traces currently entered (any thread); each has _push_phase/_pop_phase


def register(trace) -> None:
    with _lock:
        _active.append(trace)


def unregister(trace) -> None:
    with _lock:
        if trace in _active:
            _active.remove(trace)


@contextlib.contextmanager
def phase(name: str):
    """Label everything inside the block with ``name`` in every active trace (comm and memory).

    ``with phase("backward"): loss.backward()``. Nested phases restore the outer label."""
    with _lock:
        traces = list(_active)
    for t in traces:
        t._push_phase(name)
    try:
        yield
    finally:
        for t in reversed(traces):
            t._pop_phase()


class PhaseLabels:
    """Mixin of the traces: ``with trace.phase(name):`` labels only this trace (the class
    provides ``_push_phase`` / ``_pop_phase``)."""

    @contextlib.contextmanager
    def phase(self, name: str):
        """Label what this trace records inside the block (forward, backward, optimizer ...)."""
        self._push_phase(name)
        try:
            yield self
        finally:
            self._pop_phase()
