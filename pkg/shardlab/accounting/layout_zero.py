"""ZeRO and data parallelism of one planner layout: what each pipeline stage holds and what
its data-parallel groups move per step.

Split off :mod:`.layout_cost` (the planner's engine) to keep each module short; the search
(:mod:`.layout_cost`, :mod:`.layout_floors`) calls these per geometry.

* Held: a rank's parameters per layer (dense over ``t``, experts over ``ep``); per stage its
  layers plus the embedding (first stage) and the head (last); the persistent model state of
  ZeRO stage ``zero`` over the ``dp`` ranks that hold the same dense weights (experts over
  ``edp``), from :func:`.memory.model_state`; with ZeRO-Offload the optimizer side on the host
  (:func:`.hierarchical.offload_step`); and the most HSDP replicas whose state still fits.
* Moved, per step and data-parallel group of ``nb`` bytes (ring collectives, :mod:`.comm`):
  ZeRO-0 one all-reduce of ``nb``; ZeRO-1 one reduce-scatter and one all-gather of ``nb``;
  ZeRO-2 a reduce-scatter per microbatch and one all-gather; ZeRO-3 per layer and microbatch
  one all-gather (two when resharding after forward) and one reduce-scatter of that layer's
  bytes; with HSDP the shard group runs those over ``g / replicas`` ranks and each rank
  all-reduces its gradient shard across the replicas once per step
  (:func:`.hierarchical._replicate_traffic`).
"""

from __future__ import annotations

import functools
import math

from . import comm, hierarchical
from .compute import ModelShape
from .layout_types import _Opts
from .memory import get_recipe, model_state


def _params_per_rank(model: ModelShape, t: int, ep: int, layers_rank: int):
    """(dense params per layer on a rank, expert params per layer on a rank)."""
    dense = model.attn_params + model.router_params + 2 * model.hidden
    if model.experts == 1:
        return (dense + model.mlp_params) / t, 0.0
    return dense / t, model.experts * model.mlp_params / ep


@functools.lru_cache(maxsize=65536)
def _state_total(n: int, dp: int, layout: str, recipe) -> float:
    return model_state(n, dp, layout, recipe).total


def _offloaded(n: int, dp: int, o: _Opts, cl) -> hierarchical.Offload:
    """ZeRO-Offload of this rank's ``n`` parameters sharded ``dp`` ways
    (:func:`.hierarchical.offload_step`, with the recipe's master + moment bytes on the host):
    ``host_bytes`` leave the device, ``added_seconds`` (PCIe both ways, the update at host
    speed instead of device speed) join the step, not overlapped -- the bound of a run that
    does not hide them behind the backward."""
    rec = get_recipe(o.recipe)
    return hierarchical.offload_step(n, dp, o.pcie_bandwidth, o.host_bandwidth,
                                     cl.hbm_bandwidth or 3e12,
                                     host_bytes_per_param=rec.master + rec.moment1 + rec.moment2)


def stage_params(model, t: int, p: int, st_layers: dict, dense_l: float, exp_l: float
                 ) -> dict[int, tuple[int, int]]:
    """(dense, expert) parameters each stage of ``st_layers`` holds: its layers, the embedding
    on the first stage, the head (and with tied embeddings under pipelining a copy of the
    embedding) on the last."""
    out = {}
    for stage in st_layers:
        n_dense = st_layers[stage] * dense_l + (model.embedding_params / t if stage == 0 else 0)
        if stage == p - 1:  # the head, or with tied embeddings a copy of the embedding
            tied_copy = model.embedding_params if model.tied_embeddings and p > 1 else 0
            n_dense += (model.head_params + tied_copy) / t
        out[stage] = (max(1, round(n_dense)), round(st_layers[stage] * exp_l) if exp_l else 0)
    return out


def stage_states(model, cl, o: _Opts, t: int, p: int, dp: int, edp: int, st_layers: dict,
                 dense_l: float, exp_l: float, layout_name: str) -> tuple[dict, float]:
    """(persistent state on the device per stage of ``st_layers``, seconds ZeRO-Offload adds
    to the step: the busier stage's) of ZeRO ``layout_name`` over ``dp`` ranks (experts over
    ``edp``) for the parameters of :func:`stage_params`."""
    state = {}
    offload_s = 0.0
    for stage, (n_dense, n_exp) in stage_params(model, t, p, st_layers, dense_l, exp_l).items():
        parts = [(n_dense, dp)] + ([(n_exp, edp)] if exp_l else [])
        state[stage] = sum(_state_total(n, d, layout_name, o.recipe) for n, d in parts)
        if o.offload and layout_name in ("zero1", "zero2"):  # the optimizer side on the host
            off = [_offloaded(n, d, o, cl) for n, d in parts]
            state[stage] -= sum(y.host_bytes for y in off)
            offload_s = max(offload_s, sum(y.added_seconds for y in off))
    return state, offload_s


def _replicas_cap(model, cl, o: _Opts, t: int, p: int, dp: int, edp: int, st_layers: dict,
                  dense_l: float, exp_l: float, layout_name: str, budget: float,
                  least_need: dict, unit3: tuple) -> float:
    """The most HSDP replicas ``R`` whose state may fit beside ``least_need`` (a stage's least
    activations, scratch and workspace) and ZeRO-3's gathered layers, 1.000001 times the
    budget allowed against rounding: :func:`.memory.model_state` shards the state ``dp / R``
    ways, so a stage holds ``rep + (one - rep) R`` (``one``: at ``R = 1``, ``rep``: the
    replicated part); no recompute mode fits a split with more replicas."""
    one, _ = stage_states(model, cl, o, t, p, dp, edp, st_layers, dense_l, exp_l, layout_name)
    rep, _ = stage_states(model, cl, o, t, p, 2**52, 2**52, st_layers, dense_l, exp_l,
                          layout_name)
    extra = (unit3[2] * unit3[0] + unit3[1]) if unit3 else 0.0
    cap = math.inf
    for stage in one:
        grows = one[stage] - rep[stage]
        room = budget * 1.000001 - one[stage] - extra - least_need[stage]
        if grows > 0:
            cap = min(cap, 1 + room / grows)
    return cap


def dp_groups(model, D, c, t, p, ep, layers_rank, q) -> list[tuple[float, int]]:
    """``(bytes, ranks)`` of the data-parallel groups: a rank's dense weights (its layers and
    its share of the embedding and the head) over the ``D c`` ranks that hold the same dense
    weights, its experts over the ``edp`` ranks of the same experts."""
    dense_l, exp_l = _params_per_rank(model, t, ep, layers_rank)
    dense = layers_rank * dense_l + (model.embedding_params + model.head_params) / (t * p)
    groups = [(q * dense, D * c)]
    if exp_l:
        groups.append((q * (layers_rank * exp_l), D * c * t // ep))
    return groups


def dp_ops(zero: int, reshard: bool, nb: float, layers_rank: int, m: int):
    """The ring collectives ``(op, bytes each, count)`` of one group of ``nb`` bytes per step
    under ZeRO ``zero``, and how many all-reduces carry its shard across HSDP replicas."""
    ops = {0: [("all_reduce", nb, 1)],
           1: [("reduce_scatter", nb, 1), ("all_gather", nb, 1)],
           2: [("reduce_scatter", nb, m), ("all_gather", nb, 1)],
           3: [("all_gather", nb / layers_rank, (2 if reshard else 1) * m * layers_rank),
               ("reduce_scatter", nb / layers_rank, m * layers_rank)]}[zero]
    return ops, (layers_rank if zero == 3 else 1)


def dp_seconds_bytes(groups, zero: int, reshard: bool, layers_rank: int, m: int,
                     replicas: int, links) -> tuple[float, float]:
    """(seconds, bytes) per step of the gradient reduction and ZeRO gathers of the ``groups``
    (:func:`dp_groups`).

    ``links``: ``((alpha, beta),)``, or with ``replicas > 1`` (HSDP) the shard group's and the
    replicas' links: the ZeRO collectives run over ``g / replicas`` ranks, then each rank
    all-reduces its gradient shard (``1 / (g / replicas)`` of the gradients) across the
    ``replicas`` once per step (ZeRO-3: one all-reduce per layer)."""
    total_t = total_b = 0.0
    for nb, g in groups:
        g //= replicas
        ops, k = dp_ops(zero, reshard, nb, layers_rank, m)
        for op, each, count in ops:  # comm.collectives_time and comm.sent_bytes, ring
            op_t, op_b = comm._ring_collectives(op, each, g, count, *links[0])
            total_t += op_t
            total_b += op_b
        if replicas > 1:  # the shard of the gradients, across the replicas, once per step
            rep_t, rep_b = hierarchical._replicate_traffic(nb, g, replicas, k, *links[1])
            total_t, total_b = total_t + rep_t, total_b + rep_b
    return total_t, total_b
