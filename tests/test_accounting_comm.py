"""Collective and step communication volumes, alpha-beta time, validation."""

import math

import pytest
from shardlab.accounting.comm import (
    COLLECTIVES,
    alpha_beta_time,
    collectives_time,
    grad_accum_volume,
    p2p_time,
    pipeline_p2p_volume,
    ring_sent_bytes,
    rounds,
    sent_bytes,
    step_volume,
    tp_volume,
)

DS = [1, 2, 3, 4, 5, 8, 16, 100, 1024]


@pytest.mark.parametrize("d", DS)
@pytest.mark.parametrize("nbytes", [0, 1, 1000, 7 * 10**9 * 2])
def test_rs_plus_ag_is_ar(d, nbytes):
    ag = ring_sent_bytes("all_gather", nbytes, d)
    rs = ring_sent_bytes("reduce_scatter", nbytes, d)
    ar = ring_sent_bytes("all_reduce", nbytes, d)
    assert math.isclose(ag + rs, ar)
    assert math.isclose(ag, nbytes * (d - 1) / d)
    assert math.isclose(ring_sent_bytes("all_to_all", nbytes, d), nbytes * (d - 1) / d)
    assert ring_sent_bytes("broadcast", nbytes, d) == (nbytes if d > 1 else 0)
    for algo in ("ring", "tree"):
        assert rounds("reduce_scatter", d, algo) + rounds("all_gather", d, algo) == rounds(
            "all_reduce", d, algo
        )


def test_single_rank_sends_nothing():
    for op in COLLECTIVES:
        assert ring_sent_bytes(op, 123, 1) == 0
        assert rounds(op, 1) == 0 and rounds(op, 1, "tree") == 0


@pytest.mark.parametrize("d", range(1, 70))
def test_rounds(d):
    k = math.ceil(math.log2(d)) if d > 1 else 0
    assert rounds("all_gather", d) == d - 1
    assert rounds("all_reduce", d) == 2 * (d - 1)
    assert rounds("all_gather", d, "tree") == k
    assert rounds("broadcast", d, "tree") == k
    assert rounds("all_reduce", d, "tree") == 2 * k


def test_alpha_beta():
    # 8 ranks, 1 GB all-reduce, 10 us per round, 100 GB/s
    t = alpha_beta_time("all_reduce", 1e9, 8, alpha=1e-5, beta=1e11)
    assert math.isclose(t, 14 * 1e-5 + 2 * 1e9 * 7 / 8 / 1e11)
    t_tree = alpha_beta_time("all_reduce", 1e9, 8, alpha=1e-5, beta=1e11, algo="tree")
    assert math.isclose(t_tree, 6 * 1e-5 + 2 * 1e9 * 7 / 8 / 1e11)
    assert math.isclose(sent_bytes("broadcast", 100, 8, "tree"), 300)
    assert math.isclose(sent_bytes("all_to_all", 100, 8, "tree"), 150)
    # latency dominates many tiny messages: same bytes, 100 collectives, more time
    one = alpha_beta_time("all_gather", 1e8, 8, 1e-5, 1e11)
    many = 100 * alpha_beta_time("all_gather", 1e6, 8, 1e-5, 1e11)
    assert many > one


def test_an_alpha_beta_time_beyond_a_float_is_refused():
    """Each input bounded, their quotient is not: 1e30 bytes at 1e-291 bytes/s is refused
    with a sentence, never answered ``inf`` (issue 30)."""
    with pytest.raises(ValueError, match=r"nbytes=1e\+30 at beta=1e-291 bytes/s .* more time"):
        alpha_beta_time("all_reduce", 1e30, 8, 0.0, 1e-291)


@pytest.mark.parametrize("d", DS)
@pytest.mark.parametrize("q", [1, 2, 4])
def test_lecture_step_volumes(d, q):
    n = 7_000_000_000
    base = q * n * (d - 1) / d
    assert math.isclose(step_volume("ddp", n, d, q), 2 * base)
    assert math.isclose(step_volume("zero1", n, d, q), 2 * base)
    assert math.isclose(step_volume("zero2", n, d, q), 2 * base)
    assert math.isclose(step_volume("zero3", n, d, q), 3 * base)
    assert math.isclose(step_volume("zero3", n, d, q, reshard_after_forward=False), 2 * base)
    if d > 1:
        assert step_volume("zero3", n, d, q) / step_volume("ddp", n, d, q) == 1.5
    # ddp = one all-reduce of the gradients; zero3 = 2 all-gathers + 1 reduce-scatter
    assert math.isclose(step_volume("ddp", n, d, q), ring_sent_bytes("all_reduce", q * n, d))
    assert math.isclose(
        step_volume("zero3", n, d, q),
        2 * ring_sent_bytes("all_gather", q * n, d) + ring_sent_bytes("reduce_scatter", q * n, d),
    )


@pytest.mark.parametrize("m", [1, 2, 4, 8])
def test_grad_accum(m):
    n, d, q = 1000, 4, 2
    u = q * n * (d - 1) / d
    assert grad_accum_volume("ddp", n, d, q, m, False) == 2 * u
    assert grad_accum_volume("ddp", n, d, q, m, True) == 2 * m * u
    assert grad_accum_volume("zero1", n, d, q, m, False) == 2 * u
    assert grad_accum_volume("zero2", n, d, q, m, True) == (m + 1) * u
    assert grad_accum_volume("zero3", n, d, q, m, True) == 3 * m * u
    assert grad_accum_volume("zero3", n, d, q, m, False) == (2 * m + 1) * u
    assert grad_accum_volume("zero3", n, d, q, m, False, reshard_after_forward=False) == (m + 1) * u
    for layout in ("ddp", "zero1", "zero2", "zero3"):
        assert grad_accum_volume(layout, n, d, q, 1, True) == step_volume(layout, n, d, q)


def test_tp_and_pipeline_volumes():
    b, s, h, t = 1, 2048, 4096, 8
    v = tp_volume(b, s, h, t, q=2)
    assert v == 8 * 2 * b * s * h * 7 / 8
    assert tp_volume(b, s, h, t, q=2, sp=True) == v  # AG + RS pairs: same bytes
    assert tp_volume(b, s, h, t, q=2, layers=32, microbatches=4) == 128 * v
    # four all-reduces of b*s*h*q bytes
    assert math.isclose(v, 4 * ring_sent_bytes("all_reduce", 2 * b * s * h, t))
    assert tp_volume(b, s, h, 1) == 0
    assert pipeline_p2p_volume(b, s, h, q=2, microbatches=8) == 2 * 8 * 2 * b * s * h
    assert pipeline_p2p_volume(b, s, h, q=2, microbatches=8, chunks=2) == 4 * 8 * 2 * b * s * h


@pytest.mark.parametrize("op", COLLECTIVES)
@pytest.mark.parametrize("algo", ["ring", "tree"])
def test_collectives_time(op, algo):
    d, n, total, alpha, beta = 8, 16, 2 * 10**9, 10e-6, 50e9
    one = alpha_beta_time(op, total / n, d, alpha, beta, algo)
    assert collectives_time(op, total / n, d, n, alpha, beta, algo) == pytest.approx(n * one)
    assert collectives_time(op, total, d, 1, alpha, beta, algo) == alpha_beta_time(
        op, total, d, alpha, beta, algo
    )
    assert collectives_time(op, total, d, 0, alpha, beta, algo) == 0
    # zero payload leaves the latency part: count * rounds * alpha
    lat = collectives_time(op, 0, d, n, alpha, beta, algo)
    assert lat == pytest.approx(n * rounds(op, d, algo) * alpha)
    # splitting V into n pieces keeps the bandwidth term, multiplies the latency term by n
    if algo == "ring":
        split = collectives_time(op, total / n, d, n, alpha, beta, algo)
        whole = alpha_beta_time(op, total, d, alpha, beta, algo)
        assert split - whole == pytest.approx((n - 1) * rounds(op, d, algo) * alpha)


def test_p2p_time():
    assert p2p_time(50e9, 10e-6, 50e9) == pytest.approx(1 + 10e-6)
    assert p2p_time(1e9, 1e-6, 1e9, messages=16) == pytest.approx(1 + 16e-6)
    assert p2p_time(0, 1e-6, 1e9, messages=4) == pytest.approx(4e-6)
    assert p2p_time(0, 1e-6, 1e9, messages=0) == 0
    assert p2p_time(1e9, 0, 1e9) == 1
    v = pipeline_p2p_volume(1, 2048, 4096, q=2, microbatches=8)
    assert p2p_time(v, 3e-6, 300e9, 2 * 8) == pytest.approx(v / 300e9 + 16 * 3e-6)


@pytest.mark.parametrize(
    ("fn", "args", "match"),
    [
        (ring_sent_bytes, ("all_gather", 10, 0), "group_size=0"),
        (ring_sent_bytes, ("all_gather", -1, 4), "nbytes=-1"),
        (ring_sent_bytes, ("gather", 10, 4), "op='gather'"),
        (ring_sent_bytes, ("all_gather", 10, True), "group_size=True"),
        (rounds, ("all_reduce", 4, "butterfly"), "algo='butterfly'"),
        (alpha_beta_time, ("all_reduce", 10, 4, 1e-6, 0), "beta=0"),
        (alpha_beta_time, ("all_reduce", 10, 4, -1, 1e9), "alpha=-1"),
        (step_volume, ("zero4", 10, 4), "layout='zero4'"),
        (step_volume, ("ddp", 10, 2.5), "dp=2.5"),
        (step_volume, ("ddp", 10, 4, 0), "q=0"),
        (step_volume, ("zero3", 10, 4, 2, 1), "reshard_after_forward=1"),
        (grad_accum_volume, ("ddp", 10, 4, 2, 0, True), "microbatches=0"),
        (grad_accum_volume, ("ddp", 10, 4, 2, 2, "yes"), "sync_every_microbatch='yes'"),
        (tp_volume, (1, 2048, 4096, 0), "t=0"),
        (tp_volume, (1, 0, 4096, 8), "s=0"),
        (pipeline_p2p_volume, (1, 2048, 4096, 2, 0), "microbatches=0"),
        (collectives_time, ("all_gather", 10, 4, -1, 1e-6, 1e9), "count=-1"),
        (collectives_time, ("all_gather", 10, 4, 2.5, 1e-6, 1e9), "count=2.5"),
        (collectives_time, ("all_gather", 10, 4, True, 1e-6, 1e9), "count=True"),
        (collectives_time, ("all_gather", 10, 4, 2, 1e-6, 0), "beta=0"),
        (collectives_time, ("scatter", 10, 4, 2, 1e-6, 1e9), "op='scatter'"),
        (p2p_time, (-1, 1e-6, 1e9), "nbytes=-1"),
        (p2p_time, (10, -1e-6, 1e9), "alpha=-1e-06"),
        (p2p_time, (10, 1e-6, 0), "beta=0"),
        (p2p_time, (10, 1e-6, 1e9, -1), "messages=-1"),
        (p2p_time, (10, 1e-6, 1e9, 1.5), "messages=1.5"),
        (p2p_time, (10, 1e-6, 1e9, 0), "messages=0"),
    ],
)
def test_validation(fn, args, match):
    with pytest.raises(ValueError, match=match):
        fn(*args)
