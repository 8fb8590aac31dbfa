"""The hang detector itself: what counts as blocked, what does not, and the diagnoses.

The diagnoses are checked on hand-written rank reports (what ``_commwatch`` writes); the
launches check that ranks that wait for a *working* peer (sleeping, computing) are never
stopped, however small ``hang_timeout`` is, and that a deadlock warns on stderr before it
ends.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "student_mistakes"))

import _dist_workers  # noqa: E402
import watch_ranks  # noqa: E402
from shardlab.runtime import LaunchDeadlock, launch  # noqa: E402
from shardlab.runtime._hang import diagnose, summarize  # noqa: E402


def _msg(op, peer, tag=0):
    return {"op": op, "peer": peer, "tag": tag, "bytes": 4, "posted": 0.0}


def _rank(*pending, call=None, history=(), where="ring.py:9 in f", exit_barrier=False):
    return {
        "pending": list(pending),
        "history": list(history),
        "call": call,
        "where": where,
        "exit_barrier": exit_barrier,
        "blocked_for": 5.0,
    }


def test_diagnose_send_first():
    states = {0: _rank(_msg("send", 1), call={"fn": "send"}), 1: _rank(_msg("send", 0))}
    assert diagnose(states).startswith("both ranks send first — a deadlock")
    line = summarize(states, 10.0)
    assert line.startswith("rank 0 blocked in send to 1 (at ring.py:9 in f), rank 1 blocked in ")
    assert " for 10 s: both ranks send first" in line
    three = {r: _rank(_msg("isend", (r + 1) % 3)) for r in range(3)}
    assert diagnose(three).startswith("every rank sends first — a deadlock")


def test_diagnose_wrong_peer_and_tags_and_early_return():
    ring = {r: _rank(_msg("isend", (r + 1) % 3), _msg("irecv", (r + 1) % 3)) for r in range(3)}
    assert "rank 0 waits for a message from rank 1, but rank 1 sends to rank 2" in diagnose(ring)
    tags = {0: _rank(_msg("isend", 1, 4), _msg("irecv", 1, 1)), 1: _rank(_msg("irecv", 0, 6))}
    got = diagnose(tags)
    assert got.startswith("the message tags differ: rank 1 waits for rank 0's messages with tag 6")
    assert "carry tag 4" in got
    gone = {
        0: _rank(_msg("irecv", 1)),
        1: _rank(call={"fn": "barrier"}, where="", exit_barrier=True),
    }
    assert (
        diagnose(gone)
        == "rank 0 waits for a message from rank 1, which returned without sending it"
    )
    assert "rank 1 returned and waits for the other ranks" in summarize(gone, 3)


def test_diagnose_different_collectives():
    states = {0: _rank(call={"fn": "all_reduce"}), 1: _rank(call={"fn": "broadcast"})}
    assert diagnose(states).startswith("the ranks are in different calls (rank 0 in all_reduce")


@pytest.fixture(scope="module", autouse=True)
def warm():
    launch(_dist_workers.env_report, 2, quiet=True, timeout=120)


@pytest.mark.parametrize("how", ["sleep", "compute"])
def test_waiting_for_a_working_peer_is_not_a_hang(how):
    """Rank 0 sleeps or computes for 3 s (a long C call: its frame does not move either) while
    rank 1 waits in recv; with hang_timeout=1 the run must still finish normally."""
    out = launch(watch_ranks.late_sender, 2, how, 3.0, quiet=True, timeout=60, hang_timeout=1.0)
    assert out == [8.0, 7.0]


def test_deadlock_warns_while_waiting(capfd):
    t = time.monotonic()
    with pytest.raises(LaunchDeadlock) as ei:
        launch(watch_ranks.both_recv, 2, quiet=True, timeout=60, hang_timeout=4.0)
    assert time.monotonic() - t < 15
    err = capfd.readouterr().err
    warn = [ln for ln in err.splitlines() if ln.startswith("shardlab.launch: ")]
    assert warn and "rank 0 blocked in recv from 1" in warn[0], err
    assert warn[0].endswith("the run is stopped after 4 s")
    assert ei.value.summary.startswith("rank 0 blocked in recv from 1")
    assert "rank 1 blocked in recv from 0" in ei.value.summary
    assert "every rank waits to receive and none is sending" in ei.value.summary


def test_hang_timeout_none_leaves_only_the_timeout():
    with pytest.raises(LaunchDeadlock):
        launch(watch_ranks.both_recv, 2, quiet=True, timeout=60, hang_timeout=2.0)
    from shardlab.runtime import LaunchTimeout

    with pytest.raises(LaunchTimeout) as ei:
        launch(watch_ranks.both_recv, 2, quiet=True, timeout=6, hang_timeout=None)
    assert not isinstance(ei.value, LaunchDeadlock)
    assert "exceeded its timeout of 6 s" in str(ei.value)
    with pytest.raises(ValueError, match="hang_timeout=0"):
        launch(watch_ranks.both_recv, 2, hang_timeout=0)


def test_recorders_keep_torchs_p2p_apis_working():
    out = launch(watch_ranks.batched_exchange, 2, quiet=True, timeout=60)
    assert out == [[1.0, 11.0, "_P2P"], [0.0, 10.0, "_P2P"]]
