"""Each job's result written durably as soon as it is known, so a crash keeps the grades.

``--out/_journal/<digest>.json`` holds one finished job (student, lab, rows, notes, the log
tail) and the fingerprint of what it was graded against (the rubric's points and collected
cases, CUDA or not, the instructor's files). It is written to a temporary name, flushed to disk (``fsync``) and
renamed, so a file in the journal is always complete. ``shardlab grade --resume`` with the
same ``--out`` reads the journal back, keeps the jobs whose fingerprint still matches, and
grades only the others; the reports are written once every job is done.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import secrets
import threading

from ._fs import TreeError, read_regular, write_new
from ._results import LabResult
from ._score import Row
from .rubric import Rubric, sandbox_files

JOURNAL = "_journal"
MAX_ENTRY_BYTES = 4 * 2**20
_O_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def fingerprint(rubric: Rubric, cuda: bool) -> str:
    """What a result was graded against: the rubric, its collected cases, CUDA or not, and
    the content of every instructor file the sandbox gets (a changed test regrades)."""
    cases = {k: [list(c) for c in rubric.expected(k)] for k in rubric.points}
    files = {
        name: hashlib.sha256(read_regular(path, 256 * 2**20)).hexdigest()
        for name, path in sandbox_files(rubric).items()
    }
    data = [rubric.lab, rubric.points, cases, bool(cuda), files]
    if rubric.outside:  # which tests the grader compares outside, and how
        data.append(rubric.outside)
    data = json.dumps(data, sort_keys=True)
    return hashlib.sha256(data.encode()).hexdigest()


def _name(student: str, lab: str) -> str:
    return hashlib.sha256(f"{student}\0{lab}".encode()).hexdigest()[:32] + ".json"


class Journal:
    """The ``_journal`` folder of an open ``--out`` (created if absent)."""

    def __init__(self, out_fd: int, marks: dict[str, str]):
        self.marks = marks  # lab -> fingerprint
        self.errors: list[str] = []
        self._lock = threading.Lock()
        with contextlib.suppress(FileExistsError):
            os.mkdir(JOURNAL, 0o755, dir_fd=out_fd)
        self.fd = os.open(JOURNAL, _O_DIR, dir_fd=out_fd)

    def close(self) -> None:
        os.close(self.fd)

    def record(self, res: LabResult) -> None:
        """Write one result durably (temporary file, fsync, rename, fsync of the folder)."""
        entry = {
            "version": 1,
            "mark": self.marks.get(res.lab, ""),
            "result": dataclasses.asdict(res),
        }
        data = json.dumps(entry).encode("utf-8")
        final = _name(res.student, res.lab)
        tmp = f".tmp-{secrets.token_hex(8)}"
        try:
            with self._lock:
                write_new(self.fd, tmp, data)
                fd = os.open(tmp, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=self.fd)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
                os.replace(tmp, final, src_dir_fd=self.fd, dst_dir_fd=self.fd)
                os.fsync(self.fd)
        except OSError as exc:
            self.errors.append(f"{res.student}/{res.lab}: {exc.strerror or exc}")

    def load(self, wanted: set[tuple[str, str]]) -> dict[tuple[str, str], LabResult]:
        """Finished results whose fingerprint matches, for the jobs in ``wanted``.

        Anything else in the folder (a temporary file of a crash, an entry of another rubric
        or of a student no longer there) is removed, so its job is graded again.
        """
        done: dict[tuple[str, str], LabResult] = {}
        for name in sorted(os.listdir(self.fd)):
            res = self._read(name)
            key = (res.student, res.lab) if res is not None else None
            if key is None or key not in wanted or name != _name(*key):
                with contextlib.suppress(OSError):
                    os.unlink(name, dir_fd=self.fd)
                continue
            done[key] = res
        return done

    def _read(self, name: str) -> LabResult | None:
        try:
            entry = json.loads(read_regular(name, MAX_ENTRY_BYTES, dir_fd=self.fd))
            raw = dict(entry["result"])
            if entry.get("version") != 1 or entry.get("mark") != self.marks.get(raw["lab"]):
                return None
            raw["rows"] = [Row(**row) for row in raw["rows"]]
            return LabResult(**raw)
        except (OSError, ValueError, KeyError, TypeError, TreeError):
            return None
