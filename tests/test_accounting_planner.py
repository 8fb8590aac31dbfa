"""accounting.planner: Llama 3 placed, every number rebuilt from the other accounting modules."""

from __future__ import annotations

import functools
import math

import pytest
from shardlab.accounting import activations as act
from shardlab.accounting import comm, context, expert, memory, peak, pipeline
from shardlab.accounting import compute as C
from shardlab.accounting import planner as P


def llama(key: str):
    cfg = P.LLAMA3_CONFIGS[key]
    model = C.ModelShape(**{**C.LLAMA3_405B, "seq_len": cfg["seq_len"]})
    return model, P.Cluster(**P.LLAMA3_CLUSTER), cfg


@functools.cache
def cached_plan(key: str) -> P.Plan:
    model, cluster, cfg = llama(key)
    return P.plan(model, cluster, cfg["global_batch"])


@pytest.fixture(params=["8k", "128k"])
def llama_plan(request):
    return cached_plan(request.param), P.LLAMA3_CONFIGS[request.param]


def test_llama3_meshes_are_feasible_and_explained(llama_plan):
    pl, cfg = llama_plan
    found = pl.find(**cfg["layout"])
    assert found, pl.find_rejected(**cfg["layout"])
    best = found[0]
    assert best.peak <= best.budget
    rank = pl.rank_of(best)
    assert 1 <= rank <= len(pl.feasible)
    text = pl.explain(best)
    assert f"ranks {rank} of {len(pl.feasible)}" in text
    assert pl.feasible[0].layout.label in text
    # what ranks above it is faster by the sum of the term differences
    diff = pl.compare(pl.feasible[0], best)
    assert sum(diff.values()) == pytest.approx(best.step_time - pl.feasible[0].step_time)
    # the variants of the mesh that are not feasible say why
    reasons = {r.reason for r in pl.find_rejected(**cfg["layout"])}
    assert {"bubble too large", "out of memory"} <= reasons


def test_ranked_by_step_time(llama_plan):
    pl, _ = llama_plan
    times = [c.step_time for c in pl.feasible]
    assert times == sorted(times)
    for c in pl.feasible[:20]:
        assert c.step_time == pytest.approx(sum(c.times.values()))
        assert c.peak == pytest.approx(sum(c.memory.values()))
        assert c.layout.D * c.layout.t * c.layout.p * c.layout.c == 16384


def _rebuild(model, cluster, lay, batch, q=2, b=1):
    """Peak, per-axis bytes and MFU of one layout from the other accounting modules."""
    s_loc = model.seq_len // lay.c
    L_rank = math.ceil(model.layers / (lay.p * lay.v)) * lay.v
    layout = P.ZERO_LAYOUTS[lay.zero]
    mode = P.RECOMPUTE_MODES[lay.recompute]
    layer = model.activation_layer
    # sequence parallelism splits full recomputation's kept input t ways (issue 25, item 2)
    a_l = act.activation_bytes_per_layer(s_loc, b, model.hidden, model.heads, lay.t, mode,
                                         sp=lay.sp, **layer)
    kept = act.activation_bytes_per_layer(s_loc, b, model.hidden, model.heads, lay.t, "tp_sp",
                                          **layer)
    scratch = {"none": 0.0, "selective": kept - a_l, "full": kept}[lay.recompute]
    per_layer = (model.layer_params) / lay.t
    rec = memory.get_recipe("mixed-adam-16")
    peaks = []
    for stage in {0, lay.p - 1}:
        n = L_rank * per_layer + (model.embedding_params / lay.t if stage == 0 else 0)
        n += model.head_params / lay.t if stage == lay.p - 1 else 0
        state = memory.model_state(round(n), lay.D * lay.c // lay.replicas, layout).total
        units = [rec.weights * per_layer] * L_rank if lay.zero == 3 else []
        grads = [rec.grads * per_layer] * L_rank if lay.zero == 3 else None
        held = pipeline.simulate(pipeline.schedule("interleaved" if lay.v > 1 else "1f1b", lay.p,
                                                   lay.m, lay.v), lay.p).peak_inflight[stage]
        ws = None
        if stage == lay.p - 1:
            ws = peak.logits_workspace(b, s_loc, model.vocab // lay.t, 4)
        pk = peak.predict_peak(state, units, a_l * (L_rank // lay.v) * held, scratch, prefetch=1,
                               grad_unit_bytes=grads, backward_workspace_bytes=ws,
                               reshard_after_forward=lay.reshard)
        peaks.append(pk.total)
    sync = lay.zero in (2, 3)
    n_dense = L_rank * per_layer + 2 * model.vocab * model.hidden / (lay.t * lay.p)
    shard = lay.D * lay.c // lay.replicas  # HSDP: ZeRO over the shard group, then the
    across = (comm.sent_bytes("all_reduce", q * round(n_dense) / shard, lay.replicas)
              if lay.replicas > 1 else 0.0)  # gradient shard all-reduced across the replicas
    return {
        "peak": max(peaks),
        "tp": comm.tp_volume(b, s_loc, model.hidden, lay.t, q, L_rank, sp=True,
                             microbatches=lay.m),
        "cp": context.cp_volume(b, model.seq_len, model.kv_heads, model.head_dim, lay.c, q,
                                lay.t, layers=L_rank, microbatches=lay.m),
        "pp": (comm.pipeline_p2p_volume(b, s_loc, model.hidden, q, lay.m, lay.v) / lay.t
               if lay.p > 1 else 0.0),  # one stage sends nothing
        "dp": comm.grad_accum_volume(layout, round(n_dense), shard, q, lay.m, sync,
                                     lay.reshard) + across,
    }


@pytest.mark.parametrize("zero", [0, 1, 2, 3])
@pytest.mark.parametrize("key", ["8k", "128k"])
def test_numbers_equal_the_accounting_modules(key, zero):
    model, cluster, cfg = llama(key)
    pl = cached_plan(key)
    cands = [c for c in pl.feasible if c.layout.zero == zero][:3] + pl.find(**cfg["layout"],
                                                                             zero=zero)[:2]
    assert cands
    for c in cands:
        want = _rebuild(model, cluster, c.layout, cfg["global_batch"])
        assert c.peak == pytest.approx(want["peak"], rel=1e-9), c.layout.label
        for axis in ("tp", "cp", "pp"):
            assert c.comm[axis].bytes_sent == pytest.approx(want[axis], rel=1e-12), axis
        # the dense parameters are rounded to whole parameters in the rebuild only
        assert c.comm["dp"].bytes_sent == pytest.approx(want["dp"], rel=1e-9)
        flops = model.flops_per_token("step", causal=True) * cfg["global_batch"] * model.seq_len
        assert c.mfu == pytest.approx(C.mfu(flops, c.step_time, 16384, cluster.peak_flops))


def test_inflight_chunks_equal_the_simulator():
    for p in (1, 2, 4, 8):
        for m in (1, 4, 8, 16):
            for v in (1, 2, 4):
                if v > 1 and (p == 1 or m % p):
                    continue
                kind = "interleaved" if v > 1 else "1f1b"
                sim = pipeline.simulate(pipeline.schedule(kind, p, m, v), p).peak_inflight
                assert [P.inflight_chunks(p, m, v, r) for r in range(p)] == list(sim)


def test_each_rejection_reason_appears():
    model, cluster, cfg = llama("8k")
    pl = cached_plan("8k")
    counts = pl.rejected_counts()
    assert all(counts[r] > 0 for r in P.REASONS), counts
    beyond = pl.find_rejected(t=16)
    assert beyond and all(r.reason == "t beyond a node" for r in beyond)
    oom = [r for r in pl.rejected if r.reason == "out of memory"]
    for r in oom[:50]:
        assert r.over_bytes > 0 and f"out of memory by {r.over_bytes / 1e9:.1f} GB" in r.detail
    stages = [r for r in pl.rejected if r.reason == "too many stages"]
    # every p > L of a (t, c) is one family rejection (p = None); p*v > L cannot be generated
    # (v <= L/p), so evaluate() shows that reason
    assert stages and all(r.layout.p is None and "> layers=126" in r.detail for r in stages)
    rj = P.evaluate(model, cluster, P.Layout(128, 8, 16, 1, 1, 1, "full", 16, 8), 2048)
    assert rj.reason == "too many stages" and "p*v = 16*8 = 128" in rj.detail
    bubble = [r for r in pl.rejected if r.reason == "bubble too large"]
    assert all(pipeline.idle_fraction(r.layout.p, r.layout.m, r.layout.v) > 0.25 for r in bubble)


def test_evaluate_matches_plan_and_checks_one_layout():
    model, cluster, cfg = llama("8k")
    pl = cached_plan("8k")
    c = pl.find(**cfg["layout"])[0]
    again = P.evaluate(model, cluster, c.layout, cfg["global_batch"])
    assert again.step_time == c.step_time and again.peak == c.peak
    rj = P.evaluate(model, cluster, P.Layout(128, 8, 16, 1, 1, 1, "none", 16, 4), 2048)
    assert isinstance(rj, P.Rejection) and rj.reason == "out of memory"
    rj = P.evaluate(model, cluster, P.Layout(64, 16, 16, 1, 1, 1, "full", 32, 4), 2048)
    assert rj.reason == "t beyond a node"
    with pytest.raises(ValueError, match="m=7"):
        P.evaluate(model, cluster, P.Layout(128, 8, 16, 1, 1, 1, "full", 7, 4), 2048)


def test_tensor_parallel_traffic_is_exposed_and_data_parallel_can_hide():
    model, cluster, cfg = llama("8k")
    c = cached_plan("8k").find(**cfg["layout"])[0]
    assert c.comm["tp"].exposed == c.comm["tp"].comm_time > 0  # on the critical path
    assert c.comm["dp"].overlap > 0.9  # the gradient reduction hides behind backward


def test_moe_plan_uses_expert_all_to_all():
    model = C.ModelShape(8, 1024, 16, 4, 1024, 32000, 2048, experts=8, top_k=2)
    cluster = P.Cluster(64, 80e9, 8, 3e-6, 300e9, 10e-6, 50e9, 989e12)
    pl = P.plan(model, cluster, 256)
    ep = [c for c in pl.feasible if c.layout.ep > 1]
    assert ep
    c = ep[0]
    lay = c.layout
    L_rank = math.ceil(8 / (lay.p * lay.v)) * lay.v
    tokens = (2048 // lay.c) // lay.t
    per = expert.expected_a2a_sent_bytes(tokens, 2, 1024, 2, lay.ep, backward=True)
    assert c.comm["ep"].bytes_sent == pytest.approx(per * L_rank * lay.m)
    assert all(r.reason == "divisibility" for r in pl.rejected if r.layout.ep == 16)


def test_search_is_bounded():
    """Rejections cover whole families (``None`` fields) and the pruning of
    ``accounting.layout_search`` keeps the divisor search to a few thousand layout evaluations
    on 16,384 GPUs (the timed bound is in tests/test_planner_search.py). HSDP adds at most one
    layout per plain ZeRO-1/2/3 layout (the fastest split that fits): 1,625 of them here."""
    model, cluster, cfg = llama("8k")
    pl = cached_plan("8k")
    plain = [c for c in pl.feasible if c.layout.replicas == 1]
    assert len(pl.feasible) - len(plain) <= len([c for c in plain if c.layout.zero])
    assert len(plain) + len(pl.rejected) < 6000


@pytest.mark.parametrize(
    "kwargs, needle",
    [
        ({"global_batch": 0}, "global_batch=0"),
        ({"reserve": 1.0}, "reserve=1.0"),
        ({"recipe": "fp8"}, "recipe='fp8'"),
        ({"microbatch": -1}, "microbatch=-1"),
        ({"max_cp": 0}, "max_cp=0"),
    ],
)
def test_bad_plan_input(kwargs, needle):
    model, cluster, cfg = llama("8k")
    args = {"global_batch": cfg["global_batch"], **kwargs}
    with pytest.raises(ValueError) as exc:
        P.plan(model, cluster, **args)
    assert needle in str(exc.value)


@pytest.mark.parametrize(
    "kwargs, needle",
    [
        ({"gpus": 0}, "gpus=0"),
        ({"efficiency": 1.5}, "efficiency=1.5"),
        ({"beta_inter": 0}, "beta_inter=0"),
        ({"gpus": 20, "gpus_per_node": 8}, "gpus_per_node=8 does not divide gpus=20"),
    ],
)
def test_bad_cluster(kwargs, needle):
    with pytest.raises(ValueError) as exc:
        P.Cluster(**{**P.LLAMA3_CLUSTER, **kwargs})
    assert needle in str(exc.value)


def test_no_feasible_layout_is_an_answer_not_an_error():
    model, _, cfg = llama("8k")
    tiny = P.Cluster(**{**P.LLAMA3_CLUSTER, "gpus": 8})
    pl = P.plan(model, tiny, 8)
    assert pl.feasible == () and pl.rejected_counts()["out of memory"] > 0
