"""Helpers shared by the launcher tests: count processes a launch may have left behind."""

from __future__ import annotations

import time

import psutil


def marked_processes(marker: str) -> list[psutil.Process]:
    """Processes (of any parent) whose environment carries SHARDLAB_TEST_MARKER=marker."""
    found = []
    for p in psutil.process_iter(["pid"]):
        try:
            if p.environ().get("SHARDLAB_TEST_MARKER") == marker:
                found.append(p)
        except (psutil.Error, OSError):
            continue
    return found


def descendants() -> list[psutil.Process]:
    """Live descendants of this process, except the launcher's zygote: it imports torch once
    and forks the ranks of every launch, so it outlives them by design (it exits with this
    process; tests/test_dist_zygote.py checks that). The ranks it forked are still counted."""
    from shardlab.runtime import _zygote

    keep = _zygote.pid()
    return [p for p in psutil.Process().children(recursive=True) if p.pid != keep and _alive(p)]


def _alive(p: psutil.Process) -> bool:
    try:
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def assert_no_survivors(marker: str, settle: float = 2.0) -> None:
    deadline = time.monotonic() + settle
    while True:
        left = descendants() + marked_processes(marker)
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert not left, f"processes survived the launch: {[(p.pid, p.name()) for p in left]}"
