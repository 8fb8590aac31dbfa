"""Grades and reports that a submission forges from inside pytest (issue 24, "Grades and
reports" and "Forgery from inside pytest"), graded in the sandbox on fixture lab 01_toy.

* a test that calls ``pytest.skip`` with the grader's own "needs GPU" reason stays in the
  maximum (GPU exclusion comes from the markers the grader collected itself);
* a JUnit report rewritten at exit through the descriptor pytest holds: its invented cases
  (a case id carrying the hidden test's text, nine extra passing cases) are ignored, and the
  failures the progress log saw stay failures;
* a rewritten report with a DTD and entities is refused, not expanded;
* a forger that rewrites both reports at exit, sparing the planted test, still scores 0:
  the progress log is appended by the supervisor, it cannot be truncated.

Each attack only writes to the report descriptors of its own sandbox.
"""

from __future__ import annotations

import json

import pytest
from grading_fixtures.helpers import FIXTURE_LABS, rows_by_test, shared_result, write_tree
from shardlab.grading import Limits, grade
from shardlab.grading._runner import NEEDS_GPU_REASON
from shardlab.grading.release import strip_solutions

LAB = "01_toy"
FULL = 9  # the rubric's 10 points less the GPU test

# Rewrites the JUnit report after pytest wrote it (atexit runs after pytest.main returned),
# through the descriptor of the pytest process whose target is named junit-*.
_REWRITE = """

def _forge_report():
    import os
    xml = _forged_xml()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if os.path.basename(target).startswith("junit-"):
            with open(f"/proc/self/fd/{fd}", "w") as fh:
                fh.write(xml)


import atexit as _atexit

_atexit.register(_forge_report)
"""

LEAK = (
    """

def _forged_xml():
    import re
    try:
        text = open("test_gradetoy_hidden.py").read()
    except OSError:
        text = ""
    found = re.search(r'HIDDEN_SENTINEL = "([^"]+)"', text)
    secret = found.group(1) if found else "nothing"
    digits = "".join(f"{b:03d}" for b in text.encode()[:300])
    tc = "<testcase classname='{}' name='{}'/>"
    cases = [tc.format("test_gradetoy", n) for n in ("test_chunk", "test_mean", "test_scale")]
    cases += [tc.format("test_gradetoy", f"test_add[{i}]") for i in range(9)]
    cases += [tc.format("test_gradetoy_hidden", n) for n in ("test_mean_hidden", "test_chunk_last")]
    cases.append(
        f"<testcase classname='test_gradetoy' name='test_add[{secret}]'>"
        f"<failure message='AssertionError: {digits}'/></testcase>"
    )
    return "<?xml version='1.0'?><testsuites><testsuite>" + "".join(cases) + "</testsuite></testsuites>"
"""
    + _REWRITE
)

ENTITIES = (
    """

def _forged_xml():
    tc = "<testcase classname='{}' name='{}'><properties><property name='x' value='&e;'/></properties></testcase>"
    cases = [tc.format("test_gradetoy", n) for n in ("test_add", "test_chunk", "test_mean", "test_scale")]
    cases += [tc.format("test_gradetoy_hidden", n) for n in ("test_mean_hidden", "test_chunk_last")]
    dtd = "<!DOCTYPE t [<!ENTITY e 'x'>]>"
    return "<?xml version='1.0'?>" + dtd + "<testsuites><testsuite>" + "".join(cases) + "</testsuite></testsuites>"
"""
    + _REWRITE
)


# Rewrites both reports at exit, sparing the planted test (found as the one test file that
# does not import the lab's module): the JUnit report through pytest's descriptor, the
# progress log through the progress plugin's own file (truncated, then all passed).
BOTH = """

def _forge_both():
    import gc, glob, json, os, re
    planted = [f for f in sorted(glob.glob("test_*.py")) if "gradetoy" not in open(f).read()][0]
    func = re.search(r"def (test_\\w+)", open(planted).read()).group(1)
    cases = [("test_gradetoy", f"test_add[{c}]") for c in ("1-2", "0-0", "-3-5", "2.5-0.5")]
    cases += [("test_gradetoy", n) for n in ("test_chunk", "test_mean", "test_scale")]
    cases += [("test_gradetoy_hidden", n) for n in ("test_mean_hidden", "test_chunk_last")]
    xml = "".join(f"<testcase classname='{m}' name='{n}'/>" for m, n in cases)
    xml += f"<testcase classname='{planted[:-3]}' name='{func}'><failure message='x'/></testcase>"
    xml = "<?xml version='1.0'?><testsuites><testsuite>" + xml + "</testsuite></testsuites>"
    rec = {"event": "result", "when": "call", "outcome": "passed", "message": ""}
    log = [dict(rec, nodeid=f"{m}.py::{n}") for m, n in cases]
    log.append(dict(rec, nodeid=f"{planted}::{func}", outcome="failed"))
    text = "".join(json.dumps(r) + "\\n" for r in log).encode()
    for obj in gc.get_objects():
        if type(obj).__name__ == "_ProgressLog":
            fd = obj._fh.fileno()
            try:
                os.ftruncate(fd, 0)
            except OSError:
                pass
            os.write(fd, text)
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if os.path.basename(target).startswith("junit-"):
            with open(f"/proc/self/fd/{fd}", "w") as fh:
                fh.write(xml)


import atexit as _atexit

_atexit.register(_forge_both)
"""


def _gpu_skip(reference: str) -> str:
    """The reference, but chunk() skips its tests with the grader's "needs GPU" reason."""
    return reference + (
        "\n\n_chunk = chunk\n\n\ndef chunk(xs, parts, index):\n"
        "    import pytest\n\n"
        f"    pytest.skip({NEEDS_GPU_REASON!r})\n"
    )


def _grade_forgeries(folder):
    ref = (FIXTURE_LABS / LAB / "gradetoy.py").read_text()
    stub = strip_solutions(ref)
    subs = folder / "subs"
    write_tree(subs / "reference", {"gradetoy.py": ref})
    write_tree(subs / "gpu_skip", {"gradetoy.py": _gpu_skip(ref)})
    write_tree(subs / "junit_leak", {"gradetoy.py": stub + LEAK})
    write_tree(subs / "junit_entities", {"gradetoy.py": stub + ENTITIES})
    write_tree(subs / "rewrite_both", {"gradetoy.py": stub + BOTH})
    out = folder / "out"
    results = grade(
        FIXTURE_LABS, subs, out, labs=[LAB], workers=2, limits=Limits(timeout=120), cuda=False
    )
    feedback = {
        s: (out / s / "results.json").read_text()
        for s in ("reference", "gpu_skip", "junit_leak", "junit_entities", "rewrite_both")
    }
    return results, feedback


@pytest.fixture(scope="module")
def forged(tmp_path_factory):
    return shared_result(tmp_path_factory, "grading-forgeries", _grade_forgeries)


def test_every_maximum_is_the_rubrics(forged):
    results, _ = forged
    assert {r.student: r.max_points for r in results} == {
        "reference": FULL,
        "gpu_skip": FULL,
        "junit_leak": FULL,
        "junit_entities": FULL,
        "rewrite_both": FULL,
    }
    res, _ = rows_by_test(results, "reference", LAB)
    assert res.points == FULL


def test_needs_gpu_skip_from_the_submission_stays_in_the_maximum(forged):
    results, _ = forged
    res, rows = rows_by_test(results, "gpu_skip", LAB)
    for key in ("test_gradetoy.py::test_chunk", "test_gradetoy_hidden.py::test_chunk_last"):
        assert rows[key].status == "skipped"
        assert rows[key].points == 0 and rows[key].max_points > 0
    assert rows["test_gradetoy.py::test_cuda_only"].status == "needs GPU"  # the marked one
    assert res.points == FULL - 3 and res.max_points == FULL  # 6/9, not 6/6


def test_rewritten_report_is_caught_by_the_planted_test(forged):
    results, _ = forged
    for student in ("junit_leak", "junit_entities"):
        res, rows = rows_by_test(results, student, LAB)
        assert res.points == 0 and res.max_points == FULL
        assert {r.status for r in rows.values()} == {"tampered", "needs GPU"}
        assert "a test the grader planted to fail" in res.note


def test_progress_log_cannot_be_rewritten(forged):
    # the supervisor appends what pytest sends through a pipe: the truncation fails, the
    # stub's real failures stay in the log, and the worse of the two reports counts
    results, _ = forged
    res, rows = rows_by_test(results, "rewrite_both", LAB)
    assert res.points == 0 and res.max_points == FULL
    assert (
        rows["test_gradetoy.py::test_mean"].message == "NotImplementedError: sum divided by count"
    )


def test_hidden_test_text_does_not_leak_through_a_forged_report(forged):
    _, feedback = forged
    text = feedback["junit_leak"]
    assert "hidden-test-text-that-must-never-ship" not in text
    assert "105109112" not in text  # "imp" of the hidden file as digits
    data = json.loads(text)
    assert data["score"] == 0 and data["max_score"] == FULL


def _forged_run():
    """A run as a forger that evaded the planted test leaves it: pytest ended normally, the
    progress log recorded the stub's failures, the JUnit report says everything passed and
    adds ten cases of its own (one carrying the hidden test's text)."""
    from shardlab.grading.sandbox import RunResult

    tc = "<testcase classname='{}' name='{}'/>"
    cases = [tc.format("test_gradetoy", f"test_add[{i}]") for i in range(9)]
    cases += [tc.format("test_gradetoy", "test_add[hidden-test-text-that-must-never-ship]")]
    cases += [tc.format("test_gradetoy", n) for n in ("test_chunk", "test_mean", "test_scale")]
    cases += [tc.format("test_gradetoy_hidden", n) for n in ("test_mean_hidden", "test_chunk_last")]
    junit = ("<testsuites><testsuite>" + "".join(cases) + "</testsuite></testsuites>").encode()
    progress = [
        {
            "event": "result",
            "nodeid": f"test_gradetoy.py::test_add[{case}]",
            "when": "call",
            "outcome": "failed",
            "message": "NotImplementedError: return the sum of a and b",
        }
        for case in ("1-2", "0-0", "-3-5", "2.5-0.5")
    ]
    progress.append(
        {
            "event": "result",
            "nodeid": "test_gradetoy.py::test_mean",
            "when": "call",
            "outcome": "failed",
            "message": "NotImplementedError: sum divided by count",
        }
    )
    return RunResult(returncode=0, junit=junit, progress=progress)


def test_forged_report_cannot_add_cases_or_hide_failures():
    from shardlab.grading._collect import with_cases
    from shardlab.grading.grade import PYTEST_INI, _result
    from shardlab.grading.rubric import load_rubric

    rubric = with_cases(load_rubric(FIXTURE_LABS / LAB), PYTEST_INI)
    res = _result("forger", rubric, _forged_run(), [], Limits(), False, None)
    rows = {r.test: r for r in res.rows}
    add = rows["test_gradetoy.py::test_add"]
    assert add.points == 0 and add.max_points == 2  # the four collected cases failed
    assert add.message.startswith("0/4 cases passed; [1-2] NotImplementedError")
    assert "hidden-test" not in add.message + (add.feedback or "")
    assert rows["test_gradetoy.py::test_mean"].points == 0
    assert res.max_points == FULL


def test_planted_test_checked_when_pytest_dies_too():
    from shardlab.grading._canary import canary_problem, make_canary

    file, source, nodeid = make_canary("01_toy")
    assert file.startswith("test_toy_") and b"assert" in source
    before = "test_a.py::test_x"  # a file pytest runs before the planted one
    after = "test_zzzz.py::test_y"  # one it runs after
    ran = {"event": "result", "when": "call", "outcome": "passed"}
    planted_failed = {"event": "result", "when": "call", "outcome": "failed", "nodeid": nodeid}
    # died before reaching it: fine
    assert canary_problem(None, [{**ran, "nodeid": before}], nodeid, died=True) == ""
    # died after it, and the log shows it failed: fine
    log = [{**ran, "nodeid": before}, planted_failed, {**ran, "nodeid": after}]
    assert canary_problem(None, log, nodeid, died=True) == ""
    # a forged log: a later file ran but the planted test is absent, or it "passed"
    assert "planted" in canary_problem(None, [{**ran, "nodeid": after}], nodeid, died=True)
    assert "planted" in canary_problem(None, [{**ran, "nodeid": nodeid}], nodeid, died=True)
    # pytest finished: both reports must show it failed
    assert "planted" in canary_problem(b"<testsuites/>", [planted_failed], nodeid)
