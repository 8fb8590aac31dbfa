"""Find the students' submissions and read the files each one handed in.

A submission is a sub-folder or a ``.zip`` of the submissions folder. Nothing in it is
trusted: the folder is walked with :func:`shardlab.grading._fs.walk` (no link followed,
depth, entry count and size bounded before anything is read); a zip is checked whole and
unpacked by :mod:`._zips` into a fresh folder just before its own job; :func:`collect`
then reads the rubric's ``submit`` files (regular files only, size-bounded).
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from ._fs import Entry, TreeError, read_in_tree, walk

# the zip checks, the error and the depth and name limits both readers share live in ._zips
# (re-exported here: callers import them from this module)
from ._zips import MAX_DEPTH as MAX_DEPTH
from ._zips import MAX_NAME as MAX_NAME
from ._zips import MAX_ZIP_ARCHIVE as MAX_ZIP_ARCHIVE
from ._zips import MAX_ZIP_BYTES as MAX_ZIP_BYTES
from ._zips import MAX_ZIP_DIRECTORY as MAX_ZIP_DIRECTORY
from ._zips import MAX_ZIP_MEMBERS as MAX_ZIP_MEMBERS
from ._zips import SubmissionError as SubmissionError
from ._zips import check_zip as check_zip
from ._zips import safe_extract as safe_extract

MAX_ENTRIES = 20_000  # files and folders in a submission folder
MAX_SUBMIT_BYTES = 2 * 2**20  # one graded file
MAX_STUDENT_NAME = 200  # bytes of a reported (escaped) name: a folder name in --out
RESERVED_NAMES = {"grades.csv", "summary.csv", "junit.xml"}  # report files in --out


@dataclass(frozen=True)
class Submission:
    student: str
    path: Path
    kind: str  # "dir" / "zip" / "bad"
    problem: str = ""  # why a "bad" submission is rejected


def student_name(name: str) -> str:
    """The name a submission entry is reported under: one to one, printable, a plain file name.

    Every character that is not printable, and ``/``, ``\\`` and ``%`` themselves, become
    ``%XX`` (UTF-8 bytes), so two different entries never get the same name and no terminal
    escape reaches a progress line or a report; "." and ".." become "%2E" and "%2E%2E".
    """

    def esc(c: str) -> str:
        if c.isprintable() and c not in "/\\%":
            return c
        return "".join(f"%{b:02X}" for b in c.encode("utf-8", "surrogateescape"))

    clean = "".join(esc(c) for c in name)
    if clean in (".", ".."):
        clean = clean.replace(".", "%2E")
    return clean or "%00"


def _shown(name: str) -> str:
    return ascii(name) if not name.isprintable() else repr(name)


def discover_submissions(submissions: Path) -> list[Submission]:
    """Every sub-folder and ``.zip`` of ``submissions`` (links are rejected, not followed).

    Every entry is reported under :func:`student_name` (one to one). A name longer than
    :data:`MAX_STUDENT_NAME` bytes once escaped, and two entries that would still share a
    name (``alice`` and ``alice.zip``; a folder named like a report file takes ``~2`` and
    meets one of that name), stop grading with a sentence naming both; no student is ever
    renamed silently.
    """
    submissions = Path(submissions)
    if not submissions.is_dir():
        raise SubmissionError(f"submissions folder {submissions} does not exist.")
    found: dict[str, Submission] = {}
    seen: dict[str, str] = {}
    for name in sorted(os.listdir(submissions)):
        if name.startswith((".", "_")):
            continue
        entry = submissions / name
        st = os.lstat(entry)
        student = name[:-4] if name.lower().endswith(".zip") else name
        if stat.S_ISLNK(st.st_mode):
            kind, problem = "bad", f"{name} is a symbolic link; submit a real folder or zip"
        elif stat.S_ISDIR(st.st_mode):
            kind, problem, student = "dir", "", name
        elif stat.S_ISREG(st.st_mode) and name.lower().endswith(".zip"):
            kind, problem = "zip", ""
        else:
            continue
        if student in seen:
            raise SubmissionError(
                f"student {_shown(student)} has both {_shown(seen[student])} and {_shown(name)} "
                f"in {submissions}; keep one."
            )
        seen[student] = name
        shown = student_name(student)
        if len(shown.encode()) > MAX_STUDENT_NAME:
            raise SubmissionError(
                f"{_shown(name)[:120]}... in {submissions} has a name longer than "
                f"{MAX_STUDENT_NAME} bytes once escaped; rename it."
            )
        if shown in RESERVED_NAMES:
            shown += "~2"  # a report file's name: its folder gets the suffix
        if shown in found:
            raise SubmissionError(
                f"{_shown(found[shown].path.name)} and {_shown(name)} in {submissions} would both "
                f"be reported as {shown!r}; rename one."
            )
        found[shown] = Submission(shown, entry, kind, problem)
    return [found[k] for k in sorted(found)]


def _listing(root: Path) -> list[Entry]:
    try:
        return walk(root, max_depth=MAX_DEPTH, max_entries=MAX_ENTRIES)
    except TreeError as exc:
        raise SubmissionError(f"the submission is too large: {exc}.") from None


def locate(entries: list[Entry], lab: str, filename: str) -> Entry | None:
    """Find a submitted file: ``<lab>/<file>``, ``<file>``, or the best match anywhere.

    Only regular files count; links (to files or folders) are never followed.
    """
    files = [e for e in entries if e.kind == "file" and e.rel[-1] == filename]
    for wanted in ((lab, filename), (filename,)):
        for e in files:
            if e.rel == wanted:
                return e
    files = [e for e in files if "__MACOSX" not in e.rel]
    if not files:
        return None
    return min(files, key=lambda e: (len(e.rel) < 2 or e.rel[-2] != lab, len(e.rel), e.rel))


def collect(root: Path, lab: str, names: tuple[str, ...]) -> tuple[dict[str, bytes], list[str]]:
    """({name: bytes} of the submit files found, [names missing]); SubmissionError if unsafe."""
    entries = _listing(root)
    found, missing = {}, []
    for name in names:
        entry = locate(entries, lab, name)
        if entry is None:
            odd = [e for e in entries if e.rel[-1] == name and e.kind == "other"]
            if odd:
                raise SubmissionError(
                    f"{'/'.join(odd[0].rel)[:200]} is not a regular file (a FIFO, socket or "
                    "device); submit the file itself."
                )
            missing.append(name)
            continue
        try:
            found[name] = read_in_tree(root, entry.rel, MAX_SUBMIT_BYTES)
        except TreeError as exc:
            raise SubmissionError(f"{'/'.join(entry.rel)[:200]}: {exc}.") from None
    return found, missing


# Compiles the source on stdin in a child process; prints one JSON line.
_SYNTAX_CHECK = r"""
import json, resource, sys
resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))
resource.setrlimit(resource.RLIMIT_CPU, (20, 25))
name = sys.argv[1]
data = sys.stdin.buffer.read()
try:
    compile(data, name, "exec", dont_inherit=True)
    out = {"ok": True}
except SyntaxError as exc:
    out = {"ok": False, "msg": f"{name} line {exc.lineno}: {exc.msg}"}
except BaseException as exc:
    out = {"ok": False, "msg": f"{name} cannot be compiled ({type(exc).__name__}: {str(exc)[:200]})"}
print(json.dumps(out))
"""


def check_syntax(name: str, data: bytes) -> str:
    """'' if ``data`` compiles, else a sentence (compiled in a child process, time-limited)."""
    try:
        proc = subprocess.run(
            [sys.executable, "-I", "-S", "-c", _SYNTAX_CHECK, name],
            input=data,
            capture_output=True,
            timeout=60,
        )
    except subprocess.TimeoutExpired:
        return f"{name} cannot be compiled (compiling took more than 60 s)"
    try:
        out = json.loads(proc.stdout.decode("utf-8", "replace").strip().splitlines()[-1])
    except (ValueError, IndexError):
        return f"{name} cannot be compiled (the compiler stopped with exit code {proc.returncode})"
    return "" if out.get("ok") else str(out.get("msg", f"{name} cannot be compiled"))
