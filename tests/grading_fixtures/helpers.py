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
