"""The grading batch: check the options, load the rubrics, collect the cases, run the jobs,
write reports.

:func:`grade` (``shardlab grade``, exported as :func:`shardlab.grading.grade`) runs every
(student, lab) job through :mod:`._jobs`, which grades each with :func:`.grade.grade_lab`; the
imports point one way: ``_driver`` -> ``_jobs`` -> ``grade``.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

from ._collect import PYTEST_INI, with_cases
from ._jobs import require_bwrap, run_jobs
from ._results import LabResult
from ._submissions import discover_submissions
from .release import lab_dirs
from .report import prepare_out, write_reports
from .rubric import Rubric, load_rubric
from .sandbox import Limits

__all__ = ["detect_cuda", "grade", "load_rubrics"]


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
    if not Path(labs_dir).is_dir():
        raise ValueError(f"labs folder {labs_dir} does not exist (--labs).")
    all_labs = [d for d in lab_dirs(Path(labs_dir)) if (d / "rubric.toml").is_file()]
    if wanted is not None:
        unknown = wanted - {d.name for d in all_labs}
        if unknown:
            raise ValueError(
                f"unknown lab(s) {sorted(unknown)}; labs with a rubric: "
                f"{[d.name for d in all_labs]}."
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
    resume: bool = False,
    on_start=None,
) -> list[LabResult]:
    """Grade every submission against every lab; write reports to ``out_dir`` if given.

    ``sandbox=False`` runs submissions without bubblewrap (see ``_bwrap.UNSAFE_WARNING``);
    with ``sandbox=True`` a missing or broken bubblewrap raises ``SandboxUnavailable``.
    Every option, ``out_dir`` included, is checked first (ValueError with one sentence),
    before the rubrics' tests are collected (minutes on the real labs); a submissions folder
    without a submission returns ``[]`` at once, collecting nothing and writing no report
    (the same ``out_dir`` then serves the corrected run). Each job's result is
    written to ``out_dir/_journal`` as it finishes (:mod:`._journal`); ``resume=True`` takes
    the finished ones of an interrupted run from there and grades only the rest.
    ``on_start()`` is called once every check has passed, just before the collection (the
    CLI's --unsafe-no-sandbox warning goes there: a refused run prints only its sentence).
    """
    from ._journal import Journal, fingerprint
    from ._options import default_workers, limits_problem, out_dir_problem, out_problem

    limits = limits or Limits()
    problem = limits_problem(limits, workers)
    if not problem and out_dir is not None:
        problem = out_problem(Path(out_dir), Path(submissions)) or out_dir_problem(
            Path(out_dir), resume=resume
        )
    if problem:
        raise ValueError(problem)
    rubrics = load_rubrics(labs_dir, labs)
    if not rubrics:
        raise ValueError(
            f"no lab with a rubric.toml under {labs_dir}; point --labs at the folder that "
            "holds the labs."
        )
    bwrap = require_bwrap() if sandbox else None
    students = discover_submissions(submissions)
    if not students:  # nothing to grade: no collection (minutes), no --out to clear next time
        return []
    # --out is opened before the collection, so no folder problem waits for its minutes
    made = out_dir is not None and not os.path.lexists(out_dir)
    out_fd = _open_out(Path(out_dir), resume) if out_dir is not None else None
    journal = None
    try:
        if on_start is not None:
            on_start()
        # the cases of every rubric test, from the grader's own collection of the reference lab
        rubrics = [with_cases(r, PYTEST_INI) for r in rubrics]
        if cuda is None:
            cuda = detect_cuda()
        done: dict = {}
        if out_fd is not None:
            journal = Journal(out_fd, {r.lab: fingerprint(r, cuda) for r in rubrics})
            if resume:
                done = journal.load({(s.student, r.lab) for s in students for r in rubrics})

        def on_result(res: LabResult) -> None:
            if journal is not None:
                journal.record(res)
            if progress is not None:
                progress(res)

        common = dict(
            limits=limits,
            cuda=cuda,
            workers=workers or default_workers(),
            sandbox=sandbox,
            progress=on_result,
            bwrap=bwrap,
            # the start/ETA lines go to stderr only for a caller that shows progress (the
            # CLI); on_result itself is always given, for the journal
            estimate_to=sys.stderr if progress is not None else None,
        )
        if not done:
            results = run_jobs(students, rubrics, **common)
        else:  # resume: only the jobs without a result, lab by lab
            results = list(done.values())
            for rubric in rubrics:
                left = [s for s in students if (s.student, rubric.lab) not in done]
                if left:
                    results += run_jobs(left, [rubric], **common)
            results.sort(key=lambda r: (r.student, r.lab))
        if out_fd is not None:
            write_reports(results, Path(out_dir), dir_fd=out_fd)
    except BaseException:
        if made:  # the folder this run made, if still empty (a journal keeps it for --resume)
            with contextlib.suppress(OSError):
                os.rmdir(out_dir)
        raise
    finally:
        if journal is not None:
            journal.close()
        if out_fd is not None:
            os.close(out_fd)
    return results


def _open_out(out_dir: Path, resume: bool) -> int:
    """:func:`.report.prepare_out` with an OS error (a read-only or pseudo file system such as
    /proc, which root's permission checks pass) said as the --out problem it is."""
    try:
        return prepare_out(out_dir, resume=resume)
    except OSError as exc:
        why = (exc.strerror or str(exc)).lower()
        where = f" ({exc.filename})" if exc.filename and str(exc.filename) != str(out_dir) else ""
        raise ValueError(f"--out {out_dir} cannot be created or opened: {why}{where}.") from None
