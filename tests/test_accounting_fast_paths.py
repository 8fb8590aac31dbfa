"""The planner's search calls unchecked cores of a few accounting functions (``_ring_collectives``,
``_compute_time``, ``_mfu``, ``_roofline``, ``_bubble``, ``_closed_total``) tens of thousands of
times; the checked public functions call the same cores. These tests hold each core to its
public function bit for bit, so the search ranks exactly what the book's formulas say."""

from __future__ import annotations

import itertools

from shardlab.accounting import comm, compute, hierarchical, layout_cost, pipeline


def test_ring_collectives_is_collectives_time_and_sent_bytes():
    for op, d, nb, count in itertools.product(
        comm.COLLECTIVES, (1, 2, 3, 8, 1000), (0.0, 1.5, 3e9, 7.25e11), (0, 1, 7)
    ):
        t, b = comm._ring_collectives(op, nb, d, count, 3e-6, 50e9)
        assert t == comm.collectives_time(op, nb, d, count, 3e-6, 50e9), (op, d, nb, count)
        assert b == count * comm.sent_bytes(op, nb, d), (op, d, nb, count)


def test_compute_cores_are_the_public_functions():
    for flops, peak, eff in itertools.product((0.0, 1e12, 3.7e18), (1e12, 989e12), (0.3, 1.0)):
        assert compute._compute_time(flops, peak, eff) == compute.compute_time(flops, peak, eff)
        for step, g in itertools.product((0.5, 12.25), (1, 16384)):
            assert compute._mfu(flops, step, g, peak) == compute.mfu(flops, step, g, peak)
        for beta in (None, 50e9):
            fast = compute._roofline("x", 0.25, 1e9, flops, peak, eff, beta)
            assert fast == compute.roofline("x", 0.25, 1e9, flops, peak, eff, beta)


def test_bubble_core_is_bubble_time():
    for p, v, f, b in itertools.product((1, 2, 7, 16), (1, 2, 5), (0.1, 1.0, 3.3), (0.0, 2.2)):
        kind = "interleaved" if v > 1 else "1f1b"
        assert pipeline._bubble(p, f, b, v) == pipeline.bubble_time(kind, p, {"F": f, "B": b}, v)


def test_closed_total_is_closed_peak():
    for args in itertools.product((0.0, 1.2e10), (3.3e9,), (0.0, 7e8), (None, 5e8)):
        for unit3 in ((), (1.1e9, 2.2e9, 2), (1.1e9, 2.2e9, 0), (3e8, 6e8, 80)):
            assert layout_cost._closed_total(*args, *unit3) == layout_cost.closed_peak(*args, *unit3)[0]


def test_replicate_core_is_hsdp_replicate_traffic():
    for nb, shard, reps, count in itertools.product((0.0, 3.3e9, 7.25e11), (1, 2, 7, 64),
                                                    (2, 3, 1000), (1, 5, 126)):
        fast = hierarchical._replicate_traffic(nb, shard, reps, count, 10e-6, 50e9)
        assert fast == hierarchical.hsdp_replicate_traffic(nb, shard, reps, count, 10e-6, 50e9)
