"""One control group per sandbox, where the machine lets the grader create one.

The kernel then enforces what sampling from outside cannot:

* memory: ``memory.max`` (v2) / ``memory.limit_in_bytes`` (v1) counts every page the
  sandbox's processes charge: their resident memory *and* tmpfs, SysV shared memory and
  memfds they filled, which belong to no process. Over the limit the kernel's OOM killer
  ends processes of the group (v2: the whole group at once, ``memory.oom.group``); the
  grader sees the OOM kill in ``memory.events`` / ``memory.oom_control``;
* tasks: ``pids.max`` counts processes *and threads*; a fork or thread start beyond it fails
  (``EAGAIN``) and the grader sees it in ``pids.events``;
* CPU: each sandbox is its own group with the default weight (``cpu.weight`` 100 /
  ``cpu.shares`` 1024), so busy sandboxes share the CPUs equally whatever their process count;
* kill: ``cgroup.kill`` (v2) or SIGKILL to every member (v1) ends what is left in one step.

Where it is found: the grader's own cgroup, from ``/proc/self/cgroup`` and the mount table.
cgroup v2 is used when the grader's cgroup already delegates the ``memory`` and ``pids``
controllers to children, or it may enable them (``cgroup.subtree_control``; refused with
``EBUSY`` when the grader's cgroup holds processes, as in most containers: then v2 is not
used). cgroup v1 (separate ``memory``, ``pids``, ``cpu`` hierarchies, as on this project's CI
machines) is used when the grader may create a child below its own cgroup in the ``memory``
and ``pids`` hierarchies (as root, usually). Anything else: :func:`create` returns None and
the sandbox falls back to sampling (:mod:`._proctree`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from functools import lru_cache

_CPU_FILES = {"cpu.weight": "100", "cpu.shares": "1024"}


def _own() -> dict[str, str]:
    """controller (or '' for the v2 hierarchy) -> the grader's cgroup path in it."""
    found: dict[str, str] = {}
    with contextlib.suppress(OSError):
        with open("/proc/self/cgroup") as fh:
            for line in fh:
                parts = line.rstrip("\n").split(":", 2)
                if len(parts) != 3:
                    continue
                for ctrl in parts[1].split(",") if parts[1] else [""]:
                    found[ctrl] = parts[2]
    return found


def _mounts() -> dict[str, tuple[str, str]]:
    """controller ('' for cgroup2) -> (mount point, root of the mount)."""
    found: dict[str, tuple[str, str]] = {}
    with contextlib.suppress(OSError):
        with open("/proc/self/mountinfo") as fh:
            for line in fh:
                left, _, right = line.partition(" - ")
                fields, tail = left.split(), right.split()
                if len(fields) < 5 or len(tail) < 3:
                    continue
                root, point = fields[3], fields[4].replace("\\040", " ")
                if tail[0] == "cgroup2":
                    found.setdefault("", (point, root))
                elif tail[0] == "cgroup":
                    for opt in tail[2].split(","):
                        if opt in ("memory", "pids", "cpu"):
                            found.setdefault(opt, (point, root))
    return found


def _dir(mount: tuple[str, str], path: str) -> str:
    point, root = mount
    if root != "/" and path.startswith(root):
        path = path[len(root) :]
    return os.path.join(point, path.lstrip("/"))


def _read(path: str) -> str:
    try:
        with open(path) as fh:
            return fh.read()
    except OSError:
        return ""


def _write(path: str, value: str) -> bool:
    try:
        with open(path, "w") as fh:
            fh.write(value)
        return True
    except OSError:
        return False


def _counter(text: str, key: str) -> int:
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name == key and value.strip().isdigit():
            return int(value)
    return 0


@lru_cache(maxsize=1)
def _parents() -> tuple[str, dict[str, str]] | None:
    """('v2', {'': dir}) or ('v1', {'memory': dir, 'pids': dir, 'cpu': dir?}) or None."""
    own, mounts = _own(), _mounts()
    if "" in own and "" in mounts:
        base = _dir(mounts[""], own[""])
        have = set(_read(os.path.join(base, "cgroup.controllers")).split())
        if {"memory", "pids"} <= have:
            wanted = ["memory", "pids", *(["cpu"] if "cpu" in have else [])]
            sub = os.path.join(base, "cgroup.subtree_control")
            enabled = set(_read(sub).split())
            if not set(wanted) <= enabled:
                _write(sub, " ".join(f"+{c}" for c in wanted))
                enabled = set(_read(sub).split())
            if {"memory", "pids"} <= enabled and os.access(base, os.W_OK):
                return "v2", {"": base}
    dirs = {}
    for ctrl in ("memory", "pids", "cpu"):
        if ctrl in own and ctrl in mounts:
            base = _dir(mounts[ctrl], own[ctrl])
            if os.path.isdir(base) and os.access(base, os.W_OK):
                dirs[ctrl] = base
    if "memory" in dirs and "pids" in dirs:
        return "v1", dirs
    return None


class Cgroup:
    """The control group(s) of one sandbox (one directory in v2, one per hierarchy in v1)."""

    def __init__(self, version: str, dirs: dict[str, str]):
        self.version, self.by_ctrl = version, dirs
        self.dirs = list(dict.fromkeys(dirs.values()))

    def _f(self, ctrl: str, name: str) -> str:
        return os.path.join(self.by_ctrl["" if self.version == "v2" else ctrl], name)

    def add(self, pid: int) -> bool:
        """Move process ``pid`` (all its threads) into the group(s)."""
        return all(_write(os.path.join(d, "cgroup.procs"), str(pid)) for d in self.dirs)

    def read_limits(self) -> dict[str, int]:
        if self.version == "v2":
            mem, tasks = _read(self._f("", "memory.max")), _read(self._f("", "pids.max"))
        else:
            mem = _read(self._f("memory", "memory.limit_in_bytes"))
            tasks = _read(self._f("pids", "pids.max"))
        return {"memory": int(mem), "tasks": int(tasks)}

    def cpu_weight_set(self) -> bool:
        ctrl = "" if self.version == "v2" else "cpu"
        if ctrl not in self.by_ctrl:
            return False
        return any(_read(self._f("cpu", n)).strip() == v for n, v in _CPU_FILES.items())

    def oom_kills(self) -> int:
        if self.version == "v2":
            return _counter(_read(self._f("", "memory.events")), "oom_kill")
        return _counter(_read(self._f("memory", "memory.oom_control")), "oom_kill")

    def task_limit_hits(self) -> int:
        return _counter(_read(self._f("pids", "pids.events")), "max")

    def memory_peak(self) -> int:
        name = "memory.peak" if self.version == "v2" else "memory.max_usage_in_bytes"
        value = _read(self._f("memory", name)).strip()
        return int(value) if value.isdigit() else 0

    def members(self) -> set[int]:
        pids: set[int] = set()
        for d in self.dirs:
            pids.update(int(x) for x in _read(os.path.join(d, "cgroup.procs")).split())
        return pids

    def kill(self, wait: float = 10.0) -> set[int]:
        """SIGKILL every member until none is left; the pids that were there."""
        seen: set[int] = set()
        if self.version == "v2":
            _write(self._f("", "cgroup.kill"), "1")
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            left = self.members()
            if not left:
                break
            seen |= left
            for pid in left:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.02)
        return seen

    def remove(self) -> None:
        self.kill()
        for d in self.dirs:
            for _ in range(100):
                try:
                    os.rmdir(d)
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.05)  # the last members are still being torn down


def available() -> bool:
    return _parents() is not None


_swept: set[str] = set()


def _sweep(parent: str) -> None:
    """Remove empty groups left by a grader that died (``shardlab-<pid>-...``, pid gone)."""
    if parent in _swept:
        return
    _swept.add(parent)
    with contextlib.suppress(OSError):
        for entry in os.scandir(parent):
            parts = entry.name.split("-")
            if len(parts) < 3 or parts[0] != "shardlab" or not parts[1].isdigit():
                continue
            pid = int(parts[1])
            with contextlib.suppress(OSError):
                if pid == os.getpid() or os.path.exists(f"/proc/{pid}"):
                    continue
                if time.time() - entry.stat().st_mtime > 60:
                    os.rmdir(entry.path)  # refused (EBUSY) while anything is in it


def create(name: str, *, memory_bytes: int, tasks: int) -> Cgroup | None:
    """A fresh group ``shardlab-<pid>-name`` with the limits, below the grader's own.

    None if impossible. Empty groups of graders that died are removed first (once).
    """
    found = _parents()
    if found is None:
        return None
    version, parents = found
    name = f"shardlab-{os.getpid()}-{name}"
    for parent in parents.values():
        _sweep(parent)
    dirs: dict[str, str] = {}
    try:
        for ctrl, parent in parents.items():
            path = os.path.join(parent, name)
            os.mkdir(path)
            dirs[ctrl] = path
    except OSError:
        Cgroup(version, dirs).remove()
        return None
    cg = Cgroup(version, dirs)
    if version == "v2":
        ok = _write(cg._f("", "memory.max"), str(memory_bytes))
        _write(cg._f("", "memory.swap.max"), "0")
        _write(cg._f("", "memory.oom.group"), "1")
        _write(cg._f("", "cpu.weight"), _CPU_FILES["cpu.weight"])
    else:
        ok = _write(cg._f("memory", "memory.limit_in_bytes"), str(memory_bytes))
        _write(cg._f("memory", "memory.memsw.limit_in_bytes"), str(memory_bytes))
        if "cpu" in dirs:
            _write(cg._f("cpu", "cpu.shares"), _CPU_FILES["cpu.shares"])
    ok = ok and _write(cg._f("pids", "pids.max"), str(tasks))
    if not ok:
        cg.remove()
        return None
    return cg
