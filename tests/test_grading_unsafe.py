"""``--unsafe-no-sandbox``: what the grader still does without bubblewrap (slow: make test-slow).

Without the sandbox a submission can write the work folder, so tampering is *detected*
("tampered", with the GPU test still out of the maximum), a test file replaced by a FIFO does
not hang the grader, a 1,500-deep tree left behind is removed, and the supervisor does not
outlive a grader that was killed. Attacks that need the sandbox to fail (reading the labs,
killing the grader, escaping daemons) are not run here: they would succeed, as documented.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import time

import pytest
from grading_fixtures.helpers import (
    FIXTURE_LABS,
    FIXTURES,
    load_py,
    rows_by_test,
    tagged_processes,
    tree_digest,
    write_tree,
)
from shardlab.grading import Limits, grade
from shardlab.grading.release import strip_solutions

pytestmark = pytest.mark.slow
hostile = load_py(FIXTURES / "hostile.py")
LAB = "01_toy"
FULL = 9


def test_unsafe_mode_detects_tampering_and_survives_traps(tmp_path):
    labs = tmp_path / "labs"
    shutil.copytree(FIXTURE_LABS, labs)
    ref = (labs / LAB / "gradetoy.py").read_text()
    stub = strip_solutions(ref)
    subs = tmp_path / "subs"
    write_tree(subs / "victim", {"gradetoy.py": ref})
    write_tree(subs / "tamper_rewrite", {"gradetoy.py": stub + hostile.TAMPER_REWRITE})
    write_tree(subs / "tamper_fifo", {"gradetoy.py": ref + hostile.TAMPER_FIFO})
    write_tree(subs / "deep_tree", {"gradetoy.py": ref + hostile.DEEP_TREE})
    before = tree_digest(labs)
    start = time.monotonic()
    results = grade(
        labs,
        subs,
        tmp_path / "out",
        labs=[LAB],
        workers=2,
        limits=Limits(timeout=120),
        cuda=False,
        sandbox=False,
    )
    assert time.monotonic() - start < 240
    assert rows_by_test(results, "victim", LAB)[0].points == FULL
    for student, word in (("tamper_rewrite", "changed"), ("tamper_fifo", "not a regular file")):
        res, rows = rows_by_test(results, student, LAB)
        assert res.points == 0 and res.max_points == FULL  # the GPU test is not counted
        assert {r.status for r in rows.values()} == {"tampered", "needs GPU"}
        assert word in res.note
    assert rows_by_test(results, "deep_tree", LAB)[0].points == FULL
    assert tree_digest(labs) == before
    assert tagged_processes(hostile.TAG) == []


def test_unsafe_supervisor_dies_with_the_grader(tmp_path):
    ref = (FIXTURE_LABS / LAB / "gradetoy.py").read_text()
    write_tree(
        tmp_path / "subs" / "sleeper",
        {"gradetoy.py": ref + hostile.PLAIN_CHILD_HANG + hostile.HANG},
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "shardlab.grading", "grade", str(tmp_path / "subs")]
        + ["--labs", str(FIXTURE_LABS), "--lab", LAB, "--no-cuda", "--out", str(tmp_path / "o")]
        + ["--unsafe-no-sandbox"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and not tagged_processes(hostile.TAG):
        time.sleep(0.2)
    assert tagged_processes(hostile.TAG), "the child never started"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and (
        tagged_processes(hostile.TAG) or tagged_processes("_runner.py")
    ):
        time.sleep(0.2)
    assert tagged_processes(hostile.TAG) == []
    assert [
        p for p in tagged_processes("_runner.py") if str(tmp_path) in " ".join(p.cmdline())
    ] == []
