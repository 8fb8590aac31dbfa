"""Cost of one layout: per-rank peak memory by term, traffic per axis, step time, MFU.

The engine of :mod:`.planner` (whose docstring states the model); split off to keep each
module short. :func:`cost_layouts` costs every ZeRO stage and recompute mode of one
``(D, t, p, c, v, ep, sp)`` geometry, sharing what they have in common, and returns a
:class:`Candidate` or an out-of-memory :class:`Rejection` for each; every number comes from
:mod:`.memory`, :mod:`.peak`, :mod:`.activations`, :mod:`.comm`, :mod:`.context`,
:mod:`.pipeline`, :mod:`.gemm` and :mod:`.compute`. The inputs and outputs live in
:mod:`.layout_types`.

What each stage holds and what its data-parallel groups move come from :mod:`.layout_zero`.

The peak of each stage is :func:`.peak.predict_peak`'s, in closed form (:func:`closed_peak`):
the planner's units are identical layers, so the largest moment of the timeline is known and
the cost does not grow with the layer count.
"""

from __future__ import annotations

import functools
import math

from . import activations as act
from . import comm
from .compute import ModelShape, Roofline, _compute_time, _mfu, _roofline
from .context import kv_bytes
from .gemm import elementwise_bytes, gemms_time, layer_gemms
from .layout_types import (
    AXES,
    ZERO_LAYOUTS,
    Candidate,
    Layout,
    Rejection,
    _inside,
    _Opts,
    activation_mode,
    inflight_chunks,
    recompute_scratch,
)
from .layout_zero import (
    _params_per_rank,
    _replicas_cap,
    _state_total,
    dp_groups,
    dp_seconds_bytes,
    stage_states,
)
from .memory import GB, get_recipe
from .peak import logits_workspace
from .pipeline import _bubble, idle_fraction


@functools.lru_cache(maxsize=4096)
def _layer_times(model: ModelShape, cl, t: int, c: int, b: int, ep: int, causal: bool,
                 sp: bool) -> tuple[float, float, float]:
    """(one layer's attention core, one layer, the whole head) forward seconds on one rank from
    the per-GEMM roofline and the element-wise bytes (:mod:`.gemm`)."""
    g = layer_gemms(model, t, c, b, ep)
    pk, bw, cap = cl.peak_flops, cl.hbm_bandwidth, cl.efficiency
    ew = elementwise_bytes(model, t, c, b, sp) if bw is not None else {"layer": 0, "attention": 0}
    ew_t = {k: x / bw for k, x in ew.items()} if bw is not None else ew
    attn = (0.5 if causal else 1.0) * gemms_time(g["attention"], pk, bw, cap) + ew_t["attention"]
    layer = gemms_time(g["weights"], pk, bw, cap) + ew_t["layer"] + attn
    return attn, layer, gemms_time(g["head"], pk, bw, cap)


@functools.lru_cache(maxsize=16384)
def _activations(s_loc: int, b: int, h: int, a: int, t: int, rc: str, sp: bool,
                 layer: tuple) -> tuple[float, float]:
    """(saved bytes per layer, recompute scratch) of one recompute mode (memoized: the same
    shard recurs across pipeline depths and interleavings)."""
    kw = dict(layer)
    a_l = act.activation_bytes_per_layer(s_loc, b, h, a, t, activation_mode(rc, sp), sp=sp, **kw)
    return a_l, recompute_scratch(s_loc, b, h, a, t, rc, sp, **kw)


def _collective(name, op, nbytes, d, count, link, hide, pk_f, eff) -> Roofline:
    """:func:`.compute.collective_roofline` (ring) without its checks, for the search."""
    time_, sent = comm._ring_collectives(op, nbytes, d, count, *link)
    return _roofline(name, time_, sent, hide, pk_f, eff, link[1])


@functools.lru_cache(maxsize=256)
def _kv_bytes(b, s, kv_heads, head_dim, q, t) -> float:
    return kv_bytes(b, s, kv_heads, head_dim, q, t)


def clear_caches() -> None:
    """Forget the memoized per-shard results (for timing a cold search)."""
    for f in (_layer_times, _state_total, _activations, _kv_bytes):
        f.cache_clear()


def closed_peak(persistent: float, activ: float, scratch: float, ws: float | None,
                unit: float = 0.0, grad: float = 0.0, units_alive: int = 0) -> tuple[float, dict]:
    """:func:`.peak.predict_peak` of the planner's layouts in closed form: (total, terms).

    Without gathered units (ZeRO-0/1/2) the timeline has one moment, the sum of the inputs.
    With ``n`` identical ZeRO-3 units, every activation alive, ``prefetch=1`` and the logits
    workspace at the last unit, the largest moment is the backward of the last unit: every
    activation, that unit's unsharded gradient, and ``units_alive`` gathered units (2, or 1
    when ``n = 1``; all ``n`` without resharding after forward). Every other moment holds no
    more of any term. ``tests/test_planner_search`` checks both against ``predict_peak``."""
    terms = {"persistent": persistent, "gathered_params": float(units_alive * unit),
             "unsharded_grads": grad if units_alive else 0.0, "activations": float(activ),
             "buffers": scratch}
    if ws is not None:
        terms["backward_workspace"] = ws
    return _closed_total(persistent, activ, scratch, ws, unit, grad, units_alive), terms


def _closed_total(persistent: float, activ: float, scratch: float, ws: float | None,
                  unit: float = 0.0, grad: float = 0.0, units_alive: int = 0) -> float:
    """``closed_peak(...)[0]`` without building the terms (the search compares many stages
    and splits and keeps few); the sum of the terms in their order."""
    total = (persistent + float(units_alive * unit) + (grad if units_alive else 0.0)
             + float(activ) + scratch)
    return total if ws is None else total + ws


def cost_layouts(model, cl, D, t, p, c, vv, ep, zeros, recs, o: _Opts, sp: bool = True,
                 replicas: tuple[int, ...] = ()) -> list:
    """Every (ZeRO, recompute) layout of one (D, t, p, c, v, ep, sp): candidates and rejections.

    ``zeros``: ZeRO stages 0-3, or ``(3, False)`` for ZeRO-3 without resharding after forward
    (every layer stays gathered from its forward to its backward; one all-gather per layer
    and microbatch instead of two), or ``(zero, reshard, replicas)`` for one hybrid-sharded
    layout: the stage's state sharded over ``D c / replicas`` ranks (their collectives on the
    shard group's link), the gradient shards all-reduced across ``replicas`` once per step.
    ``replicas``: the HSDP splits to search for every ZeRO-1/2/3 entry (pruned as
    :mod:`.layout_search` says)."""
    G, node, L, h = cl.gpus, cl.gpus_per_node, model.layers, model.hidden
    m = max(1, o.batch // (D * o.b))
    s_loc = model.seq_len // c
    # embedding_in_split: the embedding and the head count as one layer each in the stage
    # partition (Megatron's --account-for-embedding/loss-in-pipeline-split; Llama 3 removes one
    # layer from the first and the last stage), so those stages hold one layer fewer
    split = o.embedding_in_split and p > 1
    layers_rank = math.ceil((L + (2 if split else 0)) / (p * vv)) * vv  # busiest rank's slots
    st_layers = {0: layers_rank - split, p - 1: layers_rank - split}
    dense_l, exp_l = _params_per_rank(model, t, ep, layers_rank)
    rec_spec = get_recipe(o.recipe)
    budget = cl.gpu_memory * (1 - o.reserve)
    stages = ((0, "first"), (p - 1, "last")) if p > 1 else ((0, "first"),)
    edp = D * c * t // ep
    # ---- compute per microbatch on the busiest rank (ops split t ways, tokens c ways)
    f = 0.5 if o.causal else 1.0
    tokens = o.b * s_loc / t
    attn_tok = 4.0 * model.seq_len * h * f
    layer_fwd = 2.0 * model.layer_matmul_params + attn_tok
    fwd = (layers_rank * layer_fwd + 2.0 * model.vocab * h / p) * tokens
    pk_f = cl.peak_flops
    t_attn, t_layer, t_head = _layer_times(model, cl, t, c, o.b, ep, o.causal, sp)
    t_f = layers_rank * t_layer + t_head / p
    if split:  # the head runs on the last stage: the busier of it and a middle stage counts
        last = ((layers_rank - 1) * t_layer + t_head, ((layers_rank - 1) * layer_fwd
                                                       + 2.0 * model.vocab * h) * tokens)
        middle = (layers_rank * t_layer, layers_rank * layer_fwd * tokens) if p > 2 else (0, 0)
        t_f, fwd = max(last, middle)
    t_b = 2 * t_f
    eff = fwd / (t_f * pk_f)  # attained share of the peak, for the rooflines below
    # ---- traffic that does not depend on ZeRO or recompute
    count = layers_rank * m
    q = o.q
    cp_link = cl.link(_inside(t, c, node))
    pp_link = cl.link(_inside(t * c, p, node))
    dp_link = cl.link(_inside(t, c, node) and _inside(t * c * p, D, node))
    ep_link = cl.link((ep <= t * c or p == 1) and _inside(1, ep, node))
    # compute.collective_roofline through its unchecked cores: the same arithmetic and floats
    tp_r = _collective("tp", "all_reduce", o.b * s_loc * h * q, t, 4 * count, cl.link(True),
                       0.0, pk_f, eff)
    kv = _kv_bytes(o.b, model.seq_len, model.kv_heads, model.head_dim, q, t)
    cp_r = _collective("cp", "all_gather", kv, c, 3 * count, cp_link,
                       3 * attn_tok * tokens * count, pk_f, eff)
    a2a = model.top_k * max(1, round(tokens)) * h * q
    ep_r = _collective("ep", "all_to_all", a2a, ep, 4 * count if model.experts > 1 else 0,
                       ep_link, 0.0, pk_f, eff)
    pp_bytes = comm.pipeline_p2p_volume(o.b, s_loc, h, q, m, vv) / t if p > 1 else 0.0
    pp_time = comm.p2p_time(pp_bytes, *pp_link, messages=2 * m * vv)
    fill = 2 * (p * vv - 1)
    fill_time = comm.p2p_time(pp_bytes / (2 * m * vv) * fill, *pp_link, messages=fill)
    per_mb = (tp_r.exposed + ep_r.exposed + cp_r.exposed) / m
    idle = idle_fraction(p, m, vv)  # the same for every layout of this geometry
    n_tok = o.batch * model.seq_len
    model_flops = model.flops_per_token("step", o.causal) * n_tok
    # ---- per recompute mode: saved activations per layer, scratch, extra FLOPs and seconds
    per_rec = {}
    layer = tuple(model.activation_layer.items())  # Llama- or GPT-style (accounting.activations)
    for rc in recs:
        a_l, scratch = _activations(s_loc, o.b, h, model.heads, t, rc, sp, layer)
        r_flops = layers_rank * {"none": 0.0, "selective": attn_tok, "full": layer_fwd}[rc] * tokens
        t_r = layers_rank * {"none": 0.0, "selective": t_attn, "full": t_layer}[rc]
        hw = model_flops + model.recompute_flops_per_token(rc, o.causal) * n_tok
        per_rec[rc] = (a_l, scratch, r_flops, t_r, hw)
    held = {stage: inflight_chunks(p, m, vv, stage) for stage, _ in stages}
    ws = {stage: logits_workspace(o.b, s_loc, model.vocab // t, 4) if stage == p - 1 else None
          for stage, _ in stages}
    groups = dp_groups(model, D, c, t, p, ep, layers_rank, q)  # data-parallel (bytes, ranks)
    # per stage, the least activations and scratch of any recompute mode, with the workspace
    least_need = {stage: min(per_rec[rc][0] * st_layers[stage] / vv * held[stage] + per_rec[rc][1]
                             for rc in recs) + (ws[stage] or 0.0) for stage, _ in stages}
    in_node = _inside(t, c, node)
    out = []
    for zr in zeros:
        zero, reshard, given = (*zr, 1, 1)[:3] if isinstance(zr, tuple) else (zr, True, 1)
        layout_name = ZERO_LAYOUTS[zero]
        unit3 = ()  # ZeRO-3: one layer gathered at a time, one prefetched (closed_peak)
        if zero == 3:
            unit3 = (rec_spec.weights * (dense_l + exp_l), rec_spec.grads * (dense_l + exp_l),
                     min(layers_rank, 2) if reshard else layers_rank)
        hide_none = {0: 3 * fwd, 1: 3 * fwd, 2: fwd * (1 + 2 * m), 3: 3 * fwd * m}[zero]
        hidden = _compute_time(hide_none, pk_f, eff)  # the compute the traffic can hide behind
        # the data-parallel splits to cost: the given one, or plain ZeRO then HSDP's replicas
        # while each cuts the data-parallel time that is still exposed (layout_search), up to
        # the most replicas whose state can fit (cap): a split beyond it fits no recompute
        # mode, and the search below stops at the first split that does not fit
        splits, fastest = [], math.inf
        cap = _replicas_cap(model, cl, o, t, p, D * c, edp, st_layers, dense_l, exp_l,
                            layout_name, budget, least_need, unit3) if replicas and zero else 1
        for reps in ((given,) if given > 1 else (1, *(replicas if zero else ()))):
            if reps > 1 and reps > cap and given == 1:
                break
            if reps > 1 and ((D % reps) or (exp_l and edp % reps)):
                if given > 1:
                    out.append(Rejection(Layout(D, t, p, c, ep, zero, None, m, vv, sp, reshard,
                                                reps), "divisibility",
                                         f"replicas={reps} does not divide D={D}"
                                         + (f" and edp={edp}" if exp_l else "")))
                continue
            if splits and fastest <= hidden:
                break  # nothing exposed left to cut: more replicas only add state
            links = (dp_link,) if reps == 1 else (
                cl.link(in_node and _inside(t * c * p, D // reps, node)),
                cl.link(_inside(t * c * p * (D // reps), reps, node)))  # shard group, replicas
            dp_t, dp_b = dp_seconds_bytes(groups, zero, reshard, layers_rank, m, reps, links)
            if splits and dp_t >= fastest:
                continue
            fastest = min(fastest, dp_t)
            splits.append([reps, links, dp_t, dp_b, None, 0.0])  # the state: when first read

        def settled(split: list, name: str = layout_name) -> list:
            """The split with its state per stage and offload seconds (stage_states)."""
            if split[4] is None:
                split[4], split[5] = stage_states(model, cl, o, t, p, D * c // split[0],
                                                  edp // split[0], st_layers, dense_l, exp_l,
                                                  name)
            return split
        for rc in recs:
            a_l, scratch, r_flops, t_r, hw_flops = per_rec[rc]
            mb = 3 * fwd + r_flops  # one microbatch's compute
            hide = {0: mb, 1: mb, 2: fwd + m * (2 * fwd + r_flops), 3: m * mb}[zero]
            # plain ZeRO always; of HSDP's splits only the fastest that fits (the others are
            # slower and fit: pruned), none when none fits (plain, which holds less, is OOM).
            # A split's peak grows with its replicas (only the state changes), so the search
            # walks up from the fewest and stops at the first that does not fit.
            # (The peak never falls as replicas are added, so the first split that does not
            # fit is found by bisection: the same split as walking up, fewer states.)
            chosen = splits[:1]
            if given == 1:
                lo, hi = 1, len(splits)  # splits[lo - 1] fits (or is plain), splits[hi] not
                while lo < hi:
                    mid = (lo + hi) // 2
                    state = settled(splits[mid])[4]
                    total = max(_closed_total(state[stage], a_l * st_layers[stage] / vv
                                              * held[stage], scratch, ws[stage], *unit3)
                                for stage, _ in stages)
                    lo, hi = (mid + 1, hi) if total <= budget else (lo, mid)
                chosen += splits[lo - 1:lo] if lo > 1 else []
            for reps, links, dp_t, dp_b, state, offload_s in map(settled, chosen):
                lay = Layout(D, t, p, c, ep, zero, rc, m, vv, sp, reshard, reps)
                best = (-1.0, 0, "")
                for stage, sname in stages:
                    activ = a_l * st_layers[stage] / vv * held[stage]  # layers/chunk x chunks
                    total = _closed_total(state[stage], activ, scratch, ws[stage], *unit3)
                    if total > best[0]:
                        best = (total, stage, sname)
                peak, stage, sname = best
                if peak > budget:
                    out.append(Rejection(lay, "out of memory",
                                         f"out of memory by {(peak - budget) / GB:.1f} GB "
                                         f"({sname} stage {peak / GB:.1f} GB > budget "
                                         f"{budget / GB:.1f} GB)", peak - budget))
                    continue
                # the terms of the busiest stage only (the others are compared, not kept)
                activ = a_l * st_layers[stage] / vv * held[stage]
                terms = {("recompute_scratch" if k == "buffers" else k): x for k, x in
                         closed_peak(state[stage], activ, scratch, ws[stage], *unit3)[1].items()}
                rl = {"tp": tp_r, "cp": cp_r, "ep": ep_r,
                      "pp": _roofline("pp", pp_time, pp_bytes, m * mb, pk_f, eff, pp_link[1]),
                      "dp": _roofline("dp", dp_t, dp_b, hide, pk_f, eff, links[-1][1])}
                # accounting.pipeline.bubble_time's 1f1b / interleaved closed form
                bub = (_bubble(p, t_f + per_mb / 2, t_b + t_r + per_mb / 2, vv)
                       + (fill_time if p > 1 else 0.0))
                times = {"compute": m * (t_f + t_b), "recompute": m * t_r, "bubble": bub}
                times.update({f"exposed_{a}": rl[a].exposed for a in AXES})
                if o.offload:  # every candidate of an offloading plan has the term (0: none)
                    times["offload"] = offload_s
                step = sum(times.values())
                out.append(Candidate(lay, terms, peak, sname, budget, rl, times, step,
                                     _mfu(model_flops, step, G, pk_f), n_tok / step,
                                     idle, _mfu(hw_flops, step, G, pk_f), eff))
    return out


