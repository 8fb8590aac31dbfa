"""Hostile and broken submissions: each gets a clear status, the grader carries on, and no
process survives grading (fixture lab 01_toy; submissions in grading_fixtures/hostile.py)."""

from __future__ import annotations

import os
import time

import psutil
import pytest
from grading_fixtures.helpers import (
    FIXTURE_LABS,
    FIXTURES,
    load_py,
    rows_by_test,
    shared_result,
    tree_digest,
    write_tree,
)
from shardlab.grading import Limits, grade
from shardlab.grading.release import strip_solutions

hostile = load_py(FIXTURES / "hostile.py")
LAB = "01_toy"
FULL = 9  # rubric total without the GPU test


def _tagged():
    found = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if any(hostile.TAG in part for part in p.info["cmdline"] or []):
                found.append(p)
        except psutil.Error:
            continue
    return found


def _build(root, names=None):
    ref = (FIXTURE_LABS / LAB / "gradetoy.py").read_text()
    subs = hostile.submissions(ref, strip_solutions(ref))
    for name, files in subs.items():
        if names is None or name in names:
            write_tree(root / name, files)


def _grade_all(folder):
    root = folder / "subs"
    _build(root)
    out = folder / "out"
    limits = Limits(timeout=120, file_size_mb=16, max_procs=16)
    before = tree_digest(FIXTURE_LABS)
    start = time.monotonic()
    results = grade(FIXTURE_LABS, root, out, labs=[LAB], workers=2, limits=limits, cuda=False)
    wall = time.monotonic() - start
    assert tree_digest(FIXTURE_LABS) == before  # the instructor's files are byte-identical
    return results, out, wall


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    # computed once per session even under pytest-xdist (every test here reads it)
    return shared_result(tmp_path_factory, "grading-hostile", _grade_all)


def _get(graded, student):
    return rows_by_test(graded[0], student, LAB)


def test_every_submission_graded_and_no_survivors(graded):
    results, out, _ = graded
    assert {r.student for r in results} == set(hostile.submissions("", ""))
    time.sleep(0.5)
    assert _tagged() == []
    assert (out / "grades.csv").is_file()


def test_reference_still_full_marks(graded):
    res, _ = _get(graded, "reference")
    assert res.points == FULL


def test_os_exit_in_import(graded):
    res, rows = _get(graded, "os_exit")
    assert res.points == 0
    assert {r.status for r in rows.values()} == {"did not run", "needs GPU"}
    assert "exited with code 3" in res.note and "os._exit()" in res.note
    assert "while collecting test_gradetoy.py" in res.note


def test_kill_supervisor_parent(graded):
    """The supervisor is PID 1 of the sandbox: SIGKILL from inside is ignored by the kernel."""
    res, _ = _get(graded, "kill_supervisor")
    assert res.points == FULL and "supervisor" not in res.note


def test_child_kills_pytest(graded):
    res, rows = _get(graded, "kill_pytest")
    row = rows["test_gradetoy.py::test_scale"]
    assert (
        row.status == "crashed"
        and "SIGKILL" in row.message
        and "while this test ran" in row.message
    )
    # tests that finished before the crash keep their points (read from the progress log)
    assert rows["test_gradetoy.py::test_mean"].status == "passed"
    assert rows["test_gradetoy_hidden.py::test_chunk_last"].status == "did not run"


def test_flood_stdout(graded):
    res, rows = _get(graded, "flood")
    row = rows["test_gradetoy.py::test_mean"]
    # Python ignores SIGXFSZ, so the write fails (EFBIG) once the capture file hits the limit
    assert row.status == "failed" and "File too large" in row.message
    assert "exceeded the 16 MB limit: flooding stdout?" in row.message
    assert res.points == FULL - 3  # test_mean and test_mean_hidden (both call mean)
    assert len(res.log_tail) < 10_000
    assert (graded[1] / "_logs" / "flood" / "01_toy.log").stat().st_size < 10_000


def test_daemons_are_killed(graded):
    res, _ = _get(graded, "daemons")
    assert res.points == FULL
    assert "left running by the submission were killed" in res.note
    assert _tagged() == []


def test_too_many_processes(graded):
    res, rows = _get(graded, "fork_many")
    assert res.points == 0
    assert "too many processes" in res.note


@pytest.mark.parametrize("student", ["tamper_rewrite", "tamper_delete"])
def test_tampering_with_tests(graded, student):
    """Every file of the work folder is mounted read-only: the edit fails at import (0 points).

    Without the sandbox the edit succeeds and is caught as "tampered" (the slow test
    ``test_grading_unsafe.py``)."""
    res, rows = _get(graded, student)
    assert res.points == 0
    assert {r.status for r in rows.values()} == {"did not run", "needs GPU"}
    message = rows["test_gradetoy.py::test_add"].message
    assert ("Read-only file system" if student == "tamper_rewrite" else "resource busy") in message


def test_fake_junit_report_is_ignored(graded):
    res, rows = _get(graded, "fake_junit")
    assert res.points == 0
    assert (
        rows["test_gradetoy.py::test_mean"].message == "NotImplementedError: sum divided by count"
    )


def test_submitted_tests_and_helpers_are_ignored(graded):
    res, _ = _get(graded, "own_tests")
    assert res.points == 0


def test_missing_files(graded):
    res, rows = _get(graded, "missing")
    assert res.points == 0 and rows["test_gradetoy.py::test_add"].status == "missing"
    assert "gradetoy.py not found" in rows["test_gradetoy.py::test_add"].message


def test_syntax_error(graded):
    res, rows = _get(graded, "syntax")
    row = rows["test_gradetoy.py::test_add"]
    assert res.points == 0 and row.status == "syntax error"
    assert row.message.startswith("gradetoy.py line 4:")


def test_nested_folder_submission(graded):
    res, _ = _get(graded, "nested_zip")
    assert res.points == FULL


def test_hang_times_out_and_keeps_earlier_results(tmp_path):
    _build(tmp_path / "subs", names={"hang"} | set())
    ref = (FIXTURE_LABS / LAB / "gradetoy.py").read_text()
    write_tree(tmp_path / "subs" / "hang", {"gradetoy.py": ref + hostile.HANG})
    start = time.monotonic()
    results = grade(
        FIXTURE_LABS, tmp_path / "subs", None, labs=[LAB], limits=Limits(timeout=20), cuda=False
    )
    assert time.monotonic() - start < 60
    res, rows = rows_by_test(results, "hang", LAB)
    assert rows["test_gradetoy.py::test_mean"].status == "timeout"
    assert "timed out after 20 s" in rows["test_gradetoy.py::test_mean"].message
    assert rows["test_gradetoy.py::test_add"].status == "passed"
    assert rows["test_gradetoy_hidden.py::test_chunk_last"].status == "did not run"
    assert res.points == 3  # test_add (2) and test_chunk (1) finished before the hang
    assert not [
        p
        for p in psutil.Process(os.getpid()).children(recursive=True)
        if "_runner" in " ".join(p.cmdline()) or "bwrap" in " ".join(p.cmdline())
    ]
