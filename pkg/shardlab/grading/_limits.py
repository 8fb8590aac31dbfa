"""Small helpers of :func:`shardlab.grading.sandbox.run_pytest` (kept apart for its size).

* :func:`memfds`: the job's files as anonymous in-memory files, handed to bubblewrap as
  descriptors (``--ro-bind-data``), so the sandbox's unprivileged user never needs a path
  into the grader's private job folder;
* :func:`child_pid`: the host pid of the sandbox's PID 1, from bubblewrap's ``--info-fd``;
* :func:`limit_reason`: why the kernel's cgroup limits stopped the sandbox, if they did;
* the sandbox's environment and the bounded reads of what it reported (status, log tail).
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import sys
import time
from pathlib import Path

from ._bwrap import PKG, WORK
from ._fs import read_regular
from ._proctree import TOKEN_ENV

MAX_JOB_FILE = 64 * 2**20


def memfds(files: dict[str, Path]) -> dict[str, int]:
    """name -> a memfd holding a copy of that (regular, link-free) host file."""
    out: dict[str, int] = {}
    try:
        for name, path in files.items():
            data = read_regular(Path(path), MAX_JOB_FILE)
            fd = os.memfd_create(f"shardlab-{os.path.basename(name)}"[:200], os.MFD_CLOEXEC)
            out[name] = fd
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.lseek(fd, 0, os.SEEK_SET)
    except BaseException:
        for fd in out.values():
            os.close(fd)
        raise
    return out


def child_pid(info_fd: int | None, proc, timeout: float = 60.0) -> int | None:
    """Read bubblewrap's ``{"child-pid": N}`` (host pid of the sandbox's PID 1); closes the fd.

    None if bubblewrap exits (or the pipe closes) before it says, or after ``timeout``.
    """
    if info_fd is None:
        return None
    data = b""
    deadline = time.monotonic() + timeout
    try:
        while len(data) < 65536 and time.monotonic() < deadline:
            ready, _, _ = select.select([info_fd], [], [], 0.5)
            if not ready:
                if proc.poll() is not None:
                    return None
                continue
            chunk = os.read(info_fd, 4096)
            if not chunk:
                break
            data += chunk
            with contextlib.suppress(ValueError):
                pid = json.loads(data.decode("utf-8", "replace")).get("child-pid")
                if isinstance(pid, int) and pid > 1:
                    return pid
    finally:
        os.close(info_fd)
    return None


def limit_reason(cgroup, limits) -> str:
    """A sentence when the sandbox's cgroup hit its memory or task limit, else ''."""
    if cgroup is None:
        return ""
    if cgroup.oom_kills() > 0:
        return (
            f"the submission used more than {limits.max_rss_gb:g} GB of memory (its processes, "
            "shared memory and files in its tmpfs folders together); the kernel stopped it"
        )
    if cgroup.task_limit_hits() > 0:
        return (
            f"the submission started too many processes and threads (limit {limits.max_procs} "
            "at once, threads included); the kernel refused more"
        )
    return ""


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


def _status(path: Path) -> dict:
    """Merged JSON records of the supervisor's status file (bounded read)."""
    merged: dict = {}
    try:
        with open(path, "rb") as fh:
            data = fh.read(65536)
    except OSError:
        return merged
    for line in data.decode("utf-8", "replace").splitlines():
        with contextlib.suppress(ValueError):
            record = json.loads(line)
            if isinstance(record, dict):
                merged.update(record)
    return merged


def _environment(
    token: str, cuda: bool, sandbox: bool, work: Path, package: Path | None
) -> dict[str, str]:
    if sandbox:
        pkg_parent = PKG
    else:
        pkg_parent = str(Path(package).parent if package else Path(__file__).resolve().parents[2])
    if sandbox:  # a fresh, minimal environment: nothing of the grader's leaks in
        env = {
            "PATH": f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin",
            "HOME": WORK,
            "LANG": "C.UTF-8",
            "TMPDIR": "/tmp",
        }
    else:
        env = dict(os.environ)
        for var in ("PYTEST_ADDOPTS", "PYTEST_PLUGINS", "PYTHONSTARTUP", "PYTEST_CURRENT_TEST"):
            env.pop(var, None)
        env["TMPDIR"] = str(work / ".tmp")
    env.update(
        {
            TOKEN_ENV: token,
            "PYTHONPATH": pkg_parent,
            "PYTHONDONTWRITEBYTECODE": "1",
            "PYTHONHASHSEED": "0",
            "PYTHONUNBUFFERED": "1",
            "OMP_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1",
            "MPLBACKEND": "Agg",
            # only pytest's own plugins: faster start, and nothing installed can alter reports
            "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
        }
    )
    if not cuda:
        env["CUDA_VISIBLE_DEVICES"] = ""
    return env


def _read_capped(path: Path, limit: int) -> bytes | None:
    try:
        with open(path, "rb") as fh:
            data = fh.read(limit + 1)
    except OSError:
        return None
    return data if data and len(data) <= limit else None
