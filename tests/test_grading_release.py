"""shardlab release: stubs, markers, hidden tests, notebooks, determinism (fixture labs)."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import zipfile

import pytest
from grading_fixtures.helpers import FIXTURE_LABS
from shardlab.grading.release import (
    ReleaseError,
    find_blocks,
    release,
    solution_lines,
    strip_notebook,
    strip_solutions,
)

SRC = '''def f(x):
    """Doc."""
    # BEGIN SOLUTION hint: double it
    y = 2 * x
    return y
    # END SOLUTION


def g(xs):
    out = []
    for x in xs:
        # BEGIN SOLUTION hint: keep "positive" ones
        if x > 0:
            out.append(x)
        # END SOLUTION
    return out
'''


def test_stub_replaces_block_at_marker_indent():
    out = strip_solutions(SRC, "m.py")
    ast.parse(out)
    assert '    raise NotImplementedError("double it")\n' in out
    assert '        raise NotImplementedError("keep \\"positive\\" ones")\n' in out
    assert "2 * x" not in out and "out.append(x)" not in out
    assert '"""Doc."""' in out and "return out" in out
    ns: dict = {}
    exec(compile(out, "m.py", "exec"), ns)
    with pytest.raises(NotImplementedError, match="double it"):
        ns["f"](1)


def test_missing_hint_gets_default():
    src = "def f():\n    # BEGIN SOLUTION\n    return 1\n    # END SOLUTION\n"
    assert "NotImplementedError(" in strip_solutions(src)
    assert find_blocks(src)[0].hint


@pytest.mark.parametrize(
    "src, where",
    [
        ("def f():\n    # BEGIN SOLUTION hint: a\n    return 1\n", "m.py:2"),
        ("def f():\n    return 1\n    # END SOLUTION\n", "m.py:3"),
        (
            "def f():\n    # BEGIN SOLUTION hint: a\n    # BEGIN SOLUTION hint: b\n"
            "    return 1\n    # END SOLUTION\n",
            "m.py:3",
        ),
    ],
)
def test_unbalanced_markers_name_file_and_line(src, where):
    with pytest.raises(ReleaseError, match=where):
        strip_solutions(src, "m.py")


def test_stub_that_is_not_python_is_refused():
    src = "def f():\n# BEGIN SOLUTION hint: a\n    return 1\n# END SOLUTION\n    x = 1\n"
    with pytest.raises(ReleaseError, match=r"m\.py:\d+: the released stub is not valid Python"):
        strip_solutions(src, "m.py")


def test_notebook_student_output_cells_cleared():
    nb = json.loads((FIXTURE_LABS / "01_toy" / "lab.ipynb").read_text())
    out = json.loads(strip_notebook(json.dumps(nb)))
    for before, after in zip(nb["cells"], out["cells"]):
        if "student-output" in before.get("metadata", {}).get("tags", []):
            assert after["outputs"] == [] and after["execution_count"] is None
        else:
            assert after == before


def _all_text(root):
    texts = {}
    for p in sorted(root.rglob("*")):
        if p.is_file() and p.suffix == ".zip":
            with zipfile.ZipFile(p) as zf:
                for n in zf.namelist():
                    texts[f"{p.name}!{n}"] = zf.read(n).decode()
        elif p.is_file():
            texts[str(p.relative_to(root))] = p.read_text()
    return texts


def test_release_has_no_hidden_tests_no_solutions_no_rubric(tmp_path):
    out = tmp_path / "student"
    release(FIXTURE_LABS, out, zip_labs=True)
    texts = _all_text(out)
    names = set(texts)
    assert "01_toy/gradetoy.py" in names and "01_toy/test_gradetoy.py" in names
    assert "01_toy/_helpers_gradetoy.py" in names and "01_toy/lab.ipynb" in names
    assert not any("hidden" in n or "rubric" in n for n in names)
    forbidden = []
    for lab in ("01_toy", "02_toydist"):
        public = "\n".join(p.read_text() for p in (FIXTURE_LABS / lab).glob("*.py"))
        for hidden in (FIXTURE_LABS / lab / "hidden").glob("*"):
            # every hidden line that the instructor's public files do not also contain
            lines = [ln.strip() for ln in hidden.read_text().splitlines() if ln.strip()]
            forbidden += [ln for ln in lines if ln not in public]
            assert not any(t == hidden.read_text() for t in texts.values())
        for module in (FIXTURE_LABS / lab).glob("*.py"):
            forbidden += [ln.strip() for ln in solution_lines(module.read_text()) if ln.strip()]
    assert 'HIDDEN_SENTINEL = "hidden-test-text-that-must-never-ship"' in forbidden
    assert "return total / len(xs)" in forbidden
    leaks = [(n, line) for line in forbidden for n, t in texts.items() if line in t]
    assert not leaks
    for n, t in texts.items():
        if n.endswith(".py"):
            ast.parse(t, filename=n)


def test_release_is_deterministic(tmp_path):
    a = release(FIXTURE_LABS, tmp_path / "a", zip_labs=True)
    b = release(FIXTURE_LABS, tmp_path / "b", zip_labs=True)
    assert a == b
    for z in ("01_toy.zip", "02_toydist.zip"):
        assert (tmp_path / "a" / z).read_bytes() == (tmp_path / "b" / z).read_bytes()


def test_release_refuses_nonempty_output_and_bad_markers(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("x")
    with pytest.raises(ReleaseError, match="not empty"):
        release(FIXTURE_LABS, out)
    labs = tmp_path / "labs"
    (labs / "01_bad").mkdir(parents=True)
    (labs / "01_bad" / "bad.py").write_text(
        "def f():\n    # BEGIN SOLUTION hint: x\n    return 1\n"
    )
    with pytest.raises(ReleaseError, match=r"01_bad/bad\.py:2: '# BEGIN SOLUTION' is never closed"):
        release(labs, tmp_path / "o2")
    assert not (tmp_path / "o2").exists()


def test_cli_release_module_entry_point(tmp_path):
    out = tmp_path / "rel"
    command = [
        sys.executable, "-m", "shardlab.grading", "release",
        "--labs", str(FIXTURE_LABS), "--out", str(out),
    ]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "released 2 lab(s)" in proc.stdout
    proc = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "not empty" in proc.stderr and "Traceback" not in proc.stderr
