"""The import graph has no circle, and the package never reaches into a lab.

Read from the source with :mod:`ast` (nothing is imported): every ``import`` statement of every
``.py`` file of ``pkg/shardlab`` -- at module level and inside functions, absolute and relative --
is resolved to the package module it names (``from a.b import c`` is an edge to ``a.b.c`` when
that is a module, else to ``a.b``), and in each lab folder every plain import of another file
of the same folder (its ``hidden/`` tests included) is an edge. A strongly connected component
of more than one module (Tarjan) is a circle: one module half-initialised while the other reads
it, and no order in which to read the code.

Two rules of the design are checked on the same trees: no package module edits ``sys.path``,
and none imports a lab module by its bare name (``import fsdp``); labs are loaded by path
(:mod:`shardlab.modload`).
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "pkg"
LABS = ROOT / "labs"

# the one place allowed to set sys.path, and why: a rank the launcher forks from its zygote
# takes the sys.path of the process that asked for it, as a rank multiprocessing spawns does;
# it adds no folder of its own
SYS_PATH_ALLOWED = {"shardlab.runtime._zygote"}


@functools.cache  # each file is read and parsed once per session
def _parse(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


@functools.cache
def _package_modules() -> dict[str, Path]:
    mods = {}
    for path in sorted((PKG / "shardlab").rglob("*.py")):
        parts = path.relative_to(PKG).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mods[".".join(parts)] = path
    return mods


def _imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every Import/ImportFrom node, at any depth (function bodies included).

    An import is a statement, so only statement lists are walked, not expressions."""
    found, todo = [], [tree]
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
            continue
        for field in ("body", "orelse", "finalbody", "handlers", "cases"):
            todo.extend(getattr(node, field, ()))
    return sorted(found, key=lambda n: n.lineno)


def _known(name: str, mods: dict[str, Path]) -> str | None:
    """The longest prefix of dotted ``name`` that is a package module, or None."""
    parts = name.split(".")
    for k in range(len(parts), 0, -1):
        cand = ".".join(parts[:k])
        if cand in mods:
            return cand
    return None


def _package_edges(mods: dict[str, Path]) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for node in _imports(_parse(path)):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                if node.level:
                    base_parts = package.split(".")
                    base_parts = base_parts[: len(base_parts) - (node.level - 1)]
                    base = ".".join(base_parts + ([node.module] if node.module else []))
                else:
                    base = node.module or ""
                for a in node.names:
                    full = f"{base}.{a.name}"
                    targets.append(full if full in mods else base)
            for t in targets:
                hit = _known(t, mods)
                if hit is not None and hit != mod:
                    graph[mod].add(hit)
    return graph


def _lab_folders() -> list[Path]:
    return sorted(p for p in LABS.iterdir() if p.is_dir() and p.name[:2].isdigit())


def _lab_files(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.py")) + sorted(folder.glob("hidden/*.py"))


def _lab_edges(folder: Path) -> dict[str, set[str]]:
    """Plain imports between the files of one lab folder; a node is a path under the folder."""
    files = _lab_files(folder)
    by_stem = {p.stem: p for p in files if p.parent == folder}  # what a plain import finds
    graph: dict[str, set[str]] = {}
    for path in files:
        me = str(path.relative_to(folder))
        graph[me] = set()
        for node in _imports(_parse(path)):
            if isinstance(node, ast.ImportFrom) and node.level:
                continue  # a lab folder is not a package
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module]
            for name in names:
                target = by_stem.get((name or "").split(".")[0])
                if target is not None and target != path:
                    graph[me].add(str(target.relative_to(folder)))
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components with more than one node, each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _describe(circles: list[list[str]], graph: dict[str, set[str]]) -> str:
    lines = []
    for comp in circles:
        inside = set(comp)
        edges = [f"{a} -> {b}" for a in comp for b in sorted(graph[a] & inside)]
        lines.append("circle: " + ", ".join(edges))
    return "\n".join(lines)


def test_tarjan_finds_a_circle_and_ignores_a_chain():
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _circles({"a": {"b"}, "b": set(), "c": {"a", "b"}}) == []


def test_the_resolver_sees_function_level_and_relative_imports():
    mods = _package_modules()
    graph = _package_edges(mods)
    assert len(mods) > 100
    # relative, at module level: from ._zygote import ...
    assert "shardlab.runtime._zygote" in graph["shardlab.runtime.launch"]
    # inside a function: _zygote's forked rank imports _child
    assert "shardlab.runtime._child" in graph["shardlab.runtime._zygote"]


def test_package_import_graph_has_no_circle():
    graph = _package_edges(_package_modules())
    circles = _circles(graph)
    assert not circles, _describe(circles, graph)


def test_lab_folders_import_graphs_have_no_circle():
    problems = []
    for folder in _lab_folders():
        graph = _lab_edges(folder)
        circles = _circles(graph)
        if circles:
            problems.append(f"{folder.name}:\n{_describe(circles, graph)}")
    assert not problems, "\n".join(problems)


def _is_sys_path(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Attribute)
        and node.attr == "path"
        and isinstance(node.value, ast.Name)
        and node.value.id == "sys"
    )


def _sys_path_edits(tree: ast.AST) -> list[int]:
    lines = []
    for node in ast.walk(tree):  # only for files that mention sys.path (the callers check)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if _is_sys_path(node.func.value) and node.func.attr in {
                "insert", "append", "extend", "remove", "pop", "clear", "__setitem__",
            }:
                lines.append(node.lineno)
        targets = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        elif isinstance(node, ast.Delete):
            targets = node.targets
        for t in targets:
            if _is_sys_path(t) or (isinstance(t, ast.Subscript) and _is_sys_path(t.value)):
                lines.append(node.lineno)
    return sorted(lines)


def test_no_package_module_edits_sys_path():
    found = []
    for mod, path in _package_modules().items():
        if mod in SYS_PATH_ALLOWED:
            continue
        if "sys.path" in path.read_text(encoding="utf-8"):
            found += [f"{path.relative_to(ROOT)}:{n}" for n in _sys_path_edits(_parse(path))]
    assert not found, f"sys.path edited at {found}"


def test_the_sys_path_check_sees_an_edit():
    tree = ast.parse("import sys\ndef f():\n    sys.path.insert(0, 'x')\nsys.path[:] = []\n")
    assert _sys_path_edits(tree) == [3, 4]


def test_no_package_module_imports_a_lab_module_by_name():
    lab_names = {p.stem for folder in _lab_folders() for p in _lab_files(folder)}
    lab_names |= {"_labs_path", "conftest"}
    found = []
    for _mod, path in _package_modules().items():
        tree = _parse(path)
        for node in _imports(tree):
            if isinstance(node, ast.ImportFrom) and node.level:
                continue
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module]
            for name in names:
                if (name or "").split(".")[0] in lab_names:
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno} imports {name}")
        text = path.read_text(encoding="utf-8")
        if "import_module(" not in text and "__import__(" not in text:
            continue
        for node in ast.walk(tree):  # importlib.import_module("fsdp") / __import__("fsdp")
            if (
                isinstance(node, ast.Call)
                and getattr(node.func, "attr", getattr(node.func, "id", None))
                in {"import_module", "__import__"}
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and str(node.args[0].value).split(".")[0] in lab_names
            ):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} imports {node.args[0].value}")
    assert not found, "\n".join(found)
