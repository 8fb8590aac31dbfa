"""One bad job must not lose every grade (issue 24): each job's result is written durably to
``--out/_journal`` as it finishes, and ``--resume`` grades only what a killed run had not.

Fast: the job runner is driven with a stand-in for ``grade_lab``; the "crash" is a grader
process that SIGKILLs itself while grading one student (only that child process dies).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from grading_fixtures.helpers import FIXTURE_LABS, write_tree
from shardlab.grading import _jobs as jobs
from shardlab.grading import grade

LAB = "01_toy"
PKG = Path(jobs.__file__).resolve().parents[2]

# A grader that dies (SIGKILL, no cleanup) when it reaches student "mallory".
_CRASHING = r"""
import os, signal, sys
from pathlib import Path
from shardlab.grading import _jobs as jobs
from shardlab.grading import grade


def grade_lab(student, root, rubric, **_):
    if student == "mallory":
        os.kill(os.getpid(), signal.SIGKILL)
    rows = [r.__class__(r.test, r.max_points, r.max_points, "passed")
            for r in jobs._zero(rubric, "x", "", False)]
    return jobs.LabResult(student, rubric.lab, rows)


jobs.grade_lab = grade_lab
grade(Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]), labs=["01_toy"], workers=1,
      cuda=False, sandbox=False)
"""


def _subs(tmp_path, names):
    for name in names:
        write_tree(tmp_path / "subs" / name, {"gradetoy.py": "x = 1\n"})
    return tmp_path / "subs"


def _crash(tmp_path, subs, out):
    env = {**os.environ, "PYTHONPATH": str(PKG)}
    proc = subprocess.run(
        [sys.executable, "-c", _CRASHING, str(FIXTURE_LABS), str(subs), str(out)],
        env=env,
        capture_output=True,
        timeout=300,
    )
    assert proc.returncode == -9, proc.stderr.decode()[-2000:]


def test_killed_grader_keeps_finished_jobs_and_resume_grades_the_rest(tmp_path, monkeypatch):
    subs = _subs(tmp_path, ["alice", "bob", "mallory"])
    out = tmp_path / "out"
    _crash(tmp_path, subs, out)
    journal = sorted((out / "_journal").iterdir())
    kept = {json.loads(p.read_text())["result"]["student"] for p in journal}
    assert kept == {"alice", "bob"}  # graded before the crash, on disk
    assert not (out / "grades.csv").exists()

    graded = []

    def grade_lab(student, root, rubric, **_):
        graded.append(student)
        return jobs.LabResult(student, rubric.lab, jobs._zero(rubric, "failed", "", False))

    monkeypatch.setattr(jobs, "grade_lab", grade_lab)
    with pytest.raises(ValueError, match="--resume"):  # a plain rerun refuses the folder
        grade(FIXTURE_LABS, subs, out, labs=[LAB], cuda=False, sandbox=False)
    results = grade(FIXTURE_LABS, subs, out, labs=[LAB], cuda=False, sandbox=False, resume=True)
    assert graded == ["mallory"]  # only the job the crash lost
    assert {r.student: r.points for r in results} == {"alice": 9, "bob": 9, "mallory": 0}
    rows = (out / "summary.csv").read_text().splitlines()
    assert len(rows) == 4 and rows[1].startswith("alice,01_toy,9,9,100.0")
    with pytest.raises(ValueError, match="nothing to resume"):  # finished: reports exist
        grade(FIXTURE_LABS, subs, out, labs=[LAB], cuda=False, sandbox=False, resume=True)


def test_resume_regrades_entries_of_another_rubric_or_machine(tmp_path, monkeypatch):
    subs = _subs(tmp_path, ["alice", "mallory"])
    out = tmp_path / "out"
    _crash(tmp_path, subs, out)
    graded = []

    def grade_lab(student, root, rubric, **_):
        graded.append(student)
        return jobs.LabResult(student, rubric.lab, jobs._zero(rubric, "failed", "", True))

    monkeypatch.setattr(jobs, "grade_lab", grade_lab)
    # the first run graded without CUDA: with --cuda the maximum differs, so alice is regraded
    grade(FIXTURE_LABS, subs, out, labs=[LAB], cuda=True, sandbox=False, resume=True)
    assert sorted(graded) == ["alice", "mallory"]


def test_resume_from_the_command_line(tmp_path, monkeypatch, capsys):
    from shardlab.grading.cli import main

    subs = _subs(tmp_path, ["alice", "mallory"])
    out = tmp_path / "out"
    _crash(tmp_path, subs, out)
    monkeypatch.setattr(
        jobs,
        "grade_lab",
        lambda student, root, rubric, **_: jobs.LabResult(
            student, rubric.lab, jobs._zero(rubric, "failed", "", False)
        ),
    )
    argv = ["grade", str(subs), "--labs", str(FIXTURE_LABS), "--out", str(out), "--lab", LAB]
    assert main([*argv, "--unsafe-no-sandbox", "--no-cuda"]) == 2  # not empty: says --resume
    assert "--resume" in capsys.readouterr().err
    assert main([*argv, "--unsafe-no-sandbox", "--no-cuda", "--resume"]) == 0
    assert "alice  9/9" in capsys.readouterr().out
