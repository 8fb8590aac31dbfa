"""Run one instructor-style test file inside the grading sandbox (tests/test_grading_sandbox_*.py).

``run_in_sandbox(tmp_path, source, limits)`` writes ``source`` as ``test_probe.py`` into a job
folder of ``tmp_path`` (mode 0700, like the grader's) and runs it with
:func:`shardlab.grading.sandbox.run_pytest` exactly as the grader does, with ``-s`` so that a
probe's ``print`` reaches the log. Every attack here is sized small and can only harm its
own sandbox: the probes open host-setting files for writing without ever writing.
"""

from __future__ import annotations

import os
import xml.etree.ElementTree as ET
from pathlib import Path


def run_in_sandbox(tmp_path: Path, source: str, limits, *, sandbox: bool = True):
    from shardlab.grading._jobs import require_bwrap
    from shardlab.grading.grade import PYTEST_INI
    from shardlab.grading.sandbox import run_pytest

    base = Path(tmp_path) / "job"
    base.mkdir(mode=0o700)
    os.chmod(base, 0o700)
    work, private = base / "work", base / "private"
    work.mkdir()
    private.mkdir(mode=0o700)
    (work / "test_probe.py").write_text(source)
    ini = private / "pytest.ini"
    ini.write_text(PYTEST_INI)
    return run_pytest(
        work,
        private,
        limits,
        ini=ini,
        bwrap=require_bwrap() if sandbox else None,
        work_files={"test_probe.py": work / "test_probe.py"},
        pytest_args=("-s",),
    )


def outcomes(run) -> dict[str, str]:
    """test name -> passed / failed / error / skipped, from the run's JUnit report."""
    if not run.junit:
        return {}
    found = {}
    for case in ET.fromstring(run.junit).iter("testcase"):
        kids = {child.tag for child in case}
        kind = next((k for k in ("failure", "error", "skipped") if k in kids), "passed")
        found[case.get("name")] = {"failure": "failed"}.get(kind, kind)
    return found


def probe_lines(run, prefix: str) -> list[str]:
    return [ln[len(prefix) :].strip() for ln in run.log_tail.splitlines() if ln.startswith(prefix)]
