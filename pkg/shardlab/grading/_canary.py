"""A test planted by the grader that must fail: a check on the reports pytest wrote.

Every job gets one more instructor file, ``test_<lab topic>_<random>.py``, with one test of a
random name that always fails. The submission runs in the same pytest process as this test,
so it could make it pass, like any other; but a submission that forges results wholesale
(a plugin registered in memory that passes everything, a patched ``Function.runtest``, a
JUnit report or progress log rewritten at exit, ``sys.modules`` tricks) must now also find
and spare this test, whose name and position among the files change with every job. When
pytest ended normally and either report does not show it failed, the lab is "tampered".

It narrows forgery; it does not end it: a submission that reads the test files in its
sandbox can still tell the planted test from the instructor's (see ``book/instructors.md``).
"""

from __future__ import annotations

import secrets

from ._junit import ReportError, _parse_xml


def make_canary(lab: str) -> tuple[str, bytes, str]:
    """(file name, source, pytest node id) of a fresh planted test."""
    topic = lab.split("_", 1)[-1]
    file = f"test_{topic}_{secrets.token_hex(3)}.py"
    func = (
        f"test_{secrets.choice(['case', 'check', 'step', 'rank', 'shard'])}_{secrets.token_hex(3)}"
    )
    a, b = secrets.randbelow(10**6), secrets.randbelow(10**6)
    source = f"def {func}():\n    assert {a} == {a + 1 + b}\n"
    return file, source.encode(), f"{file}::{func}"


def _progress_says(progress: list[dict], nodeid: str) -> str:
    says = "missing"
    for rec in progress:
        if rec.get("event") == "result" and rec.get("nodeid") == nodeid:
            if rec.get("when") == "call":
                says = str(rec.get("outcome"))[:20]
    return says


def _junit_says(junit: bytes | None, nodeid: str) -> str:
    file, func = nodeid.split("::")
    try:
        root = _parse_xml(junit or b"")
    except ReportError:
        return "missing"
    for tc in root.iter("testcase"):
        if tc.get("classname") == file[:-3] and tc.get("name") == func:
            return "failed" if tc.find("failure") is not None else "passed or skipped"
    return "missing"


def canary_problem(
    junit: bytes | None, progress: list[dict], nodeid: str, *, died: bool = False
) -> str:
    """'' if the reports show the planted test failed, else what they showed instead.

    ``died``: pytest did not finish (the progress log alone counts): the planted test may not
    have run yet, but if the log has a result of a test file that pytest runs after it
    (files run in name order), it must show the planted test failed.
    """
    progress_says = _progress_says(progress, nodeid)
    if died:
        file = nodeid.split("::")[0]
        later = any(
            rec.get("event") == "result" and str(rec.get("nodeid", "")).split("::")[0] > file
            for rec in progress
        )
        if progress_says == "failed" or (progress_says == "missing" and not later):
            return ""
        return (
            "the test reports were altered from inside pytest: a test the grader planted to "
            f"fail was reported {progress_says} in the progress log"
        )
    junit_says = _junit_says(junit, nodeid)
    if junit_says == "failed" and progress_says == "failed":
        return ""
    return (
        "the test reports were altered from inside pytest: a test the grader planted to fail "
        f"was reported {junit_says} in the JUnit report and {progress_says} in the progress log"
    )
