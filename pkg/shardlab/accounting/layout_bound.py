"""Large searches: which cells the planner costs when costing all of them would take too
long, and why the first ranks are still those of the full search.

A **cell** is one ``(D, t, p, c, v, ep, sp)`` that passed every check before costing;
:func:`.layout_cost.cost_layouts` costs its ZeRO stages, recompute modes and HSDP splits:
up to 27 layouts (about 50 µs each on the 2-core machine the bounds were measured on).
Highly composite cluster sizes (110,880 GPUs: 144 divisors), deep models (1,024 layers: more
interleavings) and many experts (every divisor of the expert count) multiply the cells: the
full search of some inputs the planner accepts took a minute.

**The rule.** Before costing, the planner counts the most layouts its cells can yield and
their HSDP splits (:func:`.layout_search.search_space`): the search's *work* is
``layouts + splits / 6`` (:func:`work`).

* Work up to :data:`EXACT_WORK`: every cell is costed, in the order of :mod:`.layout_search`
  -- the full search, whose ranking and rejection counts the book shows (Llama 3 405B on
  16,384 GPUs: 9,484).
* Above it: best-first branch and bound (:func:`bounded_search`). Every geometry
  ``(D, t, p, c, sp)``, each of its expert degrees and each cell has a *floor*
  (:func:`.layout_floors.floors`): a step time none of its layouts beats. They are taken in
  the order of their floors, a geometry split into its expert degrees and those into cells,
  a cell costed, until the next floor is above the step time of the :data:`RANKED_EXACTLY`-th
  fastest feasible layout found. Every layout left out is slower than that one, so ranks 1
  to ``RANKED_EXACTLY`` are exactly the full search's (``tests/test_planner_bound.py``
  compares them); below them the ranking holds the layouts of the costed cells only. A
  group none of whose layouts can fit is rejected whole, one rejection with ``None`` in the
  fields it covers. ``Plan.settings["bounded"]`` counts the cells costed, rejected whole and
  not costed (``Plan.skipped`` lists those).
* Above :data:`.layout_search.MAX_COMBINATIONS` combinations of the degrees ``(t, c, p, D,
  v, ep)``, counted before any is built: refused with one sentence.

**Floors** (:mod:`.layout_floors`): a step time none of the layouts of a group beats and a
peak none goes below, from the terms that do not depend on what the group leaves open.
"""

from __future__ import annotations

import heapq
import math

from .layout_floors import staged_floors, time_floor
from .layout_types import Layout, Rejection
from .memory import GB

# a full search of this much work takes about 0.4 s on the reference machine (Llama 3 405B
# on 16,384 GPUs: 9,484, 0.3 s); above it the search is bounded
EXACT_WORK = 10_000
RANKED_EXACTLY = 50  # ranks equal to the full search's in a bounded search
SPLIT_WORK = 1 / 6  # timing an HSDP split costs about a sixth of costing a layout


def work(layouts: int, splits: int) -> float:
    """The work of a full search that may cost ``layouts`` layouts and time ``splits`` HSDP
    splits, in layouts."""
    return layouts + splits * SPLIT_WORK


def bounded_search(model, cl, o, cells: list[tuple], cost, zeros_of, hsdp: bool
                   ) -> tuple[dict[int, list], dict, list[int]]:
    """Best-first branch and bound over ``cells`` (``(D, t, p, c, sp, v, ep)`` in the full
    search's order; a geometry's cells are consecutive). ``cost(i)`` costs cell ``i``
    (:func:`.layout_cost.cost_layouts`), ``zeros_of(i)`` its ZeRO stages. Returns the results
    of the costed cells and the rejections of whole groups, keyed by the group's first cell,
    the counts for ``Plan.settings["bounded"]`` and the cells neither costed nor rejected.

    A geometry enters the heap under :func:`.layout_floors.time_floor`. Taken from it, it is
    split into its expert degrees (MoE: those whose own time floor can still rank), and one of
    those into its cells, each part under :func:`.layout_floors.staged_floors` without the
    data-parallel exposure, then, once taken, under the full floor; a cell taken under its
    full floor is costed. A group none of whose layouts can fit (a geometry, an expert degree
    of it, a cell) is rejected whole instead: one rejection, ``None`` in the fields it
    covers."""
    groups: dict[tuple, list[int]] = {}
    for i, key in enumerate(cells):
        groups.setdefault(key[:5], []).append(i)
    budget = cl.gpu_memory * (1 - o.reserve)
    done: dict[int, list] = {}
    count = {"costed": 0, "whole": 0}
    covered: set[int] = set()
    heap: list[tuple] = []
    order = iter(range(1 << 62))  # ties in the heap: first pushed, first taken

    def reject(idx: list[int], peak: float, ep, vv, what: str) -> None:
        D, t, p, c, sp = cells[idx[0]][:5]
        lay = Layout(D, t, p, c, ep, None, None, max(1, o.batch // (D * o.b)), vv, sp, None,
                     None)
        done[idx[0]] = [_oom(lay, peak, budget, what)]
        count["whole"] += len(idx)
        covered.update(idx)

    for idx in groups.values():
        low = time_floor(model, cl, o, *cells[idx[0]][:5], sorted({cells[j][5] for j in idx}),
                         sorted({cells[j][6] for j in idx}))
        heap.append((low, next(order), 0, idx, None))
    heapq.heapify(heap)
    fastest: list[float] = []  # the RANKED_EXACTLY smallest step times, negated (a max-heap)
    kth = math.inf
    while heap and heap[0][0] <= kth:
        _, _, level, idx, full = heapq.heappop(heap)
        if full is not None:  # under its floor without data-parallel traffic: the full one
            low = full()
            if low <= kth:
                heapq.heappush(heap, (low, next(order), level, idx, None))
            continue
        D, t, p, c, sp = cells[idx[0]][:5]
        if level == 0:  # a geometry: its expert degrees
            parts: dict[int, list[int]] = {}
            for j in idx:
                parts.setdefault(cells[j][6], []).append(j)
            vs = sorted({cells[j][5] for j in idx})
            if len(parts) > 1 and kth < math.inf:  # those whose quick floor can still rank
                parts = {ep: part for ep, part in parts.items()
                         if time_floor(model, cl, o, D, t, p, c, sp, vs, [ep]) <= kth}
            got = staged_floors(model, cl, o, D, t, p, c, sp, vs, list(parts), zeros_of(idx[0]),
                                hsdp)
            if len(parts) == len({cells[j][6] for j in idx}) and all(
                    low == math.inf for low, _, _ in got):  # nothing of the geometry fits
                reject(idx, min(pk for _, pk, _ in got), None, None,
                       "interleaving, expert degree, " if model.experts > 1 else "interleaving, ")
                continue
            for (ep, part), (low, peak, full) in zip(parts.items(), got):
                if low == math.inf:
                    reject(part, peak, ep, None, "interleaving, ")
                elif low <= kth:
                    heapq.heappush(heap, (low, next(order), 1, part, full))
        elif level == 1:  # an expert degree of a geometry: its cells
            for j in idx:
                [(low, peak, full)] = staged_floors(model, cl, o, D, t, p, c, sp, (cells[j][5],),
                                                   (cells[j][6],), zeros_of(j), hsdp)
                if low == math.inf:
                    reject([j], peak, cells[j][6], cells[j][5], "")
                elif low <= kth:
                    heapq.heappush(heap, (low, next(order), 2, [j], full))
        else:  # a cell
            i = idx[0]
            done[i] = out = cost(i)
            count["costed"] += 1
            covered.add(i)
            for r in out:
                step = getattr(r, "step_time", None)
                if step is None:
                    continue
                if len(fastest) < RANKED_EXACTLY:
                    heapq.heappush(fastest, -step)
                elif step < -fastest[0]:
                    heapq.heapreplace(fastest, -step)
            if len(fastest) == RANKED_EXACTLY:
                kth = -fastest[0]
    info = {"cells": len(cells), "costed": count["costed"],
            "out_of_memory_whole": count["whole"],
            "skipped": len(cells) - count["costed"] - count["whole"],
            "ranked_exactly": RANKED_EXACTLY, "bound_s": kth if math.isfinite(kth) else None}
    return done, info, [i for i in range(len(cells)) if i not in covered]


def _oom(lay: Layout, peak: float, budget: float, what: str) -> Rejection:
    """One rejection for every layout of a geometry or a cell: none can fit."""
    return Rejection(lay, "out of memory",
                     f"out of memory by at least {(peak - budget) / GB:.1f} GB with every "
                     f"{what}ZeRO stage and recompute mode (at least {peak / GB:.1f} GB > "
                     f"budget {budget / GB:.1f} GB)", peak - budget)
