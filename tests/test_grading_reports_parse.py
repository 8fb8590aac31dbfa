"""What the grader reads from a submission's sandbox or upload, with bounded memory (issue 24):
JUnit reports with entities, oversized reports, zips whose central directory lists millions
of members, and numbers in feedback messages.

The memory figures are peak resident sizes of a child process that does nothing else, so
the parent test process is never at risk.
"""

from __future__ import annotations

import json
import struct
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from grading_fixtures.helpers import FIXTURE_LABS
from shardlab.grading import _jobs as jobs
from shardlab.grading._feedback import allowed_messages, feedback_bits, lab_feedback, safe_message
from shardlab.grading._junit import MAX_JUNIT_BYTES, ReportError, parse_junit
from shardlab.grading._submissions import MAX_ZIP_ARCHIVE, SubmissionError, check_zip
from shardlab.grading.rubric import load_rubric

PKG = Path(jobs.__file__).resolve().parents[2]
LAB = "01_toy"

# Peak RSS (MB) of a child that runs CODE after importing the grader (compared with the same
# child running nothing).
_MEASURE = r"""
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))  # a runaway child stops at 3 GB
from pathlib import Path
from shardlab.grading._junit import parse_junit
from shardlab.grading._submissions import check_zip
from shardlab.grading.rubric import load_rubric
outcome = "ok"
try:
    exec(sys.argv[1])
except BaseException as exc:
    outcome = type(exc).__name__
print(outcome, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
"""


def _run_measured(code: str) -> tuple[str, float]:
    proc = subprocess.run(
        [sys.executable, "-c", _MEASURE, code],
        capture_output=True,
        text=True,
        timeout=300,
        env={"PYTHONPATH": str(PKG), "PATH": "/usr/bin:/bin"},
    )
    outcome, mb = proc.stdout.split()
    return outcome, float(mb)


def _peak_mb(code: str) -> tuple[str, float]:
    """(outcome, MB of peak RSS above the same child running nothing)."""
    outcome, mb = _run_measured(code)
    return outcome, mb - _run_measured("pass")[1]


def _entity_report(path: Path, cases: int) -> None:
    """A report whose one entity (230 characters) is referenced 200 times per test case."""
    entity = "A" * 230
    cases = "".join(
        f"<testcase classname='test_gradetoy' name='test_add[{i}]'>"
        f"<failure message='{'&e;' * 200}'/></testcase>"
        for i in range(cases)
    )
    xml = f"<?xml version='1.0'?><!DOCTYPE t [<!ENTITY e '{entity}'>]><testsuites>{cases}</testsuites>"
    path.write_text(xml)


def test_entities_are_refused_with_bounded_memory(tmp_path):
    report = tmp_path / "junit.xml"
    _entity_report(report, 4000)
    assert 2.5e6 < report.stat().st_size < MAX_JUNIT_BYTES
    code = (
        f"parse_junit(Path({str(report)!r}).read_bytes(), "
        f"load_rubric(Path({str(FIXTURE_LABS / LAB)!r})))"
    )
    outcome, mb = _peak_mb(code)
    assert outcome == "ReportError"
    assert mb < 15, f"{mb:.0f} MB for a refused report"  # xml.etree: about 175 MB here


def test_report_limits():
    rubric = load_rubric(FIXTURE_LABS / LAB)
    with pytest.raises(ReportError, match="bytes"):
        parse_junit(b"<testsuites>" + b" " * MAX_JUNIT_BYTES + b"</testsuites>", rubric)
    with pytest.raises(ReportError, match="DTD"):
        parse_junit(b"<?xml version='1.0'?><!DOCTYPE x><testsuites/>", rubric)
    with pytest.raises(ReportError, match="malformed"):
        parse_junit(b"<testsuites><testcase", rubric)
    ok = parse_junit(
        b"<testsuites><testcase classname='test_gradetoy' name='test_mean'/>"
        b"<testcase classname='test_gradetoy' name='test_unknown'/></testsuites>",
        rubric,
    )
    assert list(ok.cases) == ["test_gradetoy.py::test_mean"]


def _many_member_zip(path: Path, members: int) -> None:
    """A valid zip of ``members`` empty stored files, written directly (fast)."""
    local, central, offset = [], [], 0
    for i in range(members):
        name = f"{i:06x}".encode()
        header = struct.pack("<4s5H3I2H", b"PK\x03\x04", 20, 0, 0, 0, 0, 0, 0, 0, len(name), 0)
        local.append(header + name)
        central.append(
            struct.pack(
                "<4s6H3I5H2I",
                b"PK\x01\x02",
                20,
                20,
                0,
                0,
                0,
                0,
                0,
                0,
                0,
                len(name),
                0,
                0,
                0,
                0,
                0,
                offset,
            )
            + name
        )
        offset += len(header) + len(name)
    cd = b"".join(central)
    n = min(members, 0xFFFF)
    end = struct.pack("<4s4H2IH", b"PK\x05\x06", 0, 0, n, n, len(cd), offset, 0)
    path.write_bytes(b"".join(local) + cd + end)


def test_zip_member_count_checked_before_listing(tmp_path):
    small = tmp_path / "small.zip"
    _many_member_zip(small, 6000)
    with zipfile.ZipFile(small) as zf:  # the writer makes real zips: zipfile lists them
        assert len(zf.infolist()) == 6000
    with pytest.raises(SubmissionError, match="6000 members"):
        check_zip(small)
    archive = tmp_path / "many.zip"
    _many_member_zip(archive, 300_000)  # 26 MB: under the archive cap
    assert archive.stat().st_size < MAX_ZIP_ARCHIVE
    outcome, mb = _peak_mb(f"check_zip(Path({str(archive)!r}))")
    assert outcome == "SubmissionError"
    assert mb < 15, f"{mb:.0f} MB to refuse the zip"  # zipfile's listing: about 134 MB here


def test_zip_archive_size_capped(tmp_path):
    big = tmp_path / "big.zip"
    with open(big, "wb") as fh:  # sparse: no disk used
        fh.truncate(MAX_ZIP_ARCHIVE + 1)
    with pytest.raises(SubmissionError, match=r"MB \(limit 64 MB\)"):
        check_zip(big)


def test_numbers_in_feedback_are_capped(tmp_path):
    test = tmp_path / "test_x.py"
    test.write_text(
        "def test_a(n, m):\n"
        '    assert n == 3, f"got {n} chunks"\n'
        '    assert m, f"rank {n} saw {m}"\n'
    )
    allowed = allowed_messages([test], [])
    assert safe_message("AssertionError: got 12 chunks", allowed) == "AssertionError: got 12 chunks"
    leak = "AssertionError: got 105109112111114116 chunks"  # a file's bytes as digits
    assert "105109" not in safe_message(leak, allowed)
    two_fields = "AssertionError: rank 1 saw 2"  # more than one field: never shown
    assert "saw" not in safe_message(two_fields, allowed)


def test_feedback_bits_per_test_are_bounded():
    allowed = lab_feedback(load_rubric(FIXTURE_LABS / LAB))
    bits = feedback_bits(allowed, cases=4)
    assert bits < 40
    print(json.dumps({"01_toy bits per test": round(bits, 1)}))
