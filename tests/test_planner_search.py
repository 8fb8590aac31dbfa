"""The planner's divisor search (issue 25, item 1): hand-worked divisors and interleavings,
clusters with odd factors and the layouts published for them, the first choice never slower
than another feasible layout, the closed-form peaks, the time bound and the refusals."""

from __future__ import annotations

import itertools
import random
import time

import pytest
from shardlab.accounting import compute as C
from shardlab.accounting import gemm, layout_cost, layout_search
from shardlab.accounting import planner as P
from shardlab.accounting.peak import predict_peak

A100 = gemm.DEVICES["a100-80gb"]


def a100_cluster(gpus: int) -> P.Cluster:
    """A100 80 GB servers of 8 (NVLink 300 GB/s, 25 GB/s per GPU across servers)."""
    return P.Cluster(gpus, A100.memory, 8, 5e-6, 300e9, 10e-6, 25e9, A100.peak_flops,
                     hbm_bandwidth=A100.hbm_bandwidth)


def gpt(layers: int, hidden: int, heads: int, vocab: int = 51200) -> C.ModelShape:
    """A GPT-style layer (GeLU MLP of 4h, dropout, LayerNorm), tied embeddings, s = 2048."""
    return C.ModelShape(layers, hidden, heads, heads, 4 * hidden, vocab, 2048, gated=False,
                        dropout=True, norm="layernorm", tied_embeddings=True)


def test_divisors_by_hand():
    assert P.divisors(1) == [1]
    assert P.divisors(384) == [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 384]
    assert len(P.divisors(2240)) == 7 * 2 * 2  # 2^6 * 5 * 7
    assert P.divisors(2520)[:12] == [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 12, 14]
    assert P.divisors(16384) == [2**k for k in range(15)]


def test_chunk_counts_by_hand():
    """126 layers on 16 stages: chunk sizes ceil(126 / (16 v)) = 8, 4, 3, 2 for v = 1..4, and
    v = 5..7 repeat the size 2 (pruned); 105 layers on 35 stages: 3, 2, 1 layers per chunk."""
    assert layout_search.chunk_counts(126, 16) == [1, 2, 3, 4]
    assert layout_search.chunk_counts(105, 35) == [1, 2, 3]
    assert layout_search.chunk_counts(8, 1) == [1]
    # every chunk size of v = 1..L/p appears once, with its smallest v
    for L, p in ((126, 2), (96, 8), (500, 3)):
        vs = layout_search.chunk_counts(L, p)
        sizes = {-(-L // (p * v)) for v in range(1, L // p + 1)}
        assert sorted({-(-L // (p * v)) for v in vs}) == sorted(sizes)
        assert all(-(-L // (p * v)) < -(-L // (p * (v - 1))) for v in vs[1:])


# (model, GPUs, global batch, the published mesh): sizes with odd factors
ODD = {
    "384 GPUs (176B GPT, t4 p12 D8)": (gpt(70, 14336, 112, 250880), 384, 2048,
                                       dict(t=4, p=12, D=8, c=1)),
    "2240 GPUs (530B GPT, t8 p35 D8)": (gpt(105, 20480, 128), 2240, 1920,
                                        dict(t=8, p=35, D=8, c=1)),
    "2520 GPUs (530B GPT, t8 p35 D9 v3)": (gpt(105, 20480, 128), 2520, 2520,
                                           dict(t=8, p=35, D=9, c=1, v=3)),
}


@pytest.mark.parametrize("name", list(ODD))
def test_odd_cluster_sizes_have_feasible_layouts_including_the_published_one(name):
    model, gpus, batch, mesh = ODD[name]
    pl = P.plan(model, a100_cluster(gpus), batch)
    assert pl.feasible, pl.rejected_counts()
    found = pl.find(**mesh)
    assert found, {r.detail for r in pl.find_rejected(**mesh)}
    # the first choice is never slower, by the planner's own model, than any feasible layout
    first = pl.feasible[0]
    assert all(first.step_time <= c.step_time for c in pl.feasible)
    for c in found[:5]:
        again = P.evaluate(model, a100_cluster(gpus), c.layout, batch)
        assert again.step_time == c.step_time and first.step_time <= again.step_time


def test_sp_off_is_pruned_only_where_it_cannot_win():
    """Where t divides s/c, SP off has the same FLOPs and collective time, more element-wise
    traffic and no fewer saved bytes (module docstring of layout_search): forcing it off never
    gives a faster first choice, and every SP-off layout has a twin with SP at least as good."""
    model, gpus, batch, _ = ODD["2240 GPUs (530B GPT, t8 p35 D8)"]
    auto = P.plan(model, a100_cluster(gpus), batch)
    off = P.plan(model, a100_cluster(gpus), batch, sp=False)
    assert all(c.layout.sp is False or c.layout.t == 1 for c in off.feasible)
    assert auto.feasible[0].step_time <= off.feasible[0].step_time
    for c in off.feasible[:20]:
        twin = auto.find(**{k: getattr(c.layout, k) for k in P.FIELDS if k != "sp"})
        if twin:
            assert twin[0].step_time <= c.step_time and twin[0].peak <= c.peak


def test_closed_form_peaks_equal_predict_peak():
    """layout_cost.closed_peak is predict_peak's largest moment for the planner's inputs:
    no units, or n identical ZeRO-3 units with one prefetched (resharded or kept)."""
    rng = random.Random(25)
    for _ in range(400):
        st, act, scr = (rng.uniform(0, 1e10) for _ in range(3))
        ws = rng.choice([None, rng.uniform(0, 1e9)])
        total, terms = layout_cost.closed_peak(st, act, scr, ws)
        pk = predict_peak(st, [], act, scr, backward_workspace_bytes=ws)
        assert total == pytest.approx(pk.total) and terms == pytest.approx(pk.terms)
        n, unit, grad = rng.randint(1, 40), rng.uniform(0, 1e9), rng.uniform(0, 1e9)
        for reshard in (True, False):
            alive = min(n, 2) if reshard else n
            total, terms = layout_cost.closed_peak(st, act, scr, ws, unit, grad, alive)
            pk = predict_peak(st, [unit] * n, act, scr, prefetch=1, grad_unit_bytes=[grad] * n,
                              backward_workspace_bytes=ws, reshard_after_forward=reshard)
            assert total == pytest.approx(pk.total, rel=1e-12)
            assert terms == pytest.approx(pk.terms, rel=1e-12)


def test_16384_gpus_search_under_two_seconds():
    """Llama 3 405B at 8K on 16,384 GPUs, cold caches, CPU time of this process (the issue's
    bound: 2 s on a 2-core machine)."""
    model = C.ModelShape(**C.LLAMA3_405B)
    cluster = P.Cluster(**P.LLAMA3_CLUSTER)
    layout_cost.clear_caches()
    start = time.process_time()
    pl = P.plan(model, cluster, 2048)
    spent = time.process_time() - start
    assert spent < 2.0, spent
    assert len(pl.feasible) > 100


@pytest.mark.parametrize(
    "change, needle",
    [
        ({"layers": 100_000}, "layers=100,000: the planner searches models of at most 1,024"),
        ({"layers": 3000}, "layers=3,000: the planner searches models of at most 1,024"),
        ({"layers": 10**9}, "at most 1,024 layers"),
        ({"seq_len": 2**41}, "beyond what the planner costs"),
    ],
)
def test_huge_models_are_refused_at_once(change, needle):
    model = C.ModelShape(**{**C.LLAMA3_405B, **change})
    start = time.process_time()
    with pytest.raises(ValueError, match=needle.replace("+", r"\+")):
        P.plan(model, P.Cluster(**P.LLAMA3_CLUSTER), 2048)
    assert time.process_time() - start < 0.1


def test_huge_clusters_are_refused_and_big_ones_answered():
    model = C.ModelShape(**C.LLAMA3_405B)
    with pytest.raises(ValueError, match="at most 2,097,152 GPUs"):
        P.plan(model, P.Cluster(**{**P.LLAMA3_CLUSTER, "gpus": 2**22}), 2048)
    start = time.process_time()
    pl = P.plan(model, P.Cluster(**{**P.LLAMA3_CLUSTER, "gpus": 1_441_440}), 2880)  # 288 divisors
    assert time.process_time() - start < 2.0
    assert pl.feasible or pl.rejected


@pytest.mark.parametrize(
    "kwargs, needle",
    [({"max_bubble": 2}, "max_bubble=2 must be an idle fraction in [0, 1]"),
     ({"max_bubble": -0.1}, "max_bubble=-0.1 must be >= 0"),
     ({"sp": 1}, "sp=1 must be True or False")],
)
def test_bad_search_options(kwargs, needle):
    with pytest.raises(ValueError) as exc:
        P.plan(C.ModelShape(**C.LLAMA3_405B), P.Cluster(**P.LLAMA3_CLUSTER), 2048, **kwargs)
    assert needle in str(exc.value)


def test_pruning_loses_no_faster_layout_brute_force():
    """A 12-layer model on 24 GPUs (an odd factor): evaluate() every layout the pruned search
    skips or keeps (every divisor, every v up to L/p, SP on and off, ZeRO-3 kept or resharded,
    every HSDP split of the data axis):
    none that is feasible is faster than plan()'s first choice, and every feasible layout
    plan() keeps is among them with the same step time."""
    model = C.ModelShape(12, 1024, 8, 8, 4096, 32000, 2048, gated=False, dropout=True,
                         norm="layernorm")
    cluster = P.Cluster(24, 8e9, 8, 5e-6, 300e9, 10e-6, 25e9, 312e12, hbm_bandwidth=2039e9)
    batch = 48
    pl = P.plan(model, cluster, batch)
    first = pl.feasible[0]
    seen = {}
    for t in P.divisors(24):
        for c in P.divisors(24 // t):
            for p in P.divisors(24 // (t * c)):
                D = 24 // (t * c * p)
                if batch % D:
                    continue
                zeros = [(0, True, 1)] + [(z, rs, reps) for reps in P.divisors(D)
                                          for z, rs in ((1, True), (2, True), (3, True),
                                                        (3, False))]
                for v, (zero, reshard, reps) in itertools.product(range(1, 12 // p + 1), zeros):
                    for rc in ("none", "selective", "full"):
                        for sp in ((True, False) if t > 1 else (True,)):
                            lay = P.Layout(D, t, p, c, 1, zero, rc, batch // D, v, sp, reshard,
                                           reps)
                            r = P.evaluate(model, cluster, lay, batch)
                            if isinstance(r, P.Candidate):
                                seen[lay] = r.step_time
                                assert first.step_time <= r.step_time, lay
    assert len(seen) > len(pl.feasible) > 0
    for c in pl.feasible:
        assert seen[c.layout] == c.step_time
