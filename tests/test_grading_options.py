"""``shardlab grade`` checks every option before anything runs (issue 30): a typo such as
``--timeout 0`` used to exit 0 and write 0/21 for a correct submission into grades.csv.

Fast: every refused command stops before a sandbox starts or ``--out`` is created.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from grading_fixtures.helpers import FIXTURE_LABS, REPO_LABS, write_tree
from shardlab.grading import Limits, grade
from shardlab.grading import _driver as driver
from shardlab.grading import _jobs as jobs
from shardlab.grading.cli import main

LAB = "01_toy"


def _subs(tmp_path):
    ref = (FIXTURE_LABS / LAB / "gradetoy.py").read_text()
    write_tree(tmp_path / "subs" / "alice", {"gradetoy.py": ref})
    return tmp_path / "subs"


def _run(tmp_path, *extra, out=None):
    subs = _subs(tmp_path)
    out = out or tmp_path / "out"
    argv = ["grade", str(subs), "--labs", str(FIXTURE_LABS), "--out", str(out), "--lab", LAB]
    return main([*argv, "--unsafe-no-sandbox", "--no-cuda", *extra]), out


@pytest.mark.parametrize(
    "option, value, says",
    [
        ("--timeout", "0", "--timeout must be between"),
        ("--timeout", "-5", "--timeout must be between"),
        ("--timeout", "nan", "--timeout must be a finite number"),
        ("--timeout", "inf", "--timeout must be a finite number"),
        ("--max-procs", "0", "--max-procs must be between"),
        ("--max-procs", "-3", "--max-procs must be between"),
        ("--max-rss-gb", "0", "--max-rss-gb must be between"),
        ("--max-rss-gb", "nan", "--max-rss-gb must be a finite number"),
        ("--file-mb", "0", "--file-mb must be between"),
        ("--tmp-mb", "0", "--tmp-mb must be between"),
        ("--as-gb", "-1", "or 0 for no limit"),
        ("--as-gb", "nan", "--as-gb must be a finite number"),
        ("--workers", "0", "--workers must be between"),
        ("--workers", "-1", "--workers must be between"),
    ],
)
def test_bad_limit_is_one_sentence_before_anything_runs(tmp_path, capsys, option, value, says):
    code, out = _run(tmp_path, option, value)
    err = capsys.readouterr().err
    assert code == 2
    assert says in err and err.count("\n") == 1 and "Traceback" not in err
    assert not out.exists()  # nothing ran, nothing was written


def test_as_gb_zero_still_means_no_limit(tmp_path, monkeypatch, capsys):
    seen = []

    def fake(student, root, rubric, *, limits, **_):
        seen.append(limits.address_space_gb)
        return jobs.LabResult(student, rubric.lab, jobs._zero(rubric, "x", "", False))

    monkeypatch.setattr(jobs, "grade_lab", fake)
    code, _ = _run(tmp_path, "--as-gb", "0")
    assert code == 0 and seen == [None]


def test_out_inside_the_submissions_is_refused(tmp_path, capsys):
    subs = _subs(tmp_path)
    for out in (subs / "out", subs / "deeper" / "grades", subs):
        code, _ = _run(tmp_path, out=out)
        err = capsys.readouterr().err
        assert code == 2 and "inside the submissions folder" in err
    assert sorted(p.name for p in subs.iterdir()) == ["alice"]  # no phantom student "out"


def test_grade_api_checks_limits_too(tmp_path):
    with pytest.raises(ValueError, match="--timeout must be between"):
        grade(FIXTURE_LABS, _subs(tmp_path), None, labs=[LAB], limits=Limits(timeout=0))
    with pytest.raises(ValueError, match="--workers must be between"):
        grade(FIXTURE_LABS, _subs(tmp_path), None, labs=[LAB], workers=-1)


def test_empty_submissions_folder_warns(tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    argv = ["grade", str(empty), "--labs", str(FIXTURE_LABS), "--out", str(tmp_path / "out")]
    code = main([*argv, "--lab", LAB, "--unsafe-no-sandbox", "--no-cuda"])
    err = capsys.readouterr().err
    assert code == 0 and "holds no submission" in err


# --- every check of --out, and the empty-folder warning, come before the collection -------
# Collecting the instructor's tests of every lab takes minutes on the real labs: a problem
# reported only after it (or a run that collects to grade nobody) is the audit's finding.


@pytest.fixture
def collected(monkeypatch):
    """The labs the grader started collecting (none is the point); the collection itself is
    replaced, so a regression fails in a second instead of running for minutes."""
    labs = []

    def fake(rubric, ini_text, **_):
        labs.append(rubric.lab)
        return rubric

    monkeypatch.setattr(driver, "with_cases", fake)
    return labs


def _nonempty(tmp_path):
    write_tree(tmp_path / "notes", {"notes.txt": "mine"})
    return tmp_path / "notes"


def _earlier_run(tmp_path):
    write_tree(tmp_path / "run1", {"grades.csv": "student,lab\n", "junit.xml": "<x/>"})
    return tmp_path / "run1"


def _a_file(tmp_path):
    write_tree(tmp_path, {"a_file": "x"})
    return tmp_path / "a_file"


@pytest.mark.parametrize(
    "make_out, says",
    [
        (_nonempty, "is not empty"),
        (_earlier_run, "holds the reports of an earlier run"),
        (_a_file, "is not a folder"),
        pytest.param(
            lambda _: Path("/proc/shardlab-grade30/out"),
            "--out /proc/shardlab-grade30/out",
            marks=pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs /proc"),
        ),
    ],
    ids=["non-empty", "earlier-run", "a-file", "unwritable"],
)
def test_a_bad_out_is_refused_before_collecting(tmp_path, capsys, collected, make_out, says):
    out = make_out(tmp_path)
    before = sorted(out.iterdir()) if out.is_dir() else None
    start = time.monotonic()
    argv = ["grade", str(_subs(tmp_path)), "--labs", str(REPO_LABS), "--out", str(out)]
    code = main([*argv, "--unsafe-no-sandbox", "--no-cuda"])
    err = capsys.readouterr().err
    assert code == 2 and collected == [], (code, collected, err)
    assert says in err and err.count("\n") == 1 and "Traceback" not in err, err
    assert time.monotonic() - start < 10
    assert (sorted(out.iterdir()) if out.is_dir() else None) == before  # untouched


def test_resume_into_a_foreign_folder_is_refused_before_collecting(tmp_path, capsys, collected):
    code, _ = _run(tmp_path, "--resume", out=_nonempty(tmp_path))
    err = capsys.readouterr().err
    assert code == 2 and collected == [] and "nothing to resume there" in err


def test_grade_api_checks_out_before_collecting(tmp_path, collected):
    with pytest.raises(ValueError, match="is not empty"):
        grade(FIXTURE_LABS, _subs(tmp_path), _nonempty(tmp_path), labs=[LAB], sandbox=False)
    assert collected == []


def test_empty_submissions_folder_stops_before_collecting(tmp_path, capsys, collected):
    empty, out = tmp_path / "empty", tmp_path / "out2"
    empty.mkdir()
    start = time.monotonic()
    argv = ["grade", str(empty), "--labs", str(REPO_LABS), "--out", str(out)]
    code = main([*argv, "--unsafe-no-sandbox", "--no-cuda"])
    captured = capsys.readouterr()
    assert code == 0 and collected == [], (code, collected)
    assert captured.err.count("holds no submission") == 1 and "Traceback" not in captured.err
    assert time.monotonic() - start < 10
    assert not out.exists()  # nothing graded, nothing written: the same --out works next time
    assert "graded" not in captured.out


def test_empty_submissions_still_check_the_labs(tmp_path, capsys, collected):
    """Nothing to grade is no reason to let a typo in --lab pass unnoticed."""
    empty = tmp_path / "empty"
    empty.mkdir()
    argv = ["grade", str(empty), "--labs", str(FIXTURE_LABS), "--out", str(tmp_path / "o")]
    code = main([*argv, "--lab", "99_nope", "--unsafe-no-sandbox", "--no-cuda"])
    err = capsys.readouterr().err
    assert code == 2 and "unknown lab" in err and collected == []


def test_a_collection_that_fails_leaves_no_empty_out(tmp_path, monkeypatch, capsys):
    """--out is made before the collection; a lab that cannot be collected takes it back, so
    the corrected run can use the same folder."""
    from shardlab.grading.rubric import RubricError

    def broken(rubric, ini_text, **_):
        raise RubricError(f"{rubric.lab}: pytest cannot collect the instructor's tests.")

    monkeypatch.setattr(driver, "with_cases", broken)
    code, out = _run(tmp_path)
    assert code == 2 and "cannot collect" in capsys.readouterr().err
    assert not out.exists()
