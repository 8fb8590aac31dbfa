"""Instructor tools: the student release and the autograder.

* :func:`release` (``shardlab release``) — student copy of every lab: solutions replaced by
  ``NotImplementedError`` stubs, hidden tests and rubric removed, student-output cells cleared.
* :func:`grade` (``shardlab grade``) — run public + hidden tests on every submission inside
  a bubblewrap sandbox (read-only system, private tmpfs, no network, own PID namespace; see
  :mod:`.sandbox` and :mod:`._bwrap`) and write grades.csv, summary.csv, junit.xml and
  Gradescope results.json.
* :func:`load_rubric` — read and validate ``labs/NN_topic/rubric.toml``.

Importing this package imports neither torch nor pytest (the sandbox runs them).
"""

from __future__ import annotations

from ._driver import grade
from .grade import LabResult, Row, SubmissionError, grade_lab
from .release import ReleaseError, release, strip_solutions
from .report import write_reports
from .rubric import Rubric, RubricError, load_rubric
from .sandbox import Limits

# The submodules ``release`` and ``grade`` share their names with these functions; the
# imports above make ``shardlab.grading.release`` / ``.grade`` the functions.
__all__ = [
    "LabResult",
    "Limits",
    "ReleaseError",
    "Row",
    "Rubric",
    "RubricError",
    "SubmissionError",
    "grade",
    "grade_lab",
    "load_rubric",
    "release",
    "strip_solutions",
    "write_reports",
]
