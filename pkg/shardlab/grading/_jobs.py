"""Run every (student, lab) job, each isolated from the others.

* Any exception while handling one job (an unreadable zip, a RecursionError, a bug of the
  grader) becomes that student's "grader error" rows with the reason; the rest is graded.
* A job that does not finish within ``timeout + JOB_GRACE`` seconds is given up: its
  student gets a "grader error" row and a fresh worker thread takes its place. Workers are
  daemon threads, so a stuck one cannot keep the grader alive, and its sandbox dies with
  the grader (bubblewrap's ``--die-with-parent``).
* Before every job the fingerprint taken at start (:mod:`._integrity`) is checked; if the
  labs, the package or the environment changed, that job and every later one get "grader
  error" and nothing more runs.
* A zip is unpacked just before its own job, into a fresh folder removed right after.
* A lab with an ``[outside]`` table first runs once on its reference solution
  (:func:`._reference.with_reference`); a reference that fails stops grading with a sentence.
"""

from __future__ import annotations

import contextlib
import os
import queue
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from ._bwrap import SandboxUnavailable, find_bwrap
from ._fs import TreeError, remove_tree
from ._integrity import Fingerprint, IntegrityError, snapshot_package
from ._progress import Estimate, stream_for
from ._reference import with_reference
from ._score import _zero
from ._submissions import Submission, SubmissionError, safe_extract
from .grade import LabResult, grade_lab, grader_error, lab_feedback
from .rubric import Rubric
from .sandbox import Limits

JOB_GRACE = 240.0  # seconds a job may take beyond the test timeout (unpack, checks, kill)


def require_bwrap() -> str:
    """Path of a working bubblewrap, or SandboxUnavailable with what to do."""
    path = find_bwrap()
    if path is None:
        raise SandboxUnavailable(
            "bubblewrap (bwrap) is not installed, so submissions cannot be sandboxed. Install "
            "it (Debian/Ubuntu: apt-get install bubblewrap), or pass --unsafe-no-sandbox to "
            "grade code you trust without a sandbox."
        )
    probe = [path, "--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent"]
    probe += ["--new-session", "--as-pid-1"]
    probe += ["--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev", "true"]
    try:
        proc = subprocess.run(probe, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SandboxUnavailable(f"bubblewrap at {path} does not run: {exc}") from None
    if proc.returncode != 0:
        said = (proc.stderr.strip().splitlines() or [f"exit code {proc.returncode}"])[-1]
        raise SandboxUnavailable(
            f"bubblewrap at {path} cannot create a sandbox here ({said}); user namespaces may "
            "be disabled. Fix that, or pass --unsafe-no-sandbox to grade code you trust."
        )
    return path


def run_jobs(
    students: list[Submission],
    rubrics: list[Rubric],
    *,
    limits: Limits,
    cuda: bool,
    workers: int,
    sandbox: bool,
    progress=None,
    bwrap: str | None = None,
    estimate_to="auto",
) -> list[LabResult]:
    """Grade every student against every rubric; one result per job, in job order.

    ``estimate_to``: a stream for the expected total at start and the live estimate
    (:mod:`._progress`); ``"auto"``: stderr when ``progress`` is given (the CLI), else none.
    """
    if sandbox and bwrap is None:
        bwrap = require_bwrap()
    tmp_root = Path(tempfile.mkdtemp(prefix="shardlab-grade-"))
    os.chmod(tmp_root, 0o711)  # the sandbox user (nobody) reaches the package copy only
    try:
        package = snapshot_package(tmp_root / "pkg")
        fingerprint = Fingerprint([r.lab_dir for r in rubrics], package)
        # the reference solution's recorded values, once per lab ([outside] tests only)
        common = dict(limits=limits, cuda=cuda, tmp_root=tmp_root, bwrap=bwrap, package=package)
        rubrics = [with_reference(r, **common) for r in rubrics]
    except BaseException:
        remove_tree(tmp_root)
        raise
    allowed = {r.lab: lab_feedback(r) for r in rubrics}
    jobs = [(sub, rubric) for sub in students for rubric in rubrics]
    results: list[LabResult | None] = [None] * len(jobs)
    n_workers = max(1, min(workers, len(jobs)))
    eta = Estimate(
        len(jobs),
        n_workers,
        stream_for(progress) if estimate_to == "auto" else estimate_to,
        students=len(students),
        labs=len(rubrics),
    )
    started: dict[int, float] = {}
    reported = [0]  # results handed to progress (and counted by the estimate)
    stopped: list[str] = []  # why grading stopped (integrity), if it did
    lock = threading.Lock()
    todo: queue.SimpleQueue[int] = queue.SimpleQueue()
    for i in range(len(jobs)):
        todo.put(i)

    def one(i: int) -> LabResult:
        sub, rubric = jobs[i]
        if stopped:
            return grader_error(sub.student, rubric, stopped[0], cuda)
        try:
            fingerprint.verify()
        except IntegrityError as exc:
            stopped.append(str(exc))
            return grader_error(sub.student, rubric, str(exc), cuda)
        if sub.kind == "bad":
            return LabResult(
                sub.student, rubric.lab, _zero(rubric, "rejected", sub.problem, cuda), sub.problem
            )
        common = dict(
            limits=limits,
            cuda=cuda,
            tmp_root=tmp_root,
            bwrap=bwrap,
            allowed=allowed[rubric.lab],
            package=package,
        )
        if sub.kind == "dir":
            return grade_lab(sub.student, sub.path, rubric, **common)
        dest = Path(tempfile.mkdtemp(prefix="unpacked-", dir=tmp_root))
        try:
            try:
                safe_extract(sub.path, dest)
            except SubmissionError as exc:
                return LabResult(
                    sub.student, rubric.lab, _zero(rubric, "rejected", str(exc), cuda), str(exc)
                )
            return grade_lab(sub.student, dest, rubric, **common)
        finally:
            remove_tree(dest)

    def finish(i: int, res: LabResult) -> None:
        with lock:
            if results[i] is not None:
                return  # given up on meanwhile
            results[i] = res
        eta.clear()
        if progress is not None:
            with contextlib.suppress(Exception):
                progress(res)
        eta.finished_one()
        with lock:
            reported[0] += 1  # the caller has seen it: run_jobs may return once all are

    def worker() -> None:
        while True:
            try:
                i = todo.get_nowait()
            except queue.Empty:
                return
            with lock:
                started[i] = time.monotonic()
            try:
                res = one(i)
            except Exception as exc:  # noqa: BLE001 - one student's failure stays theirs
                sub, rubric = jobs[i]
                reason = f"{type(exc).__name__} while grading: {str(exc)[:300]}"
                res = grader_error(sub.student, rubric, reason, cuda)
            finish(i, res)

    def start_worker() -> None:
        threading.Thread(target=worker, name="shardlab-grade", daemon=True).start()

    budget = limits.timeout + JOB_GRACE
    eta.begin()
    try:
        for _ in range(n_workers):
            start_worker()
        while True:
            with lock:
                if reported[0] >= len(jobs) and all(r is not None for r in results):
                    break
                late = [
                    i
                    for i, t0 in started.items()
                    if results[i] is None and time.monotonic() - t0 > budget
                ]
            for i in late:
                sub, rubric = jobs[i]
                reason = f"grading this submission did not finish within {budget:g} s"
                finish(i, grader_error(sub.student, rubric, reason, cuda))
                start_worker()  # the stuck thread keeps its slot; the others go on
            eta.tick()
            time.sleep(0.1)
        eta.end()
    finally:
        with contextlib.suppress(OSError, TreeError):
            remove_tree(tmp_root)
    return [r for r in results if r is not None]
