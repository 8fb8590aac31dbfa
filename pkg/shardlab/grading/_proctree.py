"""Every process of one sandbox, found and killed from outside (psutil).

The tree is found three ways, because a submission can leave each one (only the first
matters inside bubblewrap, where the PID namespace already holds everything): (1)
descendants by parent pid, (2) members of the sandbox's session, (3) processes whose
environment carries the sandbox's random token (``SHARDLAB_SANDBOX``). One scan reads the
process table once (parent map, session), so it is linear in the number of processes. To
kill, every process found is frozen with SIGSTOP (repeatedly, until no new process appears),
then all get SIGKILL, so nothing can fork during the kill. Inside bubblewrap this is the last
step only: the grader first kills the sandbox's PID 1, which ends the namespace at once.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time

import psutil

TOKEN_ENV = "SHARDLAB_SANDBOX"


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
        """Refresh and return the live processes of the sandbox.

        One pass over the process table builds the parent -> children map (and finds the
        session's members); descendants of every known process are then found in that map,
        so a scan costs O(processes on the machine), not O(n²) per-process descendant walks.
        """
        me = os.getpid()
        table: dict[int, psutil.Process] = {}
        kids: dict[int, list[int]] = {}
        zombie: set[int] = set()
        for p in psutil.process_iter(["ppid", "status"]):
            info = p.info
            table[p.pid] = p
            if info.get("status") == psutil.STATUS_ZOMBIE:
                zombie.add(p.pid)
            if info.get("ppid") is not None:
                kids.setdefault(info["ppid"], []).append(p.pid)
            if p.pid in self.known or p.pid == me:
                continue
            try:
                if os.getsid(p.pid) == self.sid:
                    self.known[p.pid] = p
                elif deep and self.token in p.environ().get(TOKEN_ENV, ""):
                    self.known[p.pid] = p
            except (OSError, psutil.Error):
                continue
        # a known pid counts only while it is the same process (pid reuse changes the object)
        live = [pid for pid, p in self.known.items() if table.get(pid) == p]
        stack = list(live)
        while stack:
            for child in kids.get(stack.pop(), ()):
                if child not in self.known and child != me:
                    self.known[child] = table[child]
                    live.append(child)
                    stack.append(child)
        return [self.known[pid] for pid in live if pid not in zombie]

    def rss(self, procs: list[psutil.Process]) -> int:
        total = 0
        for p in procs:
            with contextlib.suppress(psutil.Error):
                total += p.memory_info().rss
        return total

    def tasks(self, procs: list[psutil.Process]) -> int:
        """Processes and their threads (every task counts against ``max_procs``)."""
        total = 0
        for p in procs:
            try:
                total += p.num_threads()
            except psutil.Error:
                total += 1
        return total

    def kill_all(self, settle: float = 1.0) -> int:
        """Freeze (SIGSTOP) every process of the sandbox until no new one appears, then SIGKILL all.

        Freezing first means nothing can fork or escape while the tree is being killed; the
        settle period catches a process that was half-way through escaping anyway.
        """
        killed: set[int] = set()
        quiet_since = None
        give_up = time.monotonic() + 60.0
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
