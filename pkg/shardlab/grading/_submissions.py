"""Find the students' submissions and read the files each one handed in.

A submission is a sub-folder or a ``.zip`` of the submissions folder. Nothing in it is
trusted: the folder is walked with :func:`shardlab.grading._fs.walk` (no link followed,
depth, entry count and size bounded before anything is read); a zip is checked whole
(member count, declared and actual sizes, depth, absolute paths, '..', links) and unpacked
with :func:`safe_extract` into a fresh folder just before its own job; :func:`collect`
then reads the rubric's ``submit`` files (regular files only, size-bounded).
"""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

from ._fs import Entry, TreeError, make_dirs, open_dir_nofollow, read_in_tree, walk

MAX_ZIP_BYTES = 200 * 2**20
MAX_ZIP_MEMBERS = 5000
MAX_DEPTH = 32  # folders below a submission's top
MAX_ENTRIES = 20_000  # files and folders in a submission folder
MAX_SUBMIT_BYTES = 2 * 2**20  # one graded file
MAX_NAME = 255
RESERVED_NAMES = {"grades.csv", "summary.csv", "junit.xml"}  # report files in --out


class SubmissionError(ValueError):
    """A submission cannot be used (unsafe or oversized zip or folder, bad file)."""


@dataclass(frozen=True)
class Submission:
    student: str
    path: Path
    kind: str  # "dir" / "zip" / "bad"
    problem: str = ""  # why a "bad" submission is rejected


def _student_name(name: str, taken: set[str]) -> str:
    clean = "".join(c if c.isprintable() and c not in "/\\" else "_" for c in name)[:100]
    clean = clean if clean not in ("", ".", "..") else "_"
    base, n = clean, 2
    while clean in taken:
        clean, n = f"{base}~{n}", n + 1
    return clean


def discover_submissions(submissions: Path) -> list[Submission]:
    """Every sub-folder and ``.zip`` of ``submissions`` (links are rejected, not followed)."""
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
                f"student {student!r} has both {seen[student]!r} and {name!r} in {submissions}; "
                "keep one."
            )
        seen[student] = name
        shown = _student_name(student, set(found) | RESERVED_NAMES)
        found[shown] = Submission(shown, entry, kind, problem)
    return [found[k] for k in sorted(found)]


def _parts(name: str) -> list[str]:
    return [p for p in name.replace("\\", "/").split("/") if p not in ("", ".")]


def check_zip(archive: Path) -> None:
    """Raise SubmissionError unless the zip is safe to unpack (nothing is written)."""
    with _open_zip(archive) as zf:
        _checked_members(zf, archive.name)


def _open_zip(archive: Path) -> zipfile.ZipFile:
    try:
        fd = os.open(archive, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise SubmissionError(f"{archive.name} cannot be opened ({exc.strerror}).") from None
    fh = os.fdopen(fd, "rb")
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise SubmissionError(f"{archive.name} is not a regular file.")
        return zipfile.ZipFile(fh)
    except (zipfile.BadZipFile, OSError, ValueError) as exc:
        fh.close()
        raise SubmissionError(f"{archive.name} is not a readable zip file ({exc}).") from None
    except SubmissionError:
        fh.close()
        raise


def _checked_members(zf: zipfile.ZipFile, label: str) -> list[tuple[zipfile.ZipInfo, list[str]]]:
    infos = zf.infolist()
    if len(infos) > MAX_ZIP_MEMBERS:
        raise SubmissionError(f"{label} has {len(infos)} members (limit {MAX_ZIP_MEMBERS}).")
    total, out, names = 0, [], set()
    for info in infos:
        name = info.filename.replace("\\", "/")
        parts = _parts(name)
        if name.startswith("/") or re.match(r"^[A-Za-z]:", name) or ".." in parts:
            raise SubmissionError(
                f"{label}: member {info.filename[:200]!r} has an absolute path or '..'; "
                "zip the folder again from inside it."
            )
        if stat.S_ISLNK(info.external_attr >> 16):
            raise SubmissionError(f"{label}: member {info.filename[:200]!r} is a symbolic link.")
        if len(parts) > MAX_DEPTH + 1 or any(len(p.encode()) > MAX_NAME for p in parts):
            raise SubmissionError(
                f"{label}: member {info.filename[:80]!r}... is {len(parts)} folders deep "
                f"(limit {MAX_DEPTH}) or has an over-long name."
            )
        if any("\x00" in p for p in parts):
            raise SubmissionError(f"{label}: member name with a NUL byte.")
        total += info.file_size
        if total > MAX_ZIP_BYTES:
            raise SubmissionError(f"{label} unpacks to more than {MAX_ZIP_BYTES // 2**20} MB.")
        if parts and not info.is_dir():
            key = "/".join(parts)
            if key in names:
                raise SubmissionError(f"{label}: member {key[:200]!r} appears twice.")
            names.add(key)
            out.append((info, parts))
    return out


def safe_extract(archive: Path, dest: Path) -> None:
    """Unpack a checked zip into the existing empty folder ``dest`` (no link, no overwrite)."""
    with _open_zip(archive) as zf:
        members = _checked_members(zf, archive.name)
        dest_fd = open_dir_nofollow(dest)
        written = 0
        try:
            for info, parts in members:
                try:
                    dir_fd = make_dirs(dest_fd, tuple(parts[:-1]))
                except OSError as exc:
                    raise SubmissionError(
                        f"{archive.name}: cannot create the folders of {'/'.join(parts)[:200]!r} "
                        f"({exc.strerror}; a file and a folder with the same name?)."
                    ) from None
                try:
                    fd = os.open(
                        parts[-1],
                        os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                        0o644,
                        dir_fd=dir_fd,
                    )
                except OSError as exc:
                    raise SubmissionError(
                        f"{archive.name}: cannot write {'/'.join(parts)[:200]!r} ({exc.strerror})."
                    ) from None
                finally:
                    os.close(dir_fd)
                try:
                    with zf.open(info) as src:
                        left = info.file_size + 1  # a member may lie about its size
                        while chunk := src.read(min(1 << 20, left)):
                            written += len(chunk)
                            left -= len(chunk)
                            if left <= 0 or written > MAX_ZIP_BYTES:
                                raise SubmissionError(
                                    f"{archive.name}: member {'/'.join(parts)[:200]!r} unpacks "
                                    "to more than its declared size."
                                )
                            os.write(fd, chunk)
                except (zipfile.BadZipFile, OSError, ValueError, EOFError) as exc:
                    if isinstance(exc, SubmissionError):
                        raise
                    raise SubmissionError(f"{archive.name} is damaged ({exc}).") from None
                finally:
                    os.close(fd)
        finally:
            os.close(dest_fd)


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
