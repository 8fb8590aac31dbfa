"""Make the Python environment reachable by the sandbox's unprivileged user.

A root grader starts bubblewrap as ``nobody`` (:func:`._bwrap.sandbox_identity`), and
bubblewrap resolves every bind source as that user. An interpreter under ``/root`` (pyenv's
default, mode 700) cannot be reached, even though its own files are world-readable. For each
such folder the grader builds, once per run, a *link farm*: the same tree of folders (755)
whose files are hard links to the originals (no data copied, nothing of the original
changed), in a folder of its own that others may cross but not list (711) on the same file
system, and binds that at the original path inside the sandbox. Where that is impossible
(another file system, an error), the environment stays unreachable and the sandbox stays
mapped to the grader's uid (the caller says so).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import stat
import tempfile
from pathlib import Path

_farms: dict[str, str] = {}  # original root -> link farm
_base: list[str] = []


def reachable(path: str, uid: int, gid: int) -> bool:
    """Whether ``uid``/``gid`` may cross every folder above ``path`` and enter ``path``."""
    parts = Path(path).parts
    for i in range(1, len(parts) + 1):
        try:
            st = os.stat(os.path.join(*parts[:i]))
        except OSError:
            return False
        if st.st_uid == uid:
            ok = st.st_mode & stat.S_IXUSR
        elif st.st_gid == gid:
            ok = st.st_mode & stat.S_IXGRP
        else:
            ok = st.st_mode & stat.S_IXOTH
        if not ok:
            return False
    return True


def _farm_parent(dev: int) -> str | None:
    if _base:
        return _base[0]
    for candidate in (tempfile.gettempdir(), "/var/tmp", "/tmp"):
        with contextlib.suppress(OSError):
            if os.stat(candidate).st_dev == dev and reachable(candidate, 65534, 65534):
                _sweep(candidate)
                base = tempfile.mkdtemp(prefix=f"shardlab-env-{os.getpid()}-", dir=candidate)
                os.chmod(base, 0o711)
                _base.append(base)
                atexit.register(_remove_all)
                return base
    return None


def _sweep(parent: str) -> None:
    """Remove the farms of graders that died (``shardlab-env-<pid>-...``, pid gone)."""
    from ._fs import remove_tree

    with contextlib.suppress(OSError):
        for entry in os.scandir(parent):
            parts = entry.name.split("-")
            if len(parts) < 4 or parts[:2] != ["shardlab", "env"] or not parts[2].isdigit():
                continue
            if os.path.exists(f"/proc/{parts[2]}") or entry.is_symlink() or not entry.is_dir():
                continue
            with contextlib.suppress(OSError, ValueError):
                if entry.stat(follow_symlinks=False).st_uid == os.geteuid():
                    remove_tree(Path(entry.path))  # links only: the originals stay


def _remove_all() -> None:
    from ._fs import remove_tree

    for base in _base:
        with contextlib.suppress(OSError, ValueError):
            remove_tree(Path(base))  # unlinks the links only: the originals stay


def farm(root: str) -> str | None:
    """A reachable mirror of ``root`` (hard links; made once); None if it cannot be made."""
    if root in _farms:
        return _farms[root]
    try:
        dev = os.stat(root).st_dev
        parent = _farm_parent(dev)
        if parent is None:
            return None
        dest = tempfile.mkdtemp(prefix="root-", dir=parent)
        os.chmod(dest, 0o755)
        for here, dirs, files in os.walk(root, followlinks=False):
            rel = os.path.relpath(here, root)
            target = dest if rel == "." else os.path.join(dest, rel)
            for name in dirs:
                src = os.path.join(here, name)
                if os.path.islink(src):
                    os.symlink(os.readlink(src), os.path.join(target, name))
                else:
                    os.mkdir(os.path.join(target, name), 0o755)
            for name in files:
                src = os.path.join(here, name)
                if os.path.islink(src):
                    os.symlink(os.readlink(src), os.path.join(target, name))
                elif os.path.isfile(src):
                    os.link(src, os.path.join(target, name), follow_symlinks=False)
    except OSError:
        return None
    _farms[root] = dest
    return dest
