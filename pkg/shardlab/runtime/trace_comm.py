"""CommTrace: count every collective and point-to-point operation a rank issues.

Usage (inside a rank started by :func:`shardlab.runtime.launch`)::

    from shardlab.runtime import CommTrace
    with CommTrace() as tr:
        with tr.phase("forward"):
            loss = model(x).sum()
        with tr.phase("backward"):
            loss.backward()
    tr.sent_bytes(phase="backward")      # per-rank bytes sent under the ring model
    tr.wire_bytes(phase="backward")      # bytes this rank really wrote to its sockets
    print(tr.table())
    print(tr.wire_table())               # ring model | backend's algorithm | wire, per op
    return tr.records                     # CommRecord objects pickle back to the caller

How it works
    ``CommTrace`` is a ``TorchDispatchMode``. Every ``torch.distributed`` call reaches the
    PyTorch dispatcher as a ``c10d`` operator (``c10d::allreduce_``, ``c10d::_allgather_base_``,
    ``c10d::send`` ...), and the functional collectives used by DTensor reach it as
    ``_c10d_functional`` operators; the mode sees each one with its tensors and process group.
    For every operation it stores a :class:`CommRecord`: the operation name (the names of
    ``shardlab.accounting.comm.COLLECTIVES`` plus ``send``/``recv``/``gather``/``scatter``/
    ``reduce``/``barrier``), the group size, dtype, element count of the *full* tensor (the
    all-gather output, the reduce-scatter input, the all-reduce tensor, the all-to-all input,
    the broadcast tensor, the point-to-point tensor), the per-rank sent bytes, the wall time
    and the phase label.

Sent bytes
    Collectives: ``shardlab.accounting.comm.ring_sent_bytes(op, nbytes, group_size)`` — the
    only formula; the trace does not carry a second one. Point-to-point: the tensor's bytes on
    the sender, 0 on the receiver. ``gather``: a non-root rank sends its input, the root 0;
    ``scatter``: the root sends every chunk but its own, others 0 (these are counts of the
    bytes handed to the transport, not a model). ``reduce`` has no ring model in
    ``shardlab.accounting`` and is recorded with ``sent_bytes=None``; ``barrier`` with 0.
    The numbers are what the ring algorithm sends, not what gloo or NCCL actually chose to do
    on the wire; the next two fields say that.

Backend bytes and wire bytes (added fields; the ones above are unchanged)
    ``backend_bytes``: the payload of the algorithm the backend really runs,
    ``shardlab.accounting.wire.backend_sent_bytes`` (gloo: reduce-scatter is an all-reduce of
    the whole input, 2x the ring model; broadcast is a binomial tree, the root sends
    ``ceil(log2 D)`` copies and leaves none). ``wire_bytes``: what this rank *measurably*
    wrote to its TCP sockets during the operation (:mod:`shardlab.runtime.wire`: Linux
    ``TCP_INFO`` counters; stdout and file writes are not sockets and do not count), for a
    blocking collective issued while no asynchronous operation of the trace is in flight — the
    trace then waits for it inside the call, so the window holds this collective alone.
    Asynchronous operations overlap, so their ``wire_bytes`` is None (``wire_note`` says why)
    and their bytes are in :meth:`CommTrace.wire_bytes` of the phase open when they were
    written, i.e. per step or per phase. On nccl / CUDA tensors and off Linux every wire value
    is None and :attr:`CommTrace.wire_note` says "not measurable: ..." — NVLink and InfiniBand
    traffic never passes through the process's sockets, so any number would be wrong.

Wall time
    From the moment the operation is issued until its ``Work`` future completes (callback on
    ``work.get_future()``); for functional collectives until ``wait_tensor``. For a blocking
    call that is the full collective; for ``async_op=True`` it includes the time the caller
    spent doing other work before the collective finished. Records whose future never
    completed inside the trace keep ``seconds`` = time to issue. On CUDA the future completes
    when the NCCL kernel is done on its stream.

What it sees (checked on CPU with gloo, torch 2.13, 2 ranks; tests/test_dist_trace.py)
    * every ``torch.distributed`` collective and point-to-point call, blocking or
      ``async_op=True`` (``all_reduce``, ``all_gather``, ``all_gather_into_tensor``,
      ``reduce_scatter``, ``reduce_scatter_tensor``, ``broadcast``, ``all_to_all``,
      ``all_to_all_single``, ``send``/``recv``/``isend``/``irecv``, ``barrier`` ...);
    * PyTorch DDP: the constructor's parameter shape check (an ``all_gather``) and the
      parameter/buffer ``broadcast`` (only if the DDP object is *built* inside the trace), and
      the gradient-bucket ``all_reduce`` issued by the C++ Reducer during backward — the
      Reducer calls ``ProcessGroup::allreduce``, which goes through the dispatcher, and the
      autograd engine runs CPU backward on the calling thread, so the mode sees it;
    * FSDP2 (``fully_shard``): its ``_allgather_base_`` (parameter all-gather) and
      ``_reduce_scatter_base_`` (gradient reduce-scatter) calls;
    * DTensor / tensor parallel redistributions (``_c10d_functional`` ops).

What it cannot see
    * communication that does not go through the PyTorch dispatcher on a thread where the
      mode is active: NCCL/gloo traffic issued by other libraries (DeepSpeed's custom
      kernels, NVSHMEM, CUDA-aware MPI calls made directly), the TCPStore rendezvous traffic,
      and c10d calls made on threads started before/outside the ``with`` block (PyTorch
      propagates dispatch modes to autograd's worker threads; on CUDA check that the mode
      reaches autograd's device threads — not verified on this CPU-only build);
    * operations inside a ``torch.compile``-d region whose collectives were traced into the
      compiled graph (the mode sees only what runs eagerly);
    * the bytes on the wire of GPU backends (see Backend bytes and wire bytes);
    * DDP's bucket all-reduces while ``no_sync()`` is active are not issued, so they are
      correctly absent.

Overhead
    A dispatch mode sends *every* operator through Python, so the cost is per operator, not
    per byte: a step of hundreds of small operators slows down several times, one of large
    operators by a fifth; ``OVERHEAD`` holds the ratio for a tiny and a medium GPT step.
    Trace a few steps, not a whole training run. The wire counters add one socket snapshot
    per phase change and two per blocking collective (each 50-250 us with four ranks on two
    cores), and the trace waits for a blocking collective inside the call, which the caller
    would do next anyway.

The operator tables and the rule that turns one call into a :class:`CommRecord` (sent bytes
included) are in :mod:`shardlab.runtime._comm_ops`; this module holds the dispatch mode and the
summaries.
"""

from __future__ import annotations

import time
import weakref

from shardlab.runtime import _phase
from shardlab.runtime._comm_ops import _C10D, _FUNCOL, CommRecord, _build_record, _flat
from shardlab.runtime._comm_table import format_table, sent_table
from shardlab.runtime._phase import PhaseLabels, phase
from shardlab.runtime._trace_wire import WireColumns, _backend_reason
from shardlab.runtime.wire import WireMeter, not_measurable_reason

__all__ = ["CommTrace", "CommRecord", "phase", "OVERHEAD", "sent_table", "format_table"]

# Filled from a measurement on the development machine (2 shared cores, 2 gloo ranks, tiny GPT
# step with DDP): time(with trace) / time(without). See shardlab.runtime.trace_memory.OVERHEAD.
OVERHEAD: dict[str, float] = {
    # median step time with the trace / without; 2 gloo ranks on a shared 2-core CPU machine,
    # one DDP training step (forward, backward, Adam) of shardlab.models.GPT, n_layer=2
    "tiny d_model=64 seq_len=32 batch=8 (step ~24 ms)": 3.0,  # 2.7-3.8 over repeated runs
    "medium d_model=256 seq_len=128 batch=8 (step ~0.43 s)": 1.2,  # 1.18-1.21
}


_PLAIN: set = set()


class CommTrace(PhaseLabels, WireColumns):
    """Record every ``torch.distributed`` operation issued on this rank inside ``with``.

    ``records``: list of :class:`CommRecord`. ``phase(name)``: context manager labelling the
    records issued inside it (``shardlab.runtime.phase`` labels every active trace at once).
    ``sent_bytes(phase=None, op=None)``, ``count(...)``, ``summary()``, ``table()``;
    measured: ``wire_bytes(phase=None, op=None)``, ``backend_bytes(...)``, ``wire_table()``,
    ``wire_note`` (None, or why the wire is not measurable here).
    """

    def __init__(self):
        self.records: list[CommRecord] = []
        self._phases: list[str] = []
        self._mode = None
        self._t0 = time.perf_counter()
        self._pending: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._wire = WireMeter(not_measurable_reason())
        self._inflight: list = []  # c10d Work objects of asynchronous operations

    # -- phases (the wire bytes written so far belong to the phase that is ending/outer)
    def _push_phase(self, name: str) -> None:
        self._wire.mark(self.current_phase)
        self._phases.append(str(name))

    def _pop_phase(self) -> None:
        self._wire.mark(self.current_phase)
        if self._phases:
            self._phases.pop()

    @property
    def current_phase(self) -> str | None:
        return self._phases[-1] if self._phases else None

    # -- context
    def __enter__(self):
        from torch.utils._python_dispatch import TorchDispatchMode

        trace = self
        plain = _PLAIN  # ops known not to communicate (cache across traces)

        class _Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                if func in plain:
                    return func(*args, **(kwargs or {}))
                ns = func.namespace
                if ns == "c10d" or ns == "_c10d_functional":
                    return trace._handle(func, ns, args, kwargs or {})
                plain.add(func)
                return func(*args, **(kwargs or {}))

        self._t0 = time.perf_counter()
        self._wire = WireMeter(_backend_reason())
        self._wire.start()
        self._mode = _Mode()
        self._mode.__enter__()
        _phase.register(self)
        return self

    def __exit__(self, *exc):
        _phase.unregister(self)
        self._wire.stop(self.current_phase)
        mode, self._mode = self._mode, None
        return mode.__exit__(*exc)

    # -- recording
    def _handle(self, func, ns, args, kwargs):
        name = func._schema.name.split("::", 1)[1]
        table = _C10D if ns == "c10d" else _FUNCOL
        if name == "wait_tensor":
            out = func(*args, **kwargs)
            rec = self._pending.pop(args[0], None) if args else None
            if rec is not None:
                rec.seconds = time.perf_counter() - self._t0 - rec.start
            return out
        if name not in table:
            return func(*args, **kwargs)
        op, full_arg = table[name]
        bound = {}
        for i, a in enumerate(func._schema.arguments):
            if i < len(args):
                bound[a.name] = args[i]
            elif a.name in kwargs:
                bound[a.name] = kwargs[a.name]
            elif a.has_default_value():
                bound[a.name] = a.default_value
        blocking = ns == "c10d" and bound.get("async_op") is False
        alone = blocking and self._nothing_in_flight()
        if alone:
            self._wire.mark(self.current_phase)  # what came before is not this op's
        start = time.perf_counter()
        out = func(*args, **kwargs)
        issue = time.perf_counter() - start
        rec = self._record(ns, name, op, full_arg, bound, out)
        rec.start = start - self._t0
        rec.seconds = issue
        if ns == "c10d":
            work = out[-1] if isinstance(out, tuple) else out
            self._on_complete(work, rec)
            self._note_wire(rec, work, blocking, alone)
        else:
            rec.wire_note = self._wire.reason or "async: counted in its phase total"
            for t in _flat(out):
                try:
                    self._pending[t] = rec
                except TypeError:
                    pass
        return out

    def _on_complete(self, work, rec):
        try:
            import torch.distributed as dist

            w = work if isinstance(work, dist.Work) else dist.Work.unbox(work)
            fut = w.get_future()
            t0 = self._t0

            def done(_f, rec=rec, t0=t0):
                rec.seconds = time.perf_counter() - t0 - rec.start

            fut.add_done_callback(done)
        except Exception:
            pass  # keep the issue time

    def _record(self, ns, name, op, full_arg, bound, out) -> CommRecord:
        rec = _build_record(
            ns, name, op, full_arg, bound, out, self.current_phase, len(self.records)
        )
        self.records.append(rec)
        return rec

    # -- summaries
    def select(self, phase=None, op=None) -> list[CommRecord]:
        """Records whose phase equals ``phase`` and op equals ``op`` (None: any)."""
        return [
            r
            for r in self.records
            if (phase is None or r.phase == phase) and (op is None or r.op == op)
        ]

    def sent_bytes(self, phase=None, op=None) -> float:
        """Total per-rank sent bytes of the selected records (records without a model skip)."""
        return float(sum(r.sent_bytes for r in self.select(phase, op) if r.sent_bytes is not None))

    def count(self, phase=None, op=None) -> int:
        return len(self.select(phase, op))

    def summary(self) -> list[dict]:
        """One row per (phase, op, group size, dtype): calls, elements, sent bytes, seconds."""
        rows: dict[tuple, dict] = {}
        for r in self.records:
            key = (r.phase or "", r.op, r.group_size, r.dtype)
            row = rows.setdefault(
                key,
                {
                    "phase": key[0],
                    "op": r.op,
                    "group_size": r.group_size,
                    "dtype": r.dtype.replace("torch.", ""),
                    "calls": 0,
                    "numel": 0,
                    "sent_bytes": 0.0,
                    "seconds": 0.0,
                },
            )
            row["calls"] += 1
            row["numel"] += r.numel
            row["sent_bytes"] += r.sent_bytes or 0.0
            row["seconds"] += r.seconds
        return list(rows.values())

    def table(self, seconds: bool = False) -> str:
        """Plain-text table of :meth:`summary` (deterministic unless ``seconds=True``)."""
        return format_table(self.summary(), seconds=seconds)

    def __getstate__(self):
        return {"records": self.records, "_phases": [], "_t0": 0.0, "_wire": self._wire}

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._mode = None
        self._pending = weakref.WeakKeyDictionary()
        self._inflight = []
        if "_wire" not in state:
            self._wire = WireMeter("not measurable: trace pickled without wire counts")
