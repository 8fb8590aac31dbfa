"""How long the whole class will take: a first guess at start, then a live estimate.

At start: ``N jobs (S students x L labs), W at a time; ≈ T min at ~20 s per job (a first
guess: revised as jobs finish)``. Then, from the rate actually seen (jobs finished per
second of wall clock since the start, so it includes the effect of ``--workers`` and of the
machine's load): on a terminal, a progress bar redrawn in place on stderr (cleared before
each result line the caller prints, redrawn after); otherwise plain lines, one every 10 % of
the jobs or every 30 s, whichever comes first. Only counts and times are printed, never a
student's name.
"""

from __future__ import annotations

import sys
import threading
import time

# Seconds per job of the first guess, before any job has finished: about the slowest lab's
# job on a quiet 2-core machine with --workers 1 (lab 05, ~20 s; lab 01 takes ~13 s).
FIRST_GUESS_S = 20.0
PLAIN_EVERY_S = 30.0
BAR = 24


def _minutes(seconds: float) -> str:
    if seconds < 90:
        return f"{max(seconds, 1):.0f} s"
    return f"{seconds / 60:.0f} min" if seconds >= 600 else f"{seconds / 60:.1f} min"


class Estimate:
    """Counts finished jobs and prints the estimate to ``stream`` (None: prints nothing)."""

    def __init__(self, total: int, workers: int, stream=None, *, students: int = 0, labs: int = 0):
        self.total, self.workers, self.stream = total, max(1, workers), stream
        self.done = 0
        self.start = time.monotonic()
        self.tty = bool(stream is not None and getattr(stream, "isatty", lambda: False)())
        self._last_plain = self.start
        self._last_decile = 0
        self._drawn = False
        self._lock = threading.Lock()
        self.students, self.labs = students, labs

    # -- the numbers
    def first_guess(self) -> float:
        return self.total * FIRST_GUESS_S / min(self.workers, max(1, self.total))

    def remaining(self, now: float | None = None) -> float | None:
        """Seconds left at the rate seen so far; None before the first job finished."""
        if self.done == 0:
            return None
        elapsed = (now if now is not None else time.monotonic()) - self.start
        return (self.total - self.done) * elapsed / self.done

    def start_line(self) -> str:
        shape = f" ({self.students} students x {self.labs} labs)" if self.students else ""
        return (
            f"{self.total} jobs{shape}, {self.workers} at a time; ≈ "
            f"{_minutes(self.first_guess())} at ~{FIRST_GUESS_S:.0f} s per job (a first guess: "
            "revised as jobs finish)"
        )

    def status_line(self, now: float | None = None) -> str:
        now = now if now is not None else time.monotonic()
        left = self.remaining(now)
        eta = "estimating" if left is None else f"≈ {_minutes(left)} left at the current rate"
        return f"{self.done}/{self.total} jobs, {_minutes(now - self.start)} elapsed, {eta}"

    # -- printing
    def _write(self, text: str) -> None:
        if self.stream is None:
            return
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):
            self.stream = None

    def _bar(self) -> str:
        filled = BAR * self.done // max(1, self.total)
        return f"\r\x1b[K[{'#' * filled}{'.' * (BAR - filled)}] {self.status_line()}"

    def begin(self) -> None:
        self._write(self.start_line() + "\n")
        if self.tty:
            self._write(self._bar())
            self._drawn = True

    def clear(self) -> None:
        """Before the caller prints a line: take the bar off the terminal."""
        with self._lock:
            if self.tty and self._drawn:
                self._write("\r\x1b[K")
                self._drawn = False

    def finished_one(self) -> None:
        with self._lock:
            self.done += 1
            now = time.monotonic()
            if self.tty:
                self._write(self._bar())
                self._drawn = True
                return
            decile = 10 * self.done // max(1, self.total)
            if self.done < self.total and (
                decile > self._last_decile or now - self._last_plain >= PLAIN_EVERY_S
            ):
                self._last_decile, self._last_plain = decile, now
                self._write(self.status_line(now) + "\n")

    def tick(self) -> None:
        """Called about every 0.1 s by the job loop: redraw the bar once a second."""
        if (
            self.tty
            and self._drawn
            and int(time.monotonic() - self.start) != getattr(self, "_second", -1)
        ):
            with self._lock:
                self._second = int(time.monotonic() - self.start)
                self._write(self._bar())

    def end(self) -> None:
        with self._lock:
            if self.tty and self._drawn:
                self._write("\r\x1b[K")
            took = time.monotonic() - self.start
            self._write(f"{self.done}/{self.total} jobs in {_minutes(took)}\n")


def stream_for(progress) -> object | None:
    """Where the estimate goes: stderr when the caller shows progress (the CLI), else nowhere."""
    return sys.stderr if progress is not None else None
