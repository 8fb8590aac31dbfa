"""``shardlab grade`` checks every option before anything runs (issue 30): a typo such as
``--timeout 0`` used to exit 0 and write 0/21 for a correct submission into grades.csv.

Fast: every refused command stops before a sandbox starts or ``--out`` is created.
"""

from __future__ import annotations

import pytest
from grading_fixtures.helpers import FIXTURE_LABS, write_tree
from shardlab.grading import Limits, grade
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
