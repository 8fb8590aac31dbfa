"""Student release: copy every lab folder without solutions, hidden tests or rubric.

A lab module carries its reference solution between markers::

    # BEGIN SOLUTION hint: one line telling the student what to do
    ...reference code...
    # END SOLUTION

:func:`strip_solutions` replaces each block by ``raise NotImplementedError("<hint>")`` at
the indentation of the BEGIN marker. :func:`release` applies it to every ``.py`` file of
every ``labs/NN_*`` folder, drops ``hidden/`` and ``rubric.toml``, clears the outputs of
notebook cells tagged ``student-output`` and writes everything in sorted order with
content-only copies, so two releases of the same tree are byte-identical. Every release
also writes a marker file listing what it wrote (:data:`MARKER`): ``--force`` replaces only a
folder that holds a previous release and nothing else (:func:`clear_out_dir`). Links to the
book are rewritten for a reader without the repository, and a release whose prose still
points at something it does not contain is refused (:mod:`._kitrefs`).
"""

from __future__ import annotations

import ast
import hashlib
import json
import re
import zipfile
from dataclasses import dataclass
from pathlib import Path

# ReleaseError is defined with the output folder's guard and is this module's error as well
from ._kitrefs import Rewriter, book_url_from_config, chapter_titles, dangling
from .release_guard import (  # noqa: F401  (MARKER, clear_out_dir: re-exported)
    MARKER,
    ReleaseError,
    check_out_dir,
    clear_out_dir,
    write_marker,
)

BEGIN_RE = re.compile(r"^(?P<indent>[ \t]*)#\s*BEGIN SOLUTION\b(?P<rest>.*)$")
END_RE = re.compile(r"^[ \t]*#\s*END SOLUTION\b")
HINT_RE = re.compile(r"^\s*hint\s*:\s*(?P<hint>.*?)\s*$")
DEFAULT_HINT = "implement this part of the lab"
STUDENT_OUTPUT_TAG = "student-output"

# Never shipped to students (instructor material and build debris).
EXCLUDED_DIRS = frozenset(
    {"hidden", "__pycache__", ".ipynb_checkpoints", ".pytest_cache", ".mypy_cache", ".ruff_cache"}
)
# this_machine.json: the alpha-beta fit a lab notebook writes for the machine it ran on
EXCLUDED_FILES = frozenset({"rubric.toml", ".DS_Store", "this_machine.json"})
EXCLUDED_SUFFIXES = (".pyc", ".pyo")
LAB_DIR_RE = re.compile(r"^\d\d_[A-Za-z0-9_]+$")
# Fixed timestamp for zip members (the zip format cannot store anything earlier).
ZIP_DATE = (1980, 1, 1, 0, 0, 0)


@dataclass(frozen=True)
class SolutionBlock:
    """One solution block: 1-based line numbers of its markers and its hint."""

    begin: int
    end: int
    hint: str


def find_blocks(source: str, filename: str = "<string>") -> list[SolutionBlock]:
    """Return the solution blocks of ``source``; raise ReleaseError naming file:line if unbalanced."""
    blocks: list[SolutionBlock] = []
    open_line: int | None = None
    hint = ""
    for lineno, line in enumerate(source.splitlines(), start=1):
        begin = BEGIN_RE.match(line)
        if begin:
            if open_line is not None:
                raise ReleaseError(
                    f"{filename}:{lineno}: '# BEGIN SOLUTION' inside the solution block opened at "
                    f"line {open_line}; close that block with '# END SOLUTION' first."
                )
            open_line = lineno
            m = HINT_RE.match(begin.group("rest"))
            hint = (m.group("hint") if m else "").strip() or DEFAULT_HINT
        elif END_RE.match(line):
            if open_line is None:
                raise ReleaseError(
                    f"{filename}:{lineno}: '# END SOLUTION' without a matching '# BEGIN SOLUTION'."
                )
            blocks.append(SolutionBlock(open_line, lineno, hint))
            open_line = None
    if open_line is not None:
        raise ReleaseError(
            f"{filename}:{open_line}: '# BEGIN SOLUTION' is never closed by '# END SOLUTION'."
        )
    return blocks


def strip_solutions(
    source: str, filename: str = "<string>", check_python: bool = True, only=None
) -> str:
    """Replace every solution block of ``source`` by a ``NotImplementedError`` stub; with
    ``only`` (a set of ``# BEGIN SOLUTION`` line numbers), just those blocks."""
    blocks = [b for b in find_blocks(source, filename) if only is None or b.begin in only]
    if not blocks:
        return source
    lines = source.splitlines(keepends=True)
    newline = "\r\n" if lines and lines[0].endswith("\r\n") else "\n"
    out: list[str] = []
    starts = {b.begin: b for b in blocks}
    i = 1
    while i <= len(lines):
        block = starts.get(i)
        if block is None:
            out.append(lines[i - 1])
            i += 1
            continue
        indent = BEGIN_RE.match(lines[i - 1].rstrip("\r\n")).group("indent")
        out.append(f"{indent}raise NotImplementedError({json.dumps(block.hint)}){newline}")
        i = block.end + 1
    result = "".join(out)
    if check_python:
        try:
            ast.parse(result, filename=filename)
        except SyntaxError as exc:
            raise ReleaseError(
                f"{filename}:{exc.lineno}: the released stub is not valid Python ({exc.msg}); "
                "check that each solution block starts at the indentation of the code it replaces."
            ) from None
    return result


def solution_lines(source: str, filename: str = "<string>") -> list[str]:
    """Every line strictly between markers (what must never appear in a release)."""
    lines = source.splitlines()
    return [line for b in find_blocks(source, filename) for line in lines[b.begin : b.end - 1]]


def strip_notebook(text: str, filename: str = "<notebook>") -> str:
    """Clear outputs of ``student-output`` cells and strip solution blocks from code cells."""
    nb = json.loads(text)
    for index, cell in enumerate(nb.get("cells", [])):
        source = cell.get("source", "")
        joined = "".join(source) if isinstance(source, list) else source
        if "BEGIN SOLUTION" in joined or "END SOLUTION" in joined:
            stripped = strip_solutions(joined, f"{filename} cell {index}", check_python=False)
            cell["source"] = stripped.splitlines(keepends=True)
        tags = cell.get("metadata", {}).get("tags", [])
        if cell.get("cell_type") == "code" and STUDENT_OUTPUT_TAG in tags:
            cell["outputs"] = []
            cell["execution_count"] = None
    return json.dumps(nb, indent=1, sort_keys=True, ensure_ascii=False) + "\n"


def _excluded(rel: Path) -> bool:
    if any(part in EXCLUDED_DIRS for part in rel.parts[:-1]):
        return True
    return rel.name in EXCLUDED_FILES or rel.name.endswith(EXCLUDED_SUFFIXES)


def lab_dirs(labs_dir: Path) -> list[Path]:
    """The ``NN_topic`` lab folders of ``labs_dir``, sorted."""
    return sorted(p for p in Path(labs_dir).iterdir() if p.is_dir() and LAB_DIR_RE.match(p.name))


def released_files(labs_dir: Path, book_url: str | None = None,
                   shipped: frozenset[str] = frozenset()) -> dict[str, bytes]:
    """Map of release-relative path -> released bytes (the whole release, in memory, sorted).

    Book links point at ``book_url`` (default: ``html.baseurl`` of the repository's
    ``_config.yml``; none: the chapter's title in words); ``shipped``: what a kit holds beside
    the labs. Raises :class:`ReleaseError` naming every reference the release cannot resolve."""
    labs_dir = Path(labs_dir)
    book_url = book_url or book_url_from_config(labs_dir.parent / "_config.yml")
    refs = Rewriter(book_url, chapter_titles(labs_dir.parent / "book"))
    files: dict[str, bytes] = {}
    sources: list[tuple[str, Path]] = []
    for top in sorted(labs_dir.iterdir()):
        if top.is_file() and not _excluded(Path(top.name)) and top.suffix in (".py", ".md", ".txt"):
            sources.append((top.name, top))
    for lab in lab_dirs(labs_dir):
        for path in sorted(lab.rglob("*")):
            if not path.is_file() or path.is_symlink():
                continue
            rel = path.relative_to(labs_dir)
            if _excluded(rel.relative_to(lab.name)):
                continue
            sources.append((rel.as_posix(), path))
    for rel, path in sorted(sources):
        data = path.read_bytes()
        if path.suffix == ".py":
            data = strip_solutions(data.decode("utf-8"), rel).encode("utf-8")
        elif path.suffix == ".ipynb":
            text = strip_notebook(data.decode("utf-8"), rel)
            data = refs.notebook(rel, text).encode("utf-8")
        elif path.suffix == ".md":
            data = refs.text(rel, data.decode("utf-8")).encode("utf-8")
        files[rel] = data
    bad = dangling(files, shipped)
    if bad:
        raise ReleaseError(f"{len(bad)} reference(s) the release cannot resolve (first: "
                           f"{'; '.join(bad[:3])}); link the book by URL and name only files "
                           "the kit contains.")
    return files


def check_labs_dir(labs_dir: Path) -> None:
    """Refuse a labs folder that is missing or holds no ``NN_topic`` lab."""
    if not labs_dir.is_dir():
        raise ReleaseError(f"labs folder {labs_dir} does not exist.")
    if not lab_dirs(labs_dir):
        raise ReleaseError(
            f"labs folder {labs_dir} holds no lab folder (named like 01_collectives); "
            "point --labs at the folder that holds the labs."
        )


def write_member(zf: zipfile.ZipFile, name: str, data: bytes) -> None:
    """One zip member with a fixed timestamp and mode, so two zips of the same files are equal."""
    info = zipfile.ZipInfo(name, date_time=ZIP_DATE)
    info.external_attr = 0o644 << 16
    info.compress_type = zipfile.ZIP_DEFLATED
    zf.writestr(info, data)


def release(
    labs_dir: Path,
    out_dir: Path,
    *,
    zip_labs: bool = False,
    force: bool = False,
    marker: bool = True,
    book_url: str | None = None,
    shipped: frozenset[str] = frozenset(),
) -> dict:
    """Write the student copy of every lab of ``labs_dir`` into ``out_dir``.

    Returns a manifest ``{relative path: sha256}``. With ``zip_labs`` each lab is also written
    as ``<lab>.zip`` with fixed timestamps and sorted members. ``out_dir`` must be empty or
    absent unless ``force`` (then it must hold a previous release, which is cleared first).
    ``marker=False`` leaves out the marker file (the student kit writes its own one level up).
    ``book_url`` and ``shipped``: see :func:`released_files`.
    """
    labs_dir, out_dir = Path(labs_dir), Path(out_dir)
    check_labs_dir(labs_dir)
    check_out_dir(labs_dir, out_dir)
    files = released_files(labs_dir, book_url, shipped)  # validate all before writing
    clear_out_dir(labs_dir, out_dir, force)
    out_dir.mkdir(parents=True, exist_ok=True)
    manifest = {}
    for rel, data in files.items():
        target = out_dir / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        manifest[rel] = hashlib.sha256(data).hexdigest()
    if zip_labs:
        for lab in lab_dirs(labs_dir):
            members = [(rel, data) for rel, data in files.items() if rel.startswith(lab.name + "/")]
            with zipfile.ZipFile(out_dir / f"{lab.name}.zip", "w", zipfile.ZIP_DEFLATED) as zf:
                for rel, data in members:
                    write_member(zf, rel, data)
    if marker:
        zips = [f"{lab.name}.zip" for lab in lab_dirs(labs_dir)] if zip_labs else []
        write_marker(out_dir, [*manifest, *zips])
    return manifest
