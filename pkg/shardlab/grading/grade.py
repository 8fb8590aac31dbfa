"""Grade a folder of submissions against the labs' public and hidden tests.

For every student (a sub-folder or a ``.zip`` of the submissions folder) and every lab, one
*job* (:mod:`._jobs` runs them, each isolated: any exception or hang becomes that student's
"grader error" row):

1. verify that the labs, the ``shardlab`` package and the environment are unchanged since
   grading started (:mod:`._integrity`); unpack a zip just now, into a fresh folder;
2. read the rubric's ``submit`` files from the submission (``<lab>/<file>``, ``<file>``, or a
   unique match anywhere), with bounded, link-free walking and reading (:mod:`._fs`);
   missing files, unsafe folders and syntax errors are graded without running (the syntax
   check runs in a child process: a pathological file cannot crash the grader);
3. copy the instructor's lab files (public tests, helpers, ``hidden/`` tests of this lab)
   and the student's ``submit`` files into a fresh job folder, and run pytest on them inside
   bubblewrap (:mod:`.sandbox`, :mod:`._bwrap`), every file mounted read-only;
4. check the instructor files are unchanged afterwards (else "tampered", 0 points: only
   possible without the sandbox);
5. map pytest's per-test results to rubric points (:mod:`._score`).

Statuses: passed, partial, failed, skipped, needs GPU, did not run, timeout, crashed,
missing, syntax error, rejected, tampered, grader error.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from collections.abc import Iterable
from pathlib import Path

from ._feedback import Allowed, lab_feedback
from ._fs import TreeError, make_dirs, open_dir_nofollow, read_in_tree, read_regular, write_new
from ._junit import parse_junit, parse_progress
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
from .release import lab_dirs
from .report import prepare_out, write_reports
from .rubric import Rubric, load_rubric, sandbox_files
from .sandbox import Limits, run_pytest

__all__ = [
    "MAX_ZIP_BYTES",
    "MAX_ZIP_MEMBERS",
    "MESSAGE_CHARS",
    "PYTEST_INI",
    "LabResult",
    "Row",
    "SubmissionError",
    "detect_cuda",
    "discover_submissions",
    "grade",
    "grade_lab",
    "load_rubrics",
    "locate",
    "parse_junit",
    "parse_progress",
    "safe_extract",
    "score",
]

MAX_INSTRUCTOR_FILE = 256 * 2**20

PYTEST_INI = """[pytest]
addopts = -p no:cacheprovider
filterwarnings =
    ignore::DeprecationWarning
markers =
    gpu: needs a CUDA device
"""


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
    from ._fs import remove_tree

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
    return _result(student, rubric, run, tampered, limits, cuda, allowed)


def _result(student, rubric, run, tampered, limits, cuda, allowed) -> LabResult:
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
    parsed = None
    if run.junit and not died:
        try:
            parsed = parse_junit(run.junit, rubric)
        except (ET.ParseError, RecursionError, ValueError):
            died = "pytest's JUnit report is unreadable"
    running = None
    if parsed is None:
        parsed, running, collecting = parse_progress(run.progress, rubric)
        name = Path(collecting).name if collecting else ""
        if died and running is None and name in sandbox_files(rubric):  # a known file only
            died += f" while collecting {name}"
    if died:
        notes.insert(0, died)
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


# --------------------------------------------------------------------------- driver


def detect_cuda() -> bool:
    """Whether torch sees a CUDA device (checked in a subprocess; the grader never imports torch)."""
    try:
        out = subprocess.run(
            [sys.executable, "-c", "import torch; print(torch.cuda.is_available())"],
            capture_output=True,
            text=True,
            timeout=120,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return out.stdout.strip().endswith("True")


def load_rubrics(labs_dir: Path, labs: Iterable[str] | None = None) -> list[Rubric]:
    """Rubrics of the labs under ``labs_dir`` (those with a rubric.toml), optionally filtered."""
    wanted = set(labs) if labs else None
    all_labs = [d for d in lab_dirs(Path(labs_dir)) if (d / "rubric.toml").is_file()]
    if wanted is not None:
        unknown = wanted - {d.name for d in all_labs}
        if unknown:
            raise ValueError(
                f"unknown lab(s) {sorted(unknown)}; labs with a rubric: {[d.name for d in all_labs]}"
            )
        all_labs = [d for d in all_labs if d.name in wanted]
    return [load_rubric(d) for d in all_labs]


def grade(
    labs_dir: Path,
    submissions: Path,
    out_dir: Path | None = None,
    *,
    labs: Iterable[str] | None = None,
    workers: int | None = None,
    limits: Limits | None = None,
    cuda: bool | None = None,
    progress=None,
    sandbox: bool = True,
) -> list[LabResult]:
    """Grade every submission against every lab; write reports to ``out_dir`` if given.

    ``sandbox=False`` runs submissions without bubblewrap (see ``_bwrap.UNSAFE_WARNING``);
    with ``sandbox=True`` a missing or broken bubblewrap raises ``SandboxUnavailable``.
    """
    from ._jobs import require_bwrap, run_jobs

    limits = limits or Limits()
    rubrics = load_rubrics(labs_dir, labs)
    if not rubrics:
        raise ValueError(f"no lab with a rubric.toml under {labs_dir}.")
    bwrap = require_bwrap() if sandbox else None
    students = discover_submissions(submissions)
    out_fd = prepare_out(Path(out_dir)) if out_dir is not None else None
    try:
        if cuda is None:
            cuda = detect_cuda()
        results = run_jobs(
            students,
            rubrics,
            limits=limits,
            cuda=cuda,
            workers=workers or max(1, (os.cpu_count() or 2) // 2),
            sandbox=sandbox,
            progress=progress,
            bwrap=bwrap,
        )
        if out_fd is not None:
            write_reports(results, Path(out_dir), dir_fd=out_fd)
    finally:
        if out_fd is not None:
            os.close(out_fd)
    return results
