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
``zbv``          ZB-V, ``v = 2`` chunks in a V (:mod:`.pipeline_v`: PyTorch's
                 ``ScheduleZBVZeroBubble`` order); any ``m``.
``dualpipev``    DualPipe-V, ``v = 2`` chunks in a V (:mod:`.pipeline_v`: PyTorch's
                 ``ScheduleDualPipeV`` order, its overlapped F/B pairs as F then B); ``m >= 2p``.

Placement (:func:`placement`, :func:`virtual_stage`, :func:`stage_rank`): ``"loop"`` puts
virtual stage ``c p + r`` on rank ``r`` as chunk ``c``; ``"v"`` (zbv, dualpipev) puts stages
``r`` and ``2p-1-r`` on rank ``r``. :func:`schedule` returns a :class:`Schedule` (a list of
per-rank lists) that carries its placement, which :func:`simulate` reads. The V kinds have no
closed form here (:func:`bubble_time` refuses them): their bubble is the simulator's.

Simulator (:func:`simulate`, in :mod:`.pipeline_sim`): every rank executes its list in
order; an action starts when the rank is free and its dependencies have finished (+ ``comm``
if on another rank): F on virtual stage k after F on k-1; B/BI on k after B/BI on k+1 and F
on k; BW after BI on the same stage (a dependency on the same rank, e.g. stages p-1 and p of
a V, pays no ``comm``). ``costs`` are per microbatch for a whole rank's layers; a chunk
action costs ``cost / v``. In-flight microbatches of a rank count ``(microbatch, chunk)``
pairs between the start of F and the end of B (or BW). ``stage_costs`` (one dict per rank)
replaces ``costs`` rank by rank, for unbalanced stages or costs measured on each rank.

Point-to-point bytes per rank (:func:`p2p_sent_bytes`, in :mod:`.pipeline_bytes` with
:func:`inflight_bytes`; both re-exported here): each virtual stage sends its
``b s h`` output forward unless it is the last and its input gradient backward unless it is
the first, ``q`` bytes per element, per microbatch, whenever the neighbouring stage lives on
another rank. Interior ranks send ``comm.pipeline_p2p_volume``; with ``v = 1`` the first and
last send half; in a V ranks 0 and p-1 send half too (rank 0 holds both ends of the model,
rank p-1 keeps the p-1 -> p boundary).

Pipeline configuration (:func:`check_kind`, :func:`check_pipeline`): the sentence a bad
``(kind, p, m, v, n_layer)`` gets before any rank starts or any schedule is built;
:func:`stage_bounds` cuts ``n_layer`` layers into ``p v`` contiguous virtual stages;
:func:`inflight_bytes` is the peak of saved activations of one rank's action list, given the
bytes one microbatch leaves on each chunk.
"""

from __future__ import annotations

from . import _validate as chk
from .pipeline_actions import (  # noqa: F401  (re-exported: the schedule vocabulary)
    ACTION_KINDS,
    DEFAULT_COSTS,
    PLACEMENTS,
    Action,
    _costs,
    _pmv,
    stage_rank,
    virtual_stage,
)
from .pipeline_bytes import inflight_bytes, p2p_sent_bytes  # noqa: F401  (re-exported)
from .pipeline_sim import SimResult, simulate  # noqa: F401  (re-exported)

V_KINDS = ("zbv", "dualpipev")  # two chunks per rank, placed in a V
KINDS = ("gpipe", "1f1b", "interleaved", "zb-h1", *V_KINDS)


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
    if kind in V_KINDS:
        raise ValueError(f"kind={kind!r} has no closed-form bubble here; use simulate()")
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
    return _bubble(p, c["F"], c["B"], vv if kind == "interleaved" else 1)


def _bubble(p: int, f: float, b: float, v: int) -> float:
    # the gpipe / 1f1b / interleaved closed form without bubble_time's checks, for the
    # planner's search (tens of thousands of calls on inputs it checked once)
    return (p - 1) * (f + b) / v


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
    if kind in V_KINDS:
        raise ValueError(f"kind={kind!r} has no closed-form idle fraction here; use simulate()")
    if kind != "zb-h1":
        return idle_fraction(p, m, v)
    c = _costs(costs)
    idle = bubble_time("zb-h1", p, c)
    return idle / (idle + m * (c["F"] + c["BI"] + c["BW"]))


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


def check_kind(kind: str, p: int, m: int, v: int = 1) -> tuple[str, int, int, int]:
    """The one check of a schedule's ``(kind, p, m, v)``, which :func:`schedule`,
    :func:`schedule_size`, :func:`check_pipeline`, the pipeline calculator and ``shardlab
    bubble`` all use: ``kind`` one of :data:`KINDS`, positive sizes, ``v > 1`` only for
    ``interleaved`` (no other kind is read as interleaved), ``m % p == 0`` for interleaved,
    ``v == 2`` for the V kinds and ``m >= 2p`` for dualpipev.
    Returns the checked values; a ``ValueError`` names them otherwise."""
    kind = chk.choice("kind", kind, KINDS)
    p, m, vv = _pmv(p, m, v)
    if kind in V_KINDS:
        if vv != 2:
            raise ValueError(
                f"kind={kind!r} places 2 chunks per rank in a V (stages r and 2p-1-r): "
                f"needs v=2, got v={vv}"
            )
        if kind == "dualpipev" and m < 2 * p:
            raise ValueError(f"dualpipev needs m >= 2p microbatches, got m={m}, p={p}")
        return kind, p, m, vv
    if kind != "interleaved" and vv != 1:
        raise ValueError(f"v={vv} chunks need kind='interleaved', not kind={kind!r}")
    if kind == "interleaved" and m % p:
        raise ValueError(f"interleaved schedule needs m % p == 0, got m={m}, p={p}")
    return kind, p, m, vv


def schedule_size(kind: str, p: int, m: int, v: int = 1) -> int:
    """Number of actions ``schedule(kind, p, m, v)`` returns over all ranks, without building it.

    Every rank runs a forward and a backward of each of its ``v`` chunks for each of the ``m``
    microbatches; zero bubble splits the backward in two (``BI`` and ``BW``):
    ``p * m * v * (3 if kind in ("zb-h1", "zbv") else 2)``, plus one ``BW`` per backward
    DualPipe-V splits (``pipeline_v.dualpipev_splits``). Callers use it to bound simulated work.
    """
    kind, p, m, vv = check_kind(kind, p, m, v)
    if kind == "dualpipev":
        from .pipeline_v import dualpipev_splits

        return 2 * p * m * vv + sum(dualpipev_splits(r, p) for r in range(p))
    return p * m * vv * (3 if kind in ("zb-h1", "zbv") else 2)


class Schedule(list):
    """Per-rank action lists (a ``list`` of lists) that know where their chunks live:
    ``placement`` is ``"loop"`` or ``"v"`` (see :func:`virtual_stage`)."""

    def __init__(self, ranks, placement: str = "loop") -> None:
        super().__init__(ranks)
        self.placement = chk.choice("placement", placement, PLACEMENTS)


def placement(kind: str) -> str:
    """Where ``kind`` puts the chunks: ``"v"`` for :data:`V_KINDS`, else ``"loop"``."""
    return "v" if chk.choice("kind", kind, KINDS) in V_KINDS else "loop"


def schedule(kind: str, p: int, m: int, v: int = 1) -> Schedule:
    """Per-rank ordered actions of ``kind`` for ``p`` stages and ``m`` microbatches."""
    kind, p, m, vv = check_kind(kind, p, m, v)
    if kind == "gpipe":
        return Schedule([[Action(k, i) for k in ("F", "B") for i in range(m)] for _ in range(p)])
    if kind in ("1f1b", "zb-h1"):
        return Schedule([_one_f_one_b(r, p, m, split=kind == "zb-h1") for r in range(p)])
    if kind in V_KINDS:
        from .pipeline_v import dualpipev_rank, zbv_rank

        gen = zbv_rank if kind == "zbv" else dualpipev_rank
        return Schedule([gen(r, p, m) for r in range(p)], "v")
    return Schedule([_interleaved(r, p, m, vv) for r in range(p)])


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
    check_kind(kind, p, m, v)  # kind, p, m, v and m % p for interleaved
    if n_layer is not None:
        stage_bounds(n_layer, p, v)


__all__ = [
    "ACTION_KINDS", "DEFAULT_COSTS", "KINDS", "PLACEMENTS", "V_KINDS", "Action", "Schedule",
    "SimResult", "bubble_ratio", "bubble_time", "check_kind", "check_pipeline",
    "idle_fraction", "inflight_bytes", "p2p_sent_bytes", "placement", "schedule",
    "schedule_idle_fraction", "schedule_size", "simulate", "stage_bounds", "stage_rank",
    "utilization", "virtual_stage",
]
