"""The launcher's warm start (shardlab.runtime._zygote): ranks forked from an interpreter that
imported torch once behave like freshly spawned ones, and nothing outlives the caller."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import psutil
import pytest

sys.path.insert(0, str(Path(__file__).parent))

from _dist_util import assert_no_survivors  # noqa: E402
from shardlab.runtime import _zygote, launch  # noqa: E402

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the zygote is Linux only")

RANK_MODULE = textwrap.dedent(
    """
    import os

    def who(name):
        return {"ppid": os.getppid(), "value": os.environ.get(name), "cwd": os.getcwd(),
                "rank": int(os.environ["RANK"]), "sid": os.getsid(0), "pid": os.getpid()}
    """
)


def _write_module(folder: Path) -> str:
    """A rank module written *after* the zygote may have started (import caches must not hide it)."""
    name = f"zy_{uuid.uuid4().hex[:8]}"
    (folder / f"{name}.py").write_text(RANK_MODULE)
    return name


def test_ranks_fork_from_the_zygote_and_see_the_callers_present(tmp_path, monkeypatch):
    launch("_dist_workers:env_report", 2, quiet=True)  # the zygote exists from here on
    zpid = _zygote.pid()
    assert zpid is not None and zpid != os.getpid()
    name = _write_module(tmp_path)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SHARDLAB_ZYGOTE_PROBE", "set-after-the-zygote-started")
    res = launch(f"{name}:who", 2, "SHARDLAB_ZYGOTE_PROBE", quiet=True)
    assert [r["rank"] for r in res] == [0, 1]
    assert all(r["ppid"] == zpid for r in res), (zpid, res)  # forked, not spawned
    assert all(r["value"] == "set-after-the-zygote-started" for r in res)
    assert all(r["cwd"] == str(tmp_path) for r in res)
    assert all(r["sid"] == r["pid"] for r in res)  # each rank leads its own session
    assert _zygote.pid() == zpid  # one zygote serves every launch of this process
    assert_no_survivors("none")


@pytest.mark.parametrize(
    "env, why",
    [({"TORCH_SHOW_CPP_STACKTRACES": "1"}, "read when torch loads"), ({}, "turned off")],
)
def test_spawned_when_the_environment_must_be_fresh(tmp_path, monkeypatch, env, why):
    name = _write_module(tmp_path)
    monkeypatch.chdir(tmp_path)
    if not env:
        monkeypatch.setenv("SHARDLAB_WARM_START", "0")
    res = launch(f"{name}:who", 2, "TORCH_SHOW_CPP_STACKTRACES", env=env, quiet=True)
    assert all(r["ppid"] == os.getpid() for r in res), why  # children of the caller itself
    assert [r["value"] for r in res] == [env.get("TORCH_SHOW_CPP_STACKTRACES")] * 2


def test_a_changed_runtime_file_restarts_the_zygote(monkeypatch):
    launch("_dist_workers:env_report", 2, quiet=True)
    old = _zygote.pid()
    monkeypatch.setattr(_zygote, "_started", 0.0)  # as if every runtime file changed since
    launch("_dist_workers:env_report", 2, quiet=True)
    new = _zygote.pid()
    assert new is not None and new != old and not psutil.pid_exists(old)
    launch("_dist_workers:env_report", 2, quiet=True)
    assert _zygote.pid() == new  # unchanged files: the same zygote serves the next launch


def test_usable():
    assert _zygote.usable("gloo", None) and _zygote.usable("gloo", {"OMP_NUM_THREADS": "1"})
    assert not _zygote.usable("nccl", None)  # CUDA is never initialised before a fork
    assert not _zygote.usable("gloo", {"PYTHONHASHSEED": "0"})


def test_the_zygote_and_its_ranks_end_with_the_caller(tmp_path):
    """A caller that exits (normally, or killed while its ranks hang) leaves no process."""
    script = tmp_path / "caller.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import sys, time
            sys.path.insert(0, {str(Path(__file__).parent)!r})
            from shardlab.runtime import _zygote, launch
            launch("_dist_workers:env_report", 2, quiet=True)
            print(_zygote.pid(), flush=True)
            if sys.argv[1] == "hang":
                launch("_dist_workers:hang_on", 2, 0, quiet=True, timeout=600)
            """
        )
    )
    for mode in ("exit", "hang"):
        caller = subprocess.Popen(
            [sys.executable, str(script), mode], stdout=subprocess.PIPE, text=True
        )
        zpid = int(caller.stdout.readline())
        zygote = psutil.Process(zpid)
        if mode == "hang":
            deadline = time.monotonic() + 30
            while len(zygote.children()) < 2 and time.monotonic() < deadline:
                time.sleep(0.05)
            ranks = zygote.children()
            assert len(ranks) == 2, "the hanging launch's ranks were not forked"
            caller.kill()
        assert caller.wait(timeout=30) in (0, -9)
        gone, alive = psutil.wait_procs([zygote] + (ranks if mode == "hang" else []), timeout=5)
        assert not alive, f"{mode}: still running after the caller ended: {alive}"
