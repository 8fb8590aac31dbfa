"""Turn parsed test cases into rubric rows: points, status and a one-line message each.

Also says why pytest did not finish (:func:`_death_note`) and builds the all-zero rows of a
lab that could not run (:func:`_zero`).
"""

from __future__ import annotations

import os
import re
import signal
from dataclasses import dataclass

from ._feedback import Allowed, safe_message
from ._junit import _Case, _nodeid_key, _Parsed
from .rubric import Rubric
from .sandbox import Limits, RunResult

MESSAGE_CHARS = 400
_SAFE_CASE = re.compile(r"[\w.+\-=,]{0,60}")
_NEEDS_GPU = "needs GPU: not graded without CUDA; excluded from the maximum"


@dataclass
class Row:
    test: str
    points: float
    max_points: float
    status: str
    message: str = ""  # for the instructor (grades.csv, junit.xml)
    feedback: str | None = None  # for the student (results.json); None: same as message


def _needs_gpu_row(key: str) -> Row:
    """A GPU test graded without CUDA: no points, and not counted in the maximum."""
    return Row(key, 0.0, 0.0, "needs GPU", _NEEDS_GPU)


def _first_line(text: str) -> str:
    lines = [line.strip() for line in str(text).splitlines() if line.strip()]
    return lines[0] if lines else ""


def _truncate(text: str, limit: int = MESSAGE_CHARS) -> str:
    """First non-empty line, whitespace collapsed, at most ``limit`` characters."""
    lines = [line for line in str(text).splitlines() if line.strip()]
    text = " ".join(lines[0].split()) if lines else ""
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _signal_name(code: int) -> str:
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


def _death_note(run: RunResult, limits: Limits) -> str:
    """Why pytest did not finish normally ('' when it did)."""
    if run.timed_out:
        note = f"timed out after {limits.timeout:g} s (wall clock); the submission hangs or is too slow"
        cores = os.cpu_count() or 1
        if run.load > cores:  # a busy machine can cut a correct solution: say so
            note += (
                f" (the machine's load average was {run.load:.1f} on {cores} cores: regrade "
                "with fewer --workers or a longer --timeout if others passed slowly)"
            )
        return note
    if run.killed_reason:
        return run.killed_reason
    code = run.returncode
    if code is None:
        return "" if run.junit else "the pytest process disappeared without a report"
    if code < 0:
        sig = _signal_name(code)
        extra = {
            "SIGXFSZ": f" (output or a file exceeded {limits.file_size_mb:g} MB: flooding stdout?)",
            "SIGXCPU": " (CPU time limit exceeded)",
            "SIGKILL": " (killed: by the submission itself, or out of memory)",
            "SIGSEGV": " (segmentation fault)",
        }.get(sig, "")
        return f"pytest was killed by {sig}{extra}"
    if code in (0, 1, 5) and run.junit:
        return ""
    if code in (2, 3, 4) and run.junit:
        return f"pytest stopped with exit code {code} (interrupted or usage error)"
    return f"pytest exited with code {code} without finishing (os._exit() or sys.exit() in the submission?)"


def _graded_cases(rubric: Rubric, key: str, cuda: bool) -> tuple[list[str], int, float]:
    """(case ids that count, number of GPU cases left out, points per case) of one key.

    Decided by the grader alone: the cases it collected from the reference lab, and the
    ``gpu`` markers it saw there (never a skip reason or a case a report brings).
    """
    expected = rubric.expected(key)
    graded = [case for case, gpu in expected if cuda or not gpu]
    return graded, len(expected) - len(graded), rubric.points[key] / len(expected)


def score(
    rubric: Rubric,
    parsed: _Parsed,
    *,
    cuda: bool,
    died: str = "",
    running: str | None = None,
    file_mb: float = 64.0,
    allowed: Allowed | None = None,
) -> list[Row]:
    """Map parsed cases to rubric rows.

    Only the cases of :meth:`Rubric.expected` count, each worth an equal share of the key's
    points; a reported case that is not one of them is ignored, one that is not reported
    "did not run". ``message`` keeps the test's own first line; ``feedback`` passes on only
    what :func:`._feedback.safe_message` lets through (``allowed``: the lab's test messages).
    """
    allowed = allowed or Allowed()
    rows = []
    running_key, running_case = _nodeid_key(running) if running else (None, None)
    for key in rubric.points:
        file = key.split("::")[0]
        graded, n_gpu, per_case = _graded_cases(rubric, key, cuda)
        if not graded:
            rows.append(_needs_gpu_row(key))
            continue
        reported: dict[str, _Case] = {}
        for c in parsed.cases.get(key, []):
            if c.case in graded and (
                c.case not in reported or reported[c.case].outcome == "passed"
            ):
                reported[c.case] = c
        if running_key == key and died and running_case in graded:
            reported[running_case] = _Case(running_case, "died", f"{died} while this test ran")
        max_points = per_case * len(graded)
        if not reported:
            if file in parsed.collect_errors:
                msg = f"did not run: {file} could not be imported: {parsed.collect_errors[file]}"
                shown = safe_message(parsed.collect_errors[file], allowed)
                fb = f"did not run: {file} could not be imported: {shown}"
                rows.append(
                    Row(
                        key, 0.0, round(max_points, 6), "did not run", _truncate(msg), _truncate(fb)
                    )
                )
            else:
                msg = "did not run" + (f": {died}" if died else "")
                rows.append(Row(key, 0.0, round(max_points, 6), "did not run", _truncate(msg)))
            continue
        cases = [reported.get(case) or _Case(case, "not run", "did not run") for case in graded]
        passed = [c for c in cases if c.outcome == "passed"]
        bad = [c for c in cases if c.outcome != "passed"]
        earned = per_case * len(passed)
        if not bad:
            status, message, feedback = "passed", "", ""
        else:
            first = next((c for c in bad if c.outcome != "not run"), bad[0])
            label = f"[{first.case}] " if first.case else ""
            # the case id is the grader's own (collected from the reference lab)
            fb_label = label if _SAFE_CASE.fullmatch(first.case) else "[a case] "
            fb_label = fb_label if first.case else ""
            if len(passed):
                status = "partial"
            elif all(c.outcome == "skipped" for c in bad):
                status = "skipped"
            elif first.outcome == "died" and "timed out" in first.message:
                status = "timeout"
            elif first.outcome == "died":
                status = "crashed"
            elif all(c.outcome == "not run" for c in bad):
                status = "did not run"
            else:
                status = "failed"
            counts = f"{len(passed)}/{len(cases)} cases passed; " if len(cases) > 1 else ""
            message = f"{counts}{label}{_first_line(first.message) or first.outcome}"
            if first.outcome in ("died", "not run", "wrong values"):  # the grader's own sentence
                shown = _first_line(first.message)
            else:
                shown = safe_message(first.message, allowed)
            feedback = f"{counts}{fb_label}{shown or first.outcome}"
            if "File too large" in first.message:
                extra = f" (output or a file exceeded the {file_mb:g} MB limit: flooding stdout?)"
                message += extra
                feedback += extra
        if n_gpu:
            extra = f"{n_gpu} case(s) need a GPU (not counted)"
            message = (message + "; " if message else "") + extra
            feedback = (feedback + "; " if feedback else "") + extra
        rows.append(
            Row(
                key,
                round(earned, 6),
                round(max_points, 6),
                status,
                _truncate(message),
                _truncate(feedback),
            )
        )
    return rows


def _zero(
    rubric: Rubric, status: str, message: str, cuda: bool, feedback: str | None = None
) -> list[Row]:
    """Every test 0 points with one status; GPU tests without CUDA stay out of the maximum
    whatever the status (a tampered, rejected or failed-to-grade lab has the same maximum
    as an honest one)."""
    rows = []
    for key in rubric.points:
        graded, _, per_case = _graded_cases(rubric, key, cuda)
        if not graded:
            rows.append(_needs_gpu_row(key))
        else:
            fb = None if feedback is None else _truncate(feedback)
            most = round(per_case * len(graded), 6)
            rows.append(Row(key, 0.0, most, status, _truncate(message), fb))
    return rows
