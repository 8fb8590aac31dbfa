"""Labs 01-09 are guided walkthroughs: a missing function fails its own section, by name.

Fast: :mod:`shardlab.walkthrough` (stubs, require, once) on small module files; then each
released lab notebook (``shardlab release`` into a temporary folder: the stubs a student
gets) executed with errors allowed. Every error must be ``NotWrittenYet`` (no
``NameError`` cascade), every stub of the lab's modules must be named with its hint by an
exercise cell, and every measured section must say ``implement ... first``. These run
without a single launch (the guards stop before any rank starts): ~5 s per notebook.

SLOW (``make test-slow``): the released notebook with the reference modules dropped in
runs without an error; and with the reference minus one function, exactly that exercise
and the sections after it fail, naming that function.
"""

from __future__ import annotations

import re
import shutil
import sys
import textwrap

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

import nbformat
import pytest
from grading_fixtures.helpers import REPO_LABS
from shardlab import walkthrough as wt
from shardlab.grading import release
from shardlab.grading.release import find_blocks

pytestmark = pytest.mark.skipif(not REPO_LABS.is_dir(), reason="no labs/ folder")


def _walkthroughs():
    """Each lab declares its walkthrough in its rubric (an instructor file, not released):

    [walkthrough]
    modules = ["ddp.py"]                               # the modules its exercises cover
    one_missing = ["ddp.py", "DDP._launch", "Exercise 4"]  # a late function, its exercise
    """
    out = {}
    for lab_dir in sorted(REPO_LABS.glob("[0-9][0-9]_*")):
        rubric = lab_dir / "rubric.toml"
        if rubric.is_file():
            table = tomllib.loads(rubric.read_text()).get("walkthrough")
            if table:
                out[lab_dir.name] = (tuple(table["modules"]), tuple(table["one_missing"]))
    return out


WALKTHROUGHS = _walkthroughs()
# lab folder -> the modules its walkthrough covers
LABS = {lab: modules for lab, (modules, _) in WALKTHROUGHS.items()}
# for the one-missing-function run: a function late in the lab, and the exercise it belongs to
ONE_MISSING = {lab: one for lab, (_, one) in WALKTHROUGHS.items()}
MEASURED_HEADING = "# Measured against predicted"


def test_every_lab_with_a_notebook_is_a_walkthrough():
    """Issue 16: labs 02-04 were reshaped and new labs follow the same shape."""
    notebooks = {p.parent.name for p in REPO_LABS.glob("[0-9][0-9]_*/lab.ipynb")}
    missing = sorted(notebooks - set(WALKTHROUGHS))
    assert not missing, f"labs without a [walkthrough] table in rubric.toml: {missing}"
    for lab, (modules, (name, qualname, exercise)) in WALKTHROUGHS.items():
        assert modules and all((REPO_LABS / lab / m).is_file() for m in modules), lab
        assert name in modules and qualname in wt.functions(REPO_LABS / lab / name), lab
        assert re.fullmatch(r"Exercise \d+", exercise), (lab, exercise)


# ----------------------------------------------------------------------- the helper


SAMPLE = textwrap.dedent(
    """
    def given():
        return 1

    def todo(x):
        raise NotImplementedError("add one to x")

    class Box:
        def run(self):
            raise NotImplementedError("first part")
            raise NotImplementedError("second part")

        def done(self):
            def inner():
                raise NotImplementedError("not a stub of done")
            return inner
    """
)


def test_stubs_and_require(tmp_path):
    mod = tmp_path / "sample.py"
    mod.write_text(SAMPLE)
    found = [(s.qualname, s.hint) for s in wt.stubs(mod)]
    assert found == [
        ("todo", "add one to x"),
        ("Box.run", "first part"),
        ("Box.run", "second part"),
        ("Box.done.inner", "not a stub of done"),
    ]
    assert "Box.done" in wt.functions(mod) and "given" in wt.functions(mod)
    wt.require((mod, "given"), (mod, "Box.done"))  # written: no error
    with pytest.raises(wt.NotWrittenYet) as err:
        wt.require((mod, "Box.run", "second"), what="Exercise 9")
    msg = str(err.value)
    assert msg == "Exercise 9: implement Box.run first (sample.py line 11): second part."
    with pytest.raises(wt.NotWrittenYet, match=r"implement these first:\n  - todo .*add one"):
        wt.require(mod)
    with pytest.raises(ValueError, match="defines no function 'Box.nope'"):
        wt.require((mod, "Box.nope"))
    assert err.value._render_traceback_() == [f"NotWrittenYet: {msg}"]  # no traceback shown


def test_once_reruns_when_a_file_changes(tmp_path):
    mod = tmp_path / "m.py"
    mod.write_text("x = 1\n")
    calls = []

    def work(v):
        calls.append(v)
        if v == "bad":
            raise RuntimeError("boom")
        return v * 2

    assert wt.once(work, 3, depends=(mod,)) == 6
    assert wt.once(work, 3, depends=(mod,)) == 6 and calls == [3]
    mod.write_text("x = 2\n")
    assert wt.once(work, 3, depends=(mod,)) == 6 and calls == [3, 3]
    for _ in range(2):  # a failure is remembered, not rerun
        with pytest.raises(RuntimeError, match="boom"):
            wt.once(work, "bad", depends=(mod,))
    assert calls == [3, 3, "bad"]


def test_pytest_failure_names_the_test_first(tmp_path, monkeypatch):
    """Issue 27: a failing public test's report began mid-sentence (its last 3000 characters)."""
    (tmp_path / "test_sample.py").write_text(
        "def test_long():\n    print('x' * 5000)\n    assert 1 == 2, 'the ring sent 3 chunks'\n"
        "def test_ok():\n    pass\n"
    )
    monkeypatch.chdir(tmp_path)
    with pytest.raises(AssertionError) as err:
        wt.pytest("test_sample.py", "long or ok")
    lines = str(err.value).splitlines()
    assert lines[0] == "public tests `long or ok` of test_sample.py failed:"
    assert lines[1].startswith("FAILED test_sample.py::test_long - AssertionError: the ring sent")
    assert lines[3] == "...", lines[:5]  # the rest starts at a line, not inside one


# ----------------------------------------------------------------------- released notebooks


def _execute(path):
    """Run a notebook in its folder with errors allowed (the repository's executor)."""
    sys.path.insert(0, str(REPO_LABS.parent / "tools"))
    try:
        from execute_notebooks import execute
    finally:
        sys.path.pop(0)
    execute(path, timeout=600, allow_errors=True)
    return nbformat.read(path, as_version=4)


def _errors(nb):
    """(cell index, ename, evalue) of every error output."""
    return [
        (i, o.ename, o.evalue)
        for i, c in enumerate(nb.cells)
        if c.cell_type == "code"
        for o in c.outputs
        if o.output_type == "error"
    ]


def _measured_start(nb):
    return next(i for i, c in enumerate(nb.cells) if c.source.startswith(MEASURED_HEADING))


@pytest.fixture(scope="module")
def released(tmp_path_factory):
    out = tmp_path_factory.mktemp("student") / "labs"
    release(REPO_LABS, out)
    return out


@pytest.mark.parametrize("lab", sorted(LABS))
def test_released_stub_notebook_fails_part_by_part(released, lab):
    nb = _execute(released / lab / "lab.ipynb")
    errors = _errors(nb)
    assert errors, f"{lab}: the stub notebook ran without an error"
    bad = [(i, e, v[:200]) for i, e, v in errors if e != "NotWrittenYet"]
    assert not bad, f"{lab}: errors other than a named missing function (a cascade): {bad}"
    start = _measured_start(nb)
    exercise_msgs = [v for i, _, v in errors if i < start]
    assert all(v.startswith("Exercise ") for v in exercise_msgs), exercise_msgs
    # every stub a student gets is named, with its hint, by its own exercise's guard (the
    # first cell that names it), not only by a later cell that runs it too
    for name in LABS[lab]:
        for stub in wt.stubs(released / lab / name):
            where = f"{name} line {stub.line}): {stub.hint}"
            naming = [v for _, _, v in errors if stub.qualname in v and where in v]
            assert naming, f"{lab}: no cell names {stub.qualname} with its hint {stub.hint!r}"
            section = naming[0].split(":")[0]
            assert section.startswith("Exercise ") and " also " not in section, (stub, naming[0])
    # every code cell of the measured sections that reads the run says what is missing
    measured = [
        i
        for i, c in enumerate(nb.cells)
        if i > start and c.cell_type == "code" and "wt.require" in c.source + _guarded(nb, c)
    ]
    assert measured, f"{lab}: no guarded measured section"
    by_cell = {i: v for i, _, v in errors}
    for i in measured:
        assert i in by_cell and "implement" in by_cell[i] and "first" in by_cell[i], (lab, i)
    # nothing ran, so nothing may read as a result: no verdict over an empty set of cases
    verdicts = [(i, m.group(0)) for i, c in enumerate(nb.cells) if c.cell_type == "code"
                for o in c.outputs if o.output_type == "stream"
                for m in VERDICT_RE.finditer(o.text)]
    assert not verdicts, f"{lab}: the stub notebook prints verdicts: {verdicts[:5]}"


# a verdict word or mark (shardlab.verdict's, or a printed boolean); "'dropout': True" in a
# printed dict is a value, not a verdict
VERDICT_RE = re.compile(r"✓|✗|[^'\"]: (?:True|False)\b|\bpassed\b|\bbitwise\b|\bulps\b|\bok$",
                        re.M)


def _guarded(nb, cell):
    """Lab 04's measured cells call report(), whose guard lives in the first cell."""
    return "wt.require" if "report()" in cell.source else ""


# ----------------------------------------------------------------------- slow: drop-ins


def _reference_into(released, lab):
    """Every module of the lab that holds a solution (later sections may use more than LABS),
    and the other labs' modules its rubric's ``[needs]`` names (lab 09 runs labs 04-06's)."""
    for path in sorted((REPO_LABS / lab).glob("*.py")):
        if find_blocks(path.read_text(), str(path)):
            shutil.copyfile(path, released / lab / path.name)
    needs = tomllib.loads((REPO_LABS / lab / "rubric.toml").read_text()).get("needs", {})
    for other, names in needs.items():
        for name in names:
            shutil.copyfile(REPO_LABS / other / name, released / other / name)


def _strip_one(source, qualname, filename, tmp_path):
    """The reference with only the solution blocks inside ``qualname`` replaced by stubs."""
    from shardlab.grading.release import strip_solutions

    blocks = sorted(find_blocks(source, filename), key=lambda b: b.begin)
    stripped = tmp_path / f"stripped_{filename}"
    stripped.write_text(strip_solutions(source, filename))
    owners = [s.qualname for s in wt.stubs(stripped)]  # one stub per block, in file order
    assert len(owners) == len(blocks)
    chosen = {b.begin for b, owner in zip(blocks, owners) if owner == qualname}
    assert chosen, f"{filename} has no solution block in {qualname}"
    return strip_solutions(source, filename, only=chosen)


@pytest.mark.slow
@pytest.mark.parametrize("lab", sorted(LABS))
def test_released_notebook_with_reference_runs_clean(tmp_path, lab):
    out = tmp_path / "labs"
    release(REPO_LABS, out)
    _reference_into(out, lab)
    nb = _execute(out / lab / "lab.ipynb")
    assert _errors(nb) == [], [(i, e, v[:300]) for i, e, v in _errors(nb)]


@pytest.mark.slow
@pytest.mark.parametrize("lab", sorted(ONE_MISSING))
def test_one_missing_function_fails_only_its_sections(tmp_path, lab):
    name, qualname, exercise = ONE_MISSING[lab]
    out = tmp_path / "labs"
    release(REPO_LABS, out)
    _reference_into(out, lab)
    target = out / lab / name
    target.write_text(_strip_one(target.read_text(), qualname, name, tmp_path))
    nb = _execute(out / lab / "lab.ipynb")
    errors = _errors(nb)
    assert all(e == "NotWrittenYet" for _, e, _ in errors), errors
    assert all(qualname in v for _, _, v in errors), errors  # nothing else is reported missing
    start = _measured_start(nb)
    before = [v for i, _, v in errors if i < start]
    assert before and before[0].startswith(f"{exercise}:"), before  # its own section fails first
    cells_before = [i for i, c in enumerate(nb.cells) if i < start and c.cell_type == "code"]
    first_bad = min(i for i, _, _ in errors)
    passed = [i for i in cells_before if i < first_bad]
    assert len(passed) >= 3, "the exercises before it must run and pass"
    assert any(i > start for i, _, _ in errors), "the measured sections must name it too"
