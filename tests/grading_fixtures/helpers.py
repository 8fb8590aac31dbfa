"""Shared helpers of tests/test_grading_*.py (imported as grading_fixtures.helpers)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

FIXTURES = Path(__file__).parent
FIXTURE_LABS = FIXTURES / "labs"
REPO_LABS = Path(__file__).resolve().parents[2] / "labs"


def load_py(path: Path):
    spec = importlib.util.spec_from_file_location(path.stem.replace("-", "_"), path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write_tree(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        target = root / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)


def rows_by_test(results, student, lab):
    [res] = [r for r in results if r.student == student and r.lab == lab]
    return res, {row.test: row for row in res.rows}


def shared_result(tmp_path_factory, name: str, compute):
    """Compute ``compute(folder)`` once per test session, even across pytest-xdist workers.

    Module fixtures run once per xdist worker; an expensive grading run that every test of a
    module reads is computed by the first worker and read back (pickled) by the others.
    A failure is recorded too: the first caller raises its own error, every later caller
    fails with one line pointing at it (no second attempt in a half-written folder, which
    used to end in a cascade of ``FileExistsError``).
    """
    import os
    import pickle
    import shutil
    import traceback

    import pytest
    from filelock import FileLock

    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent  # shared by the workers of this session only
    data = base / f"{name}.pickle"
    failed = base / f"{name}.failed"
    with FileLock(str(base / f"{name}.lock")):
        if data.is_file():
            return pickle.loads(data.read_bytes())
        skipped = base / f"{name}.skipped"
        if skipped.is_file():
            pytest.skip(skipped.read_text())
        if failed.is_file():
            pytest.fail(
                f"shared fixture {name!r} failed earlier in this run (its own error is "
                f"reported once, above): {failed.read_text().strip()}",
                pytrace=False,
            )
        folder = base / name
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir()
        try:
            value = compute(folder)
        except pytest.skip.Exception as exc:
            skipped.write_text(str(exc.msg))
            raise
        except BaseException as exc:
            last = traceback.format_exception_only(type(exc), exc)[-1].strip()
            failed.write_text(last[:500])
            raise
        data.write_bytes(pickle.dumps(value))
        return value


def tree_digest(root: Path) -> dict[str, str]:
    """SHA-256 of every file under root (links by target), to show nothing was touched."""
    import hashlib
    import os

    out = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if path.is_symlink():
            out[rel] = "link:" + os.readlink(path)
        elif path.is_file():
            out[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def tagged_processes(tag: str) -> list:
    import psutil

    found = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if any(tag in part for part in p.info["cmdline"] or []):
                found.append(p)
        except psutil.Error:
            continue
    return found
