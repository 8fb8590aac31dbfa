"""Paths that only other machines take, forced here (issue 23, part 3).

Nothing in this project had run on more than 2 cores or off Linux. These tests fake the CPU
set (``os.sched_getaffinity``) and the platform so the code a 16-core workstation or a macOS
laptop runs is exercised on this 2-core Linux machine:

* thread counts per rank and lab 05's core binding for 2, 4, 8 and 16 cores;
* the launcher's spawn fallback (no warm zygote off Linux) and the wire counters' "not
  measurable" path (``SHARDLAB_WIRE=0`` answers as off Linux), the latter in a real 2-rank run
  whose logical byte counts must still be right.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import types
from pathlib import Path

import pytest
from shardlab.runtime import _zygote, launch, wire

# the module itself (the package attribute `launch` is the function)
launch_mod = sys.modules["shardlab.runtime.launch"]

sys.path.insert(0, str(Path(__file__).parent))

REPO = Path(__file__).resolve().parents[1]


def _fake_cores(monkeypatch, n: int) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(n)), raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: n)


@pytest.mark.parametrize("cores, nprocs, threads", [(2, 2, 1), (4, 2, 2), (8, 4, 2), (16, 4, 4), (16, 3, 5), (2, 4, 1)])
def test_threads_per_rank_follow_the_cpu_set(monkeypatch, cores, nprocs, threads):
    _fake_cores(monkeypatch, cores)
    assert launch_mod._cores() == cores
    assert launch_mod.threads_per_rank(nprocs) == threads  # at least 1, never oversubscribed


def test_cores_without_affinity_uses_cpu_count(monkeypatch):
    """macOS has no sched_getaffinity: the CPU count stands in."""
    monkeypatch.delattr(os, "sched_getaffinity", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 10)
    assert launch_mod._cores() == 10


def _load_pipeline_workers():
    path = REPO / "labs" / "05_pipeline" / "_timing_pipeline.py"
    sys.path.insert(0, str(path.parent))
    spec = importlib.util.spec_from_file_location("_timing_pipeline_portability", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("cores, world, bound", [(2, 2, True), (16, 4, True), (2, 4, False), (1, 2, False)])
def test_lab05_binds_each_rank_to_a_core_only_when_every_rank_gets_one(monkeypatch, cores, world, bound):
    wp = _load_pipeline_workers()
    calls = []
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(100, 100 + cores)), raising=False)
    monkeypatch.setattr(os, "sched_setaffinity", lambda tid, cpus: calls.append((tid, cpus)), raising=False)
    monkeypatch.delenv("SHARDLAB_PIN", raising=False)
    rank = world - 1
    fake_dist = types.SimpleNamespace(get_world_size=lambda: world, get_rank=lambda: rank)
    monkeypatch.setattr(wp, "dist", fake_dist)
    wp._pin_to_core()
    if bound:
        assert calls and all(cpus == {100 + rank} for _, cpus in calls)  # core `rank` of the set
    else:
        assert calls == []  # fewer cores than ranks: the scheduler shares them


def test_no_warm_start_off_linux(monkeypatch):
    monkeypatch.setattr(sys, "platform", "darwin")
    assert not _zygote.usable("gloo", None)
    monkeypatch.setattr(sys, "platform", "linux")
    assert _zygote.usable("gloo", None) or os.environ.get("SHARDLAB_WARM_START") == "0"
    assert not _zygote.usable("nccl", None)  # CUDA is never initialised before a fork
    # ATen picks its kernels once per process: a rank asked for other kernels starts fresh
    assert not _zygote.usable("gloo", {"ATEN_CPU_CAPABILITY": "default"})


def test_wire_not_measurable_off_linux(monkeypatch):
    monkeypatch.setattr(sys, "platform", "darwin")
    assert not wire.available() and wire.snapshot() is None
    reason = wire.not_measurable_reason("gloo")
    assert reason.startswith("not measurable") and "darwin" in reason


def test_real_run_off_linux_paths(tmp_path, monkeypatch):
    """A 2-rank run as a macOS student gets it: spawned ranks (no zygote), wire counters off.
    The logical bytes each collective moved are still counted; the wire column says why it
    is empty instead of showing zeros."""
    import _wire_workers as w
    from shardlab import accounting as acc

    monkeypatch.setenv("SHARDLAB_WARM_START", "0")
    res = launch(w.traced_all_reduce, 2, env={"SHARDLAB_WIRE": "0"}, quiet=True, timeout=120)
    for out in res:
        assert out["total"] is None
        assert "not measurable" in out["table"] and "SHARDLAB_WIRE=0" in out["table"]
        assert all(v is None for v in out["phases"].values())
        [rec] = [r for r in out["records"] if r.phase == "all_reduce"]
        assert rec.nbytes == w.NUMEL * 4  # logical size of the traced call, as on Linux
        assert rec.wire_bytes is None and rec.wire_note.startswith("not measurable")
        # ring model per rank: 2 (D-1)/D of the tensor = the whole tensor at D = 2
        assert rec.sent_bytes == acc.comm.ring_sent_bytes("all_reduce", w.NUMEL * 4, 2)


def test_gpu_check_without_cuda_says_so():
    """``make gpu-check`` on a machine without a GPU: one sentence, exit 2 (CI never needs it)."""
    import subprocess

    if __import__("torch").cuda.is_available():
        pytest.skip("a CUDA device is visible: make gpu-check runs the real check")
    proc = subprocess.run([sys.executable, str(REPO / "tools" / "gpu_check.py")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "no CUDA device is visible" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize("cores, workers", [(1, 1), (2, 1), (8, 4), (32, 16)])
def test_grader_default_workers_follow_the_cpu_set(monkeypatch, cores, workers):
    """``shardlab grade`` without ``--workers``: half the cores of the CPU set, at least one."""
    from shardlab.grading._options import default_workers

    _fake_cores(monkeypatch, cores)
    assert default_workers() == workers
