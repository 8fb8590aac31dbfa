"""The planner's search space: which degrees are tried, what is rejected before costing, and
what is pruned (never costed, because another candidate is at least as good).

**Degrees.** Every divisor of ``G``: ``t`` up to twice a node's GPUs (beyond a node it is
rejected), ``c`` up to ``max_cp`` with ``s / c >= min_local_seq``, ``p`` every divisor of
``G / (t c)`` (``p > L`` is rejected: too many stages), ``D = G / (t c p)``; ``v`` from 1 to
``L / p`` (:func:`chunk_counts`); ``ep`` every divisor of the expert count.

**Pruned, and why** (no candidate that could rank first is lost):

* ``v`` values that give the same chunk size ``l = ceil(L / (p v))`` as a smaller ``v``: a
  rank then holds ``l v`` layers, more than with the smaller ``v``, with the same bubble
  ``(p - 1) l`` layer-times and more in-flight chunks and pipeline messages, so it is at least
  as slow and at least as full. Only the smallest ``v`` of each ``l`` is costed: about
  ``2 sqrt(L / p)`` values instead of ``L / p``.
* SP off where SP is possible (``t`` divides ``s / c``): the same FLOPs and the same
  collective time (:func:`.comm.tp_volume` is equal), more element-wise traffic (norms and
  dropout-adds run on the whole sequence, :func:`.gemm.elementwise_bytes`) and no fewer saved
  bytes (each :mod:`.activations` mode without SP keeps at least as much), so it is never
  better. SP off is costed where SP is impossible, or on request (``sp=False``).
* ZeRO-1/2/3 when ``D c = 1``: nothing to shard, the same layout as ZeRO-0.
* HSDP splits (``replicas`` R, every divisor of ``D`` whose shard group ``D c / R`` has more
  than one rank, :func:`.layout_types.hsdp_replicas`): more replicas keep more state per rank
  (the state is split ``D c / R`` ways) and change only the data-parallel traffic, so a split
  is costed only if its data-parallel time is below that of every split with fewer replicas
  (plain ZeRO included), and none once that time already hides behind the compute. Of the
  splits left, each ZeRO stage and recompute mode keeps plain ZeRO and the split with the most
  replicas that fits: every other split that fits is slower than that one (and holds more
  than plain ZeRO), so it never ranks above it.

**Bounds.** ``G <= MAX_GPUS`` and ``L <= MAX_LAYERS`` (:mod:`.layout_types`) and at most
:data:`MAX_COMBINATIONS` combinations of ``(t, c, p, D, v, ep)``, counted before any is built
(:func:`search_space`); larger inputs are refused with one sentence. With the pruning above,
Llama 3 405B on 16,384 GPUs costs a few thousand layouts (``tests/test_planner_search.py``
times it); which cells of a larger search are costed, :mod:`.layout_bound` says.
"""

from __future__ import annotations

import math

from .context import kv_heads_per_rank
from .layout_types import (
    MAX_GPUS,
    MAX_LAYERS,
    Layout,
    Rejection,
    _inside,
    _Opts,
    divisors,
    hsdp_replicas,
    zero_choices,
)
from .pipeline import idle_fraction

REASONS = ("divisibility", "t beyond a node", "too many stages", "bubble too large",
           "out of memory")
# Combinations of (t, c, p, D, v, ep) one search checks at most: building and bounding them
# takes about 0.4 s at this count (a 1,024-layer model with 256 experts on 110,880 GPUs has
# 70,000; 720,720 experts on 16,384 GPUs, 135,120: refused)
MAX_COMBINATIONS = 100_000


def check_size(model, cluster) -> None:
    """Refuse a search whose size would grow past the bounds (one sentence)."""
    if cluster.gpus > MAX_GPUS:
        raise ValueError(f"gpus={cluster.gpus:,}: the planner searches clusters of at most "
                         f"{MAX_GPUS:,} GPUs")
    if model.layers > MAX_LAYERS:
        raise ValueError(f"layers={model.layers:,}: the planner searches models of at most "
                         f"{MAX_LAYERS:,} layers")
    big = max(model.hidden, model.ffn, model.vocab, model.seq_len, model.experts)
    if big > 2**40:
        raise ValueError(f"a model dimension of {big:,} is beyond what the planner costs "
                         "(at most 2^40 per dimension)")


def check_combinations(model, cluster, batch: int, n: int) -> None:
    """Refuse a search of more than :data:`MAX_COMBINATIONS` combinations of the degrees
    ``(t, c, p, D, v, ep)`` (counted before any is built), with one sentence naming the inputs."""
    if n > MAX_COMBINATIONS:
        moe = f", experts={model.experts:,}" if model.experts > 1 else ""
        raise ValueError(
            f"gpus={cluster.gpus:,}, layers={model.layers:,}, global_batch={batch:,}{moe}: the "
            f"search would check {n:,} combinations of the degrees t, c, p, D, v and ep; the "
            f"planner checks at most {MAX_COMBINATIONS:,}, so that it answers within a second")


def chunk_counts(L: int, p: int) -> list[int]:
    """Interleaving degrees worth costing for ``p`` stages of ``L`` layers: 1, then the
    smallest ``v <= L / p`` of each chunk size ``ceil(L / (p v))`` (module docstring)."""
    if p == 1:
        return [1]
    out, vv = [], 1
    while vv <= L // p:
        out.append(vv)
        ell = math.ceil(L / (p * vv))
        if ell == 1:
            break
        vv = max(vv + 1, math.ceil(L / (p * (ell - 1))))
    return out


def _t_rejection(model, cl, t: int) -> Rejection | None:
    """Reasons that reject a tensor degree whatever the other degrees (``None`` fields)."""
    lay = Layout(None, t, None, None, None, None, None, None, None, None)
    for name, value in (("heads", model.heads), ("hidden", model.hidden), ("ffn", model.ffn),
                        ("vocab", model.vocab)):
        if value % t:
            return Rejection(lay, "divisibility", f"t={t} does not divide {name}={value}")
    try:
        kv_heads_per_rank(model.kv_heads, t)
    except ValueError as exc:
        return Rejection(lay, "divisibility", str(exc))
    if not _inside(1, t, cl.gpus_per_node):
        return Rejection(lay, "t beyond a node",
                         f"t={t} tensor ranks do not fit in one aligned node of "
                         f"{cl.gpus_per_node} GPUs")
    return None


def _c_rejection(model, t: int, c: int, sp: bool) -> Rejection | None:
    lay = Layout(None, t, None, c, None, None, None, None, None, sp)
    s = model.seq_len
    if s % c:
        return Rejection(lay, "divisibility", f"c={c} does not divide seq_len={s}")
    if sp and (s // c) % t:
        return Rejection(lay, "divisibility",
                         f"t={t} does not divide the local sequence s/c={s // c} (sequence "
                         "parallelism)")
    return None


def geometry_rejection(model, cl, D, t, p, c, o: _Opts, sp: bool) -> Rejection | None:
    """The first reason one ``(D, t, p, c, sp)`` cannot run, before costing (or ``None``)."""
    lay = Layout(D, t, p, c, None, None, None, max(1, o.batch // (D * o.b)), None, sp)
    rj = _t_rejection(model, cl, t) or _c_rejection(model, t, c, sp)
    if rj is not None:
        return Rejection(lay, rj.reason, rj.detail)
    if o.batch % (D * o.b):
        return Rejection(lay, "divisibility",
                         f"D*b = {D}*{o.b} does not divide global_batch={o.batch}")
    return None


def chunk_rejection(model, D, t, p, c, vv, m, o: _Opts, sp: bool) -> Rejection | None:
    if p * vv > model.layers:
        why = ("too many stages",
               f"p*v = {p}*{vv} = {p * vv} virtual stages > layers={model.layers}")
    elif vv > 1 and m % p:
        why = ("divisibility", f"interleaving (v={vv}) needs p={p} to divide m={m}")
    else:
        idle = idle_fraction(p, m, vv)
        if idle <= o.max_bubble:
            return None
        why = ("bubble too large", f"idle fraction {idle:.1%} of p={p}, m={m}, v={vv} exceeds "
               f"max_bubble={o.max_bubble:.0%}")
    return Rejection(Layout(D, t, p, c, None, None, None, m, vv, sp), *why)


def ep_rejection(model, D, t, p, c, vv, ep, m, sp: bool) -> Rejection | None:
    if model.experts == 1 or not (model.experts % ep or (D * c * t) % ep):
        return None
    lay = Layout(D, t, p, c, ep, None, None, m, vv, sp)
    if model.experts % ep:
        return Rejection(lay, "divisibility", f"ep={ep} does not divide experts={model.experts}")
    return Rejection(lay, "divisibility", f"ep={ep} does not divide D*c*t = {D * c * t}")


def sp_choices(model, t: int, c: int, sp: bool | None) -> tuple[bool, ...]:
    """SP settings to cost for a tensor degree (module docstring): ``None`` = the better one."""
    if t == 1:
        return (True,)
    if sp is None:
        return (not (model.seq_len // c) % t,)  # SP where the local sequence divides
    return (sp,)


def geometries(model, cl, o: _Opts, max_c: int, min_s: int, sp: bool | None):
    """Yield ``(D, t, p, c, sp)`` to cost, or a :class:`Rejection` (``None`` fields: a whole
    family: a tensor degree, a context degree, or every ``p > L`` of a ``(t, c)``)."""
    G, L = cl.gpus, model.layers
    div_g = divisors(G)
    ts = [t for t in div_g if t <= 2 * cl.gpus_per_node and t <= model.heads]
    cs = [c for c in div_g if c <= max_c and (c == 1 or model.seq_len // c >= min_s)]
    for t in ts:
        rj = _t_rejection(model, cl, t)
        if rj is not None:
            yield rj
            continue
        for c in cs:
            if G % (t * c):
                continue
            rest = G // (t * c)
            for spv in sp_choices(model, t, c, sp):
                rj = _c_rejection(model, t, c, spv)
                if rj is not None:
                    yield rj
                    continue
                ps = [d for d in div_g if rest % d == 0]
                if ps[-1] > L:
                    deep = [x for x in ps if x > L]
                    yield Rejection(Layout(None, t, None, c, None, None, None, None, None, spv),
                                    "too many stages",
                                    f"p in {{{', '.join(map(str, deep[:4]))}"
                                    f"{', ...' if len(deep) > 4 else ''}}} > layers={L}")
                for p in ps:
                    if p > L:
                        break
                    D = rest // p
                    if o.batch % (D * o.b):
                        yield Rejection(Layout(D, t, p, c, None, None, None,
                                               max(1, o.batch // (D * o.b)), None, spv),
                                        "divisibility",
                                        f"D*b = {D}*{o.b} does not divide "
                                        f"global_batch={o.batch}")
                        continue
                    yield (D, t, p, c, spv)


def search_space(model, cl, o: _Opts, max_c: int, min_s: int, sp: bool | None, hsdp: bool,
                 eps: list[int], bounded) -> tuple[list, list[tuple], bool]:
    """The search in the order of the full search: ``items`` (each a :class:`Rejection` found
    before costing, or the index of a cell) and the ``cells`` ``(D, t, p, c, sp, v, ep)`` to
    cost. Refused (:func:`check_combinations`) before any combination is built when there are
    too many. ``bounded(layouts, splits)`` says, from the most layouts the cells can yield and
    the count of their HSDP splits, whether the search is bounded (returned too): a bounded
    search gets one rejection per geometry and expert degree that does not divide ``D c t``
    (``v`` ``None``, every interleaving), a full search one per interleaving."""
    geos = list(geometries(model, cl, o, max_c, min_s, sp))
    vs_of = {p: chunk_counts(model.layers + (2 if o.embedding_in_split and p > 1 else 0), p)
             for p in {g[2] for g in geos if not isinstance(g, Rejection)}}
    check_combinations(model, cl, o.batch, sum(
        len(vs_of[g[2]]) * len(eps) for g in geos if not isinstance(g, Rejection)))
    found, n_layouts, splits = [], 0, 0  # per geometry, its checks; and the counts
    for geo in geos:
        if isinstance(geo, Rejection):
            found.append(geo)
            continue
        D, t, p, c, spv = geo
        m = o.batch // (D * o.b)
        # an expert degree's rejection does not depend on v: found once per geometry
        why = {ep: ep_rejection(model, D, t, p, c, 1, ep, m, spv) for ep in eps}
        vs = [(vv, chunk_rejection(model, D, t, p, c, vv, m, o, spv)) for vv in vs_of[p]]
        n = sum(rj is None for _, rj in vs) * sum(rj is None for rj in why.values())
        reps = len(hsdp_replicas(D, c)) if hsdp else 0
        zeros = len(zero_choices(D, c, model.experts))  # ZeRO-0..3, ZeRO-3 kept
        # at most 3 recompute modes per ZeRO stage, and the fastest HSDP split that fits
        n_layouts += n * (3 * zeros + (3 * (zeros - 1) if reps else 0))
        splits += n * reps
        found.append((geo, m, vs, why))
    compact = bounded(n_layouts, splits)
    items: list = []
    cells: list[tuple] = []
    for entry in found:
        if isinstance(entry, Rejection):
            items.append(entry)
            continue
        (D, t, p, c, spv), m, vs, why = entry
        if compact:
            items += [Rejection(Layout(D, t, p, c, ep, None, None, m, None, spv), rj.reason,
                                rj.detail) for ep, rj in why.items() if rj is not None]
        for vv, rj in vs:
            if rj:
                items.append(rj)
                continue
            for ep, rj in why.items():
                if rj is None:
                    items.append(len(cells))
                    cells.append((D, t, p, c, spv, vv, ep))
                elif not compact:
                    items.append(Rejection(Layout(D, t, p, c, ep, None, None, m, vv, spv),
                                           rj.reason, rj.detail))
    return items, cells, compact
