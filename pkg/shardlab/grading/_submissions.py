"""Find the students' submissions and the files each one handed in.

A submission is a sub-folder or a ``.zip`` of the submissions folder; zips are unpacked with
:func:`safe_extract` (no absolute paths, no '..', no links, size and member limits), and
:func:`locate` finds a rubric ``submit`` file in it.
"""

from __future__ import annotations

import re
import shutil
import stat
import zipfile
from pathlib import Path

MAX_ZIP_BYTES = 200 * 2**20
MAX_ZIP_MEMBERS = 5000


class SubmissionError(ValueError):
    """A submission cannot be unpacked (unsafe or oversized zip)."""


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
