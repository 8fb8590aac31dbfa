"""Pipeline-parallel bubbles: closed forms, schedule generator, event-driven simulator.

Closed forms (lecture 8, "Pipeline scheduling needs both a batch and a backward plan";
Narayanan et al., *Megatron-LM*, 2021, Sec. 2.2) for ``p`` balanced stages, ``m``
microbatches, ``v`` interleaved model chunks per rank, negligible communication::

    bubble / useful  = (p-1) / (v m)                   (:func:`bubble_ratio`)
    idle fraction    = (p-1) / (v m + p - 1)           (:func:`idle_fraction`)
    utilization      = 1 - idle fraction               (:func:`utilization`)

(:func:`schedule_idle_fraction` gives the idle share of any of the four schedules, ZB-H1's
from its own bubble time below.)

p=4, m=8: 37.5 %, 3/11 = 27.3 %, 8/11 = 72.7 %. Zero bubble (Qi et al., *Zero Bubble
Pipeline Parallelism*, ICLR 2024): backward splits into ``BI`` (input gradient, needed
upstream) and ``BW`` (weight gradient, deferrable). Per-stage bubble time
(:func:`bubble_time`): 1F1B ``(p-1)(F+B)``; interleaved ``(p-1)(F+B)/v``; ZB-H1
``(p-1) max(F, F+BI-BW)``: the paper's ``(p-1)(F+BI-BW)`` (assumes ``BW <= F+BI`` and
``m >= p``), floored at the fill time ``(p-1)F`` that no schedule can avoid; a third of
1F1B's when F = BI = BW.

Schedules (:func:`schedule`) return one ordered list of :class:`Action` per rank:

``gpipe``        all m forwards, then all m backwards (fill-drain; holds m in flight).
``1f1b``         PipeDream-flush: rank r runs ``min(p-r-1, m)`` warm-up forwards, then
                 alternates F and B, then drains the remaining B (<= p in flight).
``interleaved``  Megatron interleaved 1F1B: rank r owns chunks ``c = 0..v-1``, i.e.
                 virtual stages ``c p + r``; microbatches go in groups of p per chunk; warm-up
                 ``(p-r-1) 2 + (v-1) p`` forwards; requires ``m % p == 0``.
``zb-h1``        1F1B with B split into BI and BW; rank r lags its BW by r microbatches so
                 the deferred BW fill the drain bubble, while in-flight microbatches
                 (F started, BW not finished) stay at p, as in 1F1B.

Simulator (:func:`simulate`): every rank executes its list in order; an action starts when
the rank is free and its dependencies have finished (+ ``comm`` if on another rank):
F on virtual stage k after F on k-1; B/BI on k after B/BI on k+1 and F on k; BW after BI
on the same stage. ``costs`` are per microbatch for a whole rank's layers; a chunk action
costs ``cost / v``. In-flight microbatches of a rank count ``(microbatch, chunk)`` pairs
between the start of F and the end of B (or BW). ``stage_costs`` (one dict per rank)
replaces ``costs`` rank by rank, for unbalanced stages or costs measured on each rank.

Point-to-point bytes per rank (:func:`p2p_sent_bytes`): rank ``r`` owns virtual stages
``c p + r``; each sends its ``b s h`` output forward unless it is the last virtual stage and
its input gradient backward unless it is the first, ``q`` bytes per element, per microbatch.
Interior ranks send ``comm.pipeline_p2p_volume``; with ``v = 1`` the first and last send half.

Pipeline configuration (:func:`check_pipeline`): the sentence a bad ``(kind, p, m, v,
n_layer)`` gets before any rank starts; :func:`stage_bounds` cuts ``n_layer`` layers into
``p v`` contiguous virtual stages; :func:`inflight_bytes` is the peak of saved activations
of one rank's action list, given the bytes one microbatch leaves on each chunk.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import _validate as chk

KINDS = ("gpipe", "1f1b", "interleaved", "zb-h1")
ACTION_KINDS = ("F", "B", "BI", "BW")
DEFAULT_COSTS = {"F": 1.0, "B": 2.0, "BI": 1.0, "BW": 1.0}


def _pmv(p, m, vv=1):
    return chk.positive_int("p", p), chk.positive_int("m", m), chk.positive_int("v", vv)


def bubble_ratio(p: int, m: int, v: int = 1) -> float:
    """Bubble time over useful time: ``(p-1) / (v m)``."""
    p, m, vv = _pmv(p, m, v)
    return (p - 1) / (vv * m)


def idle_fraction(p: int, m: int, v: int = 1) -> float:
    """Idle share of the step: ``(p-1) / (v m + p - 1)``."""
    p, m, vv = _pmv(p, m, v)
    return (p - 1) / (vv * m + p - 1)


def utilization(p: int, m: int, v: int = 1) -> float:
    """Useful share of the step: ``v m / (v m + p - 1)``."""
    return 1.0 - idle_fraction(p, m, v)


def bubble_time(kind: str, p: int, costs: dict[str, float] | None = None, v: int = 1) -> float:
    """Per-rank idle time of ``kind`` from the closed forms in the module docstring.

    ``costs`` are per microbatch for a whole rank (``B`` for gpipe/1f1b/interleaved,
    ``BI`` and ``BW`` for zb-h1); defaults ``F=1, B=2, BI=1, BW=1``.
    """
    kind = chk.choice("kind", kind, KINDS)
    p = chk.positive_int("p", p)
    vv = chk.positive_int("v", v)
    c = _costs(costs)
    if kind == "zb-h1":
        # Qi et al.'s bound assumes every deferred BW fits into a bubble of length F + BI.
        # The fixed-lag order of schedule("zb-h1") reaches it when F == BI == BW; for other
        # costs simulate() reports what that order achieves, which can be more.
        if c["BW"] > c["F"] + c["BI"]:
            raise ValueError(
                f"the ZB-H1 closed form needs BW <= F + BI, got BW={c['BW']:g} > "
                f"F + BI = {c['F']:g} + {c['BI']:g}; use simulate() for these costs"
            )
        # ...and can never beat the fill: the last stage waits (p-1) forwards before its first
        # action, and with balanced stages every stage idles at least that long.
        return (p - 1) * max(c["F"], c["F"] + c["BI"] - c["BW"])
    return (p - 1) * (c["F"] + c["B"]) / (vv if kind == "interleaved" else 1)


def schedule_idle_fraction(
    kind: str, p: int, m: int, v: int = 1, costs: dict[str, float] | None = None
) -> float:
    """Idle share of a step of ``kind`` on balanced stages, from the closed forms.

    gpipe, 1f1b, interleaved: ``(p-1) / (v m + p - 1)`` whatever the costs (each rank idles
    ``(p-1)(F+B)/v`` next to ``m (F+B)`` of work). zb-h1: :func:`bubble_time` over bubble plus
    work, ``(p-1) max(F, F+BI-BW) / ((p-1) max(F, F+BI-BW) + m (F+BI+BW))``; with
    ``F = BI = BW`` that is ``(p-1) / (p - 1 + 3 m)``. ``costs`` as in :func:`bubble_time`.
    """
    check_pipeline(kind, p, m, v)  # kind, sizes, v > 1 only interleaved, m % p for interleaved
    if kind != "zb-h1":
        return idle_fraction(p, m, v)
    c = _costs(costs)
    idle = bubble_time("zb-h1", p, c)
    return idle / (idle + m * (c["F"] + c["BI"] + c["BW"]))


@dataclass(frozen=True, order=True)
class Action:
    """One unit of work on a rank: ``kind`` of ``microbatch`` on model ``chunk``."""

    kind: str
    microbatch: int
    chunk: int = 0

    def __post_init__(self) -> None:
        chk.choice("kind", self.kind, ACTION_KINDS)
        chk.nonneg_int("microbatch", self.microbatch)
        chk.nonneg_int("chunk", self.chunk)

    def __str__(self) -> str:
        return f"{self.kind}{self.microbatch}" + (f".{self.chunk}" if self.chunk else "")


def _one_f_one_b(r: int, p: int, m: int, split: bool) -> list[Action]:
    """1F1B on rank r; with ``split`` (ZB-H1) B becomes BI and BW trails BI by r microbatches."""
    warm = min(p - r - 1, m)
    lag = r if split else 0
    pending_w: list[int] = []

    def backward(i: int) -> list[Action]:
        if not split:
            return [Action("B", i)]
        pending_w.append(i)
        # a deferred BW keeps microbatch i's activations alive: lag r keeps r + (p-r) = p
        return [Action("BI", i)] + (
            [Action("BW", pending_w.pop(0))] if len(pending_w) > lag else []
        )

    out = [Action("F", i) for i in range(warm)]  # warm-up: fill the pipe
    for i in range(m - warm):  # steady state: one forward, one backward
        out += [Action("F", warm + i), *backward(i)]
    for i in range(m - warm, m):  # cool-down: drain the remaining backwards
        out += backward(i)
    return out + [Action("BW", i) for i in pending_w]  # deferred BW fill the drain bubble


def _interleaved(r: int, p: int, m: int, vv: int) -> list[Action]:
    total = m * vv

    def unit(k: int, forward: bool) -> tuple[int, int]:
        group, pos = divmod(k, p * vv)
        chunk = pos // p
        return group * p + pos % p, chunk if forward else vv - 1 - chunk

    warm = min((p - r - 1) * 2 + (vv - 1) * p, total)
    out = [Action("F", *unit(k, True)) for k in range(warm)]
    for k in range(total - warm):
        out.append(Action("F", *unit(warm + k, True)))
        out.append(Action("B", *unit(k, False)))
    out.extend(Action("B", *unit(k, False)) for k in range(total - warm, total))
    return out


def _check_kind(kind: str, p: int, m: int, v: int) -> tuple[str, int, int, int]:
    kind = chk.choice("kind", kind, KINDS)
    p, m, vv = _pmv(p, m, v)
    if kind != "interleaved" and vv != 1:
        raise ValueError(f"v={vv} chunks need kind='interleaved', not kind={kind!r}")
    if kind == "interleaved" and m % p:
        raise ValueError(f"interleaved schedule needs m % p == 0, got m={m}, p={p}")
    return kind, p, m, vv


def schedule_size(kind: str, p: int, m: int, v: int = 1) -> int:
    """Number of actions ``schedule(kind, p, m, v)`` returns over all ranks, without building it.

    Every rank runs a forward and a backward of each of its ``v`` chunks for each of the ``m``
    microbatches; zero bubble splits the backward in two (``BI`` and ``BW``):
    ``p * m * v * (3 if kind == "zb-h1" else 2)``. Callers use it to bound simulated work.
    """
    kind, p, m, vv = _check_kind(kind, p, m, v)
    return p * m * vv * (3 if kind == "zb-h1" else 2)


def schedule(kind: str, p: int, m: int, v: int = 1) -> list[list[Action]]:
    """Per-rank ordered actions of ``kind`` for ``p`` stages and ``m`` microbatches."""
    kind, p, m, vv = _check_kind(kind, p, m, v)
    if kind == "gpipe":
        return [[Action(k, i) for k in ("F", "B") for i in range(m)] for _ in range(p)]
    if kind in ("1f1b", "zb-h1"):
        return [_one_f_one_b(r, p, m, split=kind == "zb-h1") for r in range(p)]
    return [_interleaved(r, p, m, vv) for r in range(p)]


@dataclass(frozen=True)
class SimResult:
    makespan: float
    idle_per_stage: tuple[float, ...]
    busy_per_stage: tuple[float, ...]
    bubble_fraction: float
    peak_inflight: tuple[int, ...]
    timeline: tuple[tuple[tuple[float, float, Action], ...], ...]  # per rank (start, end, a)

    @property
    def bubble_time(self) -> float:
        """Idle time summed over ranks."""
        return sum(self.idle_per_stage)

    def as_rows(self) -> list[dict[str, object]]:
        return [
            {"stage": r, "busy": b, "idle": i, "peak_inflight": k}
            for r, (b, i, k) in enumerate(
                zip(self.busy_per_stage, self.idle_per_stage, self.peak_inflight)
            )
        ]


def _costs(costs: dict[str, float] | None) -> dict[str, float]:
    c = dict(DEFAULT_COSTS)
    for k, x in (costs or {}).items():
        chk.choice("costs key", k, ACTION_KINDS)
        c[k] = chk.nonneg_number(f"costs[{k!r}]", x)
    return c


def _costs_only(costs: dict[str, float] | None, label: str) -> dict[str, float]:
    out = {}
    for k, x in (costs or {}).items():
        chk.choice(f"{label} key", k, ACTION_KINDS)
        out[k] = chk.nonneg_number(f"{label}[{k!r}]", x)
    return out


def _check_schedule(sched, p: int) -> int:
    if not isinstance(sched, (list, tuple)):
        raise ValueError(f"schedule={sched!r} must be a list with one action list per stage")
    if len(sched) != p:
        raise ValueError(f"schedule has {len(sched)} stages but p={p}")
    chunks = 1 + max((a.chunk for acts in sched for a in acts), default=0)
    for r, acts in enumerate(sched):
        seen: dict[tuple[str, int, int], int] = {}
        for a in acts:
            if not isinstance(a, Action):
                raise ValueError(f"stage {r} holds {a!r}, not an Action")
            key = (a.kind, a.microbatch, a.chunk)
            if key in seen:
                raise ValueError(f"stage {r} runs {a} twice")
            seen[key] = 1
        for kind, mb, c in seen:
            has_b = ("B", mb, c) in seen
            has_split = ("BI", mb, c) in seen and ("BW", mb, c) in seen
            if kind == "F" and has_b == has_split:
                raise ValueError(f"stage {r}: F{mb}.{c} needs exactly one of B or BI+BW")
            if kind != "F" and ("F", mb, c) not in seen:
                raise ValueError(f"stage {r}: {kind}{mb}.{c} has no forward")
    return chunks


def simulate(
    sched: list[list[Action]],
    p: int,
    costs: dict[str, float] | None = None,
    comm: float = 0.0,
    stage_costs: list[dict[str, float]] | None = None,
) -> SimResult:
    """Run ``sched`` event by event; see the module docstring for the dependency rules.

    ``stage_costs``: one cost dict per rank (missing keys fall back to ``costs``, then the
    defaults), e.g. the per-action times measured on each rank of a real run.
    """
    p = chk.positive_int("p", p)
    per_rank = _per_rank_costs(costs, stage_costs, p)
    delay = chk.nonneg_number("comm", comm)
    nchunks = _check_schedule(sched, p)
    done: dict[tuple[str, int, int], tuple[float, int]] = {}  # (kind, mb, vstage) -> (t, rank)

    def ready_time(r: int, a: Action) -> float | None:
        return _ready_time(done, p, nchunks, delay, r, a)

    pos = [0] * p
    free = [0.0] * p
    timeline: list[list[tuple[float, float, Action]]] = [[] for _ in range(p)]
    remaining = sum(len(s) for s in sched)
    while remaining:
        progressed = False
        for r in range(p):
            while pos[r] < len(sched[r]):
                a = sched[r][pos[r]]
                t = ready_time(r, a)
                if t is None:
                    break
                start = max(free[r], t)
                end = start + per_rank[r][a.kind] / nchunks
                free[r] = end
                timeline[r].append((start, end, a))
                _finish(done, p, r, a, end)
                pos[r] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            stuck = {r: str(sched[r][pos[r]]) for r in range(p) if pos[r] < len(sched[r])}
            raise ValueError(f"schedule deadlocks; waiting actions per stage: {stuck}")
    return _result(sched, timeline)


def _per_rank_costs(costs, stage_costs, p: int) -> list[dict[str, float]]:
    c = _costs(costs)
    if stage_costs is None:
        return [c] * p
    if not isinstance(stage_costs, (list, tuple)) or len(stage_costs) != p:
        raise ValueError(f"stage_costs={stage_costs!r} needs one cost dict per stage, p={p}")
    return [{**c, **_costs_only(sc, f"stage_costs[{r}]")} for r, sc in enumerate(stage_costs)]


def _ready_time(done, p: int, nchunks: int, delay: float, r: int, a: Action) -> float | None:
    """When ``a`` on rank ``r`` may start given the finished actions ``done`` (None: not yet)."""
    k, last = a.chunk * p + r, p * nchunks - 1
    deps: list[tuple[str, ...]] = []
    if a.kind == "F":
        deps = [("F", a.microbatch, k - 1)] if k else []
    elif a.kind in ("B", "BI"):
        deps = [("F", a.microbatch, k)] + ([("G", a.microbatch, k + 1)] if k < last else [])
    else:
        deps = [("G", a.microbatch, k)]
    t = 0.0
    for d in deps:
        if d not in done:
            return None
        end, rank = done[d]
        t = max(t, end + (delay if rank != r else 0.0))
    return t


def _finish(done, p: int, r: int, a: Action, end: float) -> None:
    k = a.chunk * p + r
    done[(a.kind, a.microbatch, k)] = (end, r)
    if a.kind in ("B", "BI"):  # the input gradient the stage below waits for
        done[("G", a.microbatch, k)] = (end, r)


def _result(sched, timeline) -> SimResult:
    """Makespan, idle and busy time per rank, and peak in-flight counts of a timeline."""
    p = len(sched)
    makespan = max((tl[-1][1] for tl in timeline if tl), default=0.0)
    busy = tuple(sum(e - s for s, e, _ in tl) for tl in timeline)
    idle = tuple(makespan - b for b in busy)
    peaks = []
    for acts in sched:
        split = {(a.microbatch, a.chunk) for a in acts if a.kind == "BW"}
        now = peak = 0
        for a in acts:
            if a.kind == "F":
                now += 1
                peak = max(peak, now)
            elif a.kind == "BW" or (a.kind in ("B", "BI") and (a.microbatch, a.chunk) not in split):
                now -= 1
        peaks.append(peak)
    frac = sum(idle) / (p * makespan) if makespan else 0.0
    return SimResult(makespan, idle, busy, frac, tuple(peaks), tuple(tuple(tl) for tl in timeline))


def p2p_sent_bytes(
    rank: int, p: int, b: int, s: int, h: int, q: float = 2, m: int = 1, v: int = 1
) -> float:
    """Bytes rank ``rank`` of ``p`` sends per step: one ``q b s h`` message forward per
    microbatch and virtual stage that is not the last, one backward per virtual stage that is
    not the first. Interior ranks send ``comm.pipeline_p2p_volume(b, s, h, q, m, v)``."""
    from .comm import pipeline_p2p_volume

    p, m, vv = _pmv(p, m, v)
    r = chk.nonneg_int("rank", rank)
    if r >= p:
        raise ValueError(f"rank={r} must be below p={p}")
    if p == 1:
        return 0.0
    per_message = pipeline_p2p_volume(b, s, h, q, microbatches=m) / (2 * m)  # q b s h
    # rank 0 owns virtual stage 0 (nothing to send backward), rank p-1 the last one
    edges = (r == 0) + (r == p - 1)
    return pipeline_p2p_volume(b, s, h, q, microbatches=m, chunks=vv) - edges * m * per_message


def stage_bounds(n_layer: int, p: int, v: int = 1) -> list[tuple[int, int]]:
    """``[lo, hi)`` layer ranges of the ``p v`` contiguous, equal virtual stages."""
    n = chk.positive_int("n_layer", n_layer)
    p, _, vv = _pmv(p, 1, v)
    k = p * vv
    if k > n:
        raise ValueError(
            f"p*v = {p}*{vv} = {k} virtual stages need at least {k} layers, got n_layer={n}"
        )
    if n % k:
        raise ValueError(f"n_layer={n} layers do not divide into p*v = {p}*{vv} = {k} equal stages")
    size = n // k
    return [(i * size, (i + 1) * size) for i in range(k)]


def check_pipeline(kind: str, p: int, m: int, v: int = 1, n_layer: int | None = None) -> None:
    """Raise a ``ValueError`` naming the values when ``(kind, p, m, v, n_layer)`` cannot run:
    unknown kind, ``v > 1`` outside interleaved, ``m % p`` for interleaved, more virtual
    stages than layers or layers that do not divide into them."""
    schedule(kind, p, m, v)  # validates kind, p, m, v and m % p for interleaved
    if n_layer is not None:
        stage_bounds(n_layer, p, v)


def inflight_bytes(actions: list[Action], chunk_bytes: list[float]) -> float:
    """Peak saved-activation bytes of one rank running ``actions``: a ``(microbatch, chunk)``
    holds ``chunk_bytes[chunk]`` from the start of its F to the end of its B (or BW, when
    the list splits the backward). For ``v = 1`` this is ``chunk_bytes[0]`` times
    ``simulate(...).peak_inflight`` of the rank."""
    sizes = [chk.nonneg_number(f"chunk_bytes[{i}]", x) for i, x in enumerate(chunk_bytes)]
    split = {(a.microbatch, a.chunk) for a in actions if a.kind == "BW"}
    now = peak = 0.0
    for a in actions:
        if not isinstance(a, Action):
            raise ValueError(f"actions holds {a!r}, not an Action")
        if a.chunk >= len(sizes):
            raise ValueError(f"{a} runs chunk {a.chunk} but chunk_bytes has {len(sizes)} entries")
        if a.kind == "F":
            now += sizes[a.chunk]
            peak = max(peak, now)
        elif a.kind == "BW" or (a.kind in ("B", "BI") and (a.microbatch, a.chunk) not in split):
            now -= sizes[a.chunk]
    return peak
