"""Which cases each rubric test has, decided by the grader from the instructor's own code.

Before any submission runs, the grader lays out one lab exactly as a job folder (the
instructor's test files, helpers and hidden tests, the *reference* ``submit`` modules in
place of a student's) and runs ``pytest --collect-only`` on it in a child process: trusted
code only, no submission anywhere. Every collected item gives a case of a rubric key with
its parametrization id and whether it carries the ``gpu`` marker (on the function, its
class, its module or the ``pytest.param``).

Scoring (:mod:`._score`) uses only these cases: a case a report invents is ignored, a case
it omits "did not run", the maximum is the rubric's points (less the GPU cases on a machine
without CUDA), and the case ids shown to students are these, never a report's.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from ._fs import make_dirs, open_dir_nofollow, read_regular, remove_tree, write_new
from ._junit import _nodeid_key
from .rubric import Rubric, RubricError, sandbox_files

COLLECT_TIMEOUT = 300.0

# the pytest configuration of every job (and of the grader's own collection)
PYTEST_INI = """[pytest]
addopts = -p no:cacheprovider
filterwarnings =
    ignore::DeprecationWarning
markers =
    gpu: needs a CUDA device
"""

# Runs in the child: collect, write one JSON list of [nodeid, has gpu marker] to argv[2].
_SCRIPT = r"""
import json, sys
import pytest

out, items = sys.argv[2], []


class Recorder:
    def pytest_collection_finish(self, session):
        for item in session.items:
            items.append([item.nodeid, item.get_closest_marker("gpu") is not None])


args = ["--collect-only", "-q", "-c", sys.argv[3], "--rootdir", sys.argv[1],
        "-p", "no:cacheprovider", sys.argv[1]]
code = pytest.main(args, plugins=[Recorder()])
with open(out, "w") as fh:
    json.dump({"code": int(code), "items": items}, fh)
"""


def _layout(rubric: Rubric, work: Path) -> None:
    files = dict(sandbox_files(rubric))
    for name in rubric.submit:
        files[name] = rubric.lab_dir / name
    work_fd = open_dir_nofollow(work)
    try:
        for name, path in files.items():
            parts = tuple(name.split("/"))
            dir_fd = make_dirs(work_fd, parts[:-1])
            try:
                write_new(dir_fd, parts[-1], read_regular(path, 256 * 2**20))
            finally:
                os.close(dir_fd)
    finally:
        os.close(work_fd)


def collect_cases(
    rubric: Rubric, ini_text: str, *, package: Path | None = None, tmp_root: Path | None = None
) -> dict[str, tuple[tuple[str, bool], ...]]:
    """{rubric key: ((case id, needs GPU), ...)} from collecting the reference lab.

    A rubric key pytest collects nothing for (a module skipped at import) gets one case,
    GPU if the rubric's static check says so. A collection that fails is a RubricError.
    """
    base = Path(tempfile.mkdtemp(prefix="shardlab-collect-", dir=tmp_root))
    try:
        work = base / "work"
        work.mkdir()
        _layout(rubric, work)
        ini = base / "pytest.ini"
        ini.write_text(ini_text)
        out = base / "items.json"
        pkg_parent = Path(package).parent if package else Path(__file__).resolve().parents[2]
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(base),
            "LANG": "C.UTF-8",
            "PYTHONPATH": str(pkg_parent),
            "PYTHONDONTWRITEBYTECODE": "1",
            "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
            "OMP_NUM_THREADS": "1",
            "MPLBACKEND": "Agg",
            "CUDA_VISIBLE_DEVICES": "",
        }
        try:
            proc = subprocess.run(
                [sys.executable, "-c", _SCRIPT, str(work), str(out), str(ini)],
                cwd=work,
                env=env,
                capture_output=True,
                timeout=COLLECT_TIMEOUT,
            )
        except subprocess.TimeoutExpired:
            raise RubricError(
                f"{rubric.lab}: collecting the instructor's tests took more than "
                f"{COLLECT_TIMEOUT:g} s."
            ) from None
        try:
            result = json.loads(out.read_text())
        except (OSError, ValueError):
            result = {"code": proc.returncode, "items": []}
        if result["code"] not in (0, 5):
            tail = proc.stdout.decode("utf-8", "replace").strip().splitlines()[-3:]
            raise RubricError(
                f"{rubric.lab}: pytest cannot collect the instructor's tests with the reference "
                f"solution (exit code {result['code']}: {' / '.join(tail)[:400]}); fix the lab."
            )
    finally:
        remove_tree(base)
    cases: dict[str, list[tuple[str, bool]]] = {}
    for nodeid, gpu in result["items"]:
        key, case = _nodeid_key(str(nodeid))
        if key in rubric.points:
            cases.setdefault(key, []).append((case, bool(gpu) or key in rubric.gpu_tests))
    return {key: tuple(cases.get(key) or [("", key in rubric.gpu_tests)]) for key in rubric.points}


def with_cases(rubric: Rubric, ini_text: str, **kw) -> Rubric:
    """The rubric with its collected cases (see :func:`collect_cases`)."""
    return dataclasses.replace(rubric, cases=collect_cases(rubric, ini_text, **kw))
