"""Write grading results: grades.csv, summary.csv, junit.xml and per-student results.json.

``grades.csv``
    one row per student, lab and rubric test:
    ``student, lab, test, points, max_points, status, message``.
``summary.csv``
    one row per student and lab: ``student, lab, points, max_points, percent, note``.
``<student>/results.json``
    Gradescope's autograder format: ``score``, ``max_score``, ``output`` (lab notes) and
    ``tests`` (``name``, ``score``, ``max_score``, ``status`` passed/failed, ``output``,
    ``extra_data.status`` with the grader's own status).
``<student>/<lab>.log``
    the last few kB of pytest's output for that lab (bounded).
``junit.xml``
    one ``testsuite`` per student and lab, one ``testcase`` per rubric test; failures carry
    the message, "needs GPU" is a ``skipped``, "did not run"/crashes are ``error``.
"""

from __future__ import annotations

import csv
import json
import xml.etree.ElementTree as ET
from pathlib import Path

from .grade import LabResult

GRADES_FIELDS = ("student", "lab", "test", "points", "max_points", "status", "message")


def fmt(x: float) -> str:
    """Points without float noise: 3, 1.5, 0.333333."""
    return f"{round(x, 6):g}"


def write_grades_csv(results: list[LabResult], path: Path) -> None:
    with open(path, "w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(GRADES_FIELDS)
        for res in results:
            for row in res.rows:
                writer.writerow(
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


def write_summary_csv(results: list[LabResult], path: Path) -> None:
    with open(path, "w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(("student", "lab", "points", "max_points", "percent", "note"))
        for res in results:
            pct = 100.0 * res.points / res.max_points if res.max_points else 0.0
            writer.writerow(
                [res.student, res.lab, fmt(res.points), fmt(res.max_points), f"{pct:.1f}", res.note]
            )


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
                    "output": row.status + (f": {row.message}" if row.message else ""),
                    "extra_data": {"status": row.status, "lab": res.lab},
                }
            )
    notes = [f"{res.lab}: {res.note}" for res in results if res.note]
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
            name=f"{res.student}.{res.lab}",
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
                suite, "testcase", classname=f"{res.student}.{res.lab}", name=row.test, time="0"
            )
            props = ET.SubElement(case, "properties")
            ET.SubElement(props, "property", name="points", value=fmt(row.points))
            ET.SubElement(props, "property", name="max_points", value=fmt(row.max_points))
            ET.SubElement(props, "property", name="status", value=row.status)
            if row.status == "passed":
                continue
            if row.status == "needs GPU":
                ET.SubElement(case, "skipped", message=row.message)
            elif row.status in ("failed", "partial", "tampered", "skipped"):
                ET.SubElement(case, "failure", message=f"{row.status}: {row.message}")
            else:
                ET.SubElement(case, "error", message=f"{row.status}: {row.message}")
    ET.indent(suites)
    return ET.ElementTree(suites)


def write_reports(results: list[LabResult], out_dir: Path) -> dict[str, Path]:
    """Write every report into ``out_dir`` (created); return the paths written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    results = sorted(results, key=lambda r: (r.student, r.lab))
    paths = {
        "grades": out_dir / "grades.csv",
        "summary": out_dir / "summary.csv",
        "junit": out_dir / "junit.xml",
    }
    write_grades_csv(results, paths["grades"])
    write_summary_csv(results, paths["summary"])
    junit(results).write(paths["junit"], encoding="utf-8", xml_declaration=True)
    by_student: dict[str, list[LabResult]] = {}
    for res in results:
        by_student.setdefault(res.student, []).append(res)
    for student, labs in by_student.items():
        folder = out_dir / student
        folder.mkdir(exist_ok=True)
        (folder / "results.json").write_text(
            json.dumps(gradescope(labs), indent=2) + "\n", encoding="utf-8"
        )
        for res in labs:
            (folder / f"{res.lab}.log").write_text(res.log_tail, encoding="utf-8")
    return paths
