"""Zip submissions: checked whole before anything is unpacked, then unpacked safely.

Before ``zipfile`` reads an archive, its size (:data:`MAX_ZIP_ARCHIVE`) and what its
end-of-central-directory record announces (members, size of the list of members) are
checked, so a zip listing millions of members is refused at no cost; then every member is
checked (count, declared and actual sizes, depth, absolute paths, '..', links) and
:func:`safe_extract` unpacks into a fresh folder without following or overwriting anything.
"""

from __future__ import annotations

import os
import re
import stat
import struct
import zipfile
from pathlib import Path

from ._fs import make_dirs, open_dir_nofollow

MAX_DEPTH = 32  # folders below a submission's top (a zip's members and a folder's walk)
MAX_NAME = 255  # bytes of one path component
MAX_ZIP_BYTES = 200 * 2**20  # unpacked
MAX_ZIP_ARCHIVE = 64 * 2**20  # the .zip file itself
MAX_ZIP_MEMBERS = 5000
MAX_ZIP_DIRECTORY = 2 * 2**20  # central directory: 5,000 members with 300-byte paths fit


class SubmissionError(ValueError):
    """A submission cannot be used (unsafe or oversized zip or folder, bad file)."""


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
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise SubmissionError(f"{archive.name} is not a regular file.")
        if st.st_size > MAX_ZIP_ARCHIVE:
            raise SubmissionError(
                f"{archive.name} is {st.st_size / 2**20:.0f} MB (limit {MAX_ZIP_ARCHIVE // 2**20} "
                "MB); submit only the lab's files."
            )
        _check_directory(fh, st.st_size, archive.name)
        return zipfile.ZipFile(fh)
    except (zipfile.BadZipFile, OSError, ValueError) as exc:
        fh.close()
        raise SubmissionError(f"{archive.name} is not a readable zip file ({exc}).") from None
    except SubmissionError:
        fh.close()
        raise


def _check_directory(fh, size: int, label: str) -> None:
    """Refuse a zip whose end-of-central-directory record announces more members or a larger
    central directory than allowed, before ``zipfile`` reads and lists it (2 M members cost
    it ~1 GB). The record is found as ``zipfile`` finds it (the last one in the final 64 kB);
    a ZIP64 record's counts are checked too."""
    tail_len = min(size, 22 + 65535)
    fh.seek(size - tail_len)
    tail = fh.read(tail_len)
    at = tail.rfind(b"PK\x05\x06")
    if at < 0 or len(tail) - at < 22:
        raise SubmissionError(f"{label} is not a readable zip file (no end of central directory).")
    entries, cd_size = struct.unpack("<HI", tail[at + 10 : at + 16])
    loc = at - 20
    if loc >= 0 and tail[loc : loc + 4] == b"PK\x06\x07":  # ZIP64 locator
        # zipfile reads the ZIP64 record right before the locator; the locator also names an
        # offset: check whatever is found at either place
        (offset,) = struct.unpack("<Q", tail[loc + 8 : loc + 16])
        base = size - tail_len
        found = False
        for pos in {base + loc - 56, offset}:
            if 0 <= pos and pos + 56 <= size:
                fh.seek(pos)
                record = fh.read(56)
                if record[:4] == b"PK\x06\x06":
                    n, cd = struct.unpack("<QQ", record[32:48])
                    entries, cd_size, found = max(entries, n), max(cd_size, cd), True
        if not found:
            raise SubmissionError(f"{label} is not a readable zip file (bad ZIP64 record).")
    fh.seek(0)
    if entries > MAX_ZIP_MEMBERS:
        raise SubmissionError(f"{label} has {entries} members (limit {MAX_ZIP_MEMBERS}).")
    if cd_size > MAX_ZIP_DIRECTORY:
        raise SubmissionError(
            f"{label}: its list of members takes {cd_size} bytes (limit {MAX_ZIP_DIRECTORY})."
        )


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
