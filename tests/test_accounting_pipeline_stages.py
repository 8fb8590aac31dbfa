"""accounting.pipeline additions for the pipeline lab: per-rank p2p bytes, stage bounds,
configuration checks, activation bytes in flight, per-stage simulator costs."""

import math

import pytest
from shardlab.accounting import comm
from shardlab.accounting.pipeline import (
    check_pipeline,
    inflight_bytes,
    p2p_sent_bytes,
    schedule,
    simulate,
    stage_bounds,
)


@pytest.mark.parametrize("p", [2, 3, 4])
@pytest.mark.parametrize("v", [1, 2, 3])
def test_p2p_sent_bytes_counts_messages(p, v):
    b, s, h, q, m = 2, 8, 16, 4, 6
    msg = q * b * s * h
    for r in range(p):
        vstages = [c * p + r for c in range(v)]
        fwd = sum(k < p * v - 1 for k in vstages)  # every virtual stage but the last sends on
        bwd = sum(k > 0 for k in vstages)  # every one but the first sends a gradient back
        assert p2p_sent_bytes(r, p, b, s, h, q, m, v) == (fwd + bwd) * m * msg
        if 0 < r < p - 1:
            assert p2p_sent_bytes(r, p, b, s, h, q, m, v) == comm.pipeline_p2p_volume(
                b, s, h, q, m, v
            )
    assert p2p_sent_bytes(0, 1, b, s, h, q, m) == 0
    with pytest.raises(ValueError, match="rank=2 must be below p=2"):
        p2p_sent_bytes(2, 2, b, s, h)


def test_stage_bounds_and_check():
    assert stage_bounds(8, 2, 2) == [(0, 2), (2, 4), (4, 6), (6, 8)]
    assert stage_bounds(3, 3) == [(0, 1), (1, 2), (2, 3)]
    with pytest.raises(ValueError, match=r"n_layer=8 layers do not divide into p\*v = 3\*1 = 3"):
        stage_bounds(8, 3)
    with pytest.raises(
        ValueError, match=r"p\*v = 2\*4 = 8 virtual stages need at least 8 .* n_layer=4"
    ):
        stage_bounds(4, 2, 4)
    check_pipeline("interleaved", 2, 4, 2, n_layer=8)
    with pytest.raises(ValueError, match="m % p == 0, got m=5, p=2"):
        check_pipeline("interleaved", 2, 5, 2, n_layer=8)
    with pytest.raises(ValueError, match="kind='x'"):
        check_pipeline("x", 2, 4)


@pytest.mark.parametrize("kind,v", [("gpipe", 1), ("1f1b", 1), ("zb-h1", 1), ("interleaved", 2)])
def test_inflight_bytes_is_peak_inflight_times_bytes(kind, v):
    p, m = 4, 8
    sched = schedule(kind, p, m, v)
    sim = simulate(sched, p)
    for r in range(p):
        assert inflight_bytes(sched[r], [10.0] * v) == 10.0 * sim.peak_inflight[r]
    # uneven chunks: interleaved rank 0 holds more of chunk 0 than of chunk 1 at its peak
    if kind == "interleaved":
        assert inflight_bytes(sched[0], [1.0, 0.0]) + inflight_bytes(sched[0], [0.0, 1.0]) >= (
            inflight_bytes(sched[0], [1.0, 1.0])
        )
    with pytest.raises(ValueError, match="chunk_bytes has 0 entries"):
        inflight_bytes(sched[0], [])


def test_simulate_stage_costs():
    p, m = 2, 4
    sched = schedule("1f1b", p, m)
    same = simulate(sched, p, {"F": 1, "B": 2}, stage_costs=[{"F": 1, "B": 2}] * p)
    assert same == simulate(sched, p, {"F": 1, "B": 2})
    slow = simulate(sched, p, stage_costs=[{"F": 1, "B": 2}, {"F": 2, "B": 4}])
    # the slow last stage sets the pace: its busy time plus the fill of stage 0's first F
    assert math.isclose(slow.busy_per_stage[1], m * 6)
    assert math.isclose(slow.makespan, 1 + m * 6 + 2)
    with pytest.raises(ValueError, match="needs one cost dict per stage, p=2"):
        simulate(sched, p, stage_costs=[{}])
    with pytest.raises(ValueError, match=r"stage_costs\[1\]\['F'\]=-1"):
        simulate(sched, p, stage_costs=[{}, {"F": -1}])


def test_schedule_idle_fraction():
    from shardlab.accounting.pipeline import (
        bubble_time,
        idle_fraction,
        schedule,
        schedule_idle_fraction,
        simulate,
    )

    for kind, v in (("gpipe", 1), ("1f1b", 1), ("interleaved", 2)):
        assert schedule_idle_fraction(kind, 4, 8, v) == idle_fraction(4, 8, v)
    assert schedule_idle_fraction("zb-h1", 2, 8) == 1 / (1 + 3 * 8)  # F = BI = BW
    costs = {"F": 2.0, "BI": 1.5, "BW": 1.0}
    bt = bubble_time("zb-h1", 4, costs)
    assert schedule_idle_fraction("zb-h1", 4, 8, costs=costs) == bt / (bt + 8 * 4.5)
    # the simulator of the same schedule with equal costs agrees (balanced stages)
    for kind, v in (("1f1b", 1), ("interleaved", 2), ("zb-h1", 1)):
        sim = simulate(schedule(kind, 4, 8, v), 4)
        assert abs(sim.bubble_fraction - schedule_idle_fraction(kind, 4, 8, v)) < 1e-12, kind
    with pytest.raises(ValueError, match="m % p == 0, got m=6, p=4"):
        schedule_idle_fraction("interleaved", 4, 6, 2)
    with pytest.raises(ValueError, match="v=2 chunks need kind='interleaved'"):
        schedule_idle_fraction("1f1b", 2, 8, 2)
