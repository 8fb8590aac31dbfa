"""Comparisons of produced values made by the grader, outside the student's process.

For every rubric test named in the rubric's ``[outside]`` table (key = tolerance):

1. :func:`with_reference` runs the lab's tests once per grading run on the *reference*
   solution (the instructor's ``submit`` files, in the same sandbox and environment as the
   students, trusted code only) and keeps the values its tests recorded
   (:mod:`.outside`): ``{(rubric key, case id): {name: value}}``. Every graded case of an
   ``[outside]`` test must pass there and record at least one value, else grading stops with
   a sentence (the lab is broken, not the student).
2. :func:`check_outside` then, for one student, keeps a case "passed" only if the test passed
   in the sandbox *and* it recorded exactly the reference's names with values equal to the
   reference's within the tolerance (:func:`._values.difference`, computed here, in the
   grader process). A missing, extra or different value, or a stream that is oversized or
   malformed, makes the case fail with one sentence of the grader's own (outcome
   :data:`WRONG`): it names only the reference's value names, never student text or numbers.

So patching the comparisons inside the sandbox (``torch.equal``, the lab's helpers, pytest
itself) no longer passes such a test: the values have to be right. The values are still
*produced* in the student's process, so a submission that produces right values by other
means (PyTorch's own collective instead of the ring, a tracer patched to report the model's
byte count) still passes; ``book/instructors.md`` says which checks are which, per lab.
"""

from __future__ import annotations

from ._junit import _Case, _nodeid_key, _Parsed
from ._values import ValuesError, difference, parse_values
from .rubric import Rubric

WRONG = "wrong values"  # outcome of a case whose values the grader refused
_PREFIX = "compared by the grader outside the sandbox: "


def by_case(rubric: Rubric, data: bytes | None) -> dict[tuple[str, str], dict[str, object]]:
    """{(rubric key, case id): {name: value}} of the ``[outside]`` tests; ValuesError if unreadable."""
    out: dict[tuple[str, str], dict[str, object]] = {}
    for nodeid, values in parse_values(data).items():
        key, case = _nodeid_key(nodeid)
        if key in rubric.outside:
            out.setdefault((key, case), {}).update(values)
    return out


def _case_problem(got: dict[str, object], ref: dict[str, object], tol: str) -> str:
    missing = [name for name in ref if name not in got]
    if missing:
        return f"{_PREFIX}the test recorded no value {missing[0]!r} (the reference solution does)"
    if set(got) - set(ref):
        return f"{_PREFIX}the test recorded values that the reference solution does not"
    for name, want in ref.items():
        diff = difference(got[name], want, tol)
        if diff:
            return f"{_PREFIX}value {name!r} {diff} (tolerance {tol})"
    return ""


def check_outside(rubric: Rubric, parsed: _Parsed, data: bytes | None) -> _Parsed:
    """``parsed`` with every passed case of an ``[outside]`` test checked against the
    reference's values (see the module docstring); other cases are unchanged."""
    if not rubric.outside or rubric.reference is None:
        return parsed
    try:
        got, refused = by_case(rubric, data), ""
    except ValuesError as exc:
        got, refused = {}, f"{_PREFIX}the values the tests recorded were refused ({exc})"
    out = _Parsed(dict(parsed.cases), dict(parsed.collect_errors), parsed.source)
    for key, tol in rubric.outside.items():
        cases = []
        for c in parsed.cases.get(key, []):
            ref = rubric.reference.get((key, c.case))
            if c.outcome == "passed" and ref is not None:
                problem = refused or _case_problem(got.get((key, c.case), {}), ref, tol)
                if problem:
                    c = _Case(c.case, WRONG, problem)
            cases.append(c)
        if key in out.cases:
            out.cases[key] = cases
    return out
