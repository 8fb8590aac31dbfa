"""Sphinx extension: a text alternative for every figure a notebook's code draws.

myst-nb writes a code cell's image output as ``<img alt="../_images/<sha256>.png">``: the alt
text is the file name, which tells a screen-reader user nothing. For each such image this
extension finds the output in the notebook (by the sha256 of its bytes, which is its file name)
and writes an alt text that says what the figure shows, from, in order:

1. the cell's own ``mystnb: image: alt`` metadata (myst-nb applies it; left alone here);
2. the output's ``text/plain`` when it is a description rather than matplotlib's default
   ``<Figure size 640x480 with 1 Axes>``;
3. the summary line of each :mod:`shardlab.diagrams` function the cell calls (so a diagram
   added there is described by its own docstring, with no change here);
4. the titles and axis labels the cell's code sets (``set_title``, ``suptitle``, ``title=``,
   ``set_xlabel``, ``set_ylabel``; the fixed parts of an f-string);
5. else "Figure drawn by code in section <title>".

Loaded by ``sphinx_shardlab_live`` (``_config.yml``: ``sphinx: local_extensions``).
"""

from __future__ import annotations

import ast
import base64
import hashlib
import json
import re
from pathlib import Path
from typing import Any

from docutils import nodes
from sphinx.application import Sphinx

_DEFAULT_REPR = re.compile(r"^<(Figure|matplotlib\.figure\.Figure) .*>$|^<Figure size ")
_TITLE_CALLS = {"set_title": "", "suptitle": "", "title": "", "set_xlabel": "x axis: ",
                "set_ylabel": "y axis: ", "xlabel": "x axis: ", "ylabel": "y axis: "}


def _text(node: ast.AST) -> str | None:
    """A string literal, or an f-string with each formatted value written as …"""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "…" for v in node.values)
    return None


def _diagram_summaries() -> dict[str, str]:
    try:
        import shardlab.diagrams as diagrams
    except Exception:  # the book builds without the package; the other sources remain
        return {}
    out = {}
    for name in getattr(diagrams, "__all__", ()):
        doc = (getattr(diagrams, name).__doc__ or "").strip().split("\n\n")[0]
        if doc:
            out[name] = " ".join(doc.split())
    return out


def describe_code(source: str, summaries: dict[str, str]) -> str:
    """What a cell's code says its figure shows ('' when it says nothing)."""
    code = "\n".join(
        line for line in source.splitlines() if not line.lstrip().startswith(("%", "!"))
    )
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return ""
    shown, labels = [], []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        if name in summaries and summaries[name] not in shown:
            shown.append(summaries[name])
        if name in _TITLE_CALLS and node.args and (t := _text(node.args[0])):
            labels.append(_TITLE_CALLS[name] + t)
        for kw in node.keywords:
            if kw.arg == "title" and (t := _text(kw.value)):
                labels.append(t)
    labels = list(dict.fromkeys(" ".join(x.split()) for x in labels if x.strip()))
    return " ".join(s.rstrip(".") + "." for s in shown + (["; ".join(labels)] if labels else []))


def notebook_alts(path: Path, summaries: dict[str, str]) -> dict[str, str]:
    """sha256 of each image output of the notebook -> its text alternative ('' if none)."""
    nb = json.loads(path.read_text(encoding="utf-8"))
    out: dict[str, str] = {}
    for cell in nb.get("cells", []):
        if cell.get("cell_type") != "code":
            continue
        source = "".join(cell.get("source", ""))
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            plain = "".join(data.get("text/plain", "")).strip()
            for mime in ("image/png", "image/jpeg", "image/svg+xml"):
                if mime not in data:
                    continue
                raw = "".join(data[mime])
                blob = raw.encode() if mime == "image/svg+xml" else base64.b64decode(raw)
                alt = plain if plain and not _DEFAULT_REPR.match(plain) else ""
                out[hashlib.sha256(blob).hexdigest()] = alt or describe_code(source, summaries)
    return out


def _section_title(node: nodes.Node) -> str:
    while node is not None:
        if isinstance(node, nodes.section) and node.children:
            return node.children[0].astext()
        node = node.parent
    return ""


def add_alt_text(app: Sphinx, doctree: nodes.document) -> None:
    source = Path(app.env.doc2path(app.env.docname))
    if source.suffix != ".ipynb":
        return
    alts = notebook_alts(source, _diagram_summaries())
    for img in doctree.findall(nodes.image):
        uri = img.get("uri", "")
        if img.get("alt") and img["alt"] != uri:
            continue
        alt = alts.get(Path(uri).stem)
        if alt is None:
            continue  # not a code cell's output
        img["alt"] = alt or f"Figure drawn by code in section {_section_title(img)!r}"


def setup(app: Sphinx) -> dict[str, Any]:
    app.connect("doctree-read", add_alt_text)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
