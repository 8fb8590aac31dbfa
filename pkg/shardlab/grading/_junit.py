"""Read pytest's results back: the JUnit XML report, or the progress log when pytest died.

Both give, per rubric key (``<test file>::<test function>``), the list of its cases
(parametrizations) with outcome and message, plus the test files that failed to import.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

from .rubric import Rubric


@dataclass
class _Case:
    case: str  # parametrization id ("" when not parametrized)
    outcome: str  # passed / failed / error / skipped
    message: str = ""


@dataclass
class _Parsed:
    cases: dict[str, list[_Case]] = field(default_factory=dict)  # rubric key -> cases
    collect_errors: dict[str, str] = field(default_factory=dict)  # test file -> message
    source: str = "junit"


def _split_case(name: str) -> tuple[str, str]:
    if "[" in name and name.endswith("]"):
        base, case = name.split("[", 1)
        return base, case[:-1]
    return name, ""


def parse_junit(data: bytes, rubric: Rubric) -> _Parsed:
    """Per-rubric-test cases from pytest's JUnit XML."""
    parsed = _Parsed()
    root = ET.fromstring(data)
    for tc in root.iter("testcase"):
        classname, name = tc.get("classname", ""), tc.get("name", "")
        outcome, message = "passed", ""
        for tag in ("skipped", "failure", "error"):
            el = tc.find(tag)
            if el is not None:
                outcome = {"failure": "failed"}.get(tag, tag)
                message = el.get("message", "") or (el.text or "")
        parts = classname.split(".") if classname else []
        if not parts:  # collection error: name is the file's dotted path
            if outcome == "error":
                el = tc.find("error")
                detail = [
                    ln[1:].strip() for ln in (el.text or "").splitlines() if ln.startswith("E ")
                ]
                file = name.replace(".", "/").split("/")[-1] + ".py"
                parsed.collect_errors[file] = detail[-1] if detail else message
            continue
        base, case = _split_case(name)
        file = parts[0] + ".py"
        key = f"{file}::" + "::".join([*parts[1:], base])
        if key not in rubric.points:
            continue
        # A teardown error after a pass shows up as an <error> in the same testcase.
        parsed.cases.setdefault(key, []).append(_Case(case, outcome, message))
    return parsed


def parse_progress(records: list[dict], rubric: Rubric) -> tuple[_Parsed, str | None, str | None]:
    """Cases from the progress log; also the test running and the file collected when pytest died."""
    parsed = _Parsed(source="progress")
    results: dict[str, tuple[str, str]] = {}
    running: str | None = None
    collecting: str | None = None
    for rec in records:
        event, nodeid = rec.get("event"), str(rec.get("nodeid", ""))
        if event == "collect":
            collecting = str(rec.get("path", ""))
        elif event == "collecterror" and nodeid.endswith(".py"):
            parsed.collect_errors[Path(nodeid).name] = str(rec.get("message", ""))
        elif event == "start":
            running = nodeid
            collecting = None
        elif event == "result":
            outcome = str(rec.get("outcome", "failed"))
            if outcome == "failed" and rec.get("when") != "call":
                outcome = "error"
            prev = results.get(nodeid)
            if prev is None or prev[0] == "passed":
                results[nodeid] = (outcome, str(rec.get("message", "")))
            if running == nodeid and rec.get("when") in ("call", "teardown"):
                running = None
    for nodeid, (outcome, message) in results.items():
        key, case = _nodeid_key(nodeid)
        if key in rubric.points:
            parsed.cases.setdefault(key, []).append(_Case(case, outcome, message))
    if running is not None and running in results:
        running = None
    return parsed, running, collecting


def _nodeid_key(nodeid: str) -> tuple[str, str]:
    parts = nodeid.split("::")
    file = Path(parts[0]).name
    base, case = _split_case(parts[-1])
    return f"{file}::" + "::".join([*parts[1:-1], base]), case
