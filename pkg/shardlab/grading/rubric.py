"""Lab rubric (``labs/NN_topic/rubric.toml``) and what the grader copies into a sandbox.

Format::

    lab = "01_collectives"                 # must equal the folder name
    submit = ["collectives.py"]            # the only files taken from a student
    [points]                               # "<test file basename>::<test function>" = points
    "test_collectives.py::test_ring_all_reduce" = 3
    "test_collectives_hidden.py::test_many_sizes" = 2
    # a test inside a class: "test_x.py::TestClass::test_method" = 1

All parametrizations of a test share its points equally. Test files are looked up in the lab
folder and in its ``hidden/`` folder; every key must name a test function that exists.

A lab built on earlier labs names the modules it imports from them; the grader mounts the
instructor's copies read-only into the sandbox as ``_earlier_labs/<file>`` (the lab loads them
from there by path, ``shardlab.modload.provide``, when the sibling lab folders are absent)::

    [needs]
    "04_fsdp" = ["fsdp.py", "fsdp_units.py"]

A test whose check compares produced values can have that comparison made by the grader
(:mod:`.outside`, :mod:`._outside`): the test records its values, the grader runs the tests on
the reference solution once and awards the points only if the values equal the reference's
within the tolerance (:mod:`._values`)::

    [outside]                              # rubric key = tolerance
    "test_collectives.py::test_ring_all_gather" = "exact"
    "test_collectives.py::test_ring_all_reduce" = "close"
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

from .release import EXCLUDED_DIRS, EXCLUDED_SUFFIXES

KEY_RE = re.compile(
    r"^(?P<file>[A-Za-z0-9_]+\.py)::(?P<name>[A-Za-z_][A-Za-z0-9_]*(::[A-Za-z_][A-Za-z0-9_]*)?)$"
)
SAFE_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]*$")


class RubricError(ValueError):
    """A rubric is malformed or names tests that do not exist."""


@dataclass(frozen=True)
class Rubric:
    lab: str
    submit: tuple[str, ...]
    points: dict[str, float]
    lab_dir: Path
    gpu_tests: frozenset[str] = field(default=frozenset())
    needs: tuple[tuple[str, str], ...] = ()  # (sibling lab, file) mounted as _earlier_labs/file
    outside: dict[str, str] = field(default_factory=dict)  # key -> tolerance ([outside])
    # {node id: {name: value}} the reference solution recorded (:mod:`._outside`); None
    # until the grader ran it
    reference: dict | None = field(default=None, compare=False, repr=False)
    # {key: ((case id, needs GPU), ...)}: the cases the grader collected itself from the
    # reference lab (:mod:`._collect`); None until then (one case per key)
    cases: dict[str, tuple[tuple[str, bool], ...]] | None = field(default=None, compare=False)

    def expected(self, key: str) -> tuple[tuple[str, bool], ...]:
        """The cases of one rubric test: collected, or one case when not collected."""
        if self.cases is not None and key in self.cases:
            return self.cases[key]
        return (("", key in self.gpu_tests),)

    @property
    def max_points(self) -> float:
        return float(sum(self.points.values()))


def _is_gpu_mark(node: ast.AST) -> bool:
    """True for ``pytest.mark.gpu``, ``mark.gpu`` (optionally called)."""
    if isinstance(node, ast.Call):
        node = node.func
    return (
        isinstance(node, ast.Attribute)
        and node.attr == "gpu"
        and (
            isinstance(node.value, ast.Attribute)
            and node.value.attr == "mark"
            or isinstance(node.value, ast.Name)
            and node.value.id == "mark"
        )
    )


def _marks_in(node: ast.AST) -> bool:
    return any(_is_gpu_mark(n) for n in ast.walk(node) if isinstance(n, ast.Attribute | ast.Call))


def test_functions(path: Path) -> tuple[set[str], set[str]]:
    """Return (test names, names marked ``gpu``) defined in a test file; names as in rubric keys."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    names: set[str] = set()
    gpu: set[str] = set()
    module_gpu = any(
        isinstance(stmt, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in stmt.targets)
        and _marks_in(stmt.value)
        for stmt in tree.body
    )

    def visit(body, prefix: str, inherited: bool) -> None:
        for stmt in body:
            if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef) and stmt.name.startswith(
                "test"
            ):
                name = prefix + stmt.name
                names.add(name)
                if inherited or any(_is_gpu_mark(d) for d in stmt.decorator_list):
                    gpu.add(name)
            elif isinstance(stmt, ast.ClassDef) and stmt.name.startswith("Test"):
                cls_gpu = inherited or any(_is_gpu_mark(d) for d in stmt.decorator_list)
                cls_gpu = cls_gpu or any(
                    isinstance(s, ast.Assign)
                    and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in s.targets)
                    and _marks_in(s.value)
                    for s in stmt.body
                )
                visit(stmt.body, prefix + stmt.name + "::", cls_gpu)

    visit(tree.body, "", module_gpu)
    return names, gpu


def test_file_path(lab_dir: Path, basename: str) -> Path | None:
    for candidate in (lab_dir / basename, lab_dir / "hidden" / basename):
        if candidate.is_file():
            return candidate
    return None


def load_rubric(lab_dir: Path) -> Rubric:
    """Read and validate ``lab_dir/rubric.toml``; every problem is a sentence naming the value."""
    lab_dir = Path(lab_dir)
    path = lab_dir / "rubric.toml"
    if not path.is_file():
        raise RubricError(f"{lab_dir.name}: no rubric.toml in {lab_dir}.")
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise RubricError(f"{path}: not valid TOML ({exc}).") from None
    lab = data.get("lab")
    if lab != lab_dir.name:
        raise RubricError(f"{path}: lab = {lab!r} but the folder is named {lab_dir.name!r}.")
    submit = data.get("submit")
    if not isinstance(submit, list) or not submit:
        raise RubricError(f"{path}: submit must be a non-empty list of file names, got {submit!r}.")
    for name in submit:
        if not isinstance(name, str) or not SAFE_NAME_RE.match(name):
            raise RubricError(
                f"{path}: submit entry {name!r} must be a plain file name (no folders, no '..')."
            )
    points = data.get("points")
    if not isinstance(points, dict) or not points:
        raise RubricError(f"{path}: [points] table is missing or empty.")
    clean: dict[str, float] = {}
    gpu_tests: set[str] = set()
    cache: dict[str, tuple[set[str], set[str]]] = {}
    for key, value in points.items():
        m = KEY_RE.match(key)
        if not m:
            raise RubricError(
                f"{path}: key {key!r} is not of the form 'test_file.py::test_function'."
            )
        if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
            raise RubricError(
                f"{path}: points for {key!r} must be a positive number, got {value!r}."
            )
        file, name = m.group("file"), m.group("name")
        test_path = test_file_path(lab_dir, file)
        if test_path is None:
            raise RubricError(
                f"{path}: key {key!r} names {file}, which is neither in {lab_dir} nor in its hidden/."
            )
        if file not in cache:
            cache[file] = test_functions(test_path)
        names, gpu = cache[file]
        if name not in names:
            raise RubricError(f"{path}: key {key!r}: {file} defines no test {name!r}.")
        if name in gpu:
            gpu_tests.add(key)
        clean[key] = float(value)
    needs = _needs(path, lab_dir, data.get("needs", {}))
    outside = _outside(path, clean, data.get("outside", {}))
    return Rubric(lab, tuple(submit), clean, lab_dir, frozenset(gpu_tests), needs, outside)


def _outside(path: Path, points: dict[str, float], table) -> dict[str, str]:
    """Validate ``[outside]``: rubric keys with a tolerance each."""
    from ._values import tolerance_problem

    if not isinstance(table, dict):
        raise RubricError(f"{path}: [outside] must be a table of test = tolerance, got {table!r}.")
    for key, tol in table.items():
        if key not in points:
            raise RubricError(f"{path}: [outside] key {key!r} is not a test of [points].")
        problem = tolerance_problem(tol)
        if problem:
            raise RubricError(f"{path}: [outside] {key!r}: {problem}.")
    return dict(table)


def _needs(path: Path, lab_dir: Path, table) -> tuple[tuple[str, str], ...]:
    """Validate ``[needs]``: sibling lab folders and plain file names that exist."""
    if not isinstance(table, dict):
        raise RubricError(f"{path}: [needs] must be a table of lab = [file names], got {table!r}.")
    out: list[tuple[str, str]] = []
    seen: set[str] = set()
    for lab, files in sorted(table.items()):
        if not SAFE_NAME_RE.match(lab) or lab == lab_dir.name:
            raise RubricError(f"{path}: [needs] entry {lab!r} must name another lab folder.")
        if not isinstance(files, list) or not files:
            raise RubricError(f"{path}: [needs] {lab!r} must be a non-empty list, got {files!r}.")
        for name in files:
            if (
                not isinstance(name, str)
                or not SAFE_NAME_RE.match(name)
                or not name.endswith(".py")
            ):
                raise RubricError(
                    f"{path}: [needs] {lab!r}: {name!r} must be a plain .py file name."
                )
            if not (lab_dir.parent / lab / name).is_file():
                raise RubricError(
                    f"{path}: [needs] {lab!r}: {lab_dir.parent / lab / name} does not exist."
                )
            if name in seen:
                raise RubricError(
                    f"{path}: [needs] names {name!r} twice; module names must be unique."
                )
            seen.add(name)
            out.append((lab, name))
    return tuple(out)


def sandbox_files(rubric: Rubric) -> dict[str, Path]:
    """Instructor files for a sandbox: {name in work dir: source}. Hidden tests go to the top.

    Everything in the lab folder except the rubric, notebooks, build debris and the files the
    student submits (those come from the submission).
    """
    lab_dir = rubric.lab_dir
    files: dict[str, Path] = {}
    for path in sorted(lab_dir.rglob("*")):
        if not path.is_file() or path.is_symlink():
            continue
        rel = path.relative_to(lab_dir)
        if any(part in EXCLUDED_DIRS - {"hidden"} for part in rel.parts[:-1]):
            continue
        if rel.name.endswith(EXCLUDED_SUFFIXES) or rel.suffix == ".ipynb":
            continue
        if rel.parts[0] == "hidden":
            rel = Path(*rel.parts[1:])
        elif len(rel.parts) == 1 and (rel.name == "rubric.toml" or rel.name in rubric.submit):
            continue
        name = rel.as_posix()
        if name in files:
            raise RubricError(
                f"{lab_dir.name}: hidden/{name} has the same name as a public file; rename it."
            )
        files[name] = path
    for lab, name in rubric.needs:  # earlier labs' reference modules this lab imports
        files[f"_earlier_labs/{name}"] = lab_dir.parent / lab / name
    return files
