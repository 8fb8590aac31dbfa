"""shardlab grade on the fixture labs: reference 100 %, stubs 0, planted bugs, report formats."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
import xml.etree.ElementTree as ET
import zipfile

import pytest
from grading_fixtures.helpers import (
    FIXTURE_LABS,
    FIXTURES,
    load_py,
    rows_by_test,
    shared_result,
    write_tree,
)
from shardlab.grading import Limits, grade, load_rubric
from shardlab.grading.release import strip_solutions
from shardlab.grading.rubric import RubricError

LIMITS = Limits(timeout=180)


def _submissions(root, lab: str, module: str):
    """reference, stub and planted-bug submissions of one fixture lab."""
    ref = (FIXTURE_LABS / lab / module).read_text()
    bug = load_py(FIXTURES / "planted_bugs" / f"{lab}.py")
    assert bug.FILE == module and ref.count(bug.OLD) == 1
    write_tree(root / "reference", {module: ref})
    write_tree(root / "stub", {f"{lab}/{module}": strip_solutions(ref)})
    write_tree(root / "planted", {module: ref.replace(bug.OLD, bug.NEW)})
    return bug


def _grade_toy(folder):
    root = folder / "subs"
    bug = _submissions(root, "01_toy", "gradetoy.py")
    ref = (FIXTURE_LABS / "01_toy" / "gradetoy.py").read_text()
    # zipped submissions: one nested in a folder (fine), one with '..' (rejected)
    with zipfile.ZipFile(root / "zipped.zip", "w") as zf:
        zf.writestr("zipped/01_toy/gradetoy.py", ref)
    with zipfile.ZipFile(root / "evil.zip", "w") as zf:
        zf.writestr("../../escape.py", "print('x')")
        zf.writestr("gradetoy.py", ref)
    out = folder / "out"
    results = grade(FIXTURE_LABS, root, out, labs=["01_toy"], workers=2, limits=LIMITS, cuda=False)
    return results, out, bug.LOST


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    # computed once per session even under pytest-xdist (several tests read it)
    results, out, lost = shared_result(tmp_path_factory, "grading-toy", _grade_toy)
    bug = load_py(FIXTURES / "planted_bugs" / "01_toy.py")
    assert bug.LOST == lost
    return results, out, bug


def test_reference_scores_full_marks_gpu_excluded(toy):
    results, _, _ = toy
    res, rows = rows_by_test(results, "reference", "01_toy")
    assert res.points == res.max_points == 9  # 10 in the rubric, 1 needs a GPU
    assert rows["test_gradetoy.py::test_cuda_only"].status == "needs GPU"
    assert rows["test_gradetoy.py::test_cuda_only"].max_points == 0
    assert all(
        r.status == "passed" for k, r in rows.items() if k != "test_gradetoy.py::test_cuda_only"
    )


def test_stub_scores_zero_with_hint_messages(toy):
    results, _, _ = toy
    res, rows = rows_by_test(results, "stub", "01_toy")
    assert res.points == 0 and res.max_points == 9
    assert (
        rows["test_gradetoy.py::test_mean"].message == "NotImplementedError: sum divided by count"
    )
    assert rows["test_gradetoy.py::test_add"].message.startswith(
        "0/4 cases passed; [1-2] NotImplementedError: return the sum of a and b"
    )


def test_planted_bug_loses_exactly_its_tests(toy):
    results, _, bug = toy
    rubric = load_rubric(FIXTURE_LABS / "01_toy")
    res, rows = rows_by_test(results, "planted", "01_toy")
    assert {k for k, r in rows.items() if r.points < r.max_points} == bug.LOST
    assert res.points == 9 - sum(rubric.points[k] for k in bug.LOST)


def test_zip_submissions(toy):
    results, _, _ = toy
    res, _ = rows_by_test(results, "zipped", "01_toy")
    assert res.points == 9
    res, rows = rows_by_test(results, "evil", "01_toy")
    assert res.points == 0 and all(r.status == "rejected" for r in rows.values() if r.max_points)
    assert "'..'" in res.note


def test_report_files(toy):
    results, out, _ = toy
    with open(out / "grades.csv", newline="") as fh:
        table = list(csv.DictReader(fh))
    assert list(table[0]) == ["student", "lab", "test", "points", "max_points", "status", "message"]
    assert len(table) == 7 * 5
    ref = {r["test"]: r for r in table if r["student"] == "reference"}
    assert ref["test_gradetoy.py::test_add"]["points"] == "2"
    gs = json.loads((out / "stub" / "results.json").read_text())
    assert gs["score"] == 0 and gs["max_score"] == 9 and len(gs["tests"]) == 7
    assert set(gs["tests"][0]) >= {"name", "score", "max_score", "status", "output"}
    assert {t["status"] for t in gs["tests"]} <= {"passed", "failed"}
    # the stub's hint is the lab's own text, so the student sees it
    outputs = {t["name"]: t["output"] for t in gs["tests"]}
    assert outputs["01_toy :: test_gradetoy.py::test_mean"] == (
        "failed: NotImplementedError: sum divided by count"
    )
    suites = ET.parse(out / "junit.xml").getroot()
    assert len(suites.findall("testsuite")) == 5
    stub = [s for s in suites if s.get("name") == "stub.01_toy"][0]
    assert stub.get("failures") == "6" and stub.get("skipped") == "1"
    summary = (out / "summary.csv").read_text()
    assert "reference,01_toy,9,9,100.0" in summary
    assert (out / "_logs" / "stub" / "01_toy.log").stat().st_size < 20_000
    assert sorted(p.name for p in (out / "stub").iterdir()) == ["results.json"]


@pytest.mark.slow  # ~30 s: 3 sandboxes x 2 ranks; make test-slow (test_grading_reallabs grades every real lab there too)
def test_dist_lab_reference_stub_planted_gloo(tmp_path):
    """The multi-process lab (shardlab.runtime.launch, gloo): 3 sandboxes with 2 ranks each."""
    bug = _submissions(tmp_path / "subs", "02_toydist", "distmean.py")
    results = grade(
        FIXTURE_LABS,
        tmp_path / "subs",
        None,
        labs=["02_toydist"],
        workers=2,
        limits=LIMITS,
        cuda=False,
    )
    ref, rows = rows_by_test(results, "reference", "02_toydist")
    assert ref.points == ref.max_points == 4, [vars(r) for r in ref.rows]
    assert rows["test_distmean.py::test_mean_on_gpu"].status == "needs GPU"
    stub, rows = rows_by_test(results, "stub", "02_toydist")
    assert stub.points == 0
    assert (
        "NotImplementedError: all_reduce with SUM"
        in rows["test_distmean.py::test_mean_two_ranks"].message
    )
    planted, rows = rows_by_test(results, "planted", "02_toydist")
    assert {k for k, r in rows.items() if r.points < r.max_points} == bug.LOST
    assert planted.points == 1


def test_rubric_errors_are_sentences(tmp_path):
    lab = tmp_path / "01_x"
    lab.mkdir()
    (lab / "test_x.py").write_text("def test_a():\n    pass\n")
    cases = [
        ('lab = "01_y"\nsubmit = ["x.py"]\n[points]\n"test_x.py::test_a" = 1\n', "folder is named"),
        (
            'lab = "01_x"\nsubmit = ["../x.py"]\n[points]\n"test_x.py::test_a" = 1\n',
            "plain file name",
        ),
        (
            'lab = "01_x"\nsubmit = ["x.py"]\n[points]\n"test_x.py::test_b" = 1\n',
            "defines no test 'test_b'",
        ),
        ('lab = "01_x"\nsubmit = ["x.py"]\n[points]\n"test_z.py::test_a" = 1\n', "neither in"),
        ('lab = "01_x"\nsubmit = ["x.py"]\n[points]\n"test_x.py::test_a" = 0\n', "positive number"),
    ]
    for text, match in cases:
        (lab / "rubric.toml").write_text(text)
        with pytest.raises(RubricError, match=match):
            load_rubric(lab)


def test_cli_grade_missing_submission(tmp_path):
    """`python -m shardlab.grading grade`: a student who sent nothing gets 'missing' rows."""
    (tmp_path / "subs" / "nobody").mkdir(parents=True)
    out = tmp_path / "out"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "shardlab.grading",
            "grade",
            str(tmp_path / "subs"),
            "--labs",
            str(FIXTURE_LABS),
            "--out",
            str(out),
            "--lab",
            "01_toy",
            "--no-cuda",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    rows = list(csv.DictReader(open(out / "grades.csv", newline="")))
    assert {r["status"] for r in rows} == {"missing", "needs GPU"}
    assert "gradetoy.py not found in the submission" in rows[0]["message"]
