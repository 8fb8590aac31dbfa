"""Run pytest on one submission in a bubblewrap sandbox (or, unsafely, a limited process tree).

Process layout::

    grader (this process, one thread per submission being graded)
      └─ bwrap                      new session, dies with the grader (--die-with-parent)
           └─ supervisor            PID 1 of a new PID namespace (--as-pid-1)
                └─ pytest           cwd = /grade/work (a size-capped tmpfs)
                     └─ whatever the submission starts (ranks, daemons, ...)

The sandbox's view of the file system is in :mod:`._bwrap`. Nothing the submission starts
can outlive the supervisor: it is the namespace's init, so when it exits (after pytest, having
killed and counted the survivors) or is killed by the grader, the kernel kills every process
of the namespace; and no process inside can kill it. No host path is writable inside: the
JUnit report, the progress log and the supervisor's status go to files the grader opened, as
inherited file descriptors.

With ``sandbox=False`` (``--unsafe-no-sandbox``) the same supervisor runs as a plain child
in its own session, a child subreaper, killing its session if the grader dies; the grader
then finds the tree three ways (descendants, session, a random token in the environment).

What is limited, and how
    * wall clock: the grader waits at most ``timeout`` seconds, then kills everything;
    * CPU seconds (``RLIMIT_CPU``), address space (``RLIMIT_AS``, generous: torch reserves
      a lot of virtual memory; not set when CUDA is used) and file size (``RLIMIT_FSIZE``,
      stops an output flood) are set by the supervisor with ``resource.setrlimit`` and
      inherited by every descendant;
    * /tmp, /dev/shm and the work folder are tmpfs mounts of ``tmp_mb`` each; ``/proc`` is
      read-only; a root grader starts bubblewrap as ``nobody`` (:func:`._bwrap.sandbox_identity`);
    * memory, processes + threads, CPU share: a cgroup per sandbox (:mod:`._cgroup`) where
      the machine allows, the supervisor moved into it before it starts pytest; else
      (sampling) psutil every ``poll`` seconds counts processes and threads and sums RSS.

To kill, the sandbox's PID 1 gets SIGKILL (the kernel ends its PID namespace at once), the
cgroup's members get SIGKILL, and a last scan freezes (SIGSTOP) and kills anything still found.
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

from ._bwrap import INI, PKG, WORK, bwrap_argv, sandbox_identity
from ._cgroup import Cgroup
from ._cgroup import create as create_cgroup
from ._limits import _environment, _read_capped, _status, _tail, child_pid, limit_reason, memfds
from ._proctree import _alive, _proc, _Tree
from ._values import read_values


@dataclass(frozen=True)
class Limits:
    """Resource limits of one sandbox run."""

    timeout: float = 120.0  # wall-clock seconds for the whole pytest run
    cpu_seconds: int | None = None  # per process; default 2 * timeout + 10
    address_space_gb: float | None = 16.0  # per process RLIMIT_AS; None = unlimited
    file_size_mb: float = 64.0  # RLIMIT_FSIZE: any single file, including the output log
    max_procs: int = 256  # processes *and threads* in the sandbox at the same time
    max_rss_gb: float = 6.0  # memory of the sandbox (cgroup: all it charges; else summed RSS)
    poll: float = 0.2  # monitor period, seconds
    tmp_mb: float = 512.0  # size of each tmpfs in the sandbox: /tmp, /dev/shm, /grade
    cgroup: bool = True  # a cgroup per sandbox where the machine allows (False: sampling only)

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
    sandbox_error: str = ""  # bubblewrap itself failed to start the sandbox
    junit: bytes | None = None
    progress: list[dict] = field(default_factory=list)
    log_tail: str = ""
    survivors_killed: int = 0
    wall: float = 0.0
    load: float = 0.0  # 1-minute load average when a timeout struck
    enforced_by: str = ""  # "cgroup v1" / "cgroup v2" / "sampling"
    values: bytes | None = None  # what the tests recorded for the grader (.outside)


_supervisors: set[int] = set()  # live supervisor / bwrap pids of all running sandboxes
_supervisors_lock = threading.Lock()


def run_pytest(
    work: Path,
    private: Path,
    limits: Limits,
    *,
    cuda: bool = False,
    ini: Path,
    bwrap: str | None,
    work_files: dict[str, Path] | None = None,
    package: Path | None = None,
    pytest_args: tuple[str, ...] = (),
    log_tail: int = 8000,
) -> RunResult:
    """Run pytest in a fresh sandbox; always kill the whole tree before returning.

    With ``bwrap`` (its path), ``work_files`` ({name: host file}) are copied read-only into
    the sandbox's ``/grade/work``; without it (unsafe), pytest runs in ``work`` itself.
    ``package``: the ``shardlab`` package folder the sandbox imports (the grader's copy).
    ``private`` is a folder of the grader's that the sandbox never sees.
    """
    private = Path(private)
    sandbox = bwrap is not None
    token = secrets.token_hex(16)
    log_path = private / "output.log"
    kinds = ("junit", "progress", "status", "values")
    paths = {k: private / f"{k}-{secrets.token_hex(8)}" for k in kinds}
    fds = {k: os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600) for k, p in paths.items()}
    config = {
        "workdir": WORK if sandbox else str(work),
        "ini": INI if sandbox else str(ini),
        "junit_fd": fds["junit"],
        "progress_fd": fds["progress"],
        "status_fd": fds["status"],
        "values_fd": fds["values"],  # what the tests record for the grader (.outside)
        "cuda": cuda,
        "limits": limits.rlimits(cuda),
        "pytest_args": list(pytest_args),
    }
    if package is None:
        package = Path(__file__).resolve().parents[1]
    env = _environment(token, cuda, sandbox, Path(work), package)
    runner = f"{PKG}/shardlab" if sandbox else str(package)
    command = [sys.executable, "-P", f"{runner}/grading/_runner.py", "supervise"]
    extra_fds: list[int] = []
    info_r = None
    ident = None
    if sandbox:
        ident = sandbox_identity(bwrap, package)
        if ident is not None:  # pytest reopens it as /proc/self/fd/N: a fresh permission check
            os.fchown(fds["junit"], *ident)
        data = memfds(work_files or {})
        ini_fd = memfds({"ini": Path(ini)})["ini"]
        extra_fds.append(ini_fd)
        extra_fds += data.values()
        info_r, info_w = os.pipe()
        extra_fds.append(info_w)
        tmp_bytes = int(limits.tmp_mb * 2**20)
        prefix = bwrap_argv(
            bwrap,
            data,
            ini_fd,
            package,
            tmp_bytes=tmp_bytes,
            cuda=cuda,
            info_fd=info_w,
            ident=ident,
        )
        command = [*prefix, "--", *command]
    else:
        (Path(work) / ".tmp").mkdir(exist_ok=True)
    cgroup: Cgroup | None = None
    if limits.cgroup:
        cgroup = create_cgroup(
            token[:16],
            memory_bytes=int(limits.max_rss_gb * 2**30),
            tasks=limits.max_procs,
        )
    start = time.monotonic()
    try:
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                command,
                stdin=subprocess.PIPE,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=str(private if sandbox and ident is None else "/" if sandbox else work),
                env=env,
                start_new_session=True,
                pass_fds=(*fds.values(), *extra_fds),
                **(dict(user=ident[0], group=ident[1], extra_groups=[]) if ident else {}),
            )
    except BaseException:
        if cgroup is not None:
            cgroup.remove()
        raise
    finally:
        for fd in (*fds.values(), *extra_fds):
            os.close(fd)
    with _supervisors_lock:
        _supervisors.add(proc.pid)
    result = RunResult(returncode=None)
    tree = _Tree(psutil.Process(proc.pid), proc.pid, token)
    # the sandbox's PID 1 (the supervisor): it waits for its configuration on stdin, so it is
    # moved into the cgroup before it or anything below it runs a line of the submission
    init = child_pid(info_r, proc) if sandbox else proc.pid
    if cgroup is not None and not (init and cgroup.add(init)):
        cgroup.remove()
        cgroup = None
    result.enforced_by = cgroup.version.replace("v", "cgroup v") if cgroup else "sampling"
    try:
        proc.stdin.write(json.dumps(config).encode())
        proc.stdin.close()
    except OSError:
        pass
    pytest_proc: psutil.Process | None = None
    deadline = start + limits.timeout
    status: dict = {}
    try:
        while True:
            status = _status(paths["status"])
            if pytest_proc is None and not sandbox and "pytest_pid" in status:
                pytest_proc = _proc(int(status["pytest_pid"]))
                if pytest_proc is not None:
                    tree.known.setdefault(pytest_proc.pid, pytest_proc)
            result.killed_reason = limit_reason(cgroup, limits)
            if result.killed_reason:
                break
            if "exit" in status:
                result.returncode = int(status["exit"])
                if sandbox:  # the supervisor exits right after: let the namespace end
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        proc.wait(timeout=10)
                break  # normal end: pytest exited and the supervisor recorded its code
            sup_code = proc.poll()
            if sup_code is not None:
                if sandbox or pytest_proc is None or not _alive(pytest_proc):
                    break  # the sandbox ended, or (unsafe) the supervisor and pytest died
                result.supervisor_killed = True  # pytest orphaned but still running: wait
            if cgroup is None:  # sampling: every process and thread, their summed RSS
                procs = [p for p in tree.scan() if p.pid != proc.pid or not sandbox]
                tasks = tree.tasks(procs)
                if tasks > limits.max_procs:
                    result.killed_reason = (
                        f"the submission started too many processes and threads ({tasks} "
                        f"at once in {len(procs)} processes; limit {limits.max_procs})"
                    )
                    break
                if tree.rss(procs) > limits.max_rss_gb * 2**30:
                    result.killed_reason = (
                        f"the submission used more than {limits.max_rss_gb:g} GB of memory"
                    )
                    break
            if time.monotonic() > deadline:
                result.timed_out = True
                result.load = os.getloadavg()[0]
                break
            time.sleep(limits.poll)
    finally:
        # Killing the sandbox's PID 1 ends its whole PID namespace at once (the kernel kills
        # every member; none can fork meanwhile); the cgroup then kills anything left.
        before = cgroup.members() if cgroup is not None else set()
        if sandbox and init:
            with contextlib.suppress(OSError):
                os.kill(init, signal.SIGKILL)
        killed = 0
        if cgroup is not None:
            killed = len((before | cgroup.kill()) - {init})  # not counting PID 1 itself
        result.killed_reason = result.killed_reason or limit_reason(cgroup, limits)
        killed += tree.kill_all(settle=0.3 if sandbox else 1.0)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)
        if cgroup is not None:
            cgroup.remove()
        with _supervisors_lock:
            _supervisors.discard(proc.pid)
    result.survivors_killed = int(status.get("survivors", 0)) + killed
    result.wall = time.monotonic() - start
    if sandbox and result.returncode is None and not (result.timed_out or result.killed_reason):
        said = [ln for ln in _tail(log_path, 4000).splitlines() if ln.startswith("bwrap:")]
        if said:
            result.sandbox_error = f"bubblewrap could not start the sandbox ({said[-1][:300]})"
    if not sandbox and result.returncode is None and not result.supervisor_killed:
        sup_code = proc.returncode
        if sup_code is not None and sup_code < 0:
            if not result.timed_out and not result.killed_reason:
                result.supervisor_killed = True
        elif sup_code is not None:
            result.returncode = sup_code
    if result.returncode is not None and result.returncode > 128:
        result.returncode = -(result.returncode - 128)  # pytest died from a signal
    result.junit = _read_capped(paths["junit"], 64 * 2**20)
    data = _read_capped(paths["progress"], 16 * 2**20) or b""
    for line in data.decode("utf-8", "replace").splitlines():
        with contextlib.suppress(ValueError):
            record = json.loads(line)
            if isinstance(record, dict):
                result.progress.append(record)
    result.values = read_values(paths["values"])
    result.log_tail = _tail(log_path, log_tail)
    return result
