"""Property-based test of ``shardlab release`` and ``shardlab grade`` (issue 30): whatever the
options and paths, each answers within a time and memory bound either with success (exit 0)
or with one sentence on stderr (exit 2) -- never a traceback, a hang, a raw errno text, or a
file removed that it did not write.

The companion of test_cli_inputs_property.py (the calculators and ``train``), whose numbers
and settings it shares; ``plan`` is left to the planner's own tests. Every path is drawn from
a small set of names resolved in a fresh scratch folder per example, which is also the
current folder, so ``--out ""``, ``.`` and ``..`` stay under pytest's tmp_path: a new folder,
one holding someone's files, a previous release or grading run, a file, the labs and the
submissions themselves and folders inside them, a link, a pseudo file system (/proc). The
labs are a copy of the grading fixtures. ``grade`` runs every check for real and fakes only
the slow steps -- the collection (real, done once per lab before the examples), CUDA
detection and the sandboxed jobs (one row each) -- since the options are under test here,
not the grading (tests/test_grading_*.py grade for real).
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import resource
import shutil
import signal
import tempfile
import zipfile
from pathlib import Path

import pytest
from grading_fixtures.helpers import FIXTURE_LABS, write_tree
from hypothesis import event, example, given
from hypothesis import strategies as st
from shardlab import cli
from shardlab.grading import _driver as driver
from shardlab.grading import _jobs as jobs
from shardlab.grading._collect import PYTEST_INI, collect_cases
from shardlab.grading.release_guard import MARKER
from shardlab.grading.rubric import load_rubric
from test_cli_inputs_property import SETTINGS, _alarm, _number_text, _sub

SECONDS = 10.0  # per case: release takes ~0.2 s, a faked grade ~0.5 s on an idle machine
MAX_GROWTH_KB = 512 * 1024  # how far one case may raise this process's peak memory (RSS)
# a pseudo file system nothing can be created in (never a real folder outside tmp_path)
PROC = "/proc/shardlab-property/new" if Path("/proc/self").is_dir() else "missing/new"
PATHS = (
    "new", "deep/er/new", "", ".", "..", "labs", "labs/01_toy", "labs/01_toy/new", "subs",
    "subs/new", "subs/alice", "link", "link/new", "empty", "notes", "run1", "journal", "prev",
    "a_file", "a_file/new", "missing", PROC,
)
LABS = ("01_toy", "02_toydist", "03_missing", "", "../01_toy", "01_toy/hidden")
URLS = ("https://example.org/book", "", "x", "javascript:alert(1)", "http://a b/\n", "é" * 3000)
# files of someone else in the scratch folder: no case may remove or change them
THEIRS = {
    "notes/notes.txt": "mine\n",
    "run1/grades.csv": "student,lab\n",
    "subs/alice/gradetoy.py": (FIXTURE_LABS / "01_toy" / "gradetoy.py").read_text(),
    "subs/bob/01_toy/gradetoy.py": "def broken(:\n",
    "a_file": "x",
}


def _scratch(base: Path) -> Path:
    root = Path(tempfile.mkdtemp(dir=base))
    shutil.copytree(FIXTURE_LABS, root / "labs", ignore=shutil.ignore_patterns("__pycache__"))
    write_tree(root, THEIRS)
    with zipfile.ZipFile(root / "subs" / "carol.zip", "w") as zf:
        zf.writestr("gradetoy.py", THEIRS["subs/alice/gradetoy.py"])
    (root / "empty").mkdir()
    (root / "journal" / "_journal").mkdir(parents=True)
    marker = json.dumps({"shardlab_release": 1, "files": ["README.md"]})
    write_tree(root / "prev", {MARKER: marker, "README.md": "an earlier release\n"})
    (root / "link").symlink_to(root / "subs")
    return root


def _either(usable: str, others) -> st.SearchStrategy[str]:
    """Mostly a usable value, so that runs which pass every check are drawn too."""
    return st.one_of(st.just(usable), st.just(usable), others)


def _value(action) -> st.SearchStrategy[list[str]]:
    if not action.option_strings:  # grade's SUBMISSIONS
        return _either("subs", st.sampled_from(PATHS)).map(lambda v: [v])
    flag = action.option_strings[0]
    if action.nargs == 0:
        return st.just([flag])
    if flag in ("--labs", "--out"):
        usable = "labs" if flag == "--labs" else "new"
        return _either(usable, st.sampled_from(PATHS)).map(lambda v: [flag, v])
    if flag == "--lab":
        return _either("01_toy", st.sampled_from(LABS)).map(lambda v: [flag, v])
    if flag == "--book-url":
        return st.sampled_from(URLS).map(lambda v: [flag, v])
    if action.type in (int, float):
        return _either("2", _number_text()).map(lambda v: [flag, v])
    raise AssertionError(f"no values for {flag}: give the new option a strategy here")


@st.composite
def argv(draw, command: str) -> list[str]:
    """The required arguments (each left out once in 20 draws) and up to four others."""
    actions = [a for a in _sub(command)._actions if "--help" not in a.option_strings]
    must = [a for a in actions if a.required or not a.option_strings]
    may = [a for a in actions if a not in must]
    out = [command]
    for action in must:
        if draw(st.sampled_from([True] * 19 + [False])):
            out += draw(_value(action))
    for action in draw(st.lists(st.sampled_from(may), max_size=4, unique_by=id)):
        out += draw(_value(action))
    return out


def _run(args: list[str]) -> tuple[int, str, str, int]:
    """(exit status, stdout, stderr, growth of the peak RSS in kB) of one bounded case."""
    out, err = io.StringIO(), io.StringIO()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, SECONDS)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                rc = cli.main(args)
            except SystemExit as exc:  # argparse's usage errors (one line)
                rc = exc.code
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak
    return rc, out.getvalue(), err.getvalue(), grown


def _check(base: Path, args: list[str]) -> int:
    root, here = _scratch(base), os.getcwd()
    os.chdir(root)
    try:
        rc, out, err, grown = _run(args)
    finally:
        os.chdir(here)
    command = args[0]
    event(f"exit {rc}" + (f": {err.strip().splitlines()[-1][:40]}" if rc else ""))  # --hypothesis-show-statistics: how many cases got past the checks
    assert grown < MAX_GROWTH_KB, (args, f"peak RSS grew by {grown} kB")
    for rel, text in THEIRS.items():
        assert (root / rel).read_text() == text, (args, f"{rel} was changed or removed")
    assert sorted(p.name for p in base.iterdir()) == sorted(
        p.name for p in base.iterdir() if p.is_dir() and p.name.startswith("tmp")
    ), (args, "something was written beside the scratch folders")
    assert "Traceback" not in err and "[Errno" not in err, (args, err)
    if rc == 0:
        assert out.strip() or "holds no submission" in err, (args, out, err)
        if command == "release":
            assert not err.strip(), (args, err)
        return rc
    assert rc == 2, (args, rc, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1, (args, err)
    assert lines[0].startswith((f"shardlab {command}: ", f"{command} failed: ", "shardlab: ")), (
        args,
        err,
    )
    assert "too large to compute with (" not in err and "more memory than" not in err, (args, err)
    return rc


@pytest.fixture(scope="module")
def cases():
    """Each fixture lab's collected cases, collected once before the examples run."""
    return {
        lab.name: collect_cases(load_rubric(lab), PYTEST_INI)
        for lab in sorted(FIXTURE_LABS.iterdir())
        if (lab / "rubric.toml").is_file()
    }


@pytest.fixture
def collected(monkeypatch, cases):
    """The collection, CUDA detection and each job replaced: the checks are what run.
    Gives the labs whose collection started (minutes each on the real labs)."""
    labs: list[str] = []

    def with_cases(rubric, ini_text, **_):
        labs.append(rubric.lab)
        return dataclasses.replace(rubric, cases=cases[rubric.lab])

    def grade_lab(student, root, rubric, *, cuda, **_):
        return jobs.LabResult(student, rubric.lab, jobs._zero(rubric, "failed", "faked", cuda))

    monkeypatch.setattr(driver, "with_cases", with_cases)
    monkeypatch.setattr(driver, "detect_cuda", lambda: False)
    monkeypatch.setattr(jobs, "grade_lab", grade_lab)
    return labs


@SETTINGS
@given(args=argv("release"))
@example(args=["release", "--out", "", "--force"])
@example(args=["release", "--out", ".", "--force"])
@example(args=["release", "--out", "..", "--force", "--labs-only"])
@example(args=["release", "--out", "notes", "--force", "--zip"])
@example(args=["release", "--out", "prev", "--force", "--zip"])
@example(args=["release", "--out", "labs/01_toy/new"])
@example(args=["release", "--labs", "empty", "--out", "new"])
@example(args=["release", "--labs", "missing", "--out", "new"])
@example(args=["release", "--out", PROC])
def test_release(tmp_path, args):
    _check(tmp_path, args)


@SETTINGS
@given(args=argv("grade"))
@example(args=["grade", "subs", "--out", "notes"])
@example(args=["grade", "subs", "--out", "run1", "--unsafe-no-sandbox"])
@example(args=["grade", "subs", "--out", PROC])
@example(args=["grade", "subs", "--out", "link/new"])
@example(args=["grade", "empty", "--out", "new", "--no-cuda"])
@example(args=["grade", "subs", "--out", "journal", "--resume", "--workers", "1024"])
@example(args=["grade", "subs", "--labs", "missing", "--out", "new"])
@example(args=["grade", "subs", "--labs", "a_file", "--out", "new"])
@example(args=["grade", "subs", "--out", "new", "--timeout", "1e308", "--max-procs", "1e9"])
def test_grade(tmp_path, collected, args):
    collected.clear()
    if _check(tmp_path, args) != 0:  # every refusal comes before the collection
        assert not collected, (args, collected)
