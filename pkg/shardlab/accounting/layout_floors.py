"""Floors of the planner's bounded search (:mod:`.layout_bound`): for a group of layouts (a
geometry ``(D, t, p, c, sp)`` with some of its interleavings and expert degrees, or one
cell), a step time none of them beats and a peak none goes below.

Memory: per pipeline stage, the least state of each ZeRO stage (plain sharding:
HSDP only adds state; ZeRO-3 with its gathered layers) plus each recompute mode's
activations at the fewest chunks in flight; a recompute mode fits a ZeRO stage only if that
is within the budget. Time: the compute ``3 m t_f``, the recomputation ``m t_r`` and the
bubble ``(p - 1)(3 t_f + t_r) / v`` at the fewest layers per rank and the least
recomputation that fits, the tensor- and expert-parallel collectives, which nothing hides,
and the data-parallel time that a ZeRO stage that fits exposes at least (:func:`_dp_floor`:
the plain ring, and HSDP's splits of at most as many replicas as can fit, through the least
of the convex ``A / R + B R + C`` over the replica counts ``R``) beyond the most compute that
can hide it. Each term only grows with what it leaves out (context-parallel and pipeline
exposure, offload, more layers per rank, more replicas), so a floor is never above a costed
layout's step or peak; floors are scaled by ``1 - 1e-9`` against rounding. A quick floor
(:func:`time_floor`, without memory) orders the geometries; the data-parallel part, the
slowest to find, is added only to what the rest cannot rule out (:func:`staged_floors`).
"""

from __future__ import annotations

import functools
import math

from . import comm
from .layout_cost import _activations, _layer_times
from .layout_types import ZERO_LAYOUTS, _inflight, _inside
from .layout_zero import (
    _params_per_rank,
    dp_groups,
    dp_ops,
    dp_seconds_bytes,
    stage_params,
    stage_states,
)
from .memory import get_recipe, model_state
from .peak import logits_workspace

SAFE = 1 - 1e-9  # floors are scaled by this against rounding


@functools.lru_cache(maxsize=64)
def _per_param(layout: str, recipe) -> tuple[float, float]:
    """(replicated, sharded) bytes per parameter of a ZeRO layout (:func:`.memory.model_state`
    of one parameter over one rank and over two: the difference is half the sharded bytes)."""
    one = model_state(1, 1, layout, recipe).total
    sh = 2 * (one - model_state(1, 2, layout, recipe).total)
    return one - sh, sh


def _dp_floor(cl, zero: int, reshard: bool, groups, lr: int, m: int, D: int, t: int, c: int,
              p: int, hsdp: bool):
    """The least data-parallel seconds over the plain ring and the HSDP splits of at most
    ``r`` replicas, as a function of ``r`` (the most replicas whose state may fit). ``groups``:
    ``(bytes, ranks)`` of the dense weights over ``D c`` ranks and of the experts over ``edp``.

    Splits ``R = D`` (the dense shard group is the context ranks) are timed; the others,
    ``2 <= R <= D / 2``, are bounded: a group of ``g`` ranks takes ``K (g / R - 1) a1 +
    W (1 - R / g) / b1 + 2 k (R - 1) a2 + 2 nb (R - 1) / (g b2)`` (``K`` ring collectives
    carrying ``W`` bytes, ``k`` all-reduces of the shards), convex in ``R``: the least of the
    sum over the real interval is below every split's. Links: the replicas span the cluster;
    a shard group of two data ranks or more stays in a node only if its stride ``t c p``
    allows it (else the faster link is assumed)."""
    node, tcp = cl.gpus_per_node, t * c * p
    in_node = _inside(t, c, node)  # the context ranks of a shard group
    plain = dp_seconds_bytes(groups, zero, reshard, lr, m, 1,
                             (cl.link(in_node and _inside(tcp, D, node)),))[0]
    if not hsdp or zero == 0:
        return lambda r: plain
    inter, intra = cl.link(False), cl.link(True)
    link_r = cl.link(_inside(tcp, D, node))  # the replicas' span: t c p D = G ranks
    whole = math.inf
    if c > 1 and all(g % D == 0 for _, g in groups):  # R = D: the context ranks shard
        whole = dp_seconds_bytes(groups, zero, reshard, lr, m, D, (cl.link(in_node), link_r))[0]
    a1, b1 = (inter if 2 * tcp > node or not in_node
              else (min(inter[0], intra[0]), max(inter[1], intra[1])))
    a2, b2 = link_r
    A = B = C = 0.0  # the bound is A / R + B R + C
    for nb, g in groups:  # ZeRO-1/2/3: all-gathers and reduce-scatters, g - 1 rounds each
        ops, k = dp_ops(zero, reshard, nb, lr, m)
        n_ops, carried = sum(n for _, _, n in ops), sum(n * each for _, each, n in ops)
        A += n_ops * g * a1
        B += -carried / (g * b1) + 2 * k * a2 + 2 * nb / (g * b2)
        C += -n_ops * a1 + carried / b1 - 2 * k * a2 - 2 * nb / (g * b2)
    top = min(D // 2, *(g for _, g in groups))

    def least(r: float) -> float:
        best = min(plain, whole) if D <= r else plain
        hi = min(top, r)
        if hi >= 2:
            R = hi if B <= 0 else min(hi, max(2.0, math.sqrt(A / B)))
            best = min(best, max(0.0, A / R + B * R + C))
        return best

    return least


def _base(model, cl, o, m: int, t: int, p: int, c: int, split: bool, lrs: dict, times: list,
          eps) -> dict[str, float]:
    """Per recompute mode, the least step time without data-parallel traffic over the
    interleavings ``lrs`` (``v``: layers per rank) and the expert degrees ``eps`` (their layer
    ``times``): compute, recomputation and bubble, and the tensor- and expert-parallel
    collectives, which nothing hides."""
    h, q, node, s_loc = model.hidden, o.q, cl.gpus_per_node, model.seq_len // c
    t_attn, t_layer = min(x[0] for x in times), min(x[1] for x in times)
    t_head = min(x[2] for x in times)
    one = comm._ring_collectives("all_reduce", o.b * s_loc * h * q, t, 1, *cl.link(True))[0]
    if model.experts > 1:
        a2a = model.top_k * max(1, round(o.b * s_loc / t)) * h * q
        one += min(comm._ring_collectives(
            "all_to_all", a2a, ep, 1, *cl.link((ep <= t * c or p == 1) and _inside(1, ep, node))
        )[0] for ep in eps)
    # each term grows with the layers per rank n and falls with v: a v whose n is not below
    # that of every larger v cannot give the least (its larger v is at least as good)
    front, least_n = [], math.inf
    for vv in sorted(lrs, reverse=True):
        if lrs[vv] < least_n:
            least_n = lrs[vv]
            front.append((vv, least_n, (least_n - 1) * t_layer + t_head if split
                          else least_n * t_layer + t_head / p))
    base = {}
    for rc, t_rc in (("none", 0.0), ("selective", t_attn), ("full", t_layer)):
        base[rc] = min(
            3 * m * t_f + m * n * t_rc + (p - 1) * (3 * t_f + n * t_rc) / vv + 4 * n * m * one
            for vv, n, t_f in front)
    return base


def time_floor(model, cl, o, D: int, t: int, p: int, c: int, sp: bool, vs, eps) -> float:
    """A quick floor of the geometry's step time: :func:`_base` without recomputation."""
    m = max(1, o.batch // (D * o.b))
    split = o.embedding_in_split and p > 1
    slots = model.layers + (2 if split else 0)
    lrs = {vv: math.ceil(slots / (p * vv)) * vv for vv in vs}
    times = [_layer_times(model, cl, t, c, o.b, ep, o.causal, sp) for ep in eps]
    return _base(model, cl, o, m, t, p, c, split, lrs, times, eps)["none"] * SAFE


def floors(model, cl, o, D: int, t: int, p: int, c: int, sp: bool, vs, eps, zeros, hsdp: bool
           ) -> list[tuple[float, float]]:
    """Per expert degree in ``eps``: (time floor, peak floor) of every layout of the geometry
    ``(D, t, p, c, sp)`` with that degree and an interleaving in ``vs`` (module docstring).
    The time floor is ``inf`` when no layout can fit; the peak floor is the least peak then,
    0 otherwise (the search stops looking once a layout may fit)."""
    return [(low if low == math.inf else full(), peak) for low, peak, full in
            staged_floors(model, cl, o, D, t, p, c, sp, vs, eps, zeros, hsdp)]


def staged_floors(model, cl, o, D: int, t: int, p: int, c: int, sp: bool, vs, eps, zeros,
                  hsdp: bool) -> list[tuple[float, float, object]]:
    """:func:`floors` in two steps, per expert degree: (time floor without the data-parallel
    exposure, peak floor, a function of no argument giving the full time floor). The first
    is quicker and lower; the search takes the second only for what the first cannot rule
    out."""
    m = max(1, o.batch // (D * o.b))
    split = o.embedding_in_split and p > 1
    slots = model.layers + (2 if split else 0)
    h, q, s_loc = model.hidden, o.q, model.seq_len // c
    lrs = {vv: math.ceil(slots / (p * vv)) * vv for vv in vs}
    lr = min(lrs.values())
    # ---- activations per pipeline stage at the fewest chunks in flight, per recompute mode
    st = {0: lr - split, p - 1: lr - split}
    ws = {r: logits_workspace(o.b, s_loc, model.vocab // t, 4) if r == p - 1 else 0.0
          for r in st}
    chunks = {r: min((lrs[vv] - split) / vv * _inflight(p, m, vv, r) for vv in vs)
              for r in st}
    layer = tuple(model.activation_layer.items())
    acts = {}
    for rc in ("none", "selective", "full"):
        a_l, scratch = _activations(s_loc, o.b, h, model.heads, t, rc, sp, layer)
        acts[rc] = {r: a_l * chunks[r] + scratch + ws[r] for r in st}
    # ---- the compute that hides data-parallel traffic: t_f x its FLOPs / forward FLOPs
    attn_tok = 4.0 * model.seq_len * h * (0.5 if o.causal else 1.0)
    layer_fwd = 2.0 * model.layer_matmul_params + attn_tok
    rho = {"none": 0.0, "selective": attn_tok / layer_fwd, "full": 1.0}  # recomputed / forward
    rec = get_recipe(o.recipe)
    budget = cl.gpu_memory * (1 - o.reserve)
    dense_l = _params_per_rank(model, t, 1, lr)[0]
    # memory: ZeRO-2 and ZeRO-3 first. Each stage shards a superset of the objects of the
    # stage before (memory.SHARDED_OBJECTS), so when neither fits, ZeRO-0 and ZeRO-1 do not
    # either. Time: ZeRO-1 first, which usually exposes the least data-parallel traffic, so
    # that the others are seldom timed (a floor no lower than the least so far is skipped)
    kind = {zr: zr[0] if isinstance(zr, tuple) else zr for zr in zeros}
    light = [zr for zr in zeros if kind[zr] in (2, 3)]
    by_memory = light + [zr for zr in zeros if zr not in light]
    by_time = sorted(zeros, key=lambda zr: (1, 0, 2, 3)[kind[zr]])
    out = []
    for ep in eps:
        exp_l = _params_per_rank(model, t, ep, lr)[1]
        edp = D * c * t // ep
        params = stage_params(model, t, p, st, dense_l, exp_l)
        best_peak = math.inf
        fit = {}  # ZeRO stage -> (state per stage, the modes that may fit, their needs)
        for zr in by_memory:
            if zr not in light and light and not fit:
                break
            zero, reshard = (*zr, True)[:2] if isinstance(zr, tuple) else (zr, True)
            name = ZERO_LAYOUTS[zero]
            if o.offload:  # the host's share too: memory.model_state through stage_states
                state, _ = stage_states(model, cl, o, t, p, D * c, edp, st, dense_l, exp_l,
                                        name)
            else:  # memory.model_state is linear in the parameters: per parameter, once
                rep, sh = _per_param(name, o.recipe)
                state = {r: nd * (rep + sh / (D * c)) + ne * (rep + sh / edp)
                         for r, (nd, ne) in params.items()}
            per = dense_l + exp_l
            extra = ((min(lr, 2) if reshard else lr) * rec.weights * per + rec.grads * per
                     if zero == 3 else 0.0)
            modes = {}
            for rc in acts:
                need = {r: state[r] + extra + acts[rc][r] for r in st}
                peak = max(need.values())
                best_peak = min(best_peak, peak)
                if peak * SAFE <= budget:
                    modes[rc] = need
            if modes:
                fit[zr] = (state, modes)
        if not fit:
            out.append((math.inf, best_peak * SAFE, None))
            continue
        times = [_layer_times(model, cl, t, c, o.b, ep, o.causal, sp)]
        base = _base(model, cl, o, m, t, p, c, split, lrs, times, (ep,))
        least = min(base[rc] for modes in (x[1] for x in fit.values()) for rc in modes)

        def full(ep=ep, exp_l=exp_l, params=params, fit=fit, base=base, times=times) -> float:
            """The time floor with the data-parallel exposure of each ZeRO stage that fits."""
            t_f_max = max(lrs.values()) * times[0][1] + times[0][2] / p
            groups = dp_groups(model, D, c, t, p, ep, lr, q)
            lowest, best_t = min(base.values()), math.inf
            for zr in by_time:
                if zr not in fit or best_t <= lowest:
                    continue
                zero, reshard = (*zr, True)[:2] if isinstance(zr, tuple) else (zr, True)
                state, modes = fit[zr]
                dp = shard = None  # computed when a mode may still lower the floor
                for rc, need in modes.items():
                    if base[rc] >= best_t:
                        continue
                    dp_t = 0.0
                    if not split:
                        if dp is None:
                            dp = _dp_floor(cl, zero, reshard, groups, lr, m, D, t, c, p, hsdp)
                            shard = dict.fromkeys(st, 0.0)  # sharded bytes at R = 1 (x R)
                            if hsdp and zero:  # the replicated part: sharded 2^52 ways
                                name = ZERO_LAYOUTS[zero]
                                rep = _per_param(name, o.recipe)[0]
                                whole = ({r: (nd + ne) * rep for r, (nd, ne) in params.items()}
                                         if not o.offload else
                                         stage_states(model, cl, o, t, p, 2**52, 2**52, st,
                                                      dense_l, exp_l, name)[0])
                                shard = {r: max(0.0, state[r] - whole[r]) for r in st}
                        r_max = min((1 + (budget / SAFE - need[r]) / shard[r] if shard[r]
                                     else math.inf) for r in st)
                        dp_t = dp(r_max)
                    hide = {0: 3 + rho[rc], 1: 3 + rho[rc], 2: 1 + m * (2 + rho[rc]),
                            3: m * (3 + rho[rc])}[zero] * t_f_max / SAFE
                    best_t = min(best_t, base[rc] + max(0.0, dp_t - hide))
            return best_t * SAFE

        out.append((least * SAFE, 0.0, full))
    return out
