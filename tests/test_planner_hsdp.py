"""Hybrid sharding (HSDP) in the planner: which replicas are searched, state, traffic, ranking.

Hand-worked case (``_CL``): 16 GPUs in nodes of 8, a GPT-style 1.4 B model (N = 1,414,103,040
parameters in the planner's count, which leaves out the final norm), ZeRO-2, D = 16 split as
2 replicas x 8 shards, m = 64 / 16 = 4 microbatches, q = 2 bytes per gradient element, so
nb = 2 N = 2,828,206,080 bytes. Per step a rank sends, ring model:

* 4 reduce-scatters of nb over the 8 ranks of its node: 4 x 7/8 nb,
* 1 all-gather of nb over the same 8 ranks: 7/8 nb,
* 1 all-reduce of its gradient shard nb / 8 across the 2 replicas: 2 x (nb / 8) x 1/2,

4.5 nb = 12,726,927,360 bytes; with alpha = 0 the first two run at 100 GB/s inside the node
and the last at 10 GB/s between nodes: 35/8 nb / 1e11 + nb / 8 / 1e10 = 0.159086592 s.
"""

from __future__ import annotations

import pytest
from shardlab.accounting import compute as C
from shardlab.accounting import planner as P
from shardlab.accounting.layout_types import hsdp_replicas

GPT_1B = dict(layers=24, hidden=2048, heads=16, kv_heads=16, ffn=8192, vocab=50304,
              seq_len=2048, gated=False)
_CL = dict(gpus=16, gpu_memory=80e9, gpus_per_node=8, alpha_intra=0.0, beta_intra=100e9,
           alpha_inter=0.0, beta_inter=10e9, peak_flops=1e15)
NB = 2 * 1_414_103_040


@pytest.mark.parametrize(
    "D, c, want",
    [
        (32, 1, [2, 4, 8, 16]),  # 32 replicas of one rank would be ZeRO-0: not a split
        (12, 1, [2, 3, 4, 6]),  # odd factors too
        (4, 2, [2, 4]),  # four replicas of the 2 context ranks each
        (1, 1, []),
    ],
)
def test_hsdp_replicas_hand_cases(D, c, want):
    assert hsdp_replicas(D, c) == want


def _hsdp(zero=2, reshard=True, replicas=2, D=16):
    return P.Layout(D, 1, 1, 1, 1, zero, "none", 64 // D, 1, True, reshard, replicas)


def test_hsdp_traffic_is_the_hand_worked_count():
    cand = P.evaluate(C.ModelShape(**GPT_1B), P.Cluster(**_CL), _hsdp(), 64)
    assert isinstance(cand, P.Candidate)
    assert cand.comm["dp"].bytes_sent == 4.5 * NB == 12_726_927_360
    assert cand.comm["dp"].comm_time == pytest.approx(35 / 8 * NB / 1e11 + NB / 8 / 1e10,
                                                      rel=1e-12)
    assert "hsdp×2" in cand.layout.label


def test_hsdp_state_is_the_shard_groups_state():
    """Two replicas of 8 shards hold per rank exactly what ZeRO over 8 ranks holds."""
    model = C.ModelShape(**GPT_1B)
    for zero, reshard in ((1, True), (2, True), (3, True), (3, False)):
        hs = P.evaluate(model, P.Cluster(**_CL), _hsdp(zero, reshard), 64)
        flat8 = P.evaluate(model, P.Cluster(**{**_CL, "gpus": 8}),
                           P.Layout(8, 1, 1, 1, 1, zero, "none", 4, 1, True, reshard), 32)
        flat16 = P.evaluate(model, P.Cluster(**_CL), _hsdp(zero, reshard, 1), 64)
        assert hs.memory["persistent"] == flat8.memory["persistent"]
        assert hs.memory["persistent"] > flat16.memory["persistent"]


def test_zero3_hsdp_all_reduces_once_per_layer_and_step():
    model = C.ModelShape(**GPT_1B)
    hs = P.evaluate(model, P.Cluster(**_CL), _hsdp(3), 64)
    flat = P.evaluate(model, P.Cluster(**_CL), _hsdp(3, replicas=1), 64)
    # ZeRO-3 over 8 instead of 16: 4 microbatches x (2 gathers + 1 reduce-scatter) of nb x 7/8,
    # plus the replicas' all-reduce of nb / 8 (the per-layer split keeps the bytes)
    assert hs.comm["dp"].bytes_sent == pytest.approx(12 * NB * 7 / 8 + NB / 8, rel=1e-12)
    assert flat.comm["dp"].bytes_sent == pytest.approx(12 * NB * 15 / 16, rel=1e-12)


def test_plan_ranks_hsdp_first_where_inter_node_links_are_slow():
    """256 GPUs in nodes of 8 at 50 GB/s between nodes: sharding inside a node and replicating
    across leaves no gradient traffic exposed, and the planner prefers it."""
    model = C.ModelShape(**GPT_1B)
    cl = P.Cluster(**{**P.LLAMA3_CLUSTER, "gpus": 256})
    with_h = P.plan(model, cl, 512)
    best = with_h.feasible[0]
    assert best.layout.replicas == 32 and best.layout.zero in (1, 2, 3)
    without = P.plan(model, cl, 512, hsdp=False)
    assert all(c.layout.replicas == 1 for c in without.feasible)
    assert best.step_time < without.feasible[0].step_time
    assert with_h.find(replicas=32, zero=3)  # every ZeRO stage is costed hybrid-sharded


@pytest.mark.parametrize(
    "layout, needle",
    [
        (_hsdp(0), "replicas=2 needs zero 1, 2 or 3"),
        (_hsdp(replicas=3), "replicas=3 must divide D=16"),
        (_hsdp(replicas=0), "replicas=0 must be"),
    ],
)
def test_bad_hsdp_layouts_get_one_sentence(layout, needle):
    with pytest.raises(ValueError, match=needle):
        P.evaluate(C.ModelShape(**GPT_1B), P.Cluster(**_CL), layout, 64)
