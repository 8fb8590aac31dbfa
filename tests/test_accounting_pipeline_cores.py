"""The pipeline simulator with ranks sharing fewer cores than there are ranks."""

import math

import pytest
from shardlab.accounting.pipeline import schedule, simulate
from shardlab.accounting.pipeline_cores import simulate_shared

CASES = [
    (kind, p, m, v)
    for p in (2, 3, 4)
    for m in (4, 8)
    for kind, v in (("gpipe", 1), ("1f1b", 1), ("interleaved", 2), ("zb-h1", 1))
    if not (kind == "interleaved" and m % p)
]
COSTS = {"F": 1.0, "B": 2.0, "BI": 1.0, "BW": 1.0}


@pytest.mark.parametrize(("kind", "p", "m", "v"), CASES)
def test_enough_cores_is_the_dedicated_simulation(kind, p, m, v):
    sched = schedule(kind, p, m, v)
    uneven = [{"F": 1.0 + 0.1 * r, "B": 2.0 - 0.2 * r, "BI": 1.1, "BW": 0.9} for r in range(p)]
    for kw in ({"costs": COSTS}, {"stage_costs": uneven, "comm": 0.05}):
        ref = simulate(sched, p, **kw)
        for cores in (p, p + 3):
            got = simulate_shared(sched, p, cores, **kw)
            assert math.isclose(got.makespan, ref.makespan, rel_tol=1e-12)
            assert got.peak_inflight == ref.peak_inflight
            for a, b in zip(got.timeline, ref.timeline):
                assert [x[2] for x in a] == [x[2] for x in b]  # same order on every rank
                assert all(
                    math.isclose(x[0], y[0], abs_tol=1e-9) and math.isclose(x[1], y[1])
                    for x, y in zip(a, b)
                )


@pytest.mark.parametrize(("kind", "p", "m", "v"), CASES)
def test_one_core_is_busy_until_the_last_action(kind, p, m, v):
    sched = schedule(kind, p, m, v)
    work = sum(COSTS[a.kind] / v for acts in sched for a in acts)
    assert math.isclose(simulate_shared(sched, p, 1, COSTS).makespan, work)


@pytest.mark.parametrize(("kind", "p", "m", "v"), [c for c in CASES if c[1] >= 3])
def test_between_the_bounds(kind, p, m, v):
    sched = schedule(kind, p, m, v)
    work = sum(COSTS[a.kind] / v for acts in sched for a in acts)
    got = simulate_shared(sched, p, 2, COSTS)
    assert max(simulate(sched, p, COSTS).makespan, work / 2) <= got.makespan + 1e-9
    assert got.makespan <= work + 1e-9
    # every rank's wall busy time is at least its work: sharing only stretches actions
    for acts, busy in zip(sched, got.busy_per_stage):
        assert busy >= sum(COSTS[a.kind] / v for a in acts) - 1e-9


def test_hand_worked_gpipe_on_two_ranks_one_core():
    # p=2, m=2, F=1, B=2, one core: F0 on rank 0 [0,1]; then F1 (rank 0) and F0 (rank 1)
    # share the core, both end at 3; F1 on rank 1 alone [3,4]; B0 on rank 1 [4,6]; then B0
    # on rank 0 and B1 on rank 1 share: both end at 10; B1 on rank 0 alone [10,12]
    r = simulate_shared(schedule("gpipe", 2, 2), 2, 1, {"F": 1, "B": 2})
    spans = [[(s, e, str(a)) for s, e, a in tl] for tl in r.timeline]
    assert spans[0] == [(0, 1, "F0"), (1, 3, "F1"), (6, 10, "B0"), (10, 12, "B1")]
    assert spans[1] == [(1, 3, "F0"), (3, 4, "F1"), (4, 6, "B0"), (6, 10, "B1")]
    assert r.makespan == 12 and r.idle_per_stage == (3, 3)


def test_bad_input_is_a_sentence():
    sched = schedule("1f1b", 2, 4)
    with pytest.raises(ValueError, match="cores"):
        simulate_shared(sched, 2, 0)
    with pytest.raises(ValueError, match="p=3"):
        simulate_shared(sched, 3, 2)
