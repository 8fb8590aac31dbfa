"""Issue 24: limits that existed only on paper (memory outside processes, threads, bursts).

Each attack runs in its own sandbox, sized small (a 256 MB cap, 400 MB of shared memory;
300 threads under a limit of 64; 200 processes under 32), and can only harm that sandbox.
With a cgroup per sandbox (used automatically where the machine offers one) the kernel
enforces the limits; ``Limits(cgroup=False)`` forces the sampling fallback.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time

import psutil
import pytest
from grading_fixtures.sandboxed import outcomes, probe_lines, run_in_sandbox
from shardlab.grading import Limits
from shardlab.grading._cgroup import available as cgroup_available

TAG = "shardlab-sandbox-limits-tag"

MEMFD = r"""
import os

def test_memfd_outside_processes():
    block = b"m" * (32 << 20)
    fds = []
    for i in range(1, 13 + 1):  # 13 x 32 MB (under RLIMIT_FSIZE each), never mapped: no RSS
        fds.append(os.memfd_create(f"hog{i}"))
        os.write(fds[-1], block)
        print("HELD", 32 * i, flush=True)
    print("ALLOCATED", flush=True)
    import time
    time.sleep(5)
"""

SYSV = r"""
import ctypes, ctypes.util, time

def test_sysv_shm_outside_processes():
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    libc.shmat.restype = ctypes.c_void_p
    libc.shmat.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
    held = 0
    for i in range(13):  # 13 x 32 MB segments, each filled then detached: owned by no process
        sid = libc.shmget(0, 32 << 20, 0o1600)  # IPC_PRIVATE | IPC_CREAT | 0600
        assert sid >= 0, ctypes.get_errno()
        addr = libc.shmat(sid, None, 0)
        ctypes.memset(addr, 7, 32 << 20)
        libc.shmdt(ctypes.c_void_p(addr))
        held += 32
        print("HELD", held, flush=True)
    print("ALLOCATED", flush=True)
    time.sleep(5)
"""

THREADS = r"""
import threading, time

def test_many_threads():
    stop = threading.Event()
    started = 0
    for _ in range(300):
        threading.Thread(target=stop.wait, daemon=True).start()
        started += 1
    print("THREADS", started, flush=True)
    time.sleep(3)  # the sampling fallback looks every 0.2 s
    stop.set()
"""

BURST = r"""
import subprocess, time

def test_burst():
    for _ in range(200):
        try:
            subprocess.Popen(["/bin/sh", "-c", "sleep 120; :", "TAG"])
        except OSError:
            break
    time.sleep(60)
"""


def _memory_limits() -> Limits:
    return Limits(timeout=90, max_rss_gb=0.25, tmp_mb=64)


@pytest.mark.skipif(not cgroup_available(), reason="no cgroup on this machine: RSS sampling only")
@pytest.mark.parametrize("source", [MEMFD, SYSV], ids=["memfd", "sysv"])
def test_shared_memory_counts_against_the_cap(tmp_path, source):
    run = run_in_sandbox(tmp_path, source, _memory_limits())
    held = probe_lines(run, "HELD")
    assert "ALLOCATED" not in run.log_tail, (held, run.log_tail[-2000:])
    assert "memory" in run.killed_reason, (run.killed_reason, held, run.log_tail[-2000:])
    assert not any(v == "passed" for v in outcomes(run).values())
    assert held == [] or int(held[-1]) <= 288, held  # never much more than the cap


@pytest.mark.parametrize("cgroup", [True, False], ids=["cgroup", "sampling"])
def test_threads_count_against_max_procs(tmp_path, cgroup):
    if cgroup and not cgroup_available():
        pytest.skip("no cgroup on this machine")
    limits = Limits(timeout=60, max_procs=64, tmp_mb=64, cgroup=cgroup)
    run = run_in_sandbox(tmp_path, THREADS, limits)
    assert "too many processes" in run.killed_reason, (run.killed_reason, run.log_tail[-2000:])
    assert outcomes(run).get("test_many_threads") != "passed"


def _tagged(tag):
    found = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if tag in " ".join(p.info["cmdline"] or []):
                found.append(p)
        except psutil.Error:
            continue
    return found


@pytest.mark.parametrize("cgroup", [True, False], ids=["cgroup", "sampling"])
def test_process_burst_ends_at_once(tmp_path, cgroup):
    if cgroup and not cgroup_available():
        pytest.skip("no cgroup on this machine")
    limits = Limits(timeout=60, max_procs=32, tmp_mb=64, cgroup=cgroup)
    start = time.monotonic()
    tag = f"{TAG}-{'cgroup' if cgroup else 'sampling'}"  # the two may run at the same time
    run = run_in_sandbox(tmp_path, BURST.replace("TAG", tag), limits)
    took = time.monotonic() - start
    assert "too many processes" in run.killed_reason, (run.killed_reason, run.log_tail[-2000:])
    assert took < 30, took  # killing PID 1 ends the namespace at once
    assert _tagged(tag) == []


def test_process_scan_is_linear():
    """One process map per scan: 300 processes in well under a second (was 1.4 s)."""
    from shardlab.grading._proctree import _Tree

    parent = subprocess.Popen(
        ["/bin/sh", "-c", "for i in $(seq 300); do sleep 60 & done; wait"],
        start_new_session=True,
    )
    try:
        root = psutil.Process(parent.pid)
        deadline = time.monotonic() + 30
        while len(root.children()) < 300 and time.monotonic() < deadline:
            time.sleep(0.1)
        tree = _Tree(root, parent.pid, "no-token")
        calls = {"children": 0, "process_iter": 0}
        real_children, real_iter = psutil.Process.children, psutil.process_iter

        def children(self, *a, **k):
            calls["children"] += 1
            return real_children(self, *a, **k)

        def process_iter(*a, **k):
            calls["process_iter"] += 1
            return real_iter(*a, **k)

        best = float("inf")
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(psutil.Process, "children", children)
            mp.setattr(psutil, "process_iter", process_iter)
            for _ in range(3):
                t0 = time.perf_counter()
                found = tree.scan()
                best = min(best, time.perf_counter() - t0)
        assert len(found) >= 301
        # one pass over the process table per scan, no per-process descendant walk
        assert calls == {"children": 0, "process_iter": 3}, calls
        assert best < 0.5, best
    finally:
        os.killpg(parent.pid, 9)
        parent.wait()


@pytest.mark.skipif(not cgroup_available(), reason="no cgroup on this machine")
def test_cgroup_gets_the_limits():
    from shardlab.grading._cgroup import create

    cg = create("test-limits", memory_bytes=300 << 20, tasks=50)
    assert cg is not None
    try:
        assert cg.read_limits() == {"memory": 300 << 20, "tasks": 50}
        assert cg.cpu_weight_set()
    finally:
        cg.remove()
    assert not any(os.path.exists(d) for d in cg.dirs)


@pytest.mark.skipif(not cgroup_available(), reason="no cgroup on this machine")
def test_groups_of_a_dead_grader_are_swept():
    """A grader killed mid-run leaves its (empty) groups; the next grader removes them."""
    from shardlab.grading import _cgroup

    dead = 4_000_000  # above any pid_max: no such process
    while os.path.exists(f"/proc/{dead}"):
        dead += 1
    _, parents = _cgroup._parents()
    left = [os.path.join(parent, f"shardlab-{dead}-left") for parent in parents.values()]
    young = [os.path.join(parent, f"shardlab-{dead}-young") for parent in parents.values()]
    try:
        for path in left + young:
            os.mkdir(path)
        for path in left:
            os.utime(path, (time.time() - 600, time.time() - 600))
        _cgroup._swept.clear()
        cg = _cgroup.create("sweeper", memory_bytes=64 << 20, tasks=8)
        cg.remove()
        assert not any(os.path.exists(p) for p in left)
        assert all(os.path.exists(p) for p in young)  # maybe a live grader's, just created
    finally:
        for path in left + young:
            with contextlib.suppress(OSError):
                os.rmdir(path)


SLEEPER = r"""
import time

def test_sleep():
    time.sleep(4)
"""


@pytest.mark.skipif(not cgroup_available(), reason="no cgroup on this machine")
def test_each_sandbox_has_its_own_cpu_group(tmp_path):
    """Busy sandboxes share the CPUs by sandbox, not by process count (was: no CPU share)."""
    import threading

    from shardlab.grading import _cgroup

    box: dict = {}
    worker = threading.Thread(
        target=lambda: box.update(run=run_in_sandbox(tmp_path, SLEEPER, Limits(timeout=60)))
    )
    worker.start()
    seen: dict[int, str] = {}
    try:
        deadline = time.monotonic() + 30
        while worker.is_alive() and time.monotonic() < deadline and not seen:
            for p in psutil.Process().children(recursive=True):
                with contextlib.suppress(OSError, psutil.Error):
                    argv = p.cmdline()
                    if len(argv) > 1 and argv[-1] == "pytest" and argv[-2].endswith("/_runner.py"):
                        with open(f"/proc/{p.pid}/cgroup") as fh:
                            seen[p.pid] = fh.read()
            time.sleep(0.2)
    finally:
        worker.join()
    assert seen, "the sandbox's pytest was not found"
    version, _ = _cgroup._parents()
    for text in seen.values():
        lines = [ln.split(":", 2) for ln in text.splitlines()]
        cpu = [path for _, ctrls, path in lines if ("cpu" in ctrls.split(",") or version == "v2")]
        assert cpu and all(f"/shardlab-{os.getpid()}-" in path for path in cpu), text
    assert outcomes(box["run"]).get("test_sleep") == "passed"
