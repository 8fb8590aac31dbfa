"""The event-driven pipeline simulator of :mod:`.pipeline` (re-exported there: use
``accounting.pipeline.simulate``).

Every rank executes its action list in order; an action starts when the rank is free and its
dependencies have finished (+ ``comm`` if on another rank): F on virtual stage k after F on
k-1; B/BI on k after B/BI on k+1 and F on k; BW after BI on the same stage. Virtual stages
are placed by the schedule's ``placement`` (:func:`.pipeline.virtual_stage`: a loop, or a V
for zbv and dualpipev). ``costs`` are per microbatch for a whole rank's layers; a chunk
action costs ``cost / v``. In-flight microbatches of a rank count ``(microbatch, chunk)``
pairs between the start of F and the end of B (or BW). Nothing is sent: no bytes here.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import _validate as chk
from .pipeline_actions import ACTION_KINDS, Action, _costs, virtual_stage


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
    defaults), e.g. the per-action times measured on each rank of a real run. The chunks'
    placement is ``sched.placement`` for a :class:`Schedule`, ``"loop"`` for a plain list.
    """
    p = chk.positive_int("p", p)
    per_rank = _per_rank_costs(costs, stage_costs, p)
    delay = chk.nonneg_number("comm", comm)
    nchunks = _check_schedule(sched, p)
    place = getattr(sched, "placement", "loop")
    done: dict[tuple[str, int, int], tuple[float, int]] = {}  # (kind, mb, vstage) -> (t, rank)

    def ready_time(r: int, a: Action) -> float | None:
        return _ready_time(done, p, nchunks, delay, r, a, place)

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
                _finish(done, p, r, a, end, place)
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


def _ready_time(
    done, p: int, nchunks: int, delay: float, r: int, a: Action, place: str = "loop"
) -> float | None:
    """When ``a`` on rank ``r`` may start given the finished actions ``done`` (None: not yet)."""
    k, last = virtual_stage(r, a.chunk, p, place), p * nchunks - 1
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


def _finish(done, p: int, r: int, a: Action, end: float, place: str = "loop") -> None:
    k = virtual_stage(r, a.chunk, p, place)
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
