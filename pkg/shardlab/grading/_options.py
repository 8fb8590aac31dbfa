"""Check the grading options before anything runs: one sentence per mistake, never a class
graded 0 because of a typo (``--timeout 0`` used to fail every test of every student).
"""

from __future__ import annotations

import math
import os
import stat
from pathlib import Path

from ._journal import JOURNAL

# (option, attribute of Limits, smallest allowed, largest allowed, integer)
_LIMITS = (
    ("--timeout", "timeout", 1.0, 7 * 86400.0, False),
    ("--max-procs", "max_procs", 1, 100_000, True),
    ("--max-rss-gb", "max_rss_gb", 0.01, 1e6, False),
    ("--file-mb", "file_size_mb", 1.0, 1e7, False),
    ("--tmp-mb", "tmp_mb", 1.0, 1e7, False),
)
MAX_WORKERS = 1024


def default_workers() -> int:
    """``--workers`` when not given: half the cores this process may run on (its CPU set, so a
    container limited to 4 of 64 cores gets 2), at least 1. Each job starts a lab's ranks (2 to
    4 processes), so half the cores keeps the ranks of two jobs from sharing one core."""
    from shardlab.runtime._rank_env import _cores

    return max(1, _cores() // 2)


def _number(option: str, value, low: float, high: float, integer: bool) -> str:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return f"{option} must be a number, got {value!r}."
    if not math.isfinite(value):
        return f"{option} must be a finite number, got {value!r}."
    if integer and value != int(value):
        return f"{option} must be a whole number, got {value!r}."
    if not low <= value <= high:
        return f"{option} must be between {low:g} and {high:g}, got {value:g}."
    return ""


def limits_problem(limits, workers: int | None = None) -> str:
    """'' if the limits and the worker count are usable, else a sentence naming the option."""
    for option, attr, low, high, integer in _LIMITS:
        problem = _number(option, getattr(limits, attr), low, high, integer)
        if problem:
            return problem
    if limits.address_space_gb is not None:
        problem = _number("--as-gb", limits.address_space_gb, 0.1, 1e6, False)
        if problem:
            return problem.replace("got", "or 0 for no limit; got", 1)
    if limits.cpu_seconds is not None:
        problem = _number("cpu_seconds", limits.cpu_seconds, 1, 10**9, True)
        if problem:
            return problem
    if workers is not None:
        problem = _number("--workers", workers, 1, MAX_WORKERS, True)
        if problem:
            return problem
    return ""


def as_gb_problem(value) -> str:
    """``--as-gb``: 0 (no limit) or a positive finite number of GB."""
    if isinstance(value, int | float) and not isinstance(value, bool) and value == 0:
        return ""
    problem = _number("--as-gb", value, 0.1, 1e6, False)
    return problem.replace("got", "or 0 for no limit; got", 1) if problem else ""


def out_problem(out_dir: Path, submissions: Path) -> str:
    """--out must not lie inside the submissions folder (the next run would grade it)."""
    out = Path(os.path.abspath(out_dir))
    subs = Path(os.path.abspath(submissions))
    for candidate in {out, out.resolve()} if out.exists() else {out}:
        for real_subs in {subs, subs.resolve()}:
            if candidate == real_subs or real_subs in candidate.parents:
                return (
                    f"--out {out_dir} is inside the submissions folder {submissions}; the next "
                    "run would grade it as a student. Give a folder outside it."
                )
    # a new folder under a link into the submissions: resolve its existing parent
    parent = next((p for p in out.parents if p.exists()), None)
    if parent is not None:
        real = parent.resolve()
        if real == subs.resolve() or subs.resolve() in real.parents:
            return (
                f"--out {out_dir} is inside the submissions folder {submissions}; the next run "
                "would grade it as a student. Give a folder outside it."
            )
    return ""


def out_entries_problem(out_dir: Path, entries: set[str], resume: bool) -> str:
    """'' if an existing --out holding ``entries`` may take the reports, else a sentence:
    reports are never written over files, and ``--resume`` needs exactly a journal."""
    if resume:
        if entries - {JOURNAL}:
            return (
                f"--out {out_dir} holds more than the _journal of an interrupted run (its "
                "reports are written, or it is another folder); nothing to resume there."
            )
        return ""
    if "grades.csv" in entries:
        return (
            f"--out {out_dir} holds the reports of an earlier run; give a new or empty folder "
            "(reports are never written over existing files)."
        )
    if entries:
        return (
            f"--out {out_dir} is not empty; give a new or empty folder (reports are never "
            "written over existing files), or --resume to finish an interrupted run there."
        )
    return ""


def out_dir_problem(out_dir: Path, *, resume: bool = False) -> str:
    """'' if the reports can go into ``out_dir``, else a sentence; creates nothing.

    Checked before the rubrics are collected (minutes on the real labs): a folder that is
    not empty or cannot be written must not be found out only when the reports are due.
    ``report.prepare_out`` (which creates the folder, still before the collection) is the
    check that counts; this one says what it would refuse without touching the disk, so a
    refused run leaves no folder behind. Root passes every permission check, so a pseudo
    file system such as /proc is caught only by prepare_out's mkdir.
    """
    out_dir = Path(out_dir)
    try:
        st = os.lstat(out_dir)
    except (FileNotFoundError, NotADirectoryError):  # NotADirectory: a file on the way
        return _creatable_problem(out_dir)
    except OSError as exc:
        return f"--out {out_dir} cannot be used: {(exc.strerror or str(exc)).lower()}."
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        return f"--out {out_dir} exists and is not a folder (or is a symbolic link)."
    if not os.access(out_dir, os.W_OK | os.X_OK):
        return f"--out {out_dir} is a folder you cannot write in; give another one."
    try:
        entries = set(os.listdir(out_dir))
    except OSError as exc:
        return f"--out {out_dir} cannot be read: {(exc.strerror or str(exc)).lower()}."
    return out_entries_problem(out_dir, entries, resume)


def _creatable_problem(out_dir: Path) -> str:
    """A missing --out: its nearest existing ancestor must be a folder this user can write."""
    for parent in Path(os.path.abspath(out_dir)).parents:
        try:
            st = os.stat(parent)
        except FileNotFoundError:
            continue
        except OSError as exc:
            return f"--out {out_dir} cannot be created: {(exc.strerror or str(exc)).lower()}."
        if not stat.S_ISDIR(st.st_mode):
            return f"--out {out_dir} cannot be created: {parent} is not a folder."
        if not os.access(parent, os.W_OK | os.X_OK):
            return f"--out {out_dir} cannot be created: you cannot write in {parent}."
        return ""
    return ""
