"""Compute, communication and *exposed* communication per rank, read from a profiler trace.

Input: the Chrome/Perfetto JSON that ``torch.profiler`` writes (``shardlab train --profile``,
:mod:`shardlab.runtime.profile`), or the compact timeline :func:`compact` makes of it. Every
complete event (``"ph": "X"``) is classified by :func:`classify`:

* **communication** — what moves bytes: gloo's ``gloo:all_reduce``, ``gloo:all_gather``,
  ``gloo:reduce_scatter`` ... (recorded on gloo's ``pt_gloo_runloop`` worker threads while the
  collective runs), or on a GPU the nccl kernels (``ncclDevKernel_*``). ``gloo:barrier`` is
  left out: it is the rank loop's synchronisation, not the layout's communication. The
  ``c10d::allreduce_`` / ``record_param_comms`` events on the Python thread only *enqueue* a
  collective (microseconds) and count as neither.
* **compute** — every other top-level CPU op (``aten::*``, ``autograd::engine::*``, the
  ``Optimizer.step#...`` span) of every thread but gloo's workers (threads that run
  collectives and no ``ProfilerStep``; a pipeline's blocking ``gloo:send`` / ``gloo:recv`` run
  on the Python thread itself), or, when the trace holds GPU kernels, every other kernel.
* **step** — ``ProfilerStep#N``, the span of one recorded step.

Per rank, with the events of all its threads: compute time = length of the union of the
compute intervals, communication time = length of the union of the communication
intervals, exposed communication = length of (communication union) minus (compute union):
the time bytes were moving while this rank computed nothing — what overlap did not hide.
It is never more than the communication time (:func:`analyze`; hand-worked cases in
``tests/test_trace_timeline.py``).

Why the JSON is read directly: HolisticTraceAnalysis (``hta``) is not installed here, and
its ``TraceAnalysis`` breakdowns (temporal, communication–computation overlap) are computed
from GPU kernel streams; a CPU/gloo trace has no kernels, so it has nothing to analyse. The
classification above is what it does on a GPU trace (nccl kernel time not overlapped by
compute kernels), applied to CPU threads.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

COMPUTE, COMM, STEP = "compute", "comm", "step"


@dataclass(frozen=True)
class Event:
    """One interval of a rank's timeline, in microseconds since the trace's first event."""

    rank: int
    thread: str
    name: str
    start: float
    end: float
    kind: str  # COMPUTE, COMM or STEP


def classify(name: str, cat: str = "cpu_op") -> str | None:
    """The kind of a trace event (``None``: not counted), from its name and category."""
    if name.startswith("ProfilerStep#"):
        return STEP
    if name.startswith("gloo:"):
        return None if name == "gloo:barrier" else COMM
    if cat == "kernel":
        return COMM if name.lower().startswith("nccl") else COMPUTE
    if name.startswith("Optimizer."):  # the optimizer's annotation spans its ops
        return COMPUTE
    if cat != "cpu_op" or name.startswith("c10d::") or name == "record_param_comms":
        return None
    return COMPUTE


def union(intervals) -> list[tuple[float, float]]:
    """The sorted, disjoint union of ``(start, end)`` intervals."""
    out: list[list[float]] = []
    for s, e in sorted(intervals):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [(s, e) for s, e in out]


def subtract(a, b) -> list[tuple[float, float]]:
    """``union(a)`` minus ``union(b)``: the parts of ``a`` that no interval of ``b`` covers."""
    out, cover = [], union(b)
    for s, e in union(a):
        for cs, ce in cover:
            if ce <= s or cs >= e:
                continue
            if cs > s:
                out.append((s, cs))
            s = max(s, ce)
            if s >= e:
                break
        if s < e:
            out.append((s, e))
    return out


def length(intervals) -> float:
    """Total length of the union of ``intervals``."""
    return sum(e - s for s, e in union(intervals))


def _top_level(evs: list[dict]) -> list[dict]:
    """The events of one thread that no other event of it contains (nested ops dropped)."""
    out, end = [], float("-inf")
    for e in sorted(evs, key=lambda e: (e["ts"], -e["dur"])):
        if e["ts"] >= end:
            out.append(e)
            end = e["ts"] + e["dur"]
    return out


def _thread_label(t: str, by_thread: dict, comm: set) -> str:
    """``main`` (the Python thread: tid = pid), ``comm<i>`` (a thread running collectives),
    ``stream<i>`` (GPU) or ``thread<i>``, numbered in order of their ids: no pid in the data."""
    pid, tid = t.split("/")
    if pid == tid:
        return "main"
    if any(e.get("cat") == "kernel" for e in by_thread[t]):
        return f"stream{tid}"
    kind = "comm" if t in comm else "thread"
    same = sorted((u for u in by_thread if (u in comm) == (t in comm) and u != f"{pid}/{pid}"),
                  key=lambda u: (len(u), u))
    return f"{kind}{same.index(t)}"


def load_events(trace: dict | str | os.PathLike) -> list[Event]:
    """The classified events of one rank's trace (a path or the loaded JSON); a compact
    timeline (:func:`compact`) is read back as it is."""
    if not isinstance(trace, dict):
        trace = json.loads(Path(trace).read_text())
    if "events" in trace:  # a compact timeline
        return [Event(**e) for e in trace["events"]]
    rank = int(trace.get("distributedInfo", {}).get("rank", 0))
    raw = [e for e in trace["traceEvents"] if e.get("ph") == "X" and "dur" in e]
    kernels = any(e.get("cat") == "kernel" for e in raw)
    t0 = min((e["ts"] for e in raw), default=0.0)
    by_thread: dict[str, list[dict]] = {}
    for e in raw:
        kind = classify(e["name"], e.get("cat", ""))
        if kind is None or (kernels and kind == COMPUTE and e.get("cat") != "kernel"):
            continue
        by_thread.setdefault(f"{e['pid']}/{e['tid']}", []).append({**e, "kind": kind})
    # gloo's worker threads: collectives and no step (the Python thread, which runs the steps,
    # may run a blocking send/recv itself: its compute counts)
    kinds = {t: {e["kind"] for e in evs} for t, evs in by_thread.items()}
    comm_threads = {t for t, k in kinds.items() if COMM in k and STEP not in k}
    out = []
    for t, evs in by_thread.items():
        label = _thread_label(t, by_thread, comm_threads)
        steps = [e for e in evs if e["kind"] == STEP]
        comm = _top_level([e for e in evs if e["kind"] == COMM])
        comp = [] if t in comm_threads and not kernels else [
            e for e in evs if e["kind"] == COMPUTE]
        for e in steps + comm + _top_level(comp):
            out.append(Event(rank, label, e["name"], e["ts"] - t0, e["ts"] - t0 + e["dur"],
                             e["kind"]))
    return sorted(out, key=lambda e: (e.start, e.thread))


@dataclass(frozen=True)
class RankTimes:
    """What :func:`analyze` finds on one rank, in microseconds over the recorded steps."""

    rank: int
    steps: int
    step_us: float
    compute_us: float
    comm_us: float
    exposed_us: float

    @property
    def hidden_fraction(self) -> float:
        """Share of the communication time that compute overlapped (1: all hidden)."""
        return 1 - self.exposed_us / self.comm_us if self.comm_us else 1.0


def analyze(events: list[Event]) -> dict[int, RankTimes]:
    """Per rank: recorded steps, their total span, compute, communication, exposed
    communication (``comm - overlap``; so ``0 <= exposed <= comm``)."""
    out = {}
    for r in sorted({e.rank for e in events}):
        mine = [e for e in events if e.rank == r]
        comp = [(e.start, e.end) for e in mine if e.kind == COMPUTE]
        comm = [(e.start, e.end) for e in mine if e.kind == COMM]
        steps = [(e.start, e.end) for e in mine if e.kind == STEP]
        out[r] = RankTimes(r, len(steps), length(steps), length(comp), length(comm),
                           length(subtract(comm, comp)))
    return out


def _phase(name: str) -> str:
    if name.startswith("autograd::"):
        return "backward"
    return "optimizer" if name.startswith("Optimizer.") else "forward"


def compact(events: list[Event], gap_us: float = 200.0) -> list[Event]:
    """The ops that matter, a few hundred at most: every step and communication event as it
    is, and each thread's compute merged into blocks named ``forward`` / ``backward`` /
    ``optimizer`` wherever two ops of the same phase are less than ``gap_us`` apart (the
    merged blocks cover the gaps, so :func:`analyze` of the compact list finds slightly more
    compute and less exposed communication than of the full one)."""
    out = [e for e in events if e.kind != COMPUTE]
    for t in sorted({e.thread for e in events}):
        cur: list | None = None
        for e in sorted((e for e in events if e.thread == t and e.kind == COMPUTE),
                        key=lambda e: e.start):
            ph = _phase(e.name)
            if cur and cur[2] == ph and e.start - cur[1] < gap_us:
                cur[1] = max(cur[1], e.end)
                continue
            if cur:
                out.append(Event(cur[3], t, cur[2], cur[0], cur[1], COMPUTE))
            cur = [e.start, e.end, ph, e.rank]
        if cur:
            out.append(Event(cur[3], t, cur[2], cur[0], cur[1], COMPUTE))
    return sorted(out, key=lambda e: (e.rank, e.start, e.thread))


def timeline_record(traces: list, meta: dict, gap_us: float = 200.0) -> dict:
    """The JSON-able record of one layout's run: ``meta`` (layout, machine, date, torch ...),
    the per-rank times of the *full* traces, and their compact events (one rank's clock per
    rank: each starts at its own first event)."""
    full = [load_events(t) for t in traces]
    events = [e for evs in full for e in compact(evs, gap_us)]
    times = {r: {k: round(v, 1) for k, v in asdict(t).items()}
             for evs in full for r, t in analyze(evs).items()}
    rows = [{**asdict(e), "start": round(e.start, 1), "end": round(e.end, 1)} for e in events]
    return {**meta, "gap_us": gap_us, "ranks": [times[r] for r in sorted(times)], "events": rows}


__all__ = ["COMM", "COMPUTE", "STEP", "Event", "RankTimes", "analyze", "classify", "compact",
           "length", "load_events", "subtract", "timeline_record", "union"]
