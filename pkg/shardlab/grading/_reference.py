"""The reference solution's recorded values, once per grading run (:func:`with_reference`).

Split from :mod:`._outside` so that the import order is one way: :mod:`.grade` uses
:mod:`._outside` to compare, this module uses :mod:`.grade` to run the reference, and the
batch (:mod:`._jobs`) calls this module before any student is graded.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from ._fs import read_regular
from ._outside import by_case
from ._values import ValuesError
from .grade import _result, run_job
from .rubric import Rubric, RubricError


def with_reference(rubric: Rubric, *, limits, cuda: bool, tmp_root=None, bwrap=None, package=None):
    """The rubric with the values its reference solution records (once per grading run)."""
    if not rubric.outside or rubric.reference is not None:
        return rubric
    found = {name: read_regular(Path(rubric.lab_dir) / name, 2 * 2**20) for name in rubric.submit}
    run, tampered, canary = run_job(
        rubric, found, limits=limits, cuda=cuda, tmp_root=tmp_root, bwrap=bwrap, package=package
    )
    res = _result("(reference)", rubric, run, tampered, limits, cuda, None, canary)
    where = f"{rubric.lab}: the reference solution"
    try:
        values = by_case(rubric, run.values)
    except ValuesError as exc:
        raise RubricError(
            f"{where} records values the grader refuses ({exc}); fix the lab."
        ) from None
    rows = {row.test: row for row in res.rows}
    for key in rubric.outside:
        row = rows[key]
        if row.status == "needs GPU":
            continue
        if row.status != "passed":
            raise RubricError(
                f"{where} does not pass {key} ({row.status}: {row.message[:300]}); fix the lab."
            )
        for case, gpu in rubric.expected(key):
            if (cuda or not gpu) and not values.get((key, case)):
                label = f"{key}[{case}]" if case else key
                raise RubricError(
                    f"{where} records no value in {label}, which [outside] names; the test "
                    "must call shardlab.grading.outside.record."
                )
    return dataclasses.replace(rubric, reference=values)
