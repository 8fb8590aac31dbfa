"""Lab modules loaded by path: the package never imports a lab by name, nothing edits
``sys.path``.

Lab modules import each other by plain name (``from fsdp import FSDP``): a student's file and
the reference are interchangeable because they share the name. Code that composes labs
(``shardlab train``, lab 09) must make that plain import find one chosen *file*:

* :func:`load_file` imports the file at a path under a module name now and registers it in
  ``sys.modules`` (``shardlab train``'s rank loads a layout's modules this way, in the order its
  rubric's ``[train]`` table lists);
* :func:`provide` maps module names to files for later: a finder at the end of
  ``sys.meta_path`` answers a plain ``import`` of one of those names, and only when nothing on
  the ordinary path has that module (lab 09 names labs 04-06's files this way, the files the
  grader mounts from its rubric's ``[needs]``).

Importing this module imports no torch.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from pathlib import Path


def is_loaded(path: str | Path, name: str | None = None) -> bool:
    """True when ``sys.modules[name]`` (default: the file's stem) is the file at ``path``."""
    path = Path(path).resolve()
    old = sys.modules.get(name or path.stem)
    return bool(getattr(old, "__file__", None)) and Path(old.__file__).resolve() == path


def load_file(path: str | Path, name: str | None = None, fresh: bool = False):
    """Import the file at ``path`` as module ``name`` (default: its stem) and register it in
    ``sys.modules``, so the modules loaded after it find it by their plain ``import``.

    The module already loaded from that file is returned as it is unless ``fresh``; another
    file under a name already loaded replaces it (the run's choice, e.g. a student's
    ``fsdp.py``, wins)."""
    path = Path(path).resolve()
    name = name or path.stem
    if not fresh and is_loaded(path, name):
        return sys.modules[name]
    old = sys.modules.get(name)
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path} as module {name!r}.")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    try:
        spec.loader.exec_module(mod)
    except BaseException:
        if old is None:
            sys.modules.pop(name, None)
        else:
            sys.modules[name] = old
        raise
    return mod


class _Files(importlib.abc.MetaPathFinder):
    """Answers ``import name`` with the file :func:`provide` gave for it."""

    def __init__(self) -> None:
        self.files: dict[str, Path] = {}

    def find_spec(self, name, path=None, target=None):
        f = self.files.get(name)
        return None if f is None else importlib.util.spec_from_file_location(name, f)


def provide(files: dict[str, str | Path]) -> None:
    """Let a later plain ``import <stem>`` load each of ``files`` (paths; the module name is
    the file's stem) when no module of that name is found on the ordinary path first."""
    finder = next((f for f in sys.meta_path if isinstance(f, _Files)), None)
    if finder is None:
        finder = _Files()
        sys.meta_path.append(finder)
    finder.files.update({Path(p).stem: Path(p).resolve() for p in files.values()})


__all__ = ["is_loaded", "load_file", "provide"]
