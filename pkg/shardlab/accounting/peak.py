"""Predicted per-rank peak memory of one training step, term by term.

Lecture 8: ``M_peak = max_tau (M_model + M_act + M_workspace + M_buffers)(tau)``; the peak
depends on which allocations coexist, so we walk the step unit by unit instead of adding
separate maxima. FSDP lifecycle and prefetching: Zhao et al., *PyTorch FSDP*, 2023, Sec. 3-4.

The step is a sequence of ``n`` FSDP units (index 0 runs first in forward): forward over
units ``0..n-1``, then backward over ``n-1..0``. At each moment the predicted bytes are the
sum of these **terms** (exactly what each counts):

``persistent``       bytes given by the caller; normally :func:`.memory.model_state` total
                     (working weights or their shard, gradients or their shard, master,
                     moments, accumulation buffer). Constant over the step.
``gathered_params``  full (all-gathered) parameter buffers of the units alive now; each is
                     ``unit_bytes[i]``, the *whole* unit, not the missing part.
                     Forward at unit ``i``: with reshard-after-forward units
                     ``i..i+prefetch``; without it ``0..i+prefetch`` (gathered units stay).
                     Backward at unit ``i``: with reshard units ``i-prefetch..i``; without
                     it ``0..i`` (still gathered from forward; freed after their backward).
``unsharded_grads``  ``grad_unit_bytes[i]`` of the unit in backward: its full gradient
                     before the reduce-scatter (0 if not given).
``activations``      saved activations alive: forward at ``i`` holds units ``0..i``;
                     backward at ``i`` still holds ``0..i`` (unit i's are freed after its
                     backward). A scalar ``activation_bytes`` is split evenly over units.
``buffers``          caller-stated extra bytes alive all step (communication buckets,
                     workspace, allocator headroom), constant.

Not modelled: temporaries inside a unit's compute, the logits/loss, allocator
fragmentation. ``total`` is the largest moment; ``phase_of_peak``/``unit_of_peak`` say
when (earliest on ties). With no units (DDP, ZeRO-1/2) there is one moment: persistent +
all activations + buffers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from . import _validate as v
from .memory import Recipe, get_recipe, model_state

TERMS = ("persistent", "gathered_params", "unsharded_grads", "activations", "buffers")
PHASES = ("forward", "backward")


@dataclass(frozen=True)
class PeakPoint:
    """Predicted bytes at one moment: ``phase`` while unit ``unit`` computes."""

    phase: str
    unit: int | None
    terms: dict[str, float]
    alive_units: tuple[int, ...]

    @property
    def total(self) -> float:
        return sum(self.terms.values())


@dataclass(frozen=True)
class PeakBreakdown:
    """The peak moment's terms, its total, when it happens, and the whole timeline."""

    terms: dict[str, float]
    total: float
    phase_of_peak: str
    unit_of_peak: int | None
    timeline: tuple[PeakPoint, ...]

    def as_rows(self) -> list[dict[str, object]]:
        rows: list[dict[str, object]] = [
            {"term": k, "bytes": b, "GiB": b / 2**30} for k, b in self.terms.items()
        ]
        rows.append({"term": "total", "bytes": self.total, "GiB": self.total / 2**30})
        return rows


def _prefetch(prefetch: bool | int) -> int:
    if isinstance(prefetch, bool):
        return int(prefetch)
    return v.nonneg_int("prefetch", prefetch)


def _alive(phase: str, i: int, n: int, prefetch: int, reshard: bool) -> tuple[int, ...]:
    if phase == "forward":
        lo = i if reshard else 0
        return tuple(range(lo, min(n, i + prefetch + 1)))
    lo = max(0, i - prefetch) if reshard else 0
    return tuple(range(lo, i + 1))


def fsdp_gathered_units_alive(
    prefetch: bool | int, reshard_after_forward: bool, n_units: int, phase: str
) -> int:
    """Most gathered units alive at once in ``phase`` ("forward" or "backward").

    With reshard-after-forward: ``min(1 + prefetch, n)`` in both phases; without: all ``n``
    (forward ends holding every unit; backward starts with every unit still gathered).
    """
    p = _prefetch(prefetch)
    reshard = v.flag("reshard_after_forward", reshard_after_forward)
    n = v.positive_int("n_units", n_units)
    ph = v.choice("phase", phase, PHASES)
    return max(len(_alive(ph, i, n, p, reshard)) for i in range(n))


def _per_unit(name: str, value, n: int) -> list[float]:
    if isinstance(value, Sequence) and not isinstance(value, str):
        if len(value) != n:
            raise ValueError(f"{name} has {len(value)} entries but there are n_units={n}")
        return [v.nonneg_number(f"{name}[{i}]", x) for i, x in enumerate(value)]
    total = v.nonneg_number(name, value)
    return [total / n] * n


def predict_peak(
    persistent_bytes: float,
    unit_bytes: Sequence[float],
    activation_bytes: float | Sequence[float],
    buffer_bytes: float = 0,
    prefetch: bool | int = 0,
    reshard_after_forward: bool = True,
    grad_unit_bytes: float | Sequence[float] | None = None,
) -> PeakBreakdown:
    """Predicted per-rank peak of one step (see module docstring for every term).

    ``unit_bytes``: full gathered size of each FSDP unit in execution order (``[]`` for
    layouts that gather nothing). ``activation_bytes``: total saved activations, or one
    value per unit. ``prefetch``: units gathered ahead of the current one (``True`` = 1).
    ``grad_unit_bytes``: unsharded gradient of each unit during its backward (a scalar is a
    total split evenly, like ``activation_bytes``); ``None`` means 0.
    """
    persistent = v.nonneg_number("persistent_bytes", persistent_bytes)
    buffers = v.nonneg_number("buffer_bytes", buffer_bytes)
    p = _prefetch(prefetch)
    reshard = v.flag("reshard_after_forward", reshard_after_forward)
    if isinstance(unit_bytes, str) or not isinstance(unit_bytes, Sequence):
        raise ValueError(f"unit_bytes={unit_bytes!r} must be a list of bytes per unit")
    units = [v.nonneg_number(f"unit_bytes[{i}]", x) for i, x in enumerate(unit_bytes)]
    n = len(units)
    base = {"persistent": persistent, "buffers": buffers}
    if n == 0:
        if isinstance(activation_bytes, Sequence) and not isinstance(activation_bytes, str):
            raise ValueError("activation_bytes must be one number when unit_bytes is empty")
        act = v.nonneg_number("activation_bytes", activation_bytes)
        terms = {**base, "gathered_params": 0.0, "unsharded_grads": 0.0, "activations": act}
        terms = {k: terms[k] for k in TERMS}
        point = PeakPoint("forward", None, terms, ())
        return PeakBreakdown(terms, point.total, "forward", None, (point,))
    acts = _per_unit("activation_bytes", activation_bytes, n)
    grads = (
        [0.0] * n if grad_unit_bytes is None else _per_unit("grad_unit_bytes", grad_unit_bytes, n)
    )
    timeline = []
    for phase, order in (("forward", range(n)), ("backward", range(n - 1, -1, -1))):
        for i in order:
            alive = _alive(phase, i, n, p, reshard)
            terms = {
                "persistent": persistent,
                "gathered_params": float(sum(units[j] for j in alive)),
                "unsharded_grads": grads[i] if phase == "backward" else 0.0,
                "activations": float(sum(acts[: i + 1])),
                "buffers": buffers,
            }
            timeline.append(PeakPoint(phase, i, terms, alive))
    best = max(timeline, key=lambda pt: pt.total)  # max() keeps the earliest on ties
    return PeakBreakdown(dict(best.terms), best.total, best.phase, best.unit, tuple(timeline))


def predict_layout_peak(
    n_params: int,
    dp: int,
    layout: str,
    recipe: str | Recipe = "mixed-adam-16",
    activation_bytes: float = 0,
    buffer_bytes: float = 0,
    n_units: int = 1,
    prefetch: bool | int = 0,
    reshard_after_forward: bool = True,
) -> PeakBreakdown:
    """Peak for a DDP/ZeRO layout with ``n_units`` equal FSDP units (ZeRO-3 only).

    ``persistent`` = :func:`.memory.model_state` total. For ``zero3`` each unit gathers
    ``N * weights / n_units`` bytes and, in its backward, holds an unsharded gradient of
    ``N * grads / n_units`` bytes. Other layouts gather nothing; their full gradients are
    already in ``persistent`` (ZeRO-2's transient buckets belong in ``buffer_bytes``).
    """
    state = model_state(n_params, dp, layout, recipe)
    rec = get_recipe(recipe)
    k = v.positive_int("n_units", n_units)
    if layout != "zero3":
        return predict_peak(state.total, [], activation_bytes, buffer_bytes)
    if k > state.n_params:
        raise ValueError(f"n_units={k} exceeds n_params={state.n_params}")
    unit = [state.n_params * rec.weights / k] * k
    grad = [state.n_params * rec.grads / k] * k
    return predict_peak(
        state.total, unit, activation_bytes, buffer_bytes, prefetch, reshard_after_forward, grad
    )
