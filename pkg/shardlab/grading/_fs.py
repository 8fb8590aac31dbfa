"""File-system access to untrusted trees: bounded, link-free, non-recursive.

Everything the grader reads from a submission, and every tree it deletes, goes through here:

* :func:`walk` lists a tree without following any symbolic link, one directory at a time
  (opened relative to its parent with ``O_NOFOLLOW``), with bounds on depth, number of
  entries and total size checked *before* anything is read. No recursion, so depth cannot
  overflow Python's stack.
* :func:`read_regular` opens a file without following links and without blocking (a FIFO or
  device is refused, never waited on), checks with ``fstat`` that it is a regular file under
  the size limit, and only then reads it.
* :func:`remove_tree` deletes a tree iteratively (a stack of names, one open directory at a
  time, ``unlinkat``/``rmdir`` relative to that directory), so neither depth nor links matter.
* :func:`write_new` creates a regular file that did not exist (``O_EXCL | O_NOFOLLOW``),
  relative to an open directory, so nothing is ever written through a planted link.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class TreeError(ValueError):
    """A tree breaks a bound, or a file is not what it must be."""


@dataclass(frozen=True)
class Entry:
    rel: tuple[str, ...]  # path components below the root
    kind: str  # "file" / "dir" / "link" / "other"
    size: int


def _open_dir(name: str | os.PathLike, dir_fd: int | None = None) -> int:
    return os.open(name, _DIR_FLAGS, dir_fd=dir_fd)


def _kind(mode: int) -> str:
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISDIR(mode):
        return "dir"
    return "link" if stat.S_ISLNK(mode) else "other"


def open_dir_nofollow(root: Path) -> int:
    """Open ``root`` as a directory; its last component must not be a link."""
    try:
        return _open_dir(root)
    except OSError as exc:
        raise TreeError(
            f"{root} is not a directory (or is a symbolic link): {exc.strerror}"
        ) from None


def walk(
    root: Path, *, max_depth: int = 32, max_entries: int = 20_000, max_bytes: int | None = None
) -> list[Entry]:
    """Every entry under ``root`` (links reported, never followed); raises TreeError past a bound.

    Directories deeper than ``max_depth`` are listed but not entered.
    """
    entries: list[Entry] = []
    total = 0
    root_fd = open_dir_nofollow(root)
    stack: list[tuple[str, ...]] = [()]  # names only: one folder open at a time
    try:
        while stack:
            rel = stack.pop()
            try:
                fd = _descend(root_fd, rel)
            except OSError:
                continue  # replaced by something else meanwhile: not entered
            try:
                with os.scandir(fd) as it:
                    names = sorted(e.name for e in it)
                for name in names:
                    if len(entries) >= max_entries:
                        raise TreeError(f"more than {max_entries} files and folders")
                    st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                    kind = _kind(st.st_mode)
                    size = st.st_size if kind == "file" else 0
                    total += size
                    if max_bytes is not None and total > max_bytes:
                        raise TreeError(f"more than {max_bytes // 2**20} MB in all")
                    entries.append(Entry((*rel, name), kind, size))
                    if kind == "dir" and len(rel) + 1 < max_depth:
                        stack.append((*rel, name))
            finally:
                os.close(fd)
    finally:
        os.close(root_fd)
    return entries


def _descend(root_fd: int, parts: tuple[str, ...]) -> int:
    """Open root/parts... as a directory, no component followed if it is a link; new fd."""
    fd = os.dup(root_fd)
    for part in parts:
        try:
            nxt = _open_dir(part, fd)
        finally:
            os.close(fd)
        fd = nxt
    return fd


def read_regular(path: Path, max_bytes: int, *, dir_fd: int | None = None) -> bytes:
    """Bytes of a regular file: no link followed (last component), no FIFO waited on, size bounded."""
    try:
        fd = os.open(
            path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd
        )
    except OSError as exc:
        raise TreeError(f"{Path(path).name} cannot be opened ({exc.strerror})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise TreeError(f"{Path(path).name} is not a regular file")
        if st.st_size > max_bytes:
            raise TreeError(
                f"{Path(path).name} is {st.st_size / 2**20:.1f} MB (limit {max_bytes / 2**20:g} MB)"
            )
        chunks, left = [], max_bytes + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        data = b"".join(chunks)
        if len(data) > max_bytes:
            raise TreeError(f"{Path(path).name} grew past {max_bytes / 2**20:g} MB while read")
        return data
    finally:
        os.close(fd)


def read_in_tree(root: Path, rel: tuple[str, ...], max_bytes: int) -> bytes:
    """Read ``root/rel...`` opening every folder on the way with ``O_NOFOLLOW``."""
    root_fd = open_dir_nofollow(root)
    try:
        fd = _descend(root_fd, rel[:-1])
    except OSError as exc:
        raise TreeError(
            f"{'/'.join(rel)}: a folder on the way is missing or a link ({exc.strerror})"
        ) from None
    finally:
        os.close(root_fd)
    try:
        return read_regular(Path(rel[-1]), max_bytes, dir_fd=fd)
    finally:
        os.close(fd)


def write_new(dir_fd: int, name: str, data: bytes, mode: int = 0o644) -> None:
    """Create ``name`` in the open directory: must not exist (no link is ever followed)."""
    fd = os.open(
        name,
        os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
        mode,
        dir_fd=dir_fd,
    )
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)


def make_dirs(dir_fd: int, parts: tuple[str, ...]) -> int:
    """Create (or enter) ``parts`` below an open directory without following links; new fd."""
    fd = os.dup(dir_fd)
    for part in parts:
        try:
            os.mkdir(part, 0o755, dir_fd=fd)
        except FileExistsError:
            pass
        try:
            nxt = _open_dir(part, fd)
        finally:
            os.close(fd)
        fd = nxt
    return fd


def remove_tree(root: Path, *, max_entries: int = 2_000_000) -> None:
    """Delete ``root`` and everything below it: iterative, link-free, any depth.

    Only the name stack grows with depth; one directory is open at a time and parents are
    re-entered through ``..``. Raises TreeError past ``max_entries`` (the rest stays).
    """
    root = Path(root)
    try:
        st = os.lstat(root)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(st.st_mode):
        os.unlink(root)
        return
    fd = open_dir_nofollow(root)
    names: list[str] = []
    removed = 0
    try:
        while True:
            with os.scandir(fd) as it:
                listing = [e.name for e in it]
            subdir = None
            for name in listing:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                removed += 1
                if removed > max_entries:
                    raise TreeError(f"{root} holds more than {max_entries} entries; not removed")
                if stat.S_ISDIR(st.st_mode):
                    subdir = name
                    break
                os.unlink(name, dir_fd=fd)
            if subdir is not None:
                nxt = _open_dir(subdir, fd)
                os.close(fd)
                fd, removed = nxt, removed - 1  # counted again when removed
                names.append(subdir)
                continue
            if not names:
                break
            parent = os.open("..", _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = parent
            os.rmdir(names.pop(), dir_fd=fd)
            removed += 1
    finally:
        os.close(fd)
    os.rmdir(root)
