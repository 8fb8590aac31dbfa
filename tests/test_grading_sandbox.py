"""Issue 12: attacks on the grader itself (bubblewrap sandbox, per-student isolation, integrity).

One grading run (shared by the tests below, computed once even under pytest-xdist) grades a
copy of the fixture lab 01_toy for an honest ``victim`` and one student per attack. The
attacks know the real host paths (the lab copy, the submissions, --out, site-packages, the
grader's pid). Every test checks its attacker's score; ``test_nobody_else_affected`` checks
the other students, the instructor's files and that no process survives.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import sys
import sysconfig
import time
import zipfile

import pytest
from grading_fixtures.helpers import (
    FIXTURE_LABS,
    FIXTURES,
    load_py,
    rows_by_test,
    shared_result,
    tagged_processes,
    tree_digest,
    write_tree,
)
from shardlab.grading import Limits, grade
from shardlab.grading.release import strip_solutions

hostile = load_py(FIXTURES / "hostile.py")
LAB = "01_toy"
FULL = 9  # rubric total without the GPU test
SITE = sysconfig.get_paths()["purelib"]
PLANTED_PTH = os.path.join(SITE, "zz_shardlab_hostile.pth")
LIMITS = Limits(timeout=120, file_size_mb=16, max_procs=16, tmp_mb=64)


def _build(folder):
    labs = folder / "labs"
    shutil.copytree(FIXTURE_LABS, labs)
    subs, out = folder / "subs", folder / "out"
    ref = (labs / LAB / "gradetoy.py").read_text()
    paths = {
        "labs": str(labs),
        "subs": str(subs),
        "out": str(out),
        "site": SITE,
        "grader_pid": os.getpid(),
        "tmp_mb": int(LIMITS.tmp_mb),
    }
    for name, files in hostile.attacks(ref, strip_solutions(ref), paths).items():
        write_tree(subs / name, files)
    # a zip whose member sits 1,200 folders deep
    with zipfile.ZipFile(subs / "deep_zip.zip", "w") as zf:
        zf.writestr("a/" * 1200 + "gradetoy.py", ref)
        zf.writestr("gradetoy.py", ref)
    # the graded file is a FIFO / a 2 GB sparse file
    (subs / "fifo").mkdir()
    os.mkfifo(subs / "fifo" / "gradetoy.py")
    (subs / "sparse").mkdir()
    with open(subs / "sparse" / "gradetoy.py", "wb") as fh:
        fh.truncate(2 * 2**30)
    # symbolic links to the instructor's lab folder, to a classmate's folder and file
    (subs / "link_lab").mkdir()
    os.symlink(labs / LAB, subs / "link_lab" / LAB)
    (subs / "link_classmate").mkdir()
    os.symlink(subs / "victim", subs / "link_classmate" / LAB)
    (subs / "link_file").mkdir()
    os.symlink(subs / "victim" / "gradetoy.py", subs / "link_file" / "gradetoy.py")
    os.symlink(subs / "victim", subs / "link_student")
    # names a spreadsheet would run as formulas
    for name in ("=HYPERLINK(1)", "+SUM(1)", "@cmd", "-2+3"):
        write_tree(subs / name, {"README.txt": "nothing\n"})
    return labs, subs, out


def _run(folder):
    labs, subs, out = _build(folder)
    before = tree_digest(labs)
    printed = []
    start = time.monotonic()
    results = grade(
        labs, subs, out, labs=[LAB], workers=2, limits=LIMITS, cuda=False, progress=printed.append
    )
    wall = time.monotonic() - start
    time.sleep(3)  # give an escaped forger time to strike
    reports = tree_digest(out)
    time.sleep(1)
    return {
        "results": results,
        "wall": wall,
        "labs_before": before,
        "labs_after": tree_digest(labs),
        "reports": reports,
        "reports_later": tree_digest(out),
        "grades": (out / "grades.csv").read_text(),
        "json": {p.parent.name: p.read_text() for p in out.glob("*/results.json")},
        "logs": {p.parent.name: p.read_text() for p in out.glob("_logs/*/*.log")},
        "survivors": [p.pid for p in tagged_processes(hostile.TAG)],
        "planted_pth": os.path.exists(PLANTED_PTH),
        "progress": len(printed),
    }


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    data = shared_result(tmp_path_factory, "grading-sandbox-attacks", _run)
    if data["planted_pth"] and os.path.exists(PLANTED_PTH):
        os.unlink(PLANTED_PTH)  # never leave it behind, even when the test fails
    return data


def _lab(run, student):
    return rows_by_test(run["results"], student, LAB)


def test_nobody_else_affected(run):
    """Honest victim full marks; instructor files byte-identical; nothing left running."""
    res, rows = _lab(run, "victim")
    assert res.points == FULL and res.max_points == FULL, [vars(r) for r in res.rows]
    assert run["labs_after"] == run["labs_before"]
    assert not run["planted_pth"]
    assert run["survivors"] == []
    assert tagged_processes(hostile.TAG) == []
    assert run["progress"] == len(run["results"])


def test_killing_the_grader_fails(run):
    res, _ = _lab(run, "killer")
    assert res.points == FULL  # honest score: its code is the reference; the grader survived


def test_writes_outside_the_sandbox_fail(run):
    res, _ = _lab(run, "overwriter")
    assert res.points == FULL, res.rows  # any write that worked fails test_mean
    assert "junit.xml" in run["reports"] and not run["reports"]["junit.xml"].startswith("link:")


def test_forged_reports_after_exit(run):
    res, _ = _lab(run, "forger")
    assert res.points == FULL
    assert run["reports_later"] == run["reports"]
    assert "forged" not in run["grades"]
    assert json.loads(run["json"]["forger"])["score"] == FULL


def test_hidden_tests_and_reference_do_not_leak(run):
    res, rows = _lab(run, "leaker")
    assert res.points == 0
    res2, rows2 = _lab(run, "leak_import")
    assert res2.points == 0
    assert all(r.status == "did not run" for r in rows2.values() if r.max_points)
    for student in ("leaker", "leak_import"):
        text = run["json"][student]
        assert "hidden-test-text-that-must-never-ship" not in text
        assert "def test_" not in text and "approx_equal" not in text
        assert "total / len(xs)" not in text  # reference solution
    # the reference is not even readable inside the sandbox; the instructor sees the raw text
    assert "reference unreadable: FileNotFoundError" in rows["test_gradetoy.py::test_mean"].message
    feedback = json.loads(run["json"]["leaker"])["tests"]
    shown = {t["name"].split(" :: ")[1]: t["output"] for t in feedback}
    assert "AssertionError (message not shown" in shown["test_gradetoy.py::test_mean"]
    assert "not shown" in shown["test_gradetoy.py::test_scale"]


def test_stub_hints_and_test_messages_still_shown(run):
    # the planted-bug style failure of the victim's classmates keeps helpful text: the stub
    # hint of the lab and the test's own assertion messages are allowed
    from shardlab.grading._feedback import safe_message
    from shardlab.grading.grade import lab_feedback
    from shardlab.grading.rubric import load_rubric

    allowed = lab_feedback(load_rubric(FIXTURE_LABS / LAB))
    assert safe_message("NotImplementedError: sum divided by count", allowed) == (
        "NotImplementedError: sum divided by count"
    )
    assert safe_message("NotImplementedError: def test_x(): secret", allowed).endswith(
        "(message not shown: it did not come from the tests)"
    )
    assert safe_message("assert [1, 2] == [6, 7, 8]", allowed).startswith("(message not shown")


def test_resources_are_capped(run):
    # its test_mean passes only if /dev/shm and /tmp took some data but at most --tmp-mb
    res, rows = _lab(run, "hog")
    assert res.points == FULL, rows["test_gradetoy.py::test_mean"].message


def test_deep_tree_left_behind(run):
    res, _ = _lab(run, "deep_tree")
    assert res.points == FULL


def test_pathological_sources_and_zips(run):
    res, rows = _lab(run, "deep_expr")
    assert res.points == 0 and rows["test_gradetoy.py::test_add"].status == "syntax error"
    assert "gradetoy.py" in rows["test_gradetoy.py::test_add"].message
    res, rows = _lab(run, "deep_zip")
    assert res.points == 0 and rows["test_gradetoy.py::test_add"].status == "rejected"
    assert "folders deep" in res.note
    res, rows = _lab(run, "fifo")
    assert res.points == 0 and "not a regular file" in res.note
    res, rows = _lab(run, "sparse")
    assert res.points == 0 and "limit 2 MB" in res.note
    assert res.max_points == FULL  # GPU test out of the maximum whatever the status


@pytest.mark.parametrize("student", ["link_lab", "link_classmate", "link_file"])
def test_symlinked_folders_and_files_are_not_followed(run, student):
    res, rows = _lab(run, student)
    assert res.points == 0 and rows["test_gradetoy.py::test_add"].status == "missing"


def test_symlinked_student_entry_rejected(run):
    res, rows = _lab(run, "link_student")
    assert res.points == 0 and "symbolic link" in res.note


def test_csv_cells_neutralized(run):
    table = list(csv.reader(run["grades"].splitlines()))
    firsts = {row[0] for row in table[1:]}
    assert {"'=HYPERLINK(1)", "'+SUM(1)", "'@cmd", "'-2+3"} <= firsts
    assert not any(c[:1] in "=+-@" for row in table for c in row if c)


def test_fast_enough(run):
    assert run["wall"] < 300


def test_reports_into_fresh_folder_only(tmp_path):
    """--out must be new or empty and not a link; nothing is written through links."""
    subs = tmp_path / "subs"
    write_tree(subs / "nobody", {"README.txt": "x\n"})
    out = tmp_path / "out"
    out.mkdir()
    os.symlink(FIXTURE_LABS / LAB / "test_gradetoy.py", out / "junit.xml")
    with pytest.raises(ValueError, match="not empty"):
        grade(FIXTURE_LABS, subs, out, labs=[LAB], limits=LIMITS, cuda=False)
    link = tmp_path / "out-link"
    os.symlink(tmp_path / "elsewhere", link)
    (tmp_path / "elsewhere").mkdir()
    with pytest.raises(ValueError, match="symbolic link"):
        grade(FIXTURE_LABS, subs, link, labs=[LAB], limits=LIMITS, cuda=False)


def test_refuses_without_bubblewrap(tmp_path):
    import subprocess

    write_tree(tmp_path / "subs" / "nobody", {"README.txt": "x\n"})
    base = [sys.executable, "-m", "shardlab.grading", "grade", str(tmp_path / "subs")]
    base += ["--labs", str(FIXTURE_LABS), "--lab", LAB, "--no-cuda"]
    env = dict(os.environ, PATH=os.path.dirname(sys.executable))  # no bwrap on PATH
    proc = subprocess.run(
        [*base, "--out", str(tmp_path / "o1")], capture_output=True, text=True, env=env
    )
    assert proc.returncode == 2
    assert "bubblewrap (bwrap) is not installed" in proc.stderr
    assert "--unsafe-no-sandbox" in proc.stderr and not (tmp_path / "o1").exists()
    proc = subprocess.run(
        [*base, "--out", str(tmp_path / "o2"), "--unsafe-no-sandbox"],
        capture_output=True,
        text=True,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    assert "WITHOUT bubblewrap" in proc.stderr and "read the reference solutions" in proc.stderr
    assert "nobody  0/9" in proc.stdout  # each student's total on stdout


def test_grader_death_kills_the_sandbox(tmp_path):
    """SIGKILL the grader mid-run: bubblewrap, the supervisor and the daemons die with it.

    The daemons carry a tag of their own: the hostile tests, which may run at the same time on
    another worker, check that no process with *their* tag survives, and must not see these
    while they are (legitimately) alive. The grader is killed in ``finally``, so a failed wait
    cannot leave them running.
    """
    import signal
    import subprocess

    tag = "shardlab-grader-death-tag"
    ref = (FIXTURE_LABS / LAB / "gradetoy.py").read_text()
    code = ref + (hostile.DAEMONS + hostile.HANG).replace(hostile.TAG, tag)
    write_tree(tmp_path / "subs" / "sleeper", {"gradetoy.py": code})
    proc = subprocess.Popen(
        [sys.executable, "-m", "shardlab.grading", "grade", str(tmp_path / "subs")]
        + ["--labs", str(FIXTURE_LABS), "--lab", LAB, "--no-cuda", "--out", str(tmp_path / "o")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and len(tagged_processes(tag)) < 3:
            time.sleep(0.2)
        started = len(tagged_processes(tag))
        assert started >= 1, "no daemon started inside the sandbox"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and tagged_processes(tag):
        time.sleep(0.2)
    assert tagged_processes(tag) == [], f"{started} daemon(s) were running; some survived"
