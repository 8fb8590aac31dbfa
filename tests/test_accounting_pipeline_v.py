"""ZB-V and DualPipe-V: two chunks per rank in a V (accounting.pipeline_v).

Hand-worked cases (p=2, m=4) are written out action by action, as PyTorch 2.13's
``ScheduleZBVZeroBubble`` / ``ScheduleDualPipeV`` order them (DualPipe-V's overlapped F/B
pairs as F then B); a grid of (p, m) is then compared with PyTorch's own generators.
"""

import math

import pytest
from shardlab.accounting import comm
from shardlab.accounting.pipeline import (
    Action,
    bubble_time,
    check_kind,
    inflight_bytes,
    p2p_sent_bytes,
    placement,
    schedule,
    schedule_size,
    simulate,
    stage_rank,
    virtual_stage,
)
from shardlab.accounting.pipeline_cores import simulate_shared

# ZB-V, p=2, m=4. Rank 0 holds stages 0 and 3, rank 1 stages 1 and 2 (".1" = chunk 1).
# Rank 0: 2(p-r)-1 = 3 forwards of chunk 0, then p-r = 2 triples F.1 BI.1 BW.1, then the
# steady F BI BW F.1 BI.1 BW.1, then the cool-down (r = 0: no BI pairs, p-r = 2 BI BW).
ZBV_2_4 = [
    "F0 F1 F2 F0.1 BI0.1 BW0.1 F1.1 BI1.1 BW1.1 F3 BI0 BW0 F2.1 BI2.1 BW2.1 BI1 BW1 "
    "F3.1 BI3.1 BW3.1 BI2 BW2 BI3 BW3",
    # rank 1: 1 forward, 1 pair F.1 F, 1 triple, steady state, r = 1 BI pair, 1 BI BW, the
    # deferred BW of chunk 1 then of chunk 0
    "F0 F0.1 F1 F1.1 BI0.1 BW0.1 F2 BI0 BW0 F2.1 BI1.1 BW1.1 F3 BI1 BW1 F3.1 BI2.1 BW2.1 "
    "BI2 BI3.1 BI3 BW2 BW3.1 BW3",
]
# DualPipe-V, p=2, m=4: steps 1-8 of the generator. Rank 0: step 1 two F, step 2 one F F.1,
# step 3 one BI.1 BW.1 F.1, step 4 (m-2p+r+1 = 1) the pairs (F B.1) (F.1 B), step 5 one
# B.1 (F.1 B), step 6 (r+1 = 1) B.1 and the split BI (r even: the split starts at chunk 0),
# step 7 one BW BI, step 8 one BW.
DUALPIPEV_2_4 = [
    "F0 F1 F2 F0.1 BI0.1 BW0.1 F1.1 F3 B1.1 F2.1 B0 B2.1 F3.1 B1 B3.1 BI2 BW2 BI3 BW3",
    # rank 1 (the V's tip): step 2 twice F F.1, step 4 twice, the first pair not overlapped
    # in PyTorch (F then B.1 all the same), step 6 r odd: the second B.1 B pair split
    "F0 F0.1 F1 F1.1 F2 B0.1 F2.1 B0 F3 B1.1 F3.1 B1 B2.1 B2 BI3.1 BI3 BW3.1 BW3",
]


def _names(sched):
    return [" ".join(str(a) for a in acts) for acts in sched]


def test_hand_worked_orders():
    assert _names(schedule("zbv", 2, 4, 2)) == ZBV_2_4
    assert _names(schedule("dualpipev", 2, 4, 2)) == DUALPIPEV_2_4
    # ZB-V pads to 2p-1 microbatches and cuts, so m = 1 runs: F, then BI BW, per chunk
    assert _names(schedule("zbv", 2, 1, 2)) == ["F0 F0.1 BI0.1 BW0.1 BI0 BW0", "F0 F0.1 BI0.1 BW0.1 BI0 BW0"]


def test_hand_worked_simulation():
    """F = BI = BW = 1 per rank (1/2 per chunk): ZB-V p=2 m=4 is 24 chunk actions of 0.5 on
    each rank, 12 of work; the tip (rank 1) waits 0.5 for stage 0's first forward, rank 0
    waits for the way back up: makespan 12.5, 0.5 idle per rank, bubble 1/25."""
    for kind in ("zbv", "dualpipev"):
        sim = simulate(schedule(kind, 2, 4, 2), 2)
        assert sim.makespan == 12.5 and sim.idle_per_stage == (0.5, 0.5), kind
        assert math.isclose(sim.bubble_fraction, 1 / 25)
    assert simulate(schedule("zbv", 2, 4, 2), 2).peak_inflight == (4, 4)
    assert simulate(schedule("dualpipev", 2, 4, 2), 2).peak_inflight == (5, 5)
    # p=4, m=8, same costs: both V schedules idle 1.5 of 25.5 per rank (1F1B: 27.3 %)
    for kind in ("zbv", "dualpipev"):
        sim = simulate(schedule(kind, 4, 8, 2), 4)
        assert sim.makespan == 25.5 and math.isclose(sim.bubble_fraction, 1.5 / 25.5)


def _torch_order(kind, p, m):
    """PyTorch 2.13's own generator, as (kind, microbatch, chunk) strings per rank."""
    sch = pytest.importorskip("torch.distributed.pipelining.schedules")
    cls = sch.ScheduleZBVZeroBubble if kind == "zbv" else sch.ScheduleDualPipeV
    gen = object.__new__(cls)  # the generator only reads these attributes
    gen.pp_group_size, gen._n_microbatches, gen.num_stages, gen._num_stages = p, m, 2 * p, 2 * p
    names = {"FORWARD": "F", "BACKWARD_INPUT": "BI", "BACKWARD_WEIGHT": "BW", "FULL_BACKWARD": "B"}
    out = []
    for r in range(p):
        acts = []
        for a in gen._calculate_single_rank_operations(r):
            for s in a.sub_actions or (a,) if a is not None else ():
                c = 0 if s.stage_index == r else 1
                assert s.stage_index == virtual_stage(r, c, p, "v")
                acts.append(str(Action(names[s.computation_type.name], s.microbatch_index, c)))
        out.append(" ".join(acts))
    return out


@pytest.mark.parametrize("p", [1, 2, 3, 4])
@pytest.mark.parametrize("m", [1, 3, 4, 6, 8, 9])
def test_same_order_as_pytorch(p, m):
    assert _names(schedule("zbv", p, m, 2)) == _torch_order("zbv", p, m)
    if m >= 2 * p:
        assert _names(schedule("dualpipev", p, m, 2)) == _torch_order("dualpipev", p, m)


@pytest.mark.parametrize("kind", ["zbv", "dualpipev"])
@pytest.mark.parametrize(("p", "m"), [(1, 2), (2, 4), (2, 5), (3, 6), (4, 8), (4, 11)])
def test_size_accumulation_order_and_no_deadlock(kind, p, m):
    sched = schedule(kind, p, m, 2)
    assert sum(map(len, sched)) == schedule_size(kind, p, m, 2)
    for acts in sched:  # each stage's .grad is summed in microbatch order, as in one process
        for c in (0, 1):
            order = [a.microbatch for a in acts if a.chunk == c and a.kind in ("B", "BW")]
            assert order == list(range(m))
    sim = simulate(sched, p, comm=0.1)
    assert 0 <= sim.bubble_fraction < 1
    # sharing fewer cores than ranks: same dependency rules, between the two bounds
    shared = simulate_shared(sched, p, 1)
    work = sum(simulate(sched, p).busy_per_stage)
    assert math.isclose(shared.makespan, work)


def test_placement():
    assert placement("zbv") == placement("dualpipev") == "v" and placement("1f1b") == "loop"
    assert [virtual_stage(r, c, 4, "v") for r in range(4) for c in (0, 1)] == [0, 7, 1, 6, 2, 5, 3, 4]
    assert [stage_rank(k, 4, "v") for k in range(8)] == [0, 1, 2, 3, 3, 2, 1, 0]
    assert [stage_rank(k, 4) for k in range(8)] == [0, 1, 2, 3, 0, 1, 2, 3]
    # the V's p-1 -> p boundary stays on rank p-1: no comm delay between its two chunks
    sim = simulate(schedule("zbv", 2, 4, 2), 2, comm=1.0)
    starts = {(str(a), r): (s, e) for r, tl in enumerate(sim.timeline) for s, e, a in tl}
    assert starts[("F0.1", 1)][0] == starts[("F0", 1)][1]


@pytest.mark.parametrize("p", [2, 3, 4])
def test_p2p_sent_bytes_in_a_v(p):
    b, s, h, q, m = 2, 8, 16, 4, 4
    msg = q * b * s * h
    for r in range(p):
        got = p2p_sent_bytes(r, p, b, s, h, q, m, 2, placement="v")
        # count the messages: each stage sends forward / backward to a neighbour on another rank
        want = 0
        for c in (0, 1):
            k = virtual_stage(r, c, p, "v")
            want += sum(0 <= j < 2 * p and stage_rank(j, p, "v") != r for j in (k - 1, k + 1))
        assert got == want * m * msg
        if 0 < r < p - 1:
            assert got == comm.pipeline_p2p_volume(b, s, h, q, m, 2)
        else:  # rank 0 holds both ends, rank p-1 the tip of the V
            assert got == comm.pipeline_p2p_volume(b, s, h, q, m, 2) / 2
    assert p2p_sent_bytes(0, 1, b, s, h, q, m, 2, placement="v") == 0


def test_inflight_bytes_of_a_v():
    acts = schedule("zbv", 2, 4, 2)[1]
    assert inflight_bytes(acts, [10.0, 1.0]) == max(
        inflight_bytes(acts[:i], [10.0, 1.0]) for i in range(1, len(acts) + 1)
    )
    assert (
        inflight_bytes(acts, [1.0, 1.0]) == simulate(schedule("zbv", 2, 4, 2), 2).peak_inflight[1]
    )


def test_the_one_check():
    with pytest.raises(ValueError, match=r"kind='zbv' places 2 chunks per rank in a V .*needs v=2, got v=1"):
        check_kind("zbv", 2, 4)
    with pytest.raises(ValueError, match="needs v=2, got v=3"):
        schedule("dualpipev", 2, 4, 3)
    with pytest.raises(ValueError, match="dualpipev needs m >= 2p microbatches, got m=7, p=4"):
        check_kind("dualpipev", 4, 7, 2)
    with pytest.raises(ValueError, match="v=2 chunks need kind='interleaved', not kind='zb-h1'"):
        check_kind("zb-h1", 4, 8, 2)
    with pytest.raises(ValueError, match="no closed-form bubble"):
        bubble_time("zbv", 4, v=2)
    with pytest.raises(ValueError, match="placement='v' holds 2 chunks"):
        p2p_sent_bytes(0, 2, 1, 1, 1, 2, 1, 1, placement="v")
    assert check_kind("zbv", 4, 3, 2) == ("zbv", 4, 3, 2)
