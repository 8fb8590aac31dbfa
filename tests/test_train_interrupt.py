"""``shardlab train`` stopped from outside (issue 30): Ctrl-C prints one sentence, a timeout
shows the stacks it promises, and a killed launcher's scratch files are swept by the next one.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from shardlab.runtime._scratch import make_run_dir, sweep_stale

ROOT = Path(__file__).resolve().parents[1]
LONG = ["--layout", "ddp", "--steps", "1000000", "--threads", "1"]


def _train(*args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "shardlab", "train", *args], cwd=ROOT, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )


def _dead_pid() -> int:
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    return int(proc.stdout)


def test_ctrl_c_prints_one_sentence_and_stops_the_ranks():
    proc = _train(*LONG)
    first = proc.stderr.readline()  # the first progress line: the ranks are training
    assert first.startswith("step "), first
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    assert err.strip().splitlines()[-1] == (
        "shardlab train: interrupted (Ctrl-C); every rank was stopped."
    )
    assert not [p for p in Path("/tmp").glob(f"shardlab-*-{proc.pid}-*")]


@pytest.mark.slow
def test_timeout_message_shows_the_stacks_it_promises():
    proc = _train(*LONG, "--timeout", "15")
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, err
    assert "stacks of every rank at that moment:" in err
    for r in (0, 1):
        block = err.split(f"--- rank {r}")[1]
        assert 'File "' in block and "line " in block, err


def test_a_killed_launchers_scratch_files_are_swept(tmp_path):
    dead, alive = _dead_pid(), os.getpid()
    stale_dir = tmp_path / f"shardlab-launch-{dead}-abc123"
    stale_dir.mkdir()
    (stale_dir / "rank0.out").write_text("x")
    stale_file = tmp_path / f"shardlab-train-{dead}-xyz.progress"
    stale_file.write_text("1 10 0.5 0.1\n")
    live = tmp_path / f"shardlab-launch-{alive}-def456"
    live.mkdir()
    other = [tmp_path / "shardlab-launch-oldstyle", tmp_path / f"notes-{dead}-x"]
    for p in other:
        p.mkdir()
    removed = sweep_stale(str(tmp_path))
    assert sorted(removed) == sorted([str(stale_dir), str(stale_file)])
    assert not stale_dir.exists() and not stale_file.exists()
    assert live.is_dir() and all(p.is_dir() for p in other)


def test_a_launch_folder_names_its_owner():
    path = Path(make_run_dir())
    try:
        assert path.name.startswith(f"shardlab-launch-{os.getpid()}-")
        assert str(path) not in sweep_stale(str(path.parent))  # we are alive: kept
        assert path.is_dir()
    finally:
        path.rmdir()


@pytest.mark.slow
def test_a_sigkilled_launcher_leaves_files_the_next_launch_removes():
    proc = _train(*LONG)
    assert proc.stderr.readline().startswith("step ")
    mine = sorted(Path("/tmp").glob(f"shardlab-*-{proc.pid}-*"))
    assert len(mine) == 2, mine  # the launch folder and the progress file
    proc.kill()  # SIGKILL: the launcher cannot clean up after itself
    proc.wait(timeout=30)
    time.sleep(0.5)
    # Not asserted: that both files still exist here. Under pytest-xdist another worker's
    # launch may already have swept them (seen once in make test-slow), which is the property
    # below happening early; the next launch must leave none of them, either way.
    path = make_run_dir()  # the next launch's start
    os.rmdir(path)
    assert not any(p.exists() for p in mine)
