"""Comparisons moved out of the student's process (issue 24, "Forgery from inside pytest").

Fixture lab ``outside_labs/03_toyvalues``: its tests record what they computed
(``shardlab.grading.outside.record``) and the rubric's ``[outside]`` table names them; the
grader compares the values with the reference solution's, in its own process. Graded in the
sandbox: the reference scores 100 %, the stub 0; a submission that computes wrong values and
patches ``torch.equal`` or pytest's ``Function.runtest`` (every instructor test "passes") now
loses every point compared outside; one that writes a malformed or oversized value stream is
refused with a sentence. The rest are fast unit tests of the encoding and the comparison.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from grading_fixtures.helpers import FIXTURES, rows_by_test, shared_result, write_tree
from shardlab.grading import Limits, RubricError, grade, load_rubric
from shardlab.grading import _values as V
from shardlab.grading.outside import RecordError, encode, record
from shardlab.grading.release import strip_solutions

LABS = FIXTURES / "outside_labs"
LAB = "03_toyvalues"
OUTSIDE = [
    "test_vecops.py::test_double",
    "test_vecops.py::test_halves",
    "test_vecops.py::test_nbytes",
    "test_vecops_hidden.py::test_sent_bytes",
]
NOT_OUTSIDE = "test_vecops.py::test_halves_not_outside"

_WRONG = """
def double(t):
    return t * 3


def halves(xs):
    return [x / 2 + (1e-3 if len(xs) > 1 else 0.0) for x in xs]


def nbytes(t):
    return 41


def sent_per_rank(v, d):
    return [0] * d
"""
# every comparison of torch and of the lab's helper passes; == on ints cannot be patched
PATCH_EQUAL = (
    """
import torch
import _helpers_vecops

torch.equal = lambda a, b: True
_helpers_vecops.same = lambda *a, **k: True
"""
    + _WRONG
)
# pytest itself: every test of the instructor's files passes, the planted test is spared
FORCE_PASS = (
    """
import _pytest.python as _pp

_orig = _pp.Function.runtest


def _runtest(self):
    try:
        _orig(self)
    except BaseException:
        if "test_vecops" not in str(self.path):
            raise


_pp.Function.runtest = _runtest
"""
    + _WRONG
)
_WRITE = """
import os

_pid, _fd = os.environ.get("SHARDLAB_OUTSIDE", "0:-1").split(":")
if os.environ.get("SHARDLAB_OUTSIDE") and str(os.getpid()) == _pid:
    os.write(int(_fd), {payload})
"""
MALFORMED = _WRITE.format(payload='b"this is not json\\n"')
OVERSIZED = _WRITE.format(payload='b"x" * (33 * 2**20)')


def _grade(folder: Path):
    ref = (LABS / LAB / "vecops.py").read_text()
    stub = strip_solutions(ref, "vecops.py")
    subs = folder / "subs"
    write_tree(subs / "reference", {"vecops.py": ref})
    write_tree(subs / "stub", {"vecops.py": stub})
    write_tree(subs / "patch_equal", {"vecops.py": PATCH_EQUAL})
    write_tree(subs / "force_pass", {"vecops.py": FORCE_PASS})
    write_tree(subs / "malformed", {"vecops.py": MALFORMED + ref})
    write_tree(subs / "oversized", {"vecops.py": OVERSIZED + ref})
    return grade(LABS, subs, None, labs=[LAB], workers=2, limits=Limits(timeout=120), cuda=False)


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    return shared_result(tmp_path_factory, "outside_graded", _grade)


def test_reference_full_stub_zero(graded):
    ref, rows = rows_by_test(graded, "reference", LAB)
    assert ref.points == ref.max_points == 6, [vars(r) for r in ref.rows]
    stub, rows = rows_by_test(graded, "stub", LAB)
    assert stub.points == 0 and stub.max_points == 6
    assert all(r.status == "failed" for r in rows.values())


@pytest.mark.parametrize("student", ["patch_equal", "force_pass"])
def test_forged_passes_lose_the_points_compared_outside(graded, student):
    res, rows = rows_by_test(graded, student, LAB)
    # in the sandbox every test passed (the forgery works there) ...
    assert rows[NOT_OUTSIDE].status == "passed"
    # ... but no point compared outside survives: those that passed in the sandbox fail
    # with the grader's sentence (an int's == cannot be patched: those fail in the sandbox)
    forged = OUTSIDE if student == "force_pass" else OUTSIDE[:2]
    for key in OUTSIDE:
        row = rows[key]
        assert row.points == 0 and row.status == "failed", vars(row)
        if key in forged:
            assert "compared by the grader outside the sandbox" in row.feedback
            assert "differs from the reference" in row.feedback, row.feedback
    assert res.points == 1
    assert "bit for bit" in rows["test_vecops.py::test_double"].feedback
    assert "(tolerance close)" in rows["test_vecops.py::test_halves"].feedback


@pytest.mark.parametrize(
    "student, said",
    [("malformed", "is not JSON"), ("oversized", "exceed 32 MB")],
)
def test_bad_value_streams_are_refused(graded, student, said):
    res, rows = rows_by_test(graded, student, LAB)
    assert rows[NOT_OUTSIDE].points == 1  # its own tests still ran, correctly
    for key in OUTSIDE:
        assert rows[key].points == 0 and rows[key].status == "failed"
        assert "the values the tests recorded were refused" in rows[key].feedback
        assert said in rows[key].feedback, rows[key].feedback
    assert res.points == 1


# ------------------------------------------------------------------ fast: no sandbox


def _stream(*records) -> bytes:
    return b"".join(json.dumps(r).encode() + b"\n" for r in records)


def test_encoding_round_trip_and_tolerances():
    torch = pytest.importorskip("torch")
    x = torch.tensor([1.0, -0.5, float("nan")], dtype=torch.float32)
    for dtype in (torch.float32, torch.float64, torch.bfloat16, torch.int64, torch.bool):
        t = x.nan_to_num().to(dtype) if dtype in (torch.int64, torch.bool) else x.to(dtype)
        rec = {"test": "t.py::a", "name": "v", "value": encode({"t": t, "n": [3, 2.5, None]})}
        got = V.parse_values(_stream(rec))["t.py::a"]["v"]
        assert got["t"].dtype == str(dtype)[6:] and got["t"].shape == (3,)
        assert got["n"] == [3, 2.5, None]
        assert V.difference(got, got, "exact") == ""
    a = V.parse_values(_stream({"test": "t", "name": "v", "value": encode(x)}))["t"]["v"]
    b = V.parse_values(_stream({"test": "t", "name": "v", "value": encode(x + 1e-7)}))["t"]["v"]
    assert "bit for bit" in V.difference(b, a, "exact")
    assert V.difference(b, a, "close") == "" and V.difference(b, a, "ulps:8") == ""
    assert "beyond the tolerance" in V.difference(b, a, "ulps:0")
    assert "beyond the tolerance" in V.difference(b, a, "close:0,1e-9")
    assert V.difference(41, 40, "close") and V.difference([1], [1, 2], "exact")
    assert V.difference(True, 1, "exact")  # a bool is not an int


@pytest.mark.parametrize(
    "data, said",
    [
        (b"{not json}\n", "not JSON"),
        (_stream({"test": "t", "name": "v"}), "not {test, name, value}"),
        (_stream({"test": "t", "name": "v", "value": {"pickle": "x"}}), "unknown kind"),
        (
            _stream(
                {
                    "test": "t",
                    "name": "v",
                    "value": {"tensor": "float32", "shape": [4], "data": "AAAA"},
                }
            ),
            "does not have the size",
        ),
        (
            _stream(
                {"test": "t", "name": "v", "value": {"tensor": "object", "shape": [1], "data": ""}}
            ),
            "unsupported dtype",
        ),
        (_stream(*[{"test": "t", "name": "v", "value": 1}] * 2), "recorded twice"),
        (b"x" * (V.MAX_BYTES + 1), "exceed 32 MB"),
        (_stream({"test": "t", "name": "v", "value": [[[[[[[[1]]]]]]]]}), "nests deeper"),
    ],
)
def test_malformed_streams_are_refused_with_a_sentence(data, said):
    with pytest.raises(V.ValuesError, match=said):
        V.parse_values(data)


def test_record_outside_the_grader_only_encodes(monkeypatch):
    monkeypatch.delenv("SHARDLAB_OUTSIDE", raising=False)
    record("fine", [1, 2.0, "three"])
    with pytest.raises(RecordError, match="recorded twice"):
        record("fine", 1)
    with pytest.raises(RecordError, match="cannot hand a object"):
        record("other", object())
    monkeypatch.setenv("SHARDLAB_OUTSIDE", "1:9")  # another process's descriptor
    with pytest.raises(RecordError, match="test process only"):
        record("in a rank", 1)


def test_rubric_outside_table_is_checked(tmp_path):
    lab = tmp_path / LAB
    write_tree(lab, {p.name: p.read_text() for p in (LABS / LAB).iterdir() if p.is_file()})
    write_tree(
        lab,
        {"hidden/test_vecops_hidden.py": (LABS / LAB / "hidden/test_vecops_hidden.py").read_text()},
    )
    text = (LABS / LAB / "rubric.toml").read_text()
    (lab / "rubric.toml").write_text(text + '"test_vecops.py::test_nope" = "exact"\n')
    with pytest.raises(RubricError, match="is not a test of \\[points\\]"):
        load_rubric(lab)
    (lab / "rubric.toml").write_text(text.replace('"close"', '"roughly"'))
    with pytest.raises(RubricError, match="is not a tolerance"):
        load_rubric(lab)
