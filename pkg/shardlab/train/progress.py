"""The per-step progress bar of ``shardlab train`` (rank 0's steps).

Rank 0 calls :meth:`StepProgress.update` after every step. Under ``torchrun`` it draws on
stderr itself; under the launcher (whose ranks' output is captured) it appends one line per
step to a file that :func:`follow` in the launching process reads and draws. On a terminal
the bar redraws in place (``\\r``); otherwise (a pipe, a CI log, a Slurm output file) every
step is one plain line.
"""

from __future__ import annotations

import os
import sys
import threading
import time

WIDTH = 30


def render(done: int, total: int, loss: float | None, seconds: float, tty: bool) -> str:
    """One progress line (no newline) for step ``done`` of ``total``."""
    lo = "loss -" if loss is None else f"loss {loss:.4f}"
    text = f"step {done}/{total}  {lo}  {seconds * 1e3:.1f} ms"
    if not tty:
        return text
    fill = int(round(WIDTH * done / total))
    return f"\r[{'#' * fill}{'-' * (WIDTH - fill)}] {text}"


class StepProgress:
    """Rank 0's progress: lines into ``path``, or drawn on ``stream`` (default stderr)."""

    def __init__(self, total: int, path: str | None = None, stream=None) -> None:
        self.total, self.path = total, path
        self.stream = stream if stream is not None or path else sys.stderr
        self.tty = bool(self.stream is not None and getattr(self.stream, "isatty", bool)())

    def update(self, done: int, loss: float | None, seconds: float) -> None:
        if self.path:
            with open(self.path, "a") as f:
                f.write(f"{done} {self.total} {loss!r} {seconds!r}\n")
            return
        end = "" if self.tty else "\n"
        self.stream.write(render(done, self.total, loss, seconds, self.tty) + end)
        self.stream.flush()

    def close(self) -> None:
        if not self.path and self.tty:
            self.stream.write("\n")
            self.stream.flush()


def follow(path: str, stop: threading.Event, stream=None) -> None:
    """Draw the steps rank 0 appends to ``path`` on ``stream`` until ``stop`` is set (run in
    a thread of the launching process)."""
    stream = stream or sys.stderr
    tty = stream.isatty()
    seen, drew = 0, False
    while True:
        finished = stop.is_set()
        lines = []
        if os.path.exists(path):
            with open(path) as f:
                lines = f.read().splitlines()
        for line in lines[seen:]:
            parts = line.split()
            if len(parts) != 4:
                break  # a line being written: read it next time
            done, total = int(parts[0]), int(parts[1])
            loss = None if parts[2] == "None" else float(parts[2])
            stream.write(render(done, total, loss, float(parts[3]), tty) + ("" if tty else "\n"))
            stream.flush()
            seen, drew = seen + 1, True
        if finished:
            if tty and drew:
                stream.write("\n")
                stream.flush()
            return
        time.sleep(0.1)
