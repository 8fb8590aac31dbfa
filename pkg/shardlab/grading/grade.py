"""Grade a folder of submissions against the labs' public and hidden tests.

For every student (a sub-folder or a ``.zip`` of the submissions folder) and every lab:

1. find the rubric's ``submit`` files in the submission (``<lab>/<file>``, ``<file>``, or a
   unique match anywhere); missing files and syntax errors are graded without running;
2. build a fresh work folder: the instructor's lab folder (public tests, support modules)
   plus ``hidden/`` tests, then the student's ``submit`` files; nothing else of the student's
   is copied, so tests and helpers always come from the instructor;
3. run pytest there in a limited process tree (:mod:`shardlab.grading.sandbox`), with the
   JUnit report written into a separate private folder whose name the submission is not told;
4. check the instructor files are unchanged afterwards (else: "tampered", 0 points);
5. map pytest's per-test results to rubric points.

Statuses: passed, partial, failed, skipped, needs GPU, did not run, timeout, crashed,
missing, syntax error, rejected, tampered.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
import zipfile
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from ._runner import NEEDS_GPU_REASON
from .release import lab_dirs
from .rubric import Rubric, load_rubric, sandbox_files
from .sandbox import Limits, RunResult, run_pytest

MAX_ZIP_BYTES = 200 * 2**20
MAX_ZIP_MEMBERS = 5000
MESSAGE_CHARS = 400

PYTEST_INI = """[pytest]
addopts = -p no:cacheprovider
filterwarnings =
    ignore::DeprecationWarning
markers =
    gpu: needs a CUDA device
"""


class SubmissionError(ValueError):
    """A submission cannot be unpacked (unsafe or oversized zip)."""


@dataclass
class Row:
    test: str
    points: float
    max_points: float
    status: str
    message: str = ""


@dataclass
class LabResult:
    student: str
    lab: str
    rows: list[Row]
    note: str = ""  # lab-level explanation (timeout, crash, tampering, ...)
    log_tail: str = ""
    wall: float = 0.0

    @property
    def points(self) -> float:
        return sum(r.points for r in self.rows)

    @property
    def max_points(self) -> float:
        return sum(r.max_points for r in self.rows)


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


# --------------------------------------------------------------------------- submissions


def discover_submissions(submissions: Path) -> list[tuple[str, Path]]:
    """(student, path) for every sub-folder and ``.zip`` of ``submissions``, sorted by name."""
    submissions = Path(submissions)
    if not submissions.is_dir():
        raise SubmissionError(f"submissions folder {submissions} does not exist.")
    found: dict[str, Path] = {}
    for entry in sorted(submissions.iterdir()):
        if entry.name.startswith((".", "_")):
            continue
        if entry.is_dir():
            student = entry.name
        elif entry.is_file() and entry.suffix.lower() == ".zip":
            student = entry.stem
        else:
            continue
        if student in found:
            raise SubmissionError(
                f"student {student!r} has both a folder and a zip in {submissions}; keep one."
            )
        found[student] = entry
    return sorted(found.items())


def safe_extract(archive: Path, dest: Path) -> None:
    """Extract a zip, rejecting absolute paths, '..', links, and oversized archives."""
    try:
        zf = zipfile.ZipFile(archive)
    except (zipfile.BadZipFile, OSError) as exc:
        raise SubmissionError(f"{archive.name} is not a readable zip file ({exc}).") from None
    with zf:
        infos = zf.infolist()
        if len(infos) > MAX_ZIP_MEMBERS:
            raise SubmissionError(
                f"{archive.name} has {len(infos)} members (limit {MAX_ZIP_MEMBERS})."
            )
        total = 0
        for info in infos:
            name = info.filename.replace("\\", "/")
            parts = [p for p in name.split("/") if p not in ("", ".")]
            if name.startswith("/") or re.match(r"^[A-Za-z]:", name) or ".." in parts:
                raise SubmissionError(
                    f"{archive.name}: member {info.filename!r} has an absolute path or '..'; "
                    "zip the folder again from inside it."
                )
            if stat.S_ISLNK(info.external_attr >> 16):
                raise SubmissionError(
                    f"{archive.name}: member {info.filename!r} is a symbolic link."
                )
            total += info.file_size
            if total > MAX_ZIP_BYTES:
                raise SubmissionError(
                    f"{archive.name} unpacks to more than {MAX_ZIP_BYTES // 2**20} MB."
                )
        for info in infos:
            parts = [p for p in info.filename.replace("\\", "/").split("/") if p not in ("", ".")]
            if not parts or info.is_dir():
                continue
            target = dest.joinpath(*parts)
            target.parent.mkdir(parents=True, exist_ok=True)
            with zf.open(info) as src, open(target, "wb") as out:
                shutil.copyfileobj(src, out)


def locate(root: Path, lab: str, filename: str) -> Path | None:
    """Find a submitted file: ``<lab>/<file>``, ``<file>``, or the best match anywhere."""
    for candidate in (root / lab / filename, root / filename):
        if candidate.is_file() and not candidate.is_symlink():
            return candidate
    matches = [
        p
        for p in root.rglob(filename)
        if p.is_file() and not p.is_symlink() and "__MACOSX" not in p.parts
    ]
    if not matches:
        return None
    return min(matches, key=lambda p: (p.parent.name != lab, len(p.parts), str(p)))


# --------------------------------------------------------------------------- results


def _split_case(name: str) -> tuple[str, str]:
    if "[" in name and name.endswith("]"):
        base, case = name.split("[", 1)
        return base, case[:-1]
    return name, ""


def _first_line(text: str) -> str:
    lines = [line.strip() for line in str(text).splitlines() if line.strip()]
    return lines[0] if lines else ""


def _truncate(text: str, limit: int = MESSAGE_CHARS) -> str:
    """First non-empty line, whitespace collapsed, at most ``limit`` characters."""
    lines = [line for line in str(text).splitlines() if line.strip()]
    text = " ".join(lines[0].split()) if lines else ""
    return text if len(text) <= limit else text[: limit - 3] + "..."


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


def _signal_name(code: int) -> str:
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


def _death_note(run: RunResult, limits: Limits) -> str:
    """Why pytest did not finish normally ('' when it did)."""
    if run.timed_out:
        return f"timed out after {limits.timeout:g} s (wall clock); the submission hangs or is too slow"
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


def score(
    rubric: Rubric,
    parsed: _Parsed,
    *,
    cuda: bool,
    died: str = "",
    running: str | None = None,
    file_mb: float = 64.0,
) -> list[Row]:
    """Map parsed cases to rubric rows."""
    rows = []
    running_key = _nodeid_key(running)[0] if running else None
    for key, points in rubric.points.items():
        file = key.split("::")[0]
        cases = list(parsed.cases.get(key, []))
        if running_key == key and died:
            cases.append(_Case(_nodeid_key(running)[1], "died", f"{died} while this test ran"))
        static_gpu = key in rubric.gpu_tests
        if not cases:
            if static_gpu and not cuda:
                rows.append(
                    Row(
                        key,
                        0.0,
                        0.0,
                        "needs GPU",
                        "needs GPU: not graded without CUDA; excluded from the maximum",
                    )
                )
            elif file in parsed.collect_errors:
                msg = f"did not run: {file} could not be imported: {parsed.collect_errors[file]}"
                rows.append(Row(key, 0.0, points, "did not run", _truncate(msg)))
            else:
                msg = "did not run" + (f": {died}" if died else "")
                rows.append(Row(key, 0.0, points, "did not run", _truncate(msg)))
            continue
        per_case = points / len(cases)
        gpu = [
            c
            for c in cases
            if c.outcome == "skipped"
            and not cuda
            and (static_gpu or c.message.strip() == NEEDS_GPU_REASON)
        ]
        graded = [c for c in cases if c not in gpu]
        passed = [c for c in graded if c.outcome == "passed"]
        bad = [c for c in graded if c.outcome != "passed"]
        max_points = per_case * len(graded)
        earned = per_case * len(passed)
        if not graded:
            rows.append(
                Row(
                    key,
                    0.0,
                    0.0,
                    "needs GPU",
                    "needs GPU: not graded without CUDA; excluded from the maximum",
                )
            )
            continue
        if not bad:
            status, message = "passed", ""
        else:
            first = bad[0]
            label = f"[{first.case}] " if first.case else ""
            if len(passed):
                status = "partial"
            elif all(c.outcome == "skipped" for c in bad):
                status = "skipped"
            elif first.outcome == "died" and "timed out" in first.message:
                status = "timeout"
            elif first.outcome == "died":
                status = "crashed"
            else:
                status = "failed"
            counts = f"{len(passed)}/{len(graded)} cases passed; " if len(graded) > 1 else ""
            message = f"{counts}{label}{_first_line(first.message) or first.outcome}"
            if "File too large" in first.message:
                message += (
                    f" (output or a file exceeded the {file_mb:g} MB limit: flooding stdout?)"
                )
        if gpu:
            message = (
                message + "; " if message else ""
            ) + f"{len(gpu)} case(s) need a GPU (not counted)"
        rows.append(Row(key, round(earned, 6), round(max_points, 6), status, _truncate(message)))
    return rows


def _zero(rubric: Rubric, status: str, message: str, cuda: bool) -> list[Row]:
    rows = []
    for key, points in rubric.points.items():
        if key in rubric.gpu_tests and not cuda and status in ("missing", "syntax error"):
            rows.append(
                Row(
                    key,
                    0.0,
                    0.0,
                    "needs GPU",
                    "needs GPU: not graded without CUDA; excluded from the maximum",
                )
            )
        else:
            rows.append(Row(key, 0.0, points, status, _truncate(message)))
    return rows


# --------------------------------------------------------------------------- one job


def _digest(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def grade_lab(
    student: str,
    root: Path,
    rubric: Rubric,
    *,
    limits: Limits,
    cuda: bool,
    tmp_root: Path | None = None,
) -> LabResult:
    """Grade one lab of one (already unpacked) submission."""
    lab = rubric.lab
    found: dict[str, Path] = {}
    missing = []
    for name in rubric.submit:
        path = locate(root, lab, name)
        if path is None:
            missing.append(name)
        else:
            found[name] = path
    if missing:
        msg = f"{', '.join(missing)} not found in the submission (expected {lab}/{missing[0]} or {missing[0]})"
        return LabResult(student, lab, _zero(rubric, "missing", msg, cuda), note=msg)
    for name, path in found.items():
        if name.endswith(".py"):
            try:
                compile(path.read_bytes(), name, "exec", dont_inherit=True)
            except SyntaxError as exc:
                msg = f"{name} line {exc.lineno}: {exc.msg}"
                return LabResult(student, lab, _zero(rubric, "syntax error", msg, cuda), note=msg)
            except ValueError as exc:  # e.g. null bytes
                msg = f"{name} cannot be compiled: {exc}"
                return LabResult(student, lab, _zero(rubric, "syntax error", msg, cuda), note=msg)

    base = Path(tempfile.mkdtemp(prefix="shardlab-grade-", dir=tmp_root))
    private = Path(tempfile.mkdtemp(prefix="shardlab-private-", dir=tmp_root))
    os.chmod(private, 0o700)
    try:
        work = base / "work"
        work.mkdir()
        digests: dict[str, str | None] = {}
        for name, src in sandbox_files(rubric).items():
            target = work / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, target)
            digests[name] = _digest(target)
        for name, src in found.items():
            shutil.copyfile(src, work / name)
        ini = private / "pytest.ini"
        ini.write_text(PYTEST_INI)
        run = run_pytest(work, private, limits, cuda=cuda, ini=ini)
        tampered = [
            f"{name} ({'deleted' if _digest(work / name) is None else 'changed'})"
            for name, digest in digests.items()
            if _digest(work / name) != digest
        ]
    finally:
        shutil.rmtree(base, ignore_errors=True)
        shutil.rmtree(private, ignore_errors=True)

    notes = []
    if run.supervisor_killed:
        notes.append(
            "the submission killed the grading supervisor (its parent process); tests kept running"
        )
    if run.survivors_killed:
        notes.append(
            f"{run.survivors_killed} process(es) left running by the submission were killed"
        )
    if tampered:
        msg = "the submission modified or deleted grader files during the run: " + ", ".join(
            tampered
        )
        return LabResult(
            student,
            lab,
            _zero(rubric, "tampered", msg, cuda),
            note="; ".join([msg, *notes]),
            log_tail=run.log_tail,
            wall=run.wall,
        )
    died = _death_note(run, limits)
    parsed = None
    if run.junit and not died:
        try:
            parsed = parse_junit(run.junit, rubric)
        except ET.ParseError:
            died = "pytest's JUnit report is unreadable"
    running = None
    if parsed is None:
        parsed, running, collecting = parse_progress(run.progress, rubric)
        if died and running is None and collecting:
            died += f" while collecting {Path(collecting).name}"
    if died:
        notes.insert(0, died)
    rows = score(rubric, parsed, cuda=cuda, died=died, running=running, file_mb=limits.file_size_mb)
    return LabResult(
        student, lab, rows, note="; ".join(notes), log_tail=run.log_tail, wall=run.wall
    )


# --------------------------------------------------------------------------- driver


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
    all_labs = [d for d in lab_dirs(Path(labs_dir)) if (d / "rubric.toml").is_file()]
    if wanted is not None:
        unknown = wanted - {d.name for d in all_labs}
        if unknown:
            raise ValueError(
                f"unknown lab(s) {sorted(unknown)}; labs with a rubric: {[d.name for d in all_labs]}"
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
) -> list[LabResult]:
    """Grade every submission against every lab; write reports to ``out_dir`` if given."""
    from .report import write_reports

    limits = limits or Limits()
    rubrics = load_rubrics(labs_dir, labs)
    if not rubrics:
        raise ValueError(f"no lab with a rubric.toml under {labs_dir}.")
    if cuda is None:
        cuda = detect_cuda()
    students = discover_submissions(submissions)
    workers = workers or max(1, (os.cpu_count() or 2) // 2)
    unpack_root = Path(tempfile.mkdtemp(prefix="shardlab-submissions-"))
    results: list[LabResult] = []
    try:
        jobs = []
        for student, path in students:
            if path.is_dir():
                jobs.extend((student, path, r, None) for r in rubrics)
                continue
            dest = unpack_root / student
            dest.mkdir()
            try:
                safe_extract(path, dest)
                jobs.extend((student, dest, r, None) for r in rubrics)
            except SubmissionError as exc:
                jobs.extend((student, dest, r, str(exc)) for r in rubrics)

        def work(job) -> LabResult:
            student, root, rubric, rejected = job
            if rejected:
                res = LabResult(
                    student, rubric.lab, _zero(rubric, "rejected", rejected, cuda), note=rejected
                )
            else:
                res = grade_lab(student, root, rubric, limits=limits, cuda=cuda)
            if progress is not None:
                progress(res)
            return res

        with ThreadPoolExecutor(max_workers=workers) as pool:
            results = list(pool.map(work, jobs))
    finally:
        shutil.rmtree(unpack_root, ignore_errors=True)
    if out_dir is not None:
        write_reports(results, Path(out_dir))
    return results
