"""The wire columns of :class:`~shardlab.runtime.trace_comm.CommTrace` (internal mixin).

What is measured and where it is blind: :mod:`shardlab.runtime.wire`. This mixin decides, per
operation, whether its bytes can be isolated (a blocking collective while none of the trace's
asynchronous operations is in flight) and offers the summaries. It expects the trace's
``records``, ``_wire`` (a :class:`~shardlab.runtime.wire.WireMeter`), ``_inflight``, ``_pending``,
``current_phase`` and ``select``.
"""

from __future__ import annotations

from shardlab.runtime._comm_table import format_wire_table, wire_rows
from shardlab.runtime.wire import not_measurable_reason


class WireColumns:
    """``wire_bytes``, ``backend_bytes``, ``wire_note`` and ``wire_table`` of a trace."""

    def _nothing_in_flight(self) -> bool:
        """No asynchronous operation of this trace is still moving bytes."""
        self._inflight = [w for w in self._inflight if not _completed(w)]
        return not self._inflight and len(self._pending) == 0

    def _note_wire(self, rec, work, blocking, alone):
        if self._wire.reason is not None:
            rec.wire_note = self._wire.reason
        elif rec.device != "cpu":
            rec.wire_note = not_measurable_reason(rec.backend, rec.device)
        elif not blocking:
            rec.wire_note = "async: counted in its phase total"
            self._inflight.append(work)
        elif not alone:
            rec.wire_note = "overlapped: an asynchronous operation was in flight"
        else:
            _unbox(work).wait()  # the caller waits next anyway; the window must hold it all
            rec.wire_bytes = self._wire.settle(self.current_phase)

    def wire_bytes(self, phase=None, op=None) -> int | None:
        """Bytes this rank wrote to its sockets (measured; None where not measurable).

        Without ``op``: everything written while ``phase`` was the innermost phase label
        (``phase=None``: the whole trace), asynchronous traffic included. With ``op``: the sum
        of the selected records' own ``wire_bytes``, None if any of them could not be isolated.
        """
        if op is None:
            return self._wire.total(phase)
        ws = [r.wire_bytes for r in self.select(phase, op)]
        return None if any(w is None for w in ws) else int(sum(ws))

    def backend_bytes(self, phase=None, op=None) -> float:
        """Sum of the selected records' ``backend_bytes`` (the backend's own algorithm)."""
        return float(
            sum(r.backend_bytes for r in self.select(phase, op) if r.backend_bytes is not None)
        )

    @property
    def wire_note(self) -> str | None:
        """None if wire bytes are measured, else the "not measurable: ..." reason."""
        return self._wire.reason

    def wire_table(self) -> str:
        """Every operation with ring-model, backend-algorithm and wire bytes, and phase totals.

        Deterministic for a given program and backend version (no timings)."""
        backend = next((r.backend for r in self.records if r.backend), "backend")
        text = format_wire_table(
            wire_rows(self.records, self._wire.by_phase, self.wire_note), backend
        )
        return text if self.wire_note is None else f"wire: {self.wire_note}\n{text}"


def _unbox(work):
    import torch.distributed as dist

    return work if isinstance(work, dist.Work) else dist.Work.unbox(work)


def _completed(work) -> bool:
    try:
        return bool(_unbox(work).is_completed())
    except Exception:
        return True  # an object we cannot ask is not something we can wait for either


def _backend_reason() -> str | None:
    """Why the default group's traffic is not measurable (None for gloo on Linux)."""
    try:
        import torch.distributed as dist

        backend = dist.get_backend() if dist.is_initialized() else "gloo"
    except Exception:
        backend = None
    return not_measurable_reason(backend)
