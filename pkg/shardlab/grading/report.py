"""Write grading results: grades.csv, summary.csv, junit.xml and per-student results.json.

``grades.csv``
    one row per student, lab and rubric test:
    ``student, lab, test, points, max_points, status, message``.
``summary.csv``
    one row per student and lab: ``student, lab, points, max_points, percent, note``.
``<student>/results.json``
    Gradescope's autograder format: ``score``, ``max_score``, ``output`` (lab notes) and
    ``tests`` (``name``, ``score``, ``max_score``, ``status`` passed/failed, ``output``,
    ``extra_data.status`` with the grader's own status). This is the only file meant for the
    student: its messages are the rows' ``feedback`` (only what the tests wrote, see
    :mod:`._feedback`), never raw exception text.
``_logs/<student>/<lab>.log``
    the last few kB of pytest's output for that lab (bounded; for the instructor: it shows
    test source lines and raw exception text).
``_journal/``
    each job's result as it finished (:mod:`._journal`; ``--resume`` reads it back).

Safety: the output folder is created by the grader, or must be an existing *empty* folder
(not a link); it is opened once and every report is created inside it relative to that open
folder with ``O_CREAT | O_EXCL | O_NOFOLLOW``, so nothing is written through a link or over
an existing file. CSV cells that begin with ``= + - @`` (or a tab / carriage return) get a
leading ``'`` so a spreadsheet does not run them as formulas; every non-printable character
of a cell or of a junit.xml attribute is escaped (:func:`printable`).
``junit.xml``
    one ``testsuite`` per student and lab, one ``testcase`` per rubric test; failures carry
    the message, "needs GPU" is a ``skipped``, "did not run"/crashes are ``error``.
"""

from __future__ import annotations

import csv
import io
import json
import os
import stat
import xml.etree.ElementTree as ET
from pathlib import Path

from ._fs import write_new
from ._options import out_entries_problem
from ._results import LabResult

GRADES_FIELDS = ("student", "lab", "test", "points", "max_points", "status", "message")


def fmt(x: float) -> str:
    """Points without float noise: 3, 1.5, 0.333333."""
    return f"{round(x, 6):g}"


def printable(value) -> str:
    """``value`` with every non-printable character (terminal escapes, CR, NUL...) written as
    ``\\xNN`` / ``\\uNNNN``, so no name or message can move a terminal's cursor or fake a line."""
    text = str(value)
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() or c == "\t" else ascii(c)[1:-1] for c in text)


def cell(value) -> str:
    """A CSV cell a spreadsheet shows as text: formula-like starts are neutralized, and
    non-printable characters escaped (:func:`printable`)."""
    text = printable(value)
    return "'" + text if text[:1] in ("=", "+", "-", "@", "\t", "\r") else text


def _csv(rows) -> bytes:
    fh = io.StringIO(newline="")
    writer = csv.writer(fh)
    for row in rows:
        writer.writerow([cell(v) for v in row])
    return fh.getvalue().encode("utf-8")


def grades_csv(results: list[LabResult]) -> bytes:
    rows = [GRADES_FIELDS]
    for res in results:
        for row in res.rows:
            rows.append(
                [
                    res.student,
                    res.lab,
                    row.test,
                    fmt(row.points),
                    fmt(row.max_points),
                    row.status,
                    row.message,
                ]
            )
    return _csv(rows)


def summary_csv(results: list[LabResult]) -> bytes:
    rows: list = [("student", "lab", "points", "max_points", "percent", "note")]
    for res in results:
        pct = 100.0 * res.points / res.max_points if res.max_points else 0.0
        rows.append(
            [res.student, res.lab, fmt(res.points), fmt(res.max_points), f"{pct:.1f}", res.note]
        )
    return _csv(rows)


def _feedback(row) -> str:
    return row.message if row.feedback is None else row.feedback


def gradescope(results: list[LabResult]) -> dict:
    """Gradescope results.json for one student's lab results."""
    tests = []
    for res in results:
        for row in res.rows:
            tests.append(
                {
                    "name": f"{res.lab} :: {row.test}",
                    "score": round(row.points, 6),
                    "max_score": round(row.max_points, 6),
                    "status": "passed" if row.points >= row.max_points else "failed",
                    "output": row.status + (f": {shown}" if (shown := _feedback(row)) else ""),
                    "extra_data": {"status": row.status, "lab": res.lab},
                }
            )
    notes = [
        f"{res.lab}: {note}"
        for res in results
        if (note := res.note if res.feedback_note is None else res.feedback_note)
    ]
    return {
        "score": round(sum(r.points for r in results), 6),
        "max_score": round(sum(r.max_points for r in results), 6),
        "output": "\n".join(notes),
        "tests": tests,
    }


def junit(results: list[LabResult]) -> ET.ElementTree:
    suites = ET.Element("testsuites", name="shardlab grades")
    for res in results:
        suite = ET.SubElement(
            suites,
            "testsuite",
            name=printable(f"{res.student}.{res.lab}"),
            tests=str(len(res.rows)),
            failures=str(
                sum(r.status in ("failed", "partial", "tampered", "skipped") for r in res.rows)
            ),
            errors=str(
                sum(
                    r.status
                    not in ("passed", "failed", "partial", "tampered", "skipped", "needs GPU")
                    for r in res.rows
                )
            ),
            skipped=str(sum(r.status == "needs GPU" for r in res.rows)),
            time=f"{res.wall:.3f}",
        )
        for row in res.rows:
            case = ET.SubElement(
                suite,
                "testcase",
                classname=printable(f"{res.student}.{res.lab}"),
                name=row.test,
                time="0",
            )
            props = ET.SubElement(case, "properties")
            ET.SubElement(props, "property", name="points", value=fmt(row.points))
            ET.SubElement(props, "property", name="max_points", value=fmt(row.max_points))
            ET.SubElement(props, "property", name="status", value=row.status)
            if row.status == "passed":
                continue
            if row.status == "needs GPU":
                ET.SubElement(case, "skipped", message=printable(row.message))
            elif row.status in ("failed", "partial", "tampered", "skipped"):
                ET.SubElement(case, "failure", message=printable(f"{row.status}: {row.message}"))
            else:
                ET.SubElement(case, "error", message=printable(f"{row.status}: {row.message}"))
    ET.indent(suites)
    return ET.ElementTree(suites)


def prepare_out(out_dir: Path, *, resume: bool = False) -> int:
    """Create ``out_dir`` (or accept an empty real folder) and return it opened (no link followed).

    ``resume``: the folder may also hold the ``_journal`` of an interrupted run (and nothing
    else: a run whose reports were written is finished)."""
    out_dir = Path(out_dir)
    try:
        st = os.lstat(out_dir)
    except FileNotFoundError:
        out_dir.parent.mkdir(parents=True, exist_ok=True)
        os.mkdir(out_dir, 0o755)
        st = os.lstat(out_dir)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise ValueError(f"--out {out_dir} exists and is not a folder (or is a symbolic link).")
    fd = os.open(out_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    problem = out_entries_problem(out_dir, set(os.listdir(fd)), resume)
    if problem:
        os.close(fd)
        raise ValueError(problem)
    return fd


def _subdir(dir_fd: int, name: str) -> int:
    os.mkdir(name, 0o755, dir_fd=dir_fd)  # fails if anything (a link too) is there already
    return os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)


def write_reports(
    results: list[LabResult], out_dir: Path, *, dir_fd: int | None = None
) -> dict[str, Path]:
    """Write every report into ``out_dir`` (see :func:`prepare_out`); return the paths written.

    ``dir_fd``: ``out_dir`` already opened by :func:`prepare_out` (the grader opens it before
    grading starts and writes only through that descriptor).
    """
    out_dir = Path(out_dir)
    own = dir_fd is None
    fd = prepare_out(out_dir) if own else dir_fd
    try:
        results = sorted(results, key=lambda r: (r.student, r.lab))
        paths = {
            "grades": out_dir / "grades.csv",
            "summary": out_dir / "summary.csv",
            "junit": out_dir / "junit.xml",
        }
        write_new(fd, "grades.csv", grades_csv(results))
        write_new(fd, "summary.csv", summary_csv(results))
        buf = io.BytesIO()
        junit(results).write(buf, encoding="utf-8", xml_declaration=True)
        write_new(fd, "junit.xml", buf.getvalue())
        by_student: dict[str, list[LabResult]] = {}
        for res in results:
            by_student.setdefault(res.student, []).append(res)
        logs_fd = _subdir(fd, "_logs")
        try:
            for student, labs in by_student.items():
                sfd = _subdir(fd, student)
                try:
                    text = json.dumps(gradescope(labs), indent=2) + "\n"
                    write_new(sfd, "results.json", text.encode("utf-8"))
                finally:
                    os.close(sfd)
                lfd = _subdir(logs_fd, student)
                try:
                    for res in labs:
                        write_new(lfd, f"{res.lab}.log", res.log_tail.encode("utf-8", "replace"))
                finally:
                    os.close(lfd)
        finally:
            os.close(logs_fd)
    finally:
        if own:
            os.close(fd)
    return paths
