"""The result of grading one lab of one student, shared by the grader and the report writers.

(Its own module so that ``grade`` can import ``report`` and ``report`` can name the type
without the two importing each other.)
"""

from __future__ import annotations

from dataclasses import dataclass

from ._score import Row


@dataclass
class LabResult:
    student: str
    lab: str
    rows: list[Row]
    note: str = ""  # lab-level explanation for the instructor (timeout, crash, tampering...)
    log_tail: str = ""
    wall: float = 0.0
    feedback_note: str | None = None  # what the student sees instead of ``note`` (None: same)

    @property
    def points(self) -> float:
        return sum(r.points for r in self.rows)

    @property
    def max_points(self) -> float:
        return sum(r.max_points for r in self.rows)
