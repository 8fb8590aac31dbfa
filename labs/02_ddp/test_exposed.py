"""Public tests of exposed.py: hand-worked intervals, then a real trace of two DDP steps.

Exact where the intervals are integers (every operation is a sum of differences of
integers, exact in float64); on the trace's decimal timestamps the two computations add the
same pieces in another order, so they agree to about 1e-16 relative: ``rel=1e-9``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from exposed import exposed_us
from shardlab.runtime.trace_timeline import COMM, COMPUTE, analyze, load_events

TRACE = Path(__file__).with_name("trace_ddp_2ranks.json")


@pytest.mark.parametrize(
    ("comm", "compute", "want"),
    [
        ([(0, 10)], [], 10),  # nothing to hide behind
        ([(0, 10)], [(0, 10)], 0),  # fully hidden
        ([(0, 10)], [(2, 5)], 7),  # a hole in the middle
        ([(0, 10)], [(8, 20), (-5, 1)], 7),  # covered at both ends
        ([(5, 10), (0, 6)], [], 10),  # overlapping collectives count once
        ([(0, 4), (6, 10)], [(3, 7)], 6),  # one compute interval over two collectives
        ([(0, 10)], [(1, 3), (2, 4), (2.5, 3.5)], 7),  # overlapping compute counts once
        ([(0, 10)], [(1, 3), (3, 4)], 7),  # touching intervals
        ([(3, 3), (0, 0)], [], 0),  # empty intervals
        ([], [(0, 5)], 0),
        ([(20, 30), (0, 10)], [(25, 40), (5, 8)], 12),  # unsorted
    ],
)
def test_hand_worked(comm, compute, want):
    assert exposed_us(comm, compute) == want


def test_refuses_an_interval_that_ends_before_it_starts():
    with pytest.raises(ValueError, match=r"comm interval \(5, 2\)"):
        exposed_us([(5, 2)], [])
    with pytest.raises(ValueError, match=r"compute interval \(1, 0\)"):
        exposed_us([], [(1, 0)])


def test_equal_to_the_analyzer_on_a_real_trace():
    """Each rank of a profiled 2-rank DDP run: the same figure as the book's analyzer."""
    events = load_events(TRACE)
    want = analyze(events)
    assert len(want) == 2
    for rank, times in want.items():
        mine = [e for e in events if e.rank == rank]
        comm = [(e.start, e.end) for e in mine if e.kind == COMM]
        compute = [(e.start, e.end) for e in mine if e.kind == COMPUTE]
        got = exposed_us(comm, compute)
        assert 0 < got < times.comm_us  # part of it is hidden, part is not
        assert got == pytest.approx(times.exposed_us, rel=1e-9), rank
