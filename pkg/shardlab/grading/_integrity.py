"""Fingerprint of what the grader trusts, taken at start and checked before every job.

* the instructor's labs folder and the ``shardlab`` package: SHA-256 of every file's content;
* the Python environment: the top two levels of the virtual environment, the top level of
  every ``site-packages`` and of the interpreter's own library folder, each entry by (path,
  size, modification time, mode, inode), and every ``.pth`` file and
  ``sitecustomize``/``usercustomize`` module there by content. A planted ``.pth`` file,
  start-up hook or top-level module shows; an edit deep inside an installed package (torch)
  does not (a full walk costs seconds per job; inside bubblewrap the environment is mounted
  read-only anyway).

``__pycache__`` folders are left out (Python writes them legitimately while grading runs) and
so are notebook checkpoints. The walks are the bounded, link-free ones of :mod:`._fs`.
"""

from __future__ import annotations

import hashlib
import os
import sys
import sysconfig
from pathlib import Path

from ._fs import TreeError, read_in_tree, walk

_SKIP_DIRS = {"__pycache__", ".ipynb_checkpoints", ".pytest_cache"}
_BY_CONTENT_NAMES = {"sitecustomize.py", "usercustomize.py", "pyvenv.cfg"}


class IntegrityError(RuntimeError):
    """Something the grader trusts changed since grading started."""


def _tree_digest(root: Path, *, content: bool, max_entries: int, depth: int = 64) -> dict[str, str]:
    out: dict[str, str] = {}
    try:
        entries = walk(root, max_depth=depth, max_entries=max_entries)
    except TreeError as exc:
        raise IntegrityError(f"cannot fingerprint {root}: {exc}") from None
    for e in entries:
        if any(p in _SKIP_DIRS for p in e.rel) or e.rel[-1].endswith(".pyc"):
            continue
        rel = "/".join(e.rel)
        if e.kind == "link":
            out[rel] = "link:" + os.readlink(root.joinpath(*e.rel))
        elif e.kind != "file":
            out[rel] = e.kind
        elif content or e.rel[-1].endswith(".pth") or e.rel[-1] in _BY_CONTENT_NAMES:
            data = read_in_tree(root, e.rel, 512 * 2**20)
            out[rel] = hashlib.sha256(data).hexdigest()
        else:
            st = os.stat(root.joinpath(*e.rel), follow_symlinks=False)
            out[rel] = f"{st.st_size}:{st.st_mtime_ns}:{st.st_mode}:{st.st_ino}"
    return out


def environment_roots() -> list[Path]:
    """Folders of the Python environment the sandbox uses (read-only inside it)."""
    paths = sysconfig.get_paths()
    roots = [sys.prefix, sys.base_prefix, paths["stdlib"], paths["purelib"], paths["platlib"]]
    return list(dict.fromkeys(Path(r).resolve() for r in roots))


def package_root() -> Path:
    return Path(__file__).resolve().parents[1]


def snapshot_package(dest_parent: Path) -> Path:
    """Copy the ``shardlab`` package (no caches) to ``dest_parent/shardlab``; return that folder.

    Grading imports this copy (inside and outside the sandbox), so the package cannot change
    under a running grade, and what was verified is what runs.
    """
    src = package_root()
    dest = Path(dest_parent) / "shardlab"
    for e in walk(src, max_depth=16, max_entries=20_000):
        if any(p in _SKIP_DIRS for p in e.rel) or e.rel[-1].endswith(".pyc"):
            continue
        target = dest.joinpath(*e.rel)
        if e.kind == "dir":
            target.mkdir(parents=True, exist_ok=True)
        elif e.kind == "file":
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(read_in_tree(src, e.rel, 64 * 2**20))
    return dest


class Fingerprint:
    """Digest of the labs folder, the shardlab package and the environment."""

    def __init__(self, lab_dirs: list[Path], package: Path | None = None):
        self.parts: dict[str, tuple[Path, bool, int, int]] = {}
        for lab in lab_dirs:
            self.parts[f"lab {Path(lab).name}"] = (Path(lab).resolve(), True, 50_000, 64)
        self.parts["shardlab package"] = (Path(package or package_root()), True, 20_000, 64)
        for root in environment_roots():
            depth = 2 if root == Path(sys.prefix).resolve() else 1
            self.parts[f"environment {root}"] = (root, False, 50_000, depth)
        self.digests = {name: self._take(*spec) for name, spec in self.parts.items()}

    @staticmethod
    def _take(root: Path, content: bool, max_entries: int, depth: int) -> dict[str, str]:
        return _tree_digest(root, content=content, max_entries=max_entries, depth=depth)

    def verify(self) -> None:
        """Raise IntegrityError naming what changed (at most five paths)."""
        for name, spec in self.parts.items():
            now = self._take(*spec)
            before = self.digests[name]
            if now != before:
                changed = sorted(k for k in set(now) | set(before) if now.get(k) != before.get(k))
                shown = ", ".join(changed[:5]) + (" ..." if len(changed) > 5 else "")
                raise IntegrityError(
                    f"{name} changed since grading started ({shown}); grading stopped"
                )
