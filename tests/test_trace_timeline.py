"""``shardlab.runtime.trace_timeline``: interval arithmetic and exposed communication on
hand-made event lists (every number worked by hand below), and classification of real event
names. The run on real ranks is in tests/test_train_profile.py."""

from __future__ import annotations

import pytest
from shardlab.runtime.trace_timeline import (
    COMM,
    COMPUTE,
    STEP,
    Event,
    analyze,
    classify,
    compact,
    length,
    load_events,
    subtract,
    union,
)


def test_union_and_length():
    assert union([(5, 7), (0, 2), (1, 3), (7, 8)]) == [(0, 3), (5, 8)]
    assert length([(0, 10), (2, 4), (8, 12)]) == 12


def test_subtract():
    # [0,10] minus [2,4] and [6,7] -> [0,2] [4,6] [7,10]
    assert subtract([(0, 10)], [(2, 4), (6, 7)]) == [(0, 2), (4, 6), (7, 10)]
    assert subtract([(0, 5)], [(0, 5)]) == []
    assert subtract([(0, 5)], [(-1, 1), (4, 9)]) == [(1, 4)]
    assert subtract([(0, 2), (3, 4)], []) == [(0, 2), (3, 4)]


def _ev(thread, name, s, e, kind, rank=0):
    return Event(rank, thread, name, s, e, kind)


def test_exposed_across_threads():
    """Compute on the main thread [0,40] and [60,100]; all-reduces on gloo's thread [30,50]
    and [55,70]. Overlap: [30,40] and [60,70] = 20; comm 35; exposed [40,50]+[55,60] = 15."""
    evs = [
        _ev("main", "ProfilerStep#3", 0, 100, STEP),
        _ev("main", "backward", 0, 40, COMPUTE),
        _ev("main", "optimizer", 60, 100, COMPUTE),
        _ev("gloo", "gloo:all_reduce", 30, 50, COMM),
        _ev("gloo", "gloo:all_reduce", 55, 70, COMM),
    ]
    t = analyze(evs)[0]
    assert (t.steps, t.step_us, t.compute_us, t.comm_us, t.exposed_us) == (1, 100, 80, 35, 15)
    assert t.hidden_fraction == pytest.approx(20 / 35)


def test_two_comm_threads_overlapping_count_once_and_ranks_apart():
    """Rank 1: two collectives on two threads at once, [0,10] and [5,20] -> comm 20; compute
    [8,12] hides 4 -> exposed 16. Rank 0 has no comm: exposed 0, hidden fraction 1."""
    evs = [
        _ev("a", "gloo:all_gather", 0, 10, COMM, rank=1),
        _ev("b", "gloo:reduce_scatter", 5, 20, COMM, rank=1),
        _ev("m", "forward", 8, 12, COMPUTE, rank=1),
        _ev("m", "forward", 0, 3, COMPUTE, rank=0),
    ]
    out = analyze(evs)
    assert (out[1].comm_us, out[1].compute_us, out[1].exposed_us) == (20, 4, 16)
    assert (out[0].comm_us, out[0].exposed_us, out[0].hidden_fraction) == (0, 0, 1.0)


def test_classify_real_names():
    assert classify("ProfilerStep#4", "user_annotation") == STEP
    assert classify("gloo:all_reduce", "user_annotation") == COMM
    assert classify("gloo:barrier", "user_annotation") is None  # the loop's, not the layout's
    assert classify("c10d::allreduce_") is None  # enqueue only
    assert classify("record_param_comms") is None
    assert classify("aten::mm") == COMPUTE
    assert classify("autograd::engine::evaluate_function: MmBackward0") == COMPUTE
    assert classify("Optimizer.step#AdamW.step", "user_annotation") == COMPUTE
    assert classify("ncclDevKernel_AllReduce_Sum_f32_RING_LL", "kernel") == COMM
    assert classify("ampere_sgemm_128x64_nn", "kernel") == COMPUTE


def test_load_events_keeps_top_level_and_drops_compute_on_comm_threads():
    """A chrome trace by hand: aten::linear [0,10] holds aten::mm [2,8] (dropped: nested);
    gloo's thread holds its all-reduce [5,15] and an aten::copy_ (not this rank's compute)."""
    x = lambda tid, name, ts, dur, cat="cpu_op": dict(  # noqa: E731
        ph="X", pid=1, tid=tid, name=name, ts=ts, dur=dur, cat=cat)
    trace = {"distributedInfo": {"rank": 1}, "traceEvents": [
        x(1, "ProfilerStep#3", 100, 20, "user_annotation"),
        x(1, "aten::linear", 100, 10), x(1, "aten::mm", 102, 6),
        x(2, "gloo:all_reduce", 105, 10, "user_annotation"), x(2, "aten::copy_", 106, 1),
        {"ph": "M", "name": "thread_name", "pid": 1, "tid": 2},
    ]}
    evs = load_events(trace)
    assert [(e.name, e.start, e.end) for e in evs] == [
        ("ProfilerStep#3", 0, 20), ("aten::linear", 0, 10), ("gloo:all_reduce", 5, 15)]
    t = analyze(evs)[1]
    assert (t.compute_us, t.comm_us, t.exposed_us) == (10, 10, 5)


def test_blocking_recv_on_the_python_thread_keeps_its_compute():
    """A pipeline stage: the Python thread (it runs the step) computes [0,10], waits in
    gloo:recv [10,30], computes [30,35]; its compute counts: 15, comm 20, all exposed."""
    x = lambda name, ts, dur, cat="cpu_op": dict(  # noqa: E731
        ph="X", pid=7, tid=7, name=name, ts=ts, dur=dur, cat=cat)
    trace = {"traceEvents": [x("ProfilerStep#3", 0, 35, "user_annotation"), x("aten::mm", 0, 10),
                             x("gloo:recv", 10, 20, "user_annotation"), x("aten::add", 30, 5)]}
    t = analyze(load_events(trace))[0]
    assert (t.compute_us, t.comm_us, t.exposed_us) == (15, 20, 20)
    assert {e.thread for e in load_events(trace)} == {"main"}


def test_compact_merges_phases_within_the_gap():
    """forward ops [0,1],[1.5,3] merge (gap 0.5 < 1); [10,11] starts a new block; a backward
    op right after is its own block; the comm event stays as it is."""
    evs = [_ev("m", "aten::mm", 0, 1, COMPUTE), _ev("m", "aten::add", 1.5, 3, COMPUTE),
           _ev("m", "aten::mm", 10, 11, COMPUTE),
           _ev("m", "autograd::engine::evaluate_function: MmBackward0", 11.2, 12, COMPUTE),
           _ev("g", "gloo:all_reduce", 2, 20, COMM)]
    out = compact(evs, gap_us=1.0)
    assert [(e.name, e.start, e.end) for e in out] == [
        ("forward", 0, 3), ("gloo:all_reduce", 2, 20), ("forward", 10, 11),
        ("backward", 11.2, 12)]


def test_stored_timelines_are_consistent_and_compact():
    """benchmarks/results/traces/*.json (the book's data): every launch's ranks have
    0 < exposed <= communication < step span, and the timeline is a few hundred events."""
    import json
    from pathlib import Path

    files = sorted((Path(__file__).resolve().parents[1] / "benchmarks/results/traces").glob("*.json"))
    assert {f.name for f in files} >= {"ddp_small_2ranks.json", "fsdp_small_2ranks.json"}
    for f in files:
        rec = json.loads(f.read_text())
        assert {"machine", "date", "torch", "command"} <= set(rec)
        assert 0 < len(rec["events"]) <= 500
        for run in rec["per_launch"]:
            for r in run:
                assert 0 < r["exposed_us"] <= r["comm_us"] < r["step_us"], (f.name, r)
        evs = load_events(rec)
        assert {e.rank for e in evs} == {0, 1}


def test_plot_timeline_draws_a_lane_per_rank_and_refuses_a_missing_step():
    import matplotlib

    matplotlib.use("Agg")
    from shardlab.runtime.plot_timeline import plot_timeline

    rec = {"layout": "ddp", "events": [
        {"rank": r, "thread": t, "name": n, "start": s, "end": e, "kind": k}
        for r in (0, 1)
        for t, n, s, e, k in [("main", "ProfilerStep#3", 0, 100, STEP),
                              ("main", "backward", 0, 40, COMPUTE),
                              ("comm0", "gloo:all_reduce", 30, 50, COMM)]]}
    fig = plot_timeline(rec)
    labels = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert labels == ["rank 1 comm", "rank 1 compute", "rank 0 comm", "rank 0 compute"]
    with pytest.raises(ValueError, match="step=1 is not one of the 1 recorded steps"):
        plot_timeline(rec, step=1)
