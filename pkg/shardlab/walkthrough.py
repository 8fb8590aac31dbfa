"""Helpers for the guided lab notebooks: which parts of a lab module are still stubs.

A released lab module carries ``raise NotImplementedError("<hint>")`` where the reference
solution was (see :mod:`shardlab.grading.release`). A lab notebook walks the student through
one function at a time, and each section starts with :func:`require`: if the function it
is about still holds its stub, the cell stops with :class:`NotWrittenYet`, a one-paragraph
message that names the function, its line and its hint (no traceback, and no later
``NameError``). The measured-versus-predicted sections call ``require(module)``, which
names every part of the module still missing.

:func:`require` reads the module's file from disk each time (a parse, no import), so it
sees the student's last save; ranks started by :func:`shardlab.runtime.launch` import the
saved file too. :func:`once` runs a launch once per content of the files it depends on, so
several sections can read one launch and a later edit of a module starts a fresh one.
:func:`pytest` runs a selection of a lab's public tests in the notebook's process and prints the
summary. :func:`single_process_group` gives the notebook's own process a one-rank gloo
group, for checks that only need the mechanics of a wrapper (no second rank).
"""

from __future__ import annotations

import ast
import contextlib
import gc
import hashlib
import inspect
import io
import os
import re
import socket
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

__all__ = [
    "NotWrittenYet",
    "Stub",
    "functions",
    "once",
    "pytest",
    "require",
    "single_process_group",
    "stubs",
]


class NotWrittenYet(NotImplementedError):
    """A notebook section needs code that still holds its ``NotImplementedError`` stub."""

    def _render_traceback_(self) -> list[str]:
        # IPython shows these lines instead of a traceback: the message is the whole story.
        return [f"{type(self).__name__}: {self}"]


@dataclass(frozen=True)
class Stub:
    """One ``raise NotImplementedError("<hint>")`` left in a module function."""

    file: str  # file name, e.g. "ddp.py"
    qualname: str  # "DDP._hook", "make_buckets"
    line: int
    hint: str

    def describe(self) -> str:
        return f"{self.qualname} ({self.file} line {self.line}): {self.hint}"


def _path(module: ModuleType | str | Path) -> Path:
    if isinstance(module, ModuleType):
        src = inspect.getsourcefile(module)
        if src is None:
            raise ValueError(f"module {module.__name__!r} has no source file to read.")
        return Path(src)
    return Path(module)


def _walk(tree: ast.Module):
    """Yield (qualname, function node) for every function and method, nested ones too."""

    def visit(node, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = f"{prefix}{child.name}"
                yield name, child
                yield from visit(child, f"{name}.")
            elif isinstance(child, ast.ClassDef):
                yield from visit(child, f"{prefix}{child.name}.")

    yield from visit(tree, "")


def _stub_hint(node: ast.AST) -> str | None:
    """The hint of ``raise NotImplementedError("<hint>")``, else None."""
    if not isinstance(node, ast.Raise) or not isinstance(node.exc, ast.Call):
        return None
    call = node.exc
    if not (isinstance(call.func, ast.Name) and call.func.id == "NotImplementedError"):
        return None
    if len(call.args) == 1 and isinstance(call.args[0], ast.Constant):
        if isinstance(call.args[0].value, str):
            return call.args[0].value
    return None


def _parse(module) -> tuple[Path, dict[str, list[Stub]]]:
    path = _path(module)
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found: dict[str, list[Stub]] = {}
    for qualname, fn in _walk(tree):
        own = found.setdefault(qualname, [])
        for stmt in ast.walk(fn):
            hint = _stub_hint(stmt)
            if hint is not None and _enclosing(fn, stmt):
                own.append(Stub(path.name, qualname, stmt.lineno, hint))
    return path, found


def _enclosing(fn: ast.AST, stmt: ast.AST) -> bool:
    """True when ``stmt`` belongs to ``fn`` itself, not to a function nested inside it."""
    for child in ast.iter_child_nodes(fn):
        if child is stmt:
            return True
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        if _enclosing(child, stmt):
            return True
    return False


def functions(module: ModuleType | str | Path) -> list[str]:
    """Qualified names of every function and method defined in ``module``'s file."""
    return list(_parse(module)[1])


def stubs(*modules: ModuleType | str | Path) -> list[Stub]:
    """Every ``raise NotImplementedError("<hint>")`` still in ``modules``, in file order."""
    out: list[Stub] = []
    for module in modules:
        out += sorted((s for ss in _parse(module)[1].values() for s in ss), key=lambda s: s.line)
    return out


def _select(spec) -> list[Stub]:
    """``module`` (all its stubs) or ``(module, qualname[, words of the hint])``."""
    if not isinstance(spec, tuple):
        return stubs(spec)
    if not 2 <= len(spec) <= 3:
        raise ValueError(
            f"require: {spec!r} is not (module, qualname) or (module, qualname, words)."
        )
    module, qualname, *words = spec
    path, found = _parse(module)
    if qualname not in found:
        raise ValueError(
            f"require: {path.name} defines no function {qualname!r} "
            f"(it defines {', '.join(found) or 'none'})."
        )
    return [s for s in found[qualname] if not words or words[0] in s.hint]


def require(*specs, what: str = "") -> None:
    """Raise :class:`NotWrittenYet` when a selected part still holds its stub.

    Each spec is a module (every stub in it), ``(module, "Class.method")`` (the stubs in that
    function) or ``(module, "Class.method", "words")`` (its stubs whose hint contains the
    words, for a function with several parts). ``what`` names the section in the message.
    """
    missing: list[Stub] = []
    for spec in specs:
        missing += [s for s in _select(spec) if s not in missing]
    if not missing:
        return
    head = f"{what}: " if what else ""
    if len(missing) == 1:
        s = missing[0]
        raise NotWrittenYet(
            f"{head}implement {s.qualname} first ({s.file} line {s.line}): {s.hint}."
        )
    lines = "\n".join(f"  - {s.describe()}" for s in missing)
    raise NotWrittenYet(f"{head}implement these first:\n{lines}")


_CACHE: dict[tuple, tuple[bool, Any]] = {}


def once(fn, *args, depends: tuple = (), **kwargs) -> Any:
    """``fn(*args, **kwargs)``, computed once per content of the ``depends`` modules' files.

    A failure is remembered too (raised again without rerunning) until a file changes.
    """
    digest = hashlib.sha256()
    for module in depends:
        digest.update(_path(module).read_bytes())
    key = (getattr(fn, "__qualname__", repr(fn)), repr(args), repr(sorted(kwargs.items())),
           digest.hexdigest())
    if key not in _CACHE:
        try:
            _CACHE[key] = (True, fn(*args, **kwargs))
        except Exception as exc:  # remembered: later sections re-raise the same error
            _CACHE[key] = (False, exc)
    ok, value = _CACHE[key]
    if not ok:
        raise value
    return value


def pytest(test_file: str, select: str) -> str:
    """Run ``pytest <test_file> -k <select>`` in this process; print and return the summary.

    In-process, so the notebook's already imported torch and lab modules are reused (a
    subprocess would spend seconds importing them again). Raises AssertionError with
    pytest's report of the failures when a selected test fails.
    """
    import pytest as _pytest

    args = [test_file, "-q", "-k", select, "--color=no", "-p", "no:cacheprovider",
            "--capture=sys", "-W", "ignore::DeprecationWarning"]
    out = io.StringIO()
    # pytest runs full garbage collections; moving what the notebook holds (torch's and the
    # lab's objects) out of the collector's sight makes each call ~0.05 s instead of ~0.5 s
    gc.freeze()
    # no third-party plugins (nbval, xdist, ...): the lab tests need none, and loading
    # them costs seconds
    saved = os.environ.get("PYTEST_DISABLE_PLUGIN_AUTOLOAD")
    os.environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    try:
        with contextlib.redirect_stdout(out):
            code = _pytest.main(args)
    finally:
        if saved is None:
            del os.environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"]
        else:
            os.environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = saved
    text = out.getvalue()
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    summary = re.sub(r" in [0-9.]+s", "", lines[-1] if lines else "").strip("= ")
    if code == _pytest.ExitCode.NO_TESTS_COLLECTED:
        raise ValueError(f"pytest {test_file} -k {select!r} selected no test ({summary}).")
    if code != _pytest.ExitCode.OK:
        # the one-line reasons first (pytest's short summary), then the report's end from the
        # start of a line: a cut in mid-sentence reads as garbage
        failed = [ln for ln in lines if ln.startswith(("FAILED ", "ERROR "))]
        tail = text if len(text) <= 3000 else "...\n" + text[-3000:].split("\n", 1)[-1]
        head = "\n".join(failed) + "\n\n" if failed else ""
        raise AssertionError(f"public tests `{select}` of {test_file} failed:\n{head}{tail}")
    print(f"{test_file} -k {select!r}: {summary}")
    return summary


def single_process_group():
    """A one-rank gloo group for the notebook's own process (created once)."""
    import torch.distributed as dist

    if not dist.is_initialized():
        with socket.socket() as s:  # a free port for this process's store
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    return dist.group.WORLD
