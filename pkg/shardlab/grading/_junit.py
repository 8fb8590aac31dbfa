"""Read pytest's results back: the JUnit XML report and the progress log.

Both give, per rubric key (``<test file>::<test function>``), the list of its cases
(parametrizations) with outcome and message, plus the test files that failed to import.
Both are written inside the sandbox, so both are treated as hostile input:

* the JUnit report is parsed with ``defusedxml`` (a DTD, an entity or an external reference
  is refused, never expanded), only when it is at most :data:`MAX_JUNIT_BYTES`, and with at
  most :data:`MAX_CASES` test cases; messages are cut to :data:`MAX_MESSAGE` characters;
* only keys of the rubric are kept; which cases a test has, its points and whether it needs a
  GPU are decided by the grader (:mod:`._collect`, :mod:`._score`), never read from here.

:func:`merge` combines the two: for a case both report, the worse outcome wins, so a report
rewritten after the tests ran does not turn a failure the progress log saw into a pass.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from .rubric import Rubric

MAX_JUNIT_BYTES = 4 * 2**20  # a real report of a lab is < 200 kB (failures with --tb=short)
MAX_CASES = 20_000
MAX_MESSAGE = 2000


class ReportError(ValueError):
    """pytest's JUnit report is unusable (too large, a DTD or entities, malformed)."""


@dataclass
class _Case:
    case: str  # parametrization id ("" when not parametrized)
    outcome: str  # passed / failed / error / skipped / died
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


def _parse_xml(data: bytes):
    if len(data) > MAX_JUNIT_BYTES:
        raise ReportError(f"the JUnit report has {len(data)} bytes (limit {MAX_JUNIT_BYTES})")
    if b"<!DOCTYPE" in data or b"<!ENTITY" in data:  # cheap early refusal; defusedxml checks too
        raise ReportError("the JUnit report declares a DTD or entities")
    import defusedxml.ElementTree as DET  # imported here: the student kit does not need it

    try:
        return DET.fromstring(data, forbid_dtd=True, forbid_entities=True, forbid_external=True)
    except (DET.ParseError, RecursionError) as exc:
        raise ReportError(f"the JUnit report is malformed ({str(exc)[:200]})") from None
    except ValueError as exc:  # defusedxml's DTDForbidden, EntitiesForbidden, ...
        raise ReportError(f"the JUnit report was refused ({type(exc).__name__})") from None


def parse_junit(data: bytes, rubric: Rubric) -> _Parsed:
    """Per-rubric-test cases from pytest's JUnit XML; ReportError if it is unusable."""
    parsed = _Parsed()
    root = _parse_xml(data)
    for n, tc in enumerate(root.iter("testcase")):
        if n >= MAX_CASES:
            raise ReportError(f"the JUnit report has more than {MAX_CASES} test cases")
        classname, name = tc.get("classname", ""), tc.get("name", "")
        outcome, message = "passed", ""
        for tag in ("skipped", "failure", "error"):
            el = tc.find(tag)
            if el is not None:
                outcome = {"failure": "failed"}.get(tag, tag)
                message = (el.get("message", "") or (el.text or ""))[:MAX_MESSAGE]
        parts = classname.split(".") if classname else []
        if not parts:  # collection error: name is the file's dotted path
            if outcome == "error":
                el = tc.find("error")
                detail = [
                    ln[1:].strip()
                    for ln in (el.text or "")[: 64 * MAX_MESSAGE].splitlines()
                    if ln.startswith("E ")
                ]
                file = name.replace(".", "/").split("/")[-1] + ".py"
                if any(k.split("::")[0] == file for k in rubric.points):
                    parsed.collect_errors[file] = (detail[-1] if detail else message)[:MAX_MESSAGE]
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
        event, nodeid = rec.get("event"), str(rec.get("nodeid", ""))[:MAX_MESSAGE]
        if event == "collect":
            collecting = str(rec.get("path", ""))[:MAX_MESSAGE]
        elif event == "collecterror" and nodeid.endswith(".py"):
            file = Path(nodeid).name
            if any(k.split("::")[0] == file for k in rubric.points):
                parsed.collect_errors[file] = str(rec.get("message", ""))[:MAX_MESSAGE]
        elif event == "start":
            running = nodeid
            collecting = None
        elif event == "result":
            outcome = str(rec.get("outcome", "failed"))
            if outcome == "failed" and rec.get("when") != "call":
                outcome = "error"
            prev = results.get(nodeid)
            if (prev is None or prev[0] == "passed") and _nodeid_key(nodeid)[0] in rubric.points:
                results[nodeid] = (outcome, str(rec.get("message", ""))[:MAX_MESSAGE])
            if running == nodeid and rec.get("when") in ("call", "teardown"):
                running = None
    for nodeid, (outcome, message) in results.items():
        key, case = _nodeid_key(nodeid)
        parsed.cases.setdefault(key, []).append(_Case(case, outcome, message))
    if running is not None and running in results:
        running = None
    return parsed, running, collecting


_RANK = {"passed": 0, "skipped": 1, "failed": 2, "error": 3, "died": 4}


def merge(junit: _Parsed, progress: _Parsed) -> _Parsed:
    """The JUnit cases, each replaced by the progress log's when that one is worse.

    Cases only the progress log has are added; collection errors of both are kept.
    """
    out = _Parsed(source="junit+progress")
    keys = list(dict.fromkeys([*junit.cases, *progress.cases]))
    for key in keys:
        seen: dict[str, _Case] = {}
        for c in [*junit.cases.get(key, []), *progress.cases.get(key, [])]:
            prev = seen.get(c.case)
            if prev is None or _RANK.get(c.outcome, 3) > _RANK.get(prev.outcome, 3):
                seen[c.case] = c
        out.cases[key] = list(seen.values())
    out.collect_errors = {**progress.collect_errors, **junit.collect_errors}
    return out


def _nodeid_key(nodeid: str) -> tuple[str, str]:
    parts = nodeid.split("::")
    file = Path(parts[0]).name
    base, case = _split_case(parts[-1])
    return f"{file}::" + "::".join([*parts[1:-1], base]), case
