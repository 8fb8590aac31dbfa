"""The grader on the repository's real labs (labs/NN_*).

* fast: every lab releases cleanly (valid Python, no hidden test, no solution line) and every
  rubric validates;
* SLOW (minutes on 2 cores: it runs each lab's multi-process tests three times):
  ``test_real_lab_grading`` (marked ``slow``: ``make test-slow``) grades the reference solution (100 %), the released stub
  (0 apart from the tests listed in ``STUB_PASSES``) and the planted bug of
  ``tests/grading_fixtures/planted_bugs/<lab>.py`` (loses exactly the points of ``LOST``);
  ``test_real_lab_grading_extra_bug`` grades each further planted bug of a lab,
  ``planted_bugs/<lab>--<name>.py`` (a part of the lab the first bug does not reach, e.g. HSDP),
  on the planted submission only (the reference and the stub are graded once, above).
"""

from __future__ import annotations

import ast

import pytest
from grading_fixtures.helpers import FIXTURES, REPO_LABS, load_py, rows_by_test, write_tree
from shardlab.grading import Limits, grade, load_rubric, release
from shardlab.grading.release import lab_dirs, solution_lines, strip_solutions

LABS = [d.name for d in lab_dirs(REPO_LABS)] if REPO_LABS.is_dir() else []
pytestmark = pytest.mark.skipif(not LABS, reason="no labs/ folder")


def test_real_labs_release_and_rubrics(tmp_path):
    out = tmp_path / "student"
    release(REPO_LABS, out)
    texts = {p.relative_to(out).as_posix(): p.read_text() for p in out.rglob("*") if p.is_file()}
    assert not any("/hidden/" in n or n.endswith("rubric.toml") for n in texts)
    for name, text in texts.items():
        if name.endswith(".py"):
            ast.parse(text, filename=name)
    for lab in LABS:
        lab_dir = REPO_LABS / lab
        if (lab_dir / "rubric.toml").is_file():
            rubric = load_rubric(lab_dir)
            assert all((lab_dir / f).is_file() for f in rubric.submit)
        for hidden in (lab_dir / "hidden").glob("*.py"):
            assert f"{lab}/{hidden.name}" not in texts
        # a solution line leaks if the lab's release contains it although no instructor file
        # of the lab has it outside a solution block (other labs may share code on purpose)
        solution, outside = set(), []
        for module in sorted(lab_dir.glob("*.py")):
            sol = solution_lines(module.read_text(), str(module))
            solution |= {ln.strip() for ln in sol if len(ln.strip()) >= 12}
            outside.append(strip_solutions(module.read_text(), str(module)))
        outside_text = "\n".join(outside)
        mine = {n: t for n, t in texts.items() if n.startswith(lab + "/")}
        leaks = [
            (n, ln) for ln in solution if ln not in outside_text for n, t in mine.items() if ln in t
        ]
        assert not leaks


def _planted(lab):
    path = FIXTURES / "planted_bugs" / f"{lab}.py"
    return load_py(path) if path.is_file() else None


@pytest.mark.slow
@pytest.mark.parametrize("lab", [lab for lab in LABS if _planted(lab) is not None])
def test_real_lab_grading(lab, tmp_path):
    bug = _planted(lab)
    if bug.LOST is None:
        pytest.skip(f"planted_bugs/{lab}.py: LOST not measured yet")
    rubric = load_rubric(REPO_LABS / lab)
    ref = (REPO_LABS / lab / bug.FILE).read_text()
    assert ref.count(bug.OLD) == 1, f"planted bug of {lab} no longer matches {bug.FILE}"
    released = tmp_path / "released"
    release(REPO_LABS, released)
    subs = tmp_path / "subs"
    others = {f: (REPO_LABS / lab / f).read_text() for f in rubric.submit if f != bug.FILE}
    write_tree(subs / "reference", {bug.FILE: ref, **others})
    write_tree(subs / "planted", {bug.FILE: ref.replace(bug.OLD, bug.NEW), **others})
    write_tree(subs / "stub", {f: (released / lab / f).read_text() for f in rubric.submit})
    results = grade(
        REPO_LABS,
        subs,
        tmp_path / "out",
        labs=[lab],
        workers=2,
        limits=Limits(timeout=600),
        cuda=False,
    )

    res, rows = rows_by_test(results, "reference", lab)
    assert res.points == res.max_points, [vars(r) for r in res.rows if r.status != "passed"]
    res, rows = rows_by_test(results, "stub", lab)
    assert {k for k, r in rows.items() if r.points > 0} == bug.STUB_PASSES
    assert any("NotImplementedError: " in r.message for r in rows.values())
    res, rows = rows_by_test(results, "planted", lab)
    assert {k for k, r in rows.items() if r.points < r.max_points} == bug.LOST
    assert all(rows[k].points == 0 for k in bug.LOST)


EXTRA_BUGS = sorted(p.stem for p in (FIXTURES / "planted_bugs").glob("*--*.py"))


@pytest.mark.slow
@pytest.mark.parametrize("name", EXTRA_BUGS)
def test_real_lab_grading_extra_bug(name, tmp_path):
    lab = name.split("--")[0]
    assert lab in LABS, f"planted_bugs/{name}.py names no lab"
    bug = load_py(FIXTURES / "planted_bugs" / f"{name}.py")
    rubric = load_rubric(REPO_LABS / lab)
    ref = (REPO_LABS / lab / bug.FILE).read_text()
    assert ref.count(bug.OLD) == 1, f"planted bug {name} no longer matches {bug.FILE}"
    others = {f: (REPO_LABS / lab / f).read_text() for f in rubric.submit if f != bug.FILE}
    subs = tmp_path / "subs"
    write_tree(subs / "planted", {bug.FILE: ref.replace(bug.OLD, bug.NEW), **others})
    results = grade(
        REPO_LABS, subs, tmp_path / "out", labs=[lab], workers=2,
        limits=Limits(timeout=600), cuda=False,
    )
    res, rows = rows_by_test(results, "planted", lab)
    lost = {k for k, r in rows.items() if r.points < r.max_points}
    assert bug.LOST is not None, f"planted_bugs/{name}.py: LOST not measured yet; lost {sorted(lost)}"
    assert lost == bug.LOST
    assert all(rows[k].points == 0 for k in bug.LOST)
