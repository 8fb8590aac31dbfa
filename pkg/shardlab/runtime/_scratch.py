"""Scratch files of a launch, named by their owner so a killed launcher's files are swept.

A launch keeps its payload, results and captured output in a temporary folder, and ``shardlab
train`` its progress in a temporary file; both are removed when the launch ends. A launcher
killed with SIGTERM or SIGKILL cannot remove them, so their names carry the owner's pid
(``shardlab-launch-<pid>-*``, ``shardlab-train-<pid>-*.progress``) and every new launch first
removes this user's ones whose owner process is gone. A folder of a live owner (another
launch running now) is never touched; nor are other users' files or names without a pid.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile

_OWNED = re.compile(r"^shardlab-(?:launch|train)-(?P<pid>\d+)-[^/]+$")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):
        return True  # another user's process (or an impossible pid): leave it
    return True


def sweep_stale(folder: str | None = None) -> list[str]:
    """Remove this user's launch folders and progress files whose owner has exited; return
    the paths removed."""
    folder = folder or tempfile.gettempdir()
    removed = []
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return removed
    uid = os.getuid() if hasattr(os, "getuid") else None
    for entry in entries:
        m = _OWNED.match(entry.name)
        if not m or int(m.group("pid")) == os.getpid() or _alive(int(m.group("pid"))):
            continue
        try:
            st = entry.stat(follow_symlinks=False)
            if (uid is not None and st.st_uid != uid) or entry.is_symlink():
                continue
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path)
            else:
                os.unlink(entry.path)
            removed.append(entry.path)
        except OSError:
            continue  # another launcher swept it first, or it is not ours to remove
    return removed


def make_run_dir() -> str:
    """A new launch folder owned by this process (stale ones swept first)."""
    sweep_stale()
    return tempfile.mkdtemp(prefix=f"shardlab-launch-{os.getpid()}-")


def make_progress_file() -> str:
    """A new, empty progress file of ``shardlab train`` owned by this process."""
    sweep_stale()
    fd, path = tempfile.mkstemp(prefix=f"shardlab-train-{os.getpid()}-", suffix=".progress")
    os.close(fd)
    return path
