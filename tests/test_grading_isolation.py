"""Per-student isolation and integrity of the grading driver, and the link-free file helpers.

Fast: the job runner is driven with a stand-in for ``grade_lab`` (no sandbox starts), so a
grader exception, a hang and a change to the instructor's lab can be staged exactly.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
import zipfile

import pytest
from grading_fixtures.helpers import FIXTURE_LABS, rows_by_test, write_tree
from shardlab.grading import Limits, grade
from shardlab.grading import _jobs as jobs
from shardlab.grading._fs import TreeError, read_regular, remove_tree, walk
from shardlab.grading._submissions import SubmissionError, check_zip, discover_submissions
from shardlab.grading.grade import LabResult
from shardlab.grading.report import cell

LAB = "01_toy"


def _fake(behaviour):
    """A grade_lab stand-in: full marks unless ``behaviour[student]`` says otherwise."""

    def grade_lab(student, root, rubric, **_):
        action = behaviour.get(student)
        if action is not None:
            action()
        rows = [
            r.__class__(r.test, r.max_points, r.max_points, "passed")
            for r in jobs._zero(rubric, "x", "", False)
        ]
        return LabResult(student, rubric.lab, rows)

    return grade_lab


def _subs(tmp_path, names):
    for name in names:
        write_tree(tmp_path / "subs" / name, {"gradetoy.py": "x = 1\n"})
    return tmp_path / "subs"


def test_exception_in_one_job_is_that_students_grader_error(tmp_path, monkeypatch):
    def boom():
        raise RecursionError("maximum recursion depth exceeded")

    monkeypatch.setattr(jobs, "grade_lab", _fake({"bob": boom}))
    subs = _subs(tmp_path, ["alice", "bob", "carol"])
    results = grade(FIXTURE_LABS, subs, tmp_path / "out", labs=[LAB], cuda=False, sandbox=False)
    res, rows = rows_by_test(results, "bob", LAB)
    assert res.points == 0 and res.max_points == 9
    assert {r.status for r in rows.values()} == {"grader error", "needs GPU"}
    assert "RecursionError while grading" in res.note
    for other in ("alice", "carol"):
        assert rows_by_test(results, other, LAB)[0].points == 9
    text = (tmp_path / "out" / "bob" / "results.json").read_text()
    assert "RecursionError" not in text and "your instructor has the reason" in text


def test_hung_job_is_given_up(tmp_path, monkeypatch):
    release = threading.Event()
    monkeypatch.setattr(jobs, "grade_lab", _fake({"stuck": lambda: release.wait(60)}))
    monkeypatch.setattr(jobs, "JOB_GRACE", 1.0)
    subs = _subs(tmp_path, ["alice", "stuck", "zed"])
    start = time.monotonic()
    try:
        results = grade(
            FIXTURE_LABS,
            subs,
            None,
            labs=[LAB],
            cuda=False,
            sandbox=False,
            workers=1,
            limits=Limits(timeout=1.0),
        )
    finally:
        release.set()
    assert time.monotonic() - start < 30
    res, _ = rows_by_test(results, "stuck", LAB)
    assert res.points == 0 and "did not finish within 2 s" in res.note
    assert rows_by_test(results, "zed", LAB)[0].points == 9  # a new worker took over


def test_instructor_change_stops_grading(tmp_path, monkeypatch):
    labs = tmp_path / "labs"
    shutil.copytree(FIXTURE_LABS, labs)

    def edit():
        (labs / LAB / "hidden" / "test_gradetoy_hidden.py").write_text("def test_x():\n    pass\n")

    monkeypatch.setattr(jobs, "grade_lab", _fake({"alice": edit}))
    subs = _subs(tmp_path, ["alice", "bob", "carol"])
    results = grade(labs, subs, None, labs=[LAB], cuda=False, sandbox=False, workers=1)
    assert rows_by_test(results, "alice", LAB)[0].points == 9
    for later in ("bob", "carol"):
        res, _ = rows_by_test(results, later, LAB)
        assert res.points == 0 and "changed since grading started" in res.note
        assert "hidden/test_gradetoy_hidden.py" in res.note


def test_refuses_without_bwrap(tmp_path, monkeypatch):
    monkeypatch.setattr(jobs, "find_bwrap", lambda: None)
    subs = _subs(tmp_path, ["alice"])
    with pytest.raises(jobs.SandboxUnavailable, match="--unsafe-no-sandbox"):
        grade(FIXTURE_LABS, subs, tmp_path / "out", labs=[LAB], cuda=False)
    assert not (tmp_path / "out").exists()


def test_walk_bounds_and_links(tmp_path):
    write_tree(tmp_path / "t", {"a/b/c.txt": "x", "d.txt": "y"})
    os.symlink("/etc", tmp_path / "t" / "etc")
    kinds = {"/".join(e.rel): e.kind for e in walk(tmp_path / "t")}
    assert kinds == {"a": "dir", "a/b": "dir", "a/b/c.txt": "file", "d.txt": "file", "etc": "link"}
    with pytest.raises(TreeError, match="more than 2 files"):
        walk(tmp_path / "t", max_entries=2)
    assert {"/".join(e.rel) for e in walk(tmp_path / "t", max_depth=1)} == {"a", "d.txt", "etc"}


def test_read_regular_refuses_fifo_link_and_big(tmp_path):
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(TreeError, match="not a regular file"):
        read_regular(tmp_path / "fifo", 100)  # returns at once: never waits for a writer
    (tmp_path / "real").write_text("x")
    os.symlink(tmp_path / "real", tmp_path / "link")
    with pytest.raises(TreeError, match="cannot be opened"):
        read_regular(tmp_path / "link", 100)
    with open(tmp_path / "sparse", "wb") as fh:
        fh.truncate(2**31)
    with pytest.raises(TreeError, match="limit"):
        read_regular(tmp_path / "sparse", 2**20)


def test_remove_tree_any_depth_without_following_links(tmp_path):
    keep = tmp_path / "keep"
    keep.mkdir()
    (keep / "precious").write_text("x")
    root = tmp_path / "deep"
    root.mkdir()
    fd = os.open(root, os.O_RDONLY)
    name = "d" * 50
    for _ in range(1100):  # deeper than Python's recursion limit, paths longer than PATH_MAX
        os.mkdir(name, dir_fd=fd)
        os.symlink(str(keep), "link", dir_fd=fd)
        nfd = os.open(name, os.O_RDONLY, dir_fd=fd)
        os.close(fd)
        fd = nfd
    os.close(fd)
    remove_tree(root)
    assert not root.exists() and (keep / "precious").read_text() == "x"


def test_zip_checks(tmp_path):
    deep = tmp_path / "deep.zip"
    with zipfile.ZipFile(deep, "w") as zf:
        zf.writestr("a/" * 1200 + "x.py", "x")
    with pytest.raises(SubmissionError, match="folders deep"):
        check_zip(deep)
    dup = tmp_path / "dup.zip"
    with zipfile.ZipFile(dup, "w") as zf:
        zf.writestr("x.py", "1")
        zf.writestr("./x.py", "2")
    with pytest.raises(SubmissionError, match="appears twice"):
        check_zip(dup)


def test_student_named_like_a_report(tmp_path, monkeypatch):
    monkeypatch.setattr(jobs, "grade_lab", _fake({}))
    subs = _subs(tmp_path, ["grades.csv", "junit.xml"])
    results = grade(FIXTURE_LABS, subs, tmp_path / "out", labs=[LAB], cuda=False, sandbox=False)
    assert {r.student for r in results} == {"grades.csv~2", "junit.xml~2"}
    assert (tmp_path / "out" / "grades.csv").is_file()
    assert (tmp_path / "out" / "junit.xml~2" / "results.json").is_file()


def test_discover_rejects_links(tmp_path):
    (tmp_path / "real").mkdir()
    os.symlink(tmp_path / "real", tmp_path / "alias")
    found = {s.student: s for s in discover_submissions(tmp_path)}
    assert found["real"].kind == "dir"
    assert found["alias"].kind == "bad" and "symbolic link" in found["alias"].problem


def test_csv_cell():
    assert [cell(v) for v in ("=1+1", "+1", "-1", "@x", "\tx", "ok", "1.5")] == [
        "'=1+1",
        "'+1",
        "'-1",
        "'@x",
        "'\tx",
        "ok",
        "1.5",
    ]


def test_timeout_under_load_says_so():
    from shardlab.grading._score import _death_note
    from shardlab.grading.sandbox import RunResult

    limits = Limits(timeout=120)
    busy = _death_note(RunResult(None, timed_out=True, load=99.0), limits)
    assert busy.startswith("timed out after 120 s") and "load average was 99.0" in busy
    quiet = _death_note(RunResult(None, timed_out=True, load=0.0), limits)
    assert "load average" not in quiet


@pytest.mark.parametrize("status", ["tampered", "rejected", "grader error", "missing"])
def test_zero_rows_leave_gpu_tests_out_of_the_maximum(status):
    from shardlab.grading._score import _zero
    from shardlab.grading.rubric import load_rubric

    rubric = load_rubric(FIXTURE_LABS / LAB)
    assert sum(r.max_points for r in _zero(rubric, status, "x", cuda=False)) == 9
    assert sum(r.max_points for r in _zero(rubric, status, "x", cuda=True)) == 10
