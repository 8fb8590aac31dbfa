"""Fault injection for shardlab.runtime.launch: every failure is reported, no process survives.

Each fault is repeated ``SHARDLAB_FAULT_REPEATS`` times (default 2 to keep the suite fast;
``SHARDLAB_FAULT_REPEATS=10`` for the full check)."""

from __future__ import annotations

import os
import sys
import uuid
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

import _dist_workers as w  # noqa: E402
from _dist_util import assert_no_survivors  # noqa: E402
from shardlab.runtime import LaunchTimeout, RankError, launch  # noqa: E402

# once each in `make test`; `make test-slow` repeats every fault 10 times
REPEATS = int(os.environ.get("SHARDLAB_FAULT_REPEATS", "1"))


def _run(fn, *args, **kw):
    marker = uuid.uuid4().hex
    try:
        launch(fn, 2, *args, quiet=True, env={"SHARDLAB_TEST_MARKER": marker}, **kw)
    finally:
        assert_no_survivors(marker)


@pytest.mark.parametrize("rep", range(REPEATS))
def test_rank_raises(rep):
    with pytest.raises(RankError) as ei:
        _run(w.raise_on, 1)
    e = ei.value
    assert e.rank == 1
    msg = str(e)
    assert msg.startswith("rank 1 raised ValueError: boom on rank 1")
    assert "raise ValueError" in e.remote_traceback and "_dist_workers.py" in msg


@pytest.mark.parametrize("rep", range(REPEATS))
def test_hang_reaches_timeout_and_shows_stacks(rep):
    with pytest.raises(LaunchTimeout) as ei:
        # generous: on a loaded 2-core machine starting torch in two ranks can take seconds
        _run(w.hang_on, 1, timeout=15.0)
    e = ei.value
    assert isinstance(e, TimeoutError)
    assert "_sleep_forever" in e.stacks[1], e.stacks
    assert "barrier" in e.stacks[0], e.stacks
    assert "--- rank 0 ---" in str(e) and "_sleep_forever" in str(e)


@pytest.mark.parametrize("rep", range(REPEATS))
def test_rank_killed_by_sigkill(rep):
    with pytest.raises(RankError, match="rank 1 was killed by signal SIGKILL") as ei:
        _run(w.sigkill_on, 1)
    assert ei.value.rank == 1


@pytest.mark.parametrize("rep", range(REPEATS))
def test_rank_os_exit(rep):
    with pytest.raises(RankError, match="rank 1 exited with code 3") as ei:
        _run(w.exit_on, 1, 3)
    assert ei.value.rank == 1


def test_grandchild_in_own_session_is_killed():
    with pytest.raises(LaunchTimeout):
        _run(w.spawn_grandchild_and_hang, timeout=6.0)


def test_lowest_failing_rank_reported_first_and_others_mentioned():
    with pytest.raises(RankError) as ei:
        _run(w.raise_all)
    e = ei.value
    assert e.rank == 0 and set(e.failures) == {0, 1}
    assert str(e).startswith("rank 0 raised KeyError")
    assert "other ranks that failed: rank 1 raised KeyError" in str(e)


def test_output_printed_on_failure(capsys):
    with pytest.raises(RankError):
        launch(w.print_then_raise, 2)
    out = capsys.readouterr().out.splitlines()
    assert out[:2] == ["[rank 0] before the error 0", "[rank 1] before the error 1"]
