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
                     ``head_activation_bytes`` (default 0): tensors saved by a *head* that
                     runs after the last unit's forward and whose backward runs before the
                     last unit's backward (final norm, logits, log-probabilities of an LM
                     whose head sits in an FSDP root unit). They exist only at the start
                     of backward: in the ``"before_units"`` moment (see
                     ``backward_workspace``), or, with ``"last_unit"``, in the last unit's
                     backward moment; with no units they add to the single moment.
``buffers``          caller-stated extra bytes alive all step (communication buckets,
                     workspace, allocator headroom), constant.

Four optional terms (present in ``terms`` only when the caller passes them, so callers
that do not see exactly the five terms above):

``recompute_scratch``  ``recompute_bytes[i]``: under activation checkpointing, the saved
                     activations unit ``i`` rebuilds when its backward reruns its forward.
                     They exist only during that unit's backward (the moment
                     ``("backward", i)``); forward keeps just the checkpoints (counted in
                     ``activations``), and no other moment holds any scratch.

``grad_shards``      ``grad_shard_bytes[i]``: unit ``i``'s *gradient shard*, the output of its
                     reduce-scatter. Use it when the shards are **not** in ``persistent``
                     (``optimizer.zero_grad(set_to_none=True)``, PyTorch's default, frees them
                     after every step): a shard then exists from the end of its unit's
                     backward to the optimizer step. Backward at unit ``i`` holds the shards
                     of units ``i+1..n-1`` (their backward is done), the ``"optimizer"``
                     moment holds all of them, forward none.
``backward_workspace``   transient gradients of activations alive at the *start of
                     backward*, while every saved activation still is. For a language model
                     trained with cross-entropy the largest such tensors are the gradient of
                     the log-probabilities and the gradient of the logits, both ``(b, s, V)``
                     and alive together: ``2 * b * s * V * q`` (:func:`logits_workspace`).
                     Where it goes (``backward_workspace_at``): ``"last_unit"`` (default)
                     adds it to the first backward moment, the last unit's backward, on top of
                     that unit's unsharded gradient; ``"before_units"`` gives it its own
                     moment ``("backward", None)`` before any unit's backward, which is when
                     it really lives when the loss and the head run outside the units (an
                     FSDP root unit): the logits' gradient is consumed before the first unit's
                     weight gradient exists. That moment holds every activation (the head's
                     too), the units still gathered from forward (all of them without
                     reshard-after-forward, none with it), no unit gradient and no gradient
                     shard; it exists when ``backward_workspace_bytes`` or
                     ``head_activation_bytes`` is given. With no units both placements mean
                     the single moment, whose phase then is ``"backward"``.
``optimizer_workspace``  temporaries of ``optimizer.step()``, in an extra moment
                     ``("optimizer", None)`` = persistent + buffers + this term (+ every
                     gradient shard, if given; activations are freed and units resharded by
                     then; the moment also exists when only ``grad_shard_bytes`` is given).
                     For PyTorch's Adam/AdamW (:func:`adam_workspace`): the *foreach*
                     implementation (CUDA default) allocates one temporary for every stepped
                     parameter at once (``sqrt(v)``, then divided and shifted in place):
                     ``q * n_stepped``; the *single-tensor* one (CPU default) allocates
                     ``sqrt(v)`` and ``sqrt(v) / bias_correction`` for one parameter at a
                     time: ``2 * q * largest_stepped_tensor``.

Not modelled: temporaries inside a unit's compute later in backward (activation gradients
smaller than the start-of-backward ones while activations are being freed), the early
release of activations saved outside the units unless given as ``head_activation_bytes``
(a root's head runs its backward first, so its saved tensors are gone before the last
unit's backward), partial gradients of a unit whose backward spans others (a root unit's
head gradients wait for its embedding gradients), an unsharded gradient kept alive while
its reduce-scatter is still in flight during the next unit's backward, the loss scalar and
optimizer step counters, allocator fragmentation. ``total`` is the largest moment;
``phase_of_peak``/``unit_of_peak`` say when (earliest on ties). With no units (DDP,
ZeRO-1/2) and no optional terms there is one moment: persistent + all activations +
buffers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from . import _validate as v
from .memory import Recipe, get_recipe, model_state

TERMS = ("persistent", "gathered_params", "unsharded_grads", "activations", "buffers")
WORKSPACE_TERMS = ("backward_workspace", "optimizer_workspace")  # optional, see docstring
OPTIONAL_TERMS = ("recompute_scratch", "grad_shards", *WORKSPACE_TERMS)  # only when given
PHASES = ("forward", "backward")
WORKSPACE_AT = ("last_unit", "before_units")  # where backward_workspace goes


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


def logits_workspace(batch: int, seq_len: int, vocab_size: int, bytes_per_elem: float = 4) -> float:
    """``backward_workspace`` of a cross-entropy language model: the gradients of the
    log-probabilities and of the logits, two ``(batch, seq_len, vocab_size)`` tensors alive
    together at the start of backward: ``2 * b * s * V * q`` bytes."""
    b = v.positive_int("batch", batch)
    s = v.positive_int("seq_len", seq_len)
    vocab = v.positive_int("vocab_size", vocab_size)
    q = v.nonneg_number("bytes_per_elem", bytes_per_elem)
    return 2.0 * b * s * vocab * q


def adam_workspace(
    numels: Sequence[int], bytes_per_elem: float = 4, foreach: bool = False
) -> float:
    """``optimizer_workspace`` of ``torch.optim.Adam``/``AdamW`` stepping tensors of
    ``numels`` elements (the ones *this rank* steps). ``foreach=True``: one temporary per
    tensor, all alive at once, ``q * sum(numels)``; ``foreach=False`` (single-tensor loop,
    PyTorch's default on CPU): two temporaries of one tensor, ``2 * q * max(numels)``."""
    if isinstance(numels, str) or not isinstance(numels, Sequence):
        raise ValueError(f"numels={numels!r} must be a list of element counts")
    ns = [v.nonneg_number(f"numels[{i}]", x) for i, x in enumerate(numels)]
    q = v.nonneg_number("bytes_per_elem", bytes_per_elem)
    foreach = v.flag("foreach", foreach)
    if not ns:
        return 0.0
    return float(q * sum(ns)) if foreach else 2.0 * q * max(ns)


def _total(name: str, value) -> float:
    if isinstance(value, Sequence) and not isinstance(value, str):
        return float(sum(v.nonneg_number(f"{name}[{i}]", x) for i, x in enumerate(value)))
    return v.nonneg_number(name, value)


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
    backward_workspace_bytes: float | None = None,
    optimizer_workspace_bytes: float | None = None,
    grad_shard_bytes: float | Sequence[float] | None = None,
    backward_workspace_at: str = "last_unit",
    head_activation_bytes: float = 0,
    recompute_bytes: float | Sequence[float] | None = None,
) -> PeakBreakdown:
    """Predicted per-rank peak of one step (see module docstring for every term).

    ``unit_bytes``: full gathered size of each FSDP unit in execution order (``[]`` for
    layouts that gather nothing). ``activation_bytes``: total saved activations, or one
    value per unit. ``prefetch``: units gathered ahead of the current one (``True`` = 1).
    ``grad_unit_bytes``: unsharded gradient of each unit during its backward (a scalar is a
    total split evenly, like ``activation_bytes``); ``None`` means 0.
    ``backward_workspace_bytes`` / ``optimizer_workspace_bytes``: the optional workspace
    terms (``None``: not modelled, and absent from ``terms``); see :func:`logits_workspace`
    and :func:`adam_workspace`. ``grad_shard_bytes``: gradient shard of each unit, alive from
    the end of its backward (a scalar is a total split evenly; with no units it only joins
    the ``"optimizer"`` moment); ``None``: not modelled (the shards are in ``persistent``).
    ``backward_workspace_at``: ``"last_unit"`` or ``"before_units"``;
    ``head_activation_bytes``: activations saved by a head outside the units (module
    docstring). ``recompute_bytes``: activations each unit rebuilds during its own backward
    under activation checkpointing (a scalar is a total split evenly; with no units it joins
    the single moment); ``None``: not modelled.
    """
    persistent = v.nonneg_number("persistent_bytes", persistent_bytes)
    buffers = v.nonneg_number("buffer_bytes", buffer_bytes)
    p = _prefetch(prefetch)
    reshard = v.flag("reshard_after_forward", reshard_after_forward)
    if isinstance(unit_bytes, str) or not isinstance(unit_bytes, Sequence):
        raise ValueError(f"unit_bytes={unit_bytes!r} must be a list of bytes per unit")
    units = [v.nonneg_number(f"unit_bytes[{i}]", x) for i, x in enumerate(unit_bytes)]
    n = len(units)
    bw = (
        None
        if backward_workspace_bytes is None
        else v.nonneg_number("backward_workspace_bytes", backward_workspace_bytes)
    )
    ow = (
        None
        if optimizer_workspace_bytes is None
        else v.nonneg_number("optimizer_workspace_bytes", optimizer_workspace_bytes)
    )
    ws_at = v.choice("backward_workspace_at", backward_workspace_at, WORKSPACE_AT)
    head = v.nonneg_number("head_activation_bytes", head_activation_bytes)
    extra = {}  # optional terms, only when given
    if recompute_bytes is not None:
        extra["recompute_scratch"] = 0.0
    if grad_shard_bytes is not None:
        extra["grad_shards"] = 0.0
    if bw is not None:
        extra["backward_workspace"] = 0.0
    if ow is not None:
        extra["optimizer_workspace"] = 0.0
    base = {"persistent": persistent, "buffers": buffers}
    timeline = []
    if n == 0:
        if isinstance(activation_bytes, Sequence) and not isinstance(activation_bytes, str):
            raise ValueError("activation_bytes must be one number when unit_bytes is empty")
        act = v.nonneg_number("activation_bytes", activation_bytes) + head
        shards_total = (
            0.0 if grad_shard_bytes is None else _total("grad_shard_bytes", grad_shard_bytes)
        )
        terms = {**base, "gathered_params": 0.0, "unsharded_grads": 0.0, "activations": act}
        terms = {k: terms[k] for k in TERMS}
        terms.update(extra)
        if recompute_bytes is not None:
            terms["recompute_scratch"] = _total("recompute_bytes", recompute_bytes)
        if bw is not None:
            terms["backward_workspace"] = bw
        timeline.append(PeakPoint("forward" if bw is None else "backward", None, terms, ()))
    else:
        acts = _per_unit("activation_bytes", activation_bytes, n)
        grads = (
            [0.0] * n
            if grad_unit_bytes is None
            else _per_unit("grad_unit_bytes", grad_unit_bytes, n)
        )
        shards = (
            [0.0] * n
            if grad_shard_bytes is None
            else _per_unit("grad_shard_bytes", grad_shard_bytes, n)
        )
        shards_total = float(sum(shards))
        rec = (
            [0.0] * n
            if recompute_bytes is None
            else _per_unit("recompute_bytes", recompute_bytes, n)
        )
        for phase, order in (("forward", range(n)), ("backward", range(n - 1, -1, -1))):
            if phase == "backward" and ws_at == "before_units" and (bw is not None or head):
                # start of backward: the loss/head gradients exist, no unit has run backward
                alive = () if reshard else tuple(range(n))
                terms = {
                    "persistent": persistent,
                    "gathered_params": float(sum(units[j] for j in alive)),
                    "unsharded_grads": 0.0,
                    "activations": float(sum(acts)) + head,
                    "buffers": buffers,
                    **extra,
                }
                if bw is not None:
                    terms["backward_workspace"] = bw
                timeline.append(PeakPoint("backward", None, terms, alive))
            for i in order:
                alive = _alive(phase, i, n, p, reshard)
                terms = {
                    "persistent": persistent,
                    "gathered_params": float(sum(units[j] for j in alive)),
                    "unsharded_grads": grads[i] if phase == "backward" else 0.0,
                    "activations": float(sum(acts[: i + 1])),
                    "buffers": buffers,
                    **extra,
                }
                if phase == "backward" and grad_shard_bytes is not None:
                    terms["grad_shards"] = float(sum(shards[i + 1 :]))
                if phase == "backward" and recompute_bytes is not None:
                    terms["recompute_scratch"] = rec[i]
                if ws_at == "last_unit" and phase == "backward" and i == n - 1:
                    terms["activations"] += head
                    if bw is not None:
                        terms["backward_workspace"] = bw
                timeline.append(PeakPoint(phase, i, terms, alive))
    if ow is not None or grad_shard_bytes is not None:
        # the optimizer step: every gradient shard exists, activations and gathered units
        # are gone
        terms = {k: 0.0 for k in TERMS}
        terms.update(extra)
        terms.update(persistent=persistent, buffers=buffers)
        if grad_shard_bytes is not None:
            terms["grad_shards"] = shards_total
        if ow is not None:
            terms["optimizer_workspace"] = ow
        timeline.append(PeakPoint("optimizer", None, terms, ()))
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
    backward_workspace_bytes: float | None = None,
    optimizer_workspace_bytes: float | None = None,
) -> PeakBreakdown:
    """Peak for a DDP/ZeRO layout with ``n_units`` equal FSDP units (ZeRO-3 only).

    ``persistent`` = :func:`.memory.model_state` total. For ``zero3`` each unit gathers
    ``N * weights / n_units`` bytes and, in its backward, holds an unsharded gradient of
    ``N * grads / n_units`` bytes. Other layouts gather nothing; their full gradients are
    already in ``persistent`` (ZeRO-2's transient buckets belong in ``buffer_bytes``).
    The two workspace terms are passed through to :func:`predict_peak`.
    """
    state = model_state(n_params, dp, layout, recipe)
    rec = get_recipe(recipe)
    k = v.positive_int("n_units", n_units)
    ws = {
        "backward_workspace_bytes": backward_workspace_bytes,
        "optimizer_workspace_bytes": optimizer_workspace_bytes,
    }
    if layout != "zero3":
        return predict_peak(state.total, [], activation_bytes, buffer_bytes, **ws)
    if k > state.n_params:
        raise ValueError(f"n_units={k} exceeds n_params={state.n_params}")
    unit = [state.n_params * rec.weights / k] * k
    grad = [state.n_params * rec.grads / k] * k
    return predict_peak(
        state.total,
        unit,
        activation_bytes,
        buffer_bytes,
        prefetch,
        reshard_after_forward,
        grad,
        **ws,
    )
