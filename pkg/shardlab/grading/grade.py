"""Grade one job: one lab of one submission, against the lab's public and hidden tests.

The batch -- every student (a sub-folder or a ``.zip`` of the submissions folder) times every
lab -- is :func:`shardlab.grading.grade` in :mod:`._driver` (options, rubrics, collection,
journal, reports), which runs the jobs through :mod:`._jobs` (each isolated: any exception or
hang becomes that student's "grader error" row). One job:

1. verify that the labs, the ``shardlab`` package and the environment are unchanged since
   grading started (:mod:`._integrity`); unpack a zip just now, into a fresh folder;
2. read the rubric's ``submit`` files from the submission (``<lab>/<file>``, ``<file>``, or a
   unique match anywhere), with bounded, link-free walking and reading (:mod:`._fs`);
   missing files, unsafe folders and syntax errors are graded without running (the syntax
   check runs in a child process: a pathological file cannot crash the grader);
3. copy the instructor's lab files (public tests, helpers, ``hidden/`` tests of this lab),
   a planted test that must fail (:mod:`._canary`) and the student's ``submit`` files into
   a fresh job folder, and run pytest on them inside bubblewrap (:mod:`.sandbox`,
   :mod:`._bwrap`), every file mounted read-only;
4. check the instructor files are unchanged afterwards (else "tampered", 0 points: only
   possible without the sandbox);
5. check the planted test failed in both reports (else "tampered"), then map pytest's
   per-case results to rubric points (:mod:`._score`), counting only the cases the grader
   collected itself from the reference lab (:mod:`._collect`), the worse of the JUnit report
   and the progress log per case (:mod:`._junit`); a passed case of a test in the rubric's
   ``[outside]`` table counts only if the values it recorded equal the reference
   solution's, compared here in the grader (:mod:`._outside`).

Statuses: passed, partial, failed, skipped, needs GPU, did not run, timeout, crashed,
missing, syntax error, rejected, tampered, grader error.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

from ._canary import canary_problem, make_canary
from ._collect import PYTEST_INI
from ._feedback import Allowed, lab_feedback
from ._fs import TreeError, make_dirs, open_dir_nofollow, read_in_tree, read_regular, write_new
from ._junit import ReportError, merge, parse_junit, parse_progress
from ._outside import check_outside
from ._results import LabResult
from ._score import MESSAGE_CHARS, Row, _death_note, _zero, score
from ._submissions import (
    MAX_ZIP_BYTES,
    MAX_ZIP_MEMBERS,
    SubmissionError,
    check_syntax,
    collect,
    discover_submissions,
    locate,
    safe_extract,
)
from .rubric import Rubric, RubricError, sandbox_files
from .sandbox import Limits, run_pytest

__all__ = [
    "MAX_ZIP_BYTES",
    "MAX_ZIP_MEMBERS",
    "MESSAGE_CHARS",
    "PYTEST_INI",
    "LabResult",
    "Row",
    "SubmissionError",
    "discover_submissions",
    "grade_lab",
    "locate",
    "parse_junit",
    "parse_progress",
    "safe_extract",
    "score",
]

MAX_INSTRUCTOR_FILE = 256 * 2**20


def grader_error(student: str, rubric: Rubric, reason: str, cuda: bool) -> LabResult:
    """0 points with status "grader error": the reason for the instructor, a neutral line for the student."""
    msg = f"grader error: {reason}"
    shown = "the grader could not grade this lab; your instructor has the reason"
    return LabResult(
        student,
        rubric.lab,
        _zero(rubric, "grader error", msg, cuda, feedback=shown),
        note=msg,
        feedback_note=shown,
    )


# --------------------------------------------------------------------------- one job


def _digest_in(root: Path, name: str) -> str | None:
    try:
        return hashlib.sha256(
            read_in_tree(root, tuple(name.split("/")), MAX_INSTRUCTOR_FILE)
        ).hexdigest()
    except TreeError:
        return None


def grade_lab(
    student: str,
    root: Path,
    rubric: Rubric,
    *,
    limits: Limits,
    cuda: bool,
    tmp_root: Path | None = None,
    bwrap: str | None = None,
    allowed: Allowed | None = None,
    package: Path | None = None,
) -> LabResult:
    """Grade one lab of one (already unpacked) submission folder ``root``.

    ``bwrap``: path of bubblewrap (the sandbox); None runs without it (unsafe).
    """
    lab = rubric.lab
    try:
        found, missing = collect(Path(root), lab, rubric.submit)
    except SubmissionError as exc:
        msg = str(exc)
        return LabResult(student, lab, _zero(rubric, "rejected", msg, cuda), note=msg)
    if missing:
        msg = f"{', '.join(missing)} not found in the submission (expected {lab}/{missing[0]} or {missing[0]})"
        return LabResult(student, lab, _zero(rubric, "missing", msg, cuda), note=msg)
    for name, data in found.items():
        if name.endswith(".py"):
            problem = check_syntax(name, data)
            if problem:
                return LabResult(
                    student, lab, _zero(rubric, "syntax error", problem, cuda), note=problem
                )

    if rubric.outside and rubric.reference is None:
        # the batch (_jobs.run_jobs) records the reference's values first (_reference)
        raise RubricError(f"{lab}: [outside] needs the reference solution's values, which "
                          "were not recorded before grading")
    run, tampered, canary = run_job(
        rubric, found, limits=limits, cuda=cuda, tmp_root=tmp_root, bwrap=bwrap, package=package
    )
    return _result(student, rubric, run, tampered, limits, cuda, allowed, canary)


def run_job(rubric: Rubric, found: dict[str, bytes], *, limits, cuda, tmp_root, bwrap, package):
    """Lay out one job folder (instructor files, a planted test, ``found``: the submitted
    files) and run pytest on it; (run result, instructor files changed, planted test)."""
    from ._fs import remove_tree

    lab = rubric.lab
    base = Path(tempfile.mkdtemp(prefix="shardlab-job-", dir=tmp_root))
    try:
        os.chmod(base, 0o700)
        work, private = base / "work", base / "private"
        work.mkdir()
        private.mkdir(mode=0o700)
        work_fd = open_dir_nofollow(work)
        digests: dict[str, str] = {}
        names: list[str] = []
        try:
            sources = [
                (n, read_regular(p, MAX_INSTRUCTOR_FILE)) for n, p in sandbox_files(rubric).items()
            ]
            canary_file, canary_source, canary = make_canary(lab)
            sources.append((canary_file, canary_source))
            for name, data in [*sources, *found.items()]:
                parts = tuple(name.split("/"))
                dir_fd = make_dirs(work_fd, parts[:-1])
                try:
                    write_new(dir_fd, parts[-1], data)
                finally:
                    os.close(dir_fd)
                names.append(name)
            for name, data in sources:
                digests[name] = hashlib.sha256(data).hexdigest()
        finally:
            os.close(work_fd)
        ini = private / "pytest.ini"
        ini.write_text(PYTEST_INI)
        run = run_pytest(
            work,
            private,
            limits,
            cuda=cuda,
            ini=ini,
            bwrap=bwrap,
            work_files={n: work / n for n in names},
            package=package,
        )
        tampered = [
            f"{name} ({'deleted or not a regular file' if now is None else 'changed'})"
            for name, digest in digests.items()
            if (now := _digest_in(work, name)) != digest
        ]
    finally:
        remove_tree(base)
    return run, tampered, canary


def _result(student, rubric, run, tampered, limits, cuda, allowed, canary=None) -> LabResult:
    lab = rubric.lab
    if run.sandbox_error:
        return grader_error(student, rubric, run.sandbox_error, cuda)
    notes = []
    if run.supervisor_killed:
        notes.append(
            "the submission killed the grading supervisor (its parent process); tests kept running"
        )
    if run.survivors_killed:
        notes.append(
            f"{run.survivors_killed} process(es) left running by the submission were killed"
        )
    if tampered:
        msg = "the submission modified or deleted grader files during the run: " + ", ".join(
            tampered
        )
        return LabResult(
            student,
            lab,
            _zero(rubric, "tampered", msg, cuda),
            note="; ".join([msg, *notes]),
            log_tail=run.log_tail,
            wall=run.wall,
        )
    died = _death_note(run, limits)
    forged = canary_problem(run.junit, run.progress, canary, died=bool(died)) if canary else ""
    if forged:
        return LabResult(
            student,
            lab,
            _zero(rubric, "tampered", forged, cuda),
            note="; ".join([forged, *notes]),
            log_tail=run.log_tail,
            wall=run.wall,
        )
    progress, running, collecting = parse_progress(run.progress, rubric)
    parsed = None
    if run.junit and not died:
        try:
            # the worse of the two reports per case: a JUnit file rewritten at exit does not
            # turn a failure the progress log recorded into a pass
            parsed = merge(parse_junit(run.junit, rubric), progress)
            running = None
        except (ReportError, RecursionError):
            died = "pytest's JUnit report is unreadable"
    if parsed is None:
        parsed = progress
        name = Path(collecting).name if collecting else ""
        if died and running is None and name in sandbox_files(rubric):  # a known file only
            died += f" while collecting {name}"
    if died:
        notes.insert(0, died)
    # values the tests recorded, compared with the reference's here, outside the sandbox
    parsed = check_outside(rubric, parsed, run.values)
    rows = score(
        rubric,
        parsed,
        cuda=cuda,
        died=died,
        running=running,
        file_mb=limits.file_size_mb,
        allowed=allowed if allowed is not None else lab_feedback(rubric),
    )
    return LabResult(
        student, lab, rows, note="; ".join(notes), log_tail=run.log_tail, wall=run.wall
    )
