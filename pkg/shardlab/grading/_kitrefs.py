"""References in released lab files: book links rewritten for the kit, dangling ones refused.

In the repository a lab notebook links the book the way jupyter-book resolves it (MyST's
``{doc}`../../book/01_collectives``` role, or ``[6](../../book/06_tensor.ipynb)``) and may
name repository files the kit does not contain. A student opens the kit in JupyterLab, where a
``{doc}`` role shows as raw text and a relative link into ``../../book`` points nowhere. So the
release rewrites, in every markdown cell of a notebook and in every ``.md`` file:

* a link to a book chapter -> a Markdown link to the published page ``<book_url>/<chapter>.html``
  when a book URL is configured (``shardlab release --book-url``, or ``html.baseurl`` in
  ``_config.yml``), otherwise the chapter's title in words ("the book's chapter *Title*");
* a ``{doc}`` link to another lab's notebook -> a relative Markdown link to that notebook;

and then refuses the release (:func:`dangling`) when any released text still holds a MyST role,
a relative link to a file the release does not contain, or a backticked repository path
(``tests/...``, ``book/...``, ``pkg/...``, ``tools/...``) the kit does not ship.
"""

from __future__ import annotations

import json
import posixpath
import re
from pathlib import Path

# {doc}`target` or {doc}`text <target>`
DOC_RE = re.compile(r"\{doc\}`(?:(?P<text>[^`<]*?)\s*<(?P<target>[^`>]+)>|(?P<bare>[^`]+))`")
# [text](relative/target) with an optional #anchor; absolute URLs are left alone
LINK_RE = re.compile(r"\[(?P<text>[^\]]+)\]\((?P<target>(?![a-z]+:)[^)\s#]+)(?P<anchor>#[^)]*)?\)")
ROLE_RE = re.compile(r"\{(?:doc|ref|numref|eq|glue|glue:text|term|download)\}`")
REPO_PATH_RE = re.compile(r"`(?P<path>(?:tests|book|pkg|tools)/[\w./-]+)`")
BOOK_PART = "book/"


def book_url_from_config(config: Path) -> str | None:
    """``html.baseurl`` of a jupyter-book ``_config.yml`` (a plain two-level lookup)."""
    if not config.is_file():
        return None
    in_html = False
    for line in config.read_text(encoding="utf-8").splitlines():
        if re.match(r"^html\s*:", line):
            in_html = True
        elif in_html and re.match(r"^\S", line):
            in_html = False
        elif in_html and (m := re.match(r"^\s+baseurl\s*:\s*[\"']?([^\"'#\s]+)", line)):
            return m.group(1).rstrip("/")
    return None


def chapter_titles(book_dir: Path) -> dict[str, str]:
    """Chapter stem -> its first heading, for the chapters in ``book_dir``."""
    titles: dict[str, str] = {}
    for path in sorted(book_dir.glob("*.ipynb")) if book_dir.is_dir() else []:
        try:
            cells = json.loads(path.read_text(encoding="utf-8")).get("cells", [])
        except ValueError:
            continue
        for cell in cells:
            text = "".join(cell.get("source", ""))
            if cell.get("cell_type") == "markdown" and (m := re.search(r"^#\s+(.+)$", text, re.M)):
                titles[path.stem] = m.group(1).strip()
                break
    return titles


class Rewriter:
    """Rewrite the book and lab links of one released file (``rel``: its path in the release)."""

    def __init__(self, book_url: str | None, titles: dict[str, str]) -> None:
        self.book_url = book_url.rstrip("/") if book_url else None
        self.titles = titles

    def _chapter(self, rel: str, target: str) -> str | None:
        """The chapter stem a target inside ``rel``'s folder points at, or ``None``."""
        joined = posixpath.normpath(posixpath.join(posixpath.dirname("labs/" + rel), target))
        if not joined.startswith(BOOK_PART):
            return None
        return posixpath.splitext(joined[len(BOOK_PART):])[0]

    def _to_book(self, text: str | None, stem: str, anchor: str = "") -> str:
        title = self.titles.get(stem, stem)
        if self.book_url:
            return f"[{text or title}]({self.book_url}/{stem}.html{anchor})"
        if not text:  # "the chapter {doc}`...`": the prose already says what it is
            return f"*{title}*"
        if re.fullmatch(r"[\d.]+", text.strip()):  # "Chapters [6](...)": keep the number
            return f"*{title}*" if title.startswith(text.strip()) else f"{text} (*{title}*)"
        return f"{text} (the book's chapter *{title}*)"

    def text(self, rel: str, text: str) -> str:
        def doc(m: re.Match) -> str:
            target = m.group("target") or m.group("bare")
            label = m.group("text")
            stem = self._chapter(rel, target.strip())
            if stem is not None:
                return self._to_book(label, stem)
            path = target.strip()
            path += "" if path.endswith((".ipynb", ".md")) else ".ipynb"
            return f"[{label or posixpath.basename(target)}]({path})"

        def link(m: re.Match) -> str:
            stem = self._chapter(rel, m.group("target"))
            if stem is None:
                return m.group(0)
            return self._to_book(m.group("text"), stem, m.group("anchor") or "")

        return LINK_RE.sub(link, DOC_RE.sub(doc, text))

    def notebook(self, rel: str, data: str) -> str:
        nb = json.loads(data)
        for cell in nb.get("cells", []):
            if cell.get("cell_type") != "markdown":
                continue
            src = "".join(cell.get("source", ""))
            new = self.text(rel, src)
            if new != src:
                cell["source"] = new.splitlines(keepends=True)
        return json.dumps(nb, indent=1, sort_keys=True, ensure_ascii=False) + "\n"


def _texts(rel: str, data: bytes) -> list[str]:
    """The prose of a released file a student reads: markdown cells, ``.md`` files."""
    if rel.endswith(".ipynb"):
        cells = json.loads(data.decode("utf-8")).get("cells", [])
        return ["".join(c.get("source", "")) for c in cells if c.get("cell_type") == "markdown"]
    if rel.endswith(".md"):
        return [data.decode("utf-8")]
    return []


def dangling(files: dict[str, bytes], shipped: set[str] | frozenset[str] = frozenset()) -> list[str]:
    """Every reference in the released prose that a kit cannot resolve: ``"<file>: <ref>"``.

    ``files``: release-relative path -> bytes; ``shipped``: further paths the kit holds
    beside the labs, relative to the labs folder (``../README.md``) and, for backticked
    repository paths, to the kit's root (``pkg/shardlab/...``)."""
    have = set(files)
    out = []
    for rel, data in sorted(files.items()):
        for text in _texts(rel, data):
            out += [f"{rel}: MyST role {m.group(0)}…" for m in ROLE_RE.finditer(text)]
            for m in LINK_RE.finditer(text):
                target = posixpath.normpath(posixpath.join(posixpath.dirname(rel),
                                                           m.group("target")))
                if target not in have and target not in shipped:
                    out.append(f"{rel}: link to {m.group('target')} (not in the release)")
            for m in REPO_PATH_RE.finditer(text):
                if m.group("path") not in shipped:
                    out.append(f"{rel}: names {m.group('path')} (not in the kit)")
    return out
