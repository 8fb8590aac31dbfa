"""Persistent model-state memory per rank: precision recipes x sharding layouts.

The method (lecture 8, "First separate model state from peak memory"; Rajbhandari et al.,
*ZeRO*, 2020, Sec. 3 and 5): list every object stored per parameter, give each a byte count
(a *recipe*), and for a layout divide **only the objects that layout shards** by the
data-parallel degree ``D``::

    bytes per rank = N * ( sum_{o replicated} b_o  +  sum_{o sharded} b_o / D )

Objects (field names of :class:`Recipe`, bytes per parameter):

``weights``     working weights used by forward/backward
``grads``       gradient storage produced by backward
``master``      higher-precision copy of the weights updated by the optimizer
``moment1``     Adam first moment (m)
``moment2``     Adam second moment (v)
``grad_accum``  a separate gradient-accumulation buffer (0 unless the recipe keeps one)

Named recipes (:data:`RECIPES`):

``mixed-adam-16``     2 + 2 + 4 + 4 + 4 = 16 B. bf16/fp16 weights and grads, fp32 master and
                      fp32 Adam moments: the lecture's table and the classic ZeRO example.
``low-precision-12``  2 + 2 + 4 + 2 + 2 = 12 B. As above but both Adam moments kept in bf16
                      (fp32 master weights retained). This is *our* stated split for the
                      lecture's "lower-precision 12-byte variant".
``bf16-no-master-10`` 2 + 4 + 0 + 2 + 2 = 10 B. bf16 weights updated in place (no master copy,
                      e.g. with stochastic rounding), gradients accumulated/reduced in fp32
                      (Megatron-style ``main_grad``), bf16 Adam moments.
``mixed-fp32-accum``  the 16 B recipe plus a 4 B fp32 gradient-accumulation buffer = 20 B.
``fp32``              4 + 4 + 0 + 4 + 4 = 16 B. Everything fp32; the weights are the master
                      copy, so there is no separate one.

Layouts (:data:`SHARDED_OBJECTS`): DDP shards nothing; ZeRO-1 shards master + moments;
ZeRO-2 additionally the gradients and the gradient-accumulation buffer; ZeRO-3 additionally
the working weights. For ``mixed-adam-16`` this gives the lecture's formulas
``M1 = (4 + 12/D) N``, ``M2 = (2 + 14/D) N``, ``M3 = 16 N / D``; with ``N = 7e9, D = 8``:
112, 38.5, 26.25 and 14 GB (decimal). Activations, gathered parameters, communication
buffers, workspaces and allocator overhead are **not** model state; see :mod:`.peak`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from . import _validate as v

OBJECTS = ("weights", "grads", "master", "moment1", "moment2", "grad_accum")
LAYOUTS = ("ddp", "zero1", "zero2", "zero3")

_OPT = frozenset({"master", "moment1", "moment2"})
SHARDED_OBJECTS: dict[str, frozenset[str]] = {
    "ddp": frozenset(),
    "zero1": _OPT,
    "zero2": _OPT | {"grads", "grad_accum"},
    "zero3": _OPT | {"grads", "grad_accum", "weights"},
}

GB = 10**9
GiB = 2**30


@dataclass(frozen=True)
class Recipe:
    """Bytes per parameter for each stored object (any non-negative number)."""

    name: str
    weights: float
    grads: float
    master: float
    moment1: float
    moment2: float
    grad_accum: float = 0.0

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"name={self.name!r} must be a non-empty string")
        for obj in OBJECTS:
            v.nonneg_number(f"{obj} (recipe {self.name!r})", getattr(self, obj))
        if self.total == 0:
            raise ValueError(f"recipe {self.name!r} stores 0 bytes per parameter")

    @property
    def total(self) -> float:
        """Bytes per parameter summed over all objects."""
        return sum(getattr(self, obj) for obj in OBJECTS)

    def bytes_of(self, obj: str) -> float:
        """Bytes per parameter of one object."""
        return getattr(self, v.choice("object", obj, OBJECTS))

    def as_dict(self) -> dict[str, float]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


RECIPES: dict[str, Recipe] = {
    r.name: r
    for r in (
        Recipe("mixed-adam-16", weights=2, grads=2, master=4, moment1=4, moment2=4),
        Recipe("low-precision-12", weights=2, grads=2, master=4, moment1=2, moment2=2),
        Recipe("bf16-no-master-10", weights=2, grads=4, master=0, moment1=2, moment2=2),
        Recipe(
            "mixed-fp32-accum", weights=2, grads=2, master=4, moment1=4, moment2=4, grad_accum=4
        ),
        Recipe("fp32", weights=4, grads=4, master=0, moment1=4, moment2=4),
    )
}


def get_recipe(recipe: str | Recipe) -> Recipe:
    """Look up a named recipe, or pass a :class:`Recipe` through."""
    if isinstance(recipe, Recipe):
        return recipe
    return RECIPES[v.choice("recipe", recipe, RECIPES)]


@dataclass(frozen=True)
class StateBreakdown:
    """Per-rank persistent model state for one (N, D, layout, recipe)."""

    layout: str
    recipe: Recipe
    n_params: int
    dp: int
    per_object: dict[str, float]
    sharded: frozenset[str]

    @property
    def total(self) -> float:
        """Bytes per rank."""
        return sum(self.per_object.values())

    @property
    def total_gb(self) -> float:
        return self.total / GB

    @property
    def total_gib(self) -> float:
        return self.total / GiB

    @property
    def bytes_per_param(self) -> float:
        """Bytes per rank divided by N (the lecture table's middle column)."""
        return self.total / self.n_params

    def as_rows(self) -> list[dict[str, object]]:
        """One row per object plus a ``total`` row (bytes, GB, GiB, sharded flag)."""
        rows: list[dict[str, object]] = []
        for obj in OBJECTS:
            b = self.per_object[obj]
            rows.append(
                {
                    "object": obj,
                    "bytes_per_param": self.recipe.bytes_of(obj),
                    "sharded": obj in self.sharded,
                    "bytes": b,
                    "GB": b / GB,
                    "GiB": b / GiB,
                }
            )
        rows.append(
            {
                "object": "total",
                "bytes_per_param": self.recipe.total,
                "sharded": None,
                "bytes": self.total,
                "GB": self.total_gb,
                "GiB": self.total_gib,
            }
        )
        return rows

    def summary_row(self) -> dict[str, object]:
        """A single row (layout, bytes/param per rank, total GB and GiB) for layout tables."""
        return {
            "layout": self.layout,
            "bytes_per_param_per_rank": self.bytes_per_param,
            "GB": self.total_gb,
            "GiB": self.total_gib,
            **{obj: self.per_object[obj] for obj in OBJECTS},
        }


def model_state(
    n_params: int, dp: int, layout: str = "ddp", recipe: str | Recipe = "mixed-adam-16"
) -> StateBreakdown:
    """Per-rank persistent model state: shard only the objects in ``SHARDED_OBJECTS[layout]``.

    ``n_params`` and ``dp`` are positive integers; per-object bytes are ``N*b_o`` (replicated)
    or ``N*b_o/dp`` (sharded; ideal balanced sharding, so fractions of a byte may appear).
    """
    n = v.positive_int("n_params", n_params)
    d = v.positive_int("dp", dp)
    layout = v.choice("layout", layout, LAYOUTS)
    rec = get_recipe(recipe)
    sharded = SHARDED_OBJECTS[layout]
    per_object: dict[str, float] = {}
    for obj in OBJECTS:
        total = n * rec.bytes_of(obj)
        per_object[obj] = total / d if obj in sharded else float(total)
    return StateBreakdown(layout, rec, n, d, per_object, sharded)


PAD_MODES = ("flat", "per_param")


def fsdp_padded_numel(shapes, dp: int, mode: str = "per_param") -> int:
    """Elements an FSDP unit stores over all ranks once padded so every rank holds the same.

    ``shapes``: the shapes of the unit's (distinct) parameters; ``dp``: ranks ``D``.

    * ``"flat"`` (FSDP1, lab 04's ``FlatParam``): the parameters are concatenated into one
      vector of ``n = sum(numel)`` elements padded to ``ceil(n / D) * D``; at most ``D - 1``
      padding elements per unit.
    * ``"per_param"`` (FSDP2, ``fully_shard``): each parameter of shape ``(d0, *rest)`` is
      padded on dim 0 to ``ceil(d0 / D) * D`` rows: ``sum ceil(d0/D) * D * prod(rest)``; up to
      ``(D - 1) * prod(rest)`` padding elements per parameter (a 0-d parameter counts as
      ``(1,)``).

    Each rank holds ``fsdp_padded_numel(...) / D`` elements (use it as ``N`` in
    :func:`model_state` with layout ``"zero3"`` and in ``comm.step_volume``).
    """
    d = v.positive_int("dp", dp)
    mode = v.choice("mode", mode, PAD_MODES)
    if isinstance(shapes, str) or not hasattr(shapes, "__iter__"):
        raise ValueError(f"shapes={shapes!r} must be a list of parameter shapes")
    dims = []
    for i, shape in enumerate(shapes):
        if isinstance(shape, str) or not hasattr(shape, "__iter__"):
            raise ValueError(f"shapes[{i}]={shape!r} must be a shape (a tuple of sizes)")
        dims.append([v.nonneg_int(f"shapes[{i}][{j}]", x) for j, x in enumerate(shape)] or [1])
    if mode == "flat":
        n = sum(math.prod(s) for s in dims)
        return -(-n // d) * d
    return sum(-(-s[0] // d) * d * math.prod(s[1:]) for s in dims)


def state_table(
    n_params: int, dp: int, recipe: str | Recipe = "mixed-adam-16"
) -> list[StateBreakdown]:
    """:func:`model_state` for every layout in ``LAYOUTS`` order."""
    return [model_state(n_params, dp, layout, recipe) for layout in LAYOUTS]
