"""Grade a folder of submissions against the labs' public and hidden tests.

For every student (a sub-folder or a ``.zip`` of the submissions folder) and every lab:

1. find the rubric's ``submit`` files in the submission (``<lab>/<file>``, ``<file>``, or a
   unique match anywhere); missing files and syntax errors are graded without running;
2. build a fresh work folder: the instructor's lab folder (public tests, support modules)
   plus ``hidden/`` tests, then the student's ``submit`` files; nothing else of the student's
   is copied, so tests and helpers always come from the instructor;
3. run pytest there in a limited process tree (:mod:`shardlab.grading.sandbox`), with the
   JUnit report written into a separate private folder whose name the submission is not told;
4. check the instructor files are unchanged afterwards (else: "tampered", 0 points);
5. map pytest's per-test results to rubric points.

Statuses: passed, partial, failed, skipped, needs GPU, did not run, timeout, crashed,
missing, syntax error, rejected, tampered.

Finding submissions is in ``_submissions``, reading pytest's reports in ``_junit``, and
mapping cases to points in ``_score``; this module builds the work folder, runs the sandbox
and drives the whole grading.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from ._junit import parse_junit, parse_progress
from ._score import MESSAGE_CHARS, Row, _death_note, _zero, score
from ._submissions import (
    MAX_ZIP_BYTES,
    MAX_ZIP_MEMBERS,
    SubmissionError,
    discover_submissions,
    locate,
    safe_extract,
)
from .release import lab_dirs
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


PYTEST_INI = """[pytest]
addopts = -p no:cacheprovider
filterwarnings =
    ignore::DeprecationWarning
markers =
    gpu: needs a CUDA device
"""


@dataclass
class LabResult:
    student: str
    lab: str
    rows: list[Row]
    note: str = ""  # lab-level explanation (timeout, crash, tampering, ...)
    log_tail: str = ""
    wall: float = 0.0

    @property
    def points(self) -> float:
        return sum(r.points for r in self.rows)

    @property
    def max_points(self) -> float:
        return sum(r.max_points for r in self.rows)


# --------------------------------------------------------------------------- one job


def _digest(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def grade_lab(
    student: str,
    root: Path,
    rubric: Rubric,
    *,
    limits: Limits,
    cuda: bool,
    tmp_root: Path | None = None,
) -> LabResult:
    """Grade one lab of one (already unpacked) submission."""
    lab = rubric.lab
    found: dict[str, Path] = {}
    missing = []
    for name in rubric.submit:
        path = locate(root, lab, name)
        if path is None:
            missing.append(name)
        else:
            found[name] = path
    if missing:
        msg = f"{', '.join(missing)} not found in the submission (expected {lab}/{missing[0]} or {missing[0]})"
        return LabResult(student, lab, _zero(rubric, "missing", msg, cuda), note=msg)
    for name, path in found.items():
        if name.endswith(".py"):
            try:
                compile(path.read_bytes(), name, "exec", dont_inherit=True)
            except SyntaxError as exc:
                msg = f"{name} line {exc.lineno}: {exc.msg}"
                return LabResult(student, lab, _zero(rubric, "syntax error", msg, cuda), note=msg)
            except ValueError as exc:  # e.g. null bytes
                msg = f"{name} cannot be compiled: {exc}"
                return LabResult(student, lab, _zero(rubric, "syntax error", msg, cuda), note=msg)

    base = Path(tempfile.mkdtemp(prefix="shardlab-grade-", dir=tmp_root))
    private = Path(tempfile.mkdtemp(prefix="shardlab-private-", dir=tmp_root))
    os.chmod(private, 0o700)
    try:
        work = base / "work"
        work.mkdir()
        digests: dict[str, str | None] = {}
        for name, src in sandbox_files(rubric).items():
            target = work / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, target)
            digests[name] = _digest(target)
        for name, src in found.items():
            shutil.copyfile(src, work / name)
        ini = private / "pytest.ini"
        ini.write_text(PYTEST_INI)
        run = run_pytest(work, private, limits, cuda=cuda, ini=ini)
        tampered = [
            f"{name} ({'deleted' if _digest(work / name) is None else 'changed'})"
            for name, digest in digests.items()
            if _digest(work / name) != digest
        ]
    finally:
        shutil.rmtree(base, ignore_errors=True)
        shutil.rmtree(private, ignore_errors=True)

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
        except ET.ParseError:
            died = "pytest's JUnit report is unreadable"
    running = None
    if parsed is None:
        parsed, running, collecting = parse_progress(run.progress, rubric)
        if died and running is None and collecting:
            died += f" while collecting {Path(collecting).name}"
    if died:
        notes.insert(0, died)
    rows = score(rubric, parsed, cuda=cuda, died=died, running=running, file_mb=limits.file_size_mb)
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
) -> list[LabResult]:
    """Grade every submission against every lab; write reports to ``out_dir`` if given."""
    from .report import write_reports

    limits = limits or Limits()
    rubrics = load_rubrics(labs_dir, labs)
    if not rubrics:
        raise ValueError(f"no lab with a rubric.toml under {labs_dir}.")
    if cuda is None:
        cuda = detect_cuda()
    students = discover_submissions(submissions)
    workers = workers or max(1, (os.cpu_count() or 2) // 2)
    unpack_root = Path(tempfile.mkdtemp(prefix="shardlab-submissions-"))
    results: list[LabResult] = []
    try:
        jobs = []
        for student, path in students:
            if path.is_dir():
                jobs.extend((student, path, r, None) for r in rubrics)
                continue
            dest = unpack_root / student
            dest.mkdir()
            try:
                safe_extract(path, dest)
                jobs.extend((student, dest, r, None) for r in rubrics)
            except SubmissionError as exc:
                jobs.extend((student, dest, r, str(exc)) for r in rubrics)

        def work(job) -> LabResult:
            student, root, rubric, rejected = job
            if rejected:
                res = LabResult(
                    student, rubric.lab, _zero(rubric, "rejected", rejected, cuda), note=rejected
                )
            else:
                res = grade_lab(student, root, rubric, limits=limits, cuda=cuda)
            if progress is not None:
                progress(res)
            return res

        with ThreadPoolExecutor(max_workers=workers) as pool:
            results = list(pool.map(work, jobs))
    finally:
        shutil.rmtree(unpack_root, ignore_errors=True)
    if out_dir is not None:
        write_reports(results, Path(out_dir))
    return results
