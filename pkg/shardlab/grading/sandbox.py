"""Run pytest on one submission in a separate, limited, killable process tree.

Process layout::

    grader (this process, possibly several threads, one per submission)
      └─ supervisor  python -m shardlab.grading._runner supervise   (new session)
           └─ pytest python -m shardlab.grading._runner pytest      (cwd = work dir)
                └─ whatever the submission starts (ranks, daemons, ...)

What is limited, and how
    * wall clock: the grader waits at most ``timeout`` seconds, then kills everything;
    * CPU seconds (``RLIMIT_CPU``), address space (``RLIMIT_AS``, generous: torch reserves
      a lot of virtual memory; not set when CUDA is used) and file size (``RLIMIT_FSIZE``,
      stops an output flood from filling the disk) are set by the supervisor with
      ``resource.setrlimit`` and inherited by every descendant. The supervisor applies them
      to itself instead of the grader using ``preexec_fn``, which is unsafe in a threaded
      program;
    * number of processes and total resident memory: ``RLIMIT_NPROC`` counts all processes
      of the *user* (root is exempt), so it cannot limit one sandbox. A monitor polls the
      sandbox's processes with psutil every ``poll`` seconds and kills the whole tree when
      either exceeds its limit.

Finding every process of the sandbox
    The tree is found three ways, because a submission can leave each one: (1) descendants
    by parent pid (psutil), (2) members of the supervisor's session (``start_new_session``),
    (3) processes whose environment carries this sandbox's random token
    (``SHARDLAB_SANDBOX``; readable for processes of the same user). On Linux the supervisor
    is a child subreaper, so a daemon that double-forks is re-parented to the supervisor
    rather than to init and is still found by (1). The grader itself is *not* a subreaper:
    otherwise a submission that kills its parent twice would reach the grader. Only a process
    that leaves its session, clears its environment *and* escapes the subreaper (by killing
    the supervisor first) is missed (see the threat model).
    To kill, every process found is frozen with SIGSTOP (repeatedly, until no new process
    appears), then all get SIGKILL, so nothing can fork during the kill.

Output
    stdout and stderr of the tree go to one file in the private folder; it can grow only up
    to ``RLIMIT_FSIZE`` and only its last ``log_tail`` bytes are read back.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

TOKEN_ENV = "SHARDLAB_SANDBOX"


@dataclass(frozen=True)
class Limits:
    """Resource limits of one sandbox run."""

    timeout: float = 120.0  # wall-clock seconds for the whole pytest run
    cpu_seconds: int | None = None  # per process; default 2 * timeout + 10
    address_space_gb: float | None = 16.0  # per process RLIMIT_AS; None = unlimited
    file_size_mb: float = 64.0  # RLIMIT_FSIZE: any single file, including the output log
    max_procs: int = 32  # processes in the sandbox tree at the same time
    max_rss_gb: float = 6.0  # resident memory of the whole tree
    poll: float = 0.2  # monitor period, seconds

    def rlimits(self, cuda: bool) -> dict:
        cpu = self.cpu_seconds if self.cpu_seconds is not None else int(2 * self.timeout + 10)
        limits = {
            "RLIMIT_CPU": cpu,
            "RLIMIT_FSIZE": int(self.file_size_mb * 2**20),
            "RLIMIT_CORE": 0,
        }
        if self.address_space_gb is not None and not cuda:
            limits["RLIMIT_AS"] = int(self.address_space_gb * 2**30)
        return limits


@dataclass
class RunResult:
    """What happened to one sandbox run (the grader interprets it)."""

    returncode: int | None  # of the pytest process when known, else of the supervisor
    timed_out: bool = False
    killed_reason: str = ""  # "too many processes" / "memory" / "" ...
    supervisor_killed: bool = False
    junit: bytes | None = None
    progress: list[dict] = field(default_factory=list)
    log_tail: str = ""
    survivors_killed: int = 0
    wall: float = 0.0


def _proc(pid: int) -> psutil.Process | None:
    try:
        return psutil.Process(pid)
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None


def _alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


class _Tree:
    """Bookkeeping of every process known to belong to one sandbox."""

    def __init__(self, root: psutil.Process, sid: int, token: str):
        self.root, self.sid, self.token = root, sid, token
        self.known: dict[int, psutil.Process] = {root.pid: root}

    def scan(self, deep: bool = False) -> list[psutil.Process]:
        """Refresh and return the live processes of the sandbox."""
        for p in list(self.known.values()):
            if _alive(p):
                with contextlib.suppress(psutil.Error):
                    for c in p.children(recursive=True):
                        self.known.setdefault(c.pid, c)
        me = os.getpid()
        for p in psutil.process_iter():
            if p.pid in self.known or p.pid == me:
                continue
            try:
                if os.getsid(p.pid) == self.sid:
                    self.known[p.pid] = p
                elif deep and self.token in p.environ().get(TOKEN_ENV, ""):
                    self.known[p.pid] = p
            except (OSError, psutil.Error):
                continue
        return [p for p in self.known.values() if _alive(p)]

    def rss(self, procs: list[psutil.Process]) -> int:
        total = 0
        for p in procs:
            with contextlib.suppress(psutil.Error):
                total += p.memory_info().rss
        return total

    def kill_all(self, settle: float = 1.0) -> int:
        """Freeze (SIGSTOP) every process of the sandbox until no new one appears, then SIGKILL all.

        Freezing first means nothing can fork or escape while the tree is being killed; the
        settle period catches a process that was half-way through escaping anyway.
        """
        killed: set[int] = set()
        quiet_since = None
        give_up = time.monotonic() + 30.0
        while time.monotonic() < give_up:
            stopped: set[int] = set()
            for _ in range(50):
                procs = [p for p in self.scan(deep=True) if p.pid not in stopped]
                if not procs:
                    break
                for p in procs:
                    with contextlib.suppress(psutil.Error):
                        p.send_signal(signal.SIGSTOP)
                    stopped.add(p.pid)
            with contextlib.suppress(OSError):
                os.killpg(self.sid, signal.SIGKILL)
            for pid in stopped:
                with contextlib.suppress(psutil.Error):
                    self.known[pid].kill()
                    killed.add(pid)
            now = time.monotonic()
            if stopped:
                quiet_since = None
            elif quiet_since is None:
                quiet_since = now
            elif now - quiet_since >= settle:
                break
            time.sleep(0.05)
        return len(killed - {self.root.pid})


_supervisors: set[int] = set()  # live supervisor pids of all running sandboxes
_supervisors_lock = threading.Lock()


def _tail(path: Path, nbytes: int) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - nbytes))
            data = fh.read(nbytes)
    except OSError:
        return ""
    text = data.decode("utf-8", "replace")
    if size > nbytes:
        text = f"[... {size - nbytes} earlier bytes of output not shown]\n" + text
    return text


def run_pytest(
    workdir: Path,
    private: Path,
    limits: Limits,
    *,
    cuda: bool = False,
    ini: Path,
    pytest_args: tuple[str, ...] = (),
    log_tail: int = 8000,
) -> RunResult:
    """Run pytest over ``workdir`` in a fresh limited process tree; always kill the tree."""
    private = Path(private)
    token = secrets.token_hex(16)
    junit = private / f"junit-{secrets.token_hex(8)}.xml"
    progress = private / f"progress-{secrets.token_hex(8)}.jsonl"
    log_path = private / "output.log"
    config = {
        "workdir": str(workdir),
        "private": str(private),
        "ini": str(ini),
        "junit": str(junit),
        "progress": str(progress),
        "cuda": cuda,
        "limits": limits.rlimits(cuda),
        "pytest_args": list(pytest_args),
    }
    env = dict(os.environ)
    for var in ("PYTEST_ADDOPTS", "PYTEST_PLUGINS", "PYTHONSTARTUP", "PYTEST_CURRENT_TEST"):
        env.pop(var, None)
    pkg_parent = str(Path(__file__).resolve().parents[2])
    env.update(
        {
            TOKEN_ENV: token,
            "PYTHONPATH": pkg_parent,
            "PYTHONDONTWRITEBYTECODE": "1",
            "PYTHONHASHSEED": "0",
            "PYTHONUNBUFFERED": "1",
            "OMP_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1",
            "TMPDIR": str(workdir / ".tmp"),
            "MPLBACKEND": "Agg",
            # only pytest's own plugins: faster start, and nothing installed can alter reports
            "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
        }
    )
    if not cuda:
        env["CUDA_VISIBLE_DEVICES"] = ""
    (workdir / ".tmp").mkdir(exist_ok=True)
    start = time.monotonic()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "shardlab.grading._runner", "supervise"],
            stdin=subprocess.PIPE,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=str(workdir),
            env=env,
            start_new_session=True,
        )
    with _supervisors_lock:
        _supervisors.add(proc.pid)
    result = RunResult(returncode=None)
    tree = _Tree(psutil.Process(proc.pid), proc.pid, token)
    try:
        proc.stdin.write(json.dumps(config).encode())
        proc.stdin.close()
    except OSError:
        pass
    pytest_proc: psutil.Process | None = None
    deadline = start + limits.timeout
    try:
        while True:
            if pytest_proc is None:
                with contextlib.suppress(OSError, ValueError):
                    pid = int((private / "pytest.pid").read_text())
                    pytest_proc = _proc(pid)
                    if pytest_proc is not None:
                        tree.known.setdefault(pid, pytest_proc)
            with contextlib.suppress(OSError, ValueError):
                result.returncode = int((private / "pytest.exit").read_text())
                break  # normal end: pytest exited and the supervisor recorded its code
            sup_code = proc.poll()
            if sup_code is not None:
                if pytest_proc is None or not _alive(pytest_proc):
                    break  # the supervisor died, and pytest too
                result.supervisor_killed = True  # pytest orphaned but still running: wait
            procs = tree.scan()
            if len(procs) > limits.max_procs:
                result.killed_reason = (
                    f"the submission started too many processes ({len(procs)} at once; "
                    f"limit {limits.max_procs})"
                )
                break
            if tree.rss(procs) > limits.max_rss_gb * 2**30:
                result.killed_reason = (
                    f"the submission used more than {limits.max_rss_gb:g} GB of memory"
                )
                break
            if time.monotonic() > deadline:
                result.timed_out = True
                break
            time.sleep(limits.poll)
    finally:
        result.survivors_killed = tree.kill_all()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)
        with _supervisors_lock:
            _supervisors.discard(proc.pid)
    result.wall = time.monotonic() - start
    if result.returncode is None and not result.supervisor_killed:
        sup_code = proc.returncode
        if sup_code is not None and sup_code < 0:
            if not result.timed_out and not result.killed_reason:
                result.supervisor_killed = True
        elif sup_code is not None:
            result.returncode = sup_code
    if result.returncode is not None and result.returncode > 128:
        result.returncode = -(result.returncode - 128)  # pytest died from a signal
    with contextlib.suppress(OSError):
        result.junit = junit.read_bytes()
    with contextlib.suppress(OSError):
        for line in progress.read_text(encoding="utf-8", errors="replace").splitlines():
            with contextlib.suppress(ValueError):
                record = json.loads(line)
                if isinstance(record, dict):
                    result.progress.append(record)
    result.log_tail = _tail(log_path, log_tail)
    return result
