"""Submission names in the reports (issue 24, "Names"): every printed or written name is
printable, two entries never share a name, and a collision stops grading with a sentence.

Fast: the job runner is driven with a stand-in for ``grade_lab`` (no sandbox starts).
"""

from __future__ import annotations

import csv

import pytest
from grading_fixtures.helpers import FIXTURE_LABS, write_tree
from shardlab.grading import _jobs as jobs
from shardlab.grading import grade
from shardlab.grading._submissions import SubmissionError, discover_submissions, student_name
from shardlab.grading.cli import main

LAB = "01_toy"
ESCAPE = "n9_\x1b[2K\r\x1b[1mmallory 21 of 21\x1b[0m"  # clears the line and prints a fake grade


def _fake(student, root, rubric, **_):
    rows = [
        r.__class__(r.test, r.max_points, r.max_points, "passed")
        for r in jobs._zero(rubric, "x", "", False)
    ]
    return jobs.LabResult(student, rubric.lab, rows, note=f"graded {student}")


def _subs(tmp_path, names):
    for name in names:
        write_tree(tmp_path / "subs" / name, {"gradetoy.py": "x = 1\n"})
    return tmp_path / "subs"


def test_near_identical_names_stay_distinct(tmp_path, monkeypatch):
    monkeypatch.setattr(jobs, "grade_lab", _fake)
    subs = _subs(tmp_path, ["n17_victim\x01", "n17_victim_", "n17_victim%01"])
    results = grade(FIXTURE_LABS, subs, tmp_path / "out", labs=[LAB], cuda=False, sandbox=False)
    names = {r.student for r in results}
    assert names == {"n17_victim%01", "n17_victim_", "n17_victim%2501"}  # none renamed ~2
    assert (tmp_path / "out" / "n17_victim_" / "results.json").is_file()


def test_mapping_is_one_to_one():
    names = ["a", "a\x01", "a%01", "a/b", "a%2Fb", "a\\b", ".", "..", "%2E", "é", "\udcff"]
    mapped = [student_name(n) for n in names]
    assert len(set(mapped)) == len(names)
    assert all(m.isprintable() and "/" not in m and m not in (".", "..") for m in mapped)


def test_terminal_escapes_never_reach_the_progress_line_or_reports(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(jobs, "grade_lab", _fake)
    subs = _subs(tmp_path, [ESCAPE, "alice"])
    out = tmp_path / "out"
    argv = ["grade", str(subs), "--labs", str(FIXTURE_LABS), "--out", str(out), "--lab", LAB]
    assert main([*argv, "--unsafe-no-sandbox", "--no-cuda"]) == 0
    printed = capsys.readouterr()
    assert "\x1b" not in printed.out and "\r" not in printed.out
    assert "n9_%1B[2K%0D%1B[1mmallory 21 of 21%1B[0m" in printed.out
    for name in ("summary.csv", "grades.csv", "junit.xml"):
        text = (out / name).read_text()
        assert "\x1b" not in text and "\r" not in text.replace("\r\n", "\n"), name
    with open(out / "summary.csv", newline="") as fh:
        students = {row["student"] for row in csv.DictReader(fh)}
    assert students == {"alice", "n9_%1B[2K%0D%1B[1mmallory 21 of 21%1B[0m"}


def test_collision_stops_with_both_names(tmp_path):
    subs = _subs(tmp_path, ["grades.csv", "grades.csv~2"])  # a report name takes "~2"
    with pytest.raises(SubmissionError) as err:
        discover_submissions(subs)
    assert "'grades.csv'" in str(err.value) and "'grades.csv~2'" in str(err.value)
    long = _subs(tmp_path / "long", ["\x01" * 80])  # 240 bytes once escaped
    with pytest.raises(SubmissionError, match="longer than 200 bytes"):
        discover_submissions(long)


def test_messages_in_csv_are_printable():
    from shardlab.grading.report import cell, printable

    assert printable("ok\x1b[2Kfake\x00\r\n") == "ok\\x1b[2Kfake\\x00\\r\\n"
    assert cell("\r=1+1") == "\\r=1+1"
    assert cell("\tx") == "'\tx"
