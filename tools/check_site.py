"""Check a built book (``_build/html``) for what a warning-free Sphinx build cannot see.

Run by ``make book-build`` after ``jupyter-book build``::

    .venv/bin/python tools/check_site.py _build/html

Fails (exit 1, one line per problem) when

* any page loads a script, stylesheet, font, image or frame from another host
  (``src``/``href`` of ``script``, ``link``, ``img``, ``iframe``, ``source``, ``embed``,
  ``object``) — the book must work with no network, so the widget JavaScript, require.js
  and MathJax are served from ``_static/`` (tools/fetch_widget_js.sh);
* a local script or stylesheet that a page loads does not exist in the build, or a
  stylesheet it loads (or a ``<style>`` block) imports a stylesheet or font from another
  host (``@import``/``url()`` with ``http(s)://`` or ``//``: e.g. the Google-Fonts
  stylesheet jupyterlite-sphinx would inject);
* a page with embedded widget state does not load the local ``require.js`` and
  ``embed-amd.js`` (the widgets would stay blank);
* a page that uses a folded (``dropdown``) block does not load ``togglebutton.js``, or
  ``book/how_to_read.html`` lost its example of a folded worked solution;
* a page that displays widgets does not load the live-calculator script
  ``_static/shardlab-live/shardlab-live.js``, or the Pyodide runtime beside it is
  incomplete: a core file is missing, or a wheel listed in ``pyodide-lock.json`` is
  missing or its sha256 differs from the lock file's (Pyodide would refuse it).

Only attributes are checked, not text: sphinx-thebe's configuration mentions a CDN URL as a
string, but it is fetched only when a reader presses a "live code" button, which this book
does not enable (``launch_buttons.thebe: false``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parent))
from build_live import snapshot_name  # noqa: E402  (the shipped snapshot's one name rule)

URL_ATTRS = {
    "script": ("src",),
    "link": ("href",),
    "img": ("src", "srcset"),
    "iframe": ("src",),
    "source": ("src", "srcset"),
    "embed": ("src",),
    "object": ("data",),
}
WIDGET_STATE_MIME = "application/vnd.jupyter.widget-state+json"
CSS_REMOTE = re.compile(r"""(@import\s+|url\(\s*)['"]?((https?:)?//[^'")\s;]+)""", re.I)
WIDGET_VIEW_MIME = "application/vnd.jupyter.widget-view+json"
LIVE_SCRIPT = "shardlab-live.js"
LIVE_DIR = Path("_static") / "shardlab-live"
PYODIDE_CORE = ("pyodide.mjs", "pyodide.asm.mjs", "pyodide.asm.wasm", "python_stdlib.zip")


class _PageParser(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.loads: list[tuple[str, str, str]] = []  # (tag, rel, url)
        self.has_widget_state = False
        self.has_widget_view = False
        self.has_dropdown = False
        self.in_style = False
        self.styles: list[str] = []

    def handle_endtag(self, tag: str) -> None:
        if tag == "style":
            self.in_style = False

    def handle_data(self, data: str) -> None:
        if self.in_style:
            self.styles.append(data)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: (v or "") for k, v in attrs}
        if tag == "style":
            self.in_style = True
        if tag == "script" and a.get("type") == WIDGET_STATE_MIME:
            self.has_widget_state = True
        if tag == "script" and a.get("type") == WIDGET_VIEW_MIME:
            self.has_widget_view = True
        if "dropdown" in a.get("class", "").split():
            self.has_dropdown = True
        if tag == "link" and a.get("rel", "") in ("canonical", "next", "prev", "index", "search"):
            return  # navigation, not loaded
        for attr in URL_ATTRS.get(tag, ()):
            value = a.get(attr)
            if not value:
                continue
            urls = (
                [part.strip().split(" ")[0] for part in value.split(",")]
                if attr == "srcset"
                else [value]
            )
            for url in urls:
                self.loads.append((tag, a.get("rel", ""), url))


def _is_remote(url: str) -> bool:
    parts = urlsplit(url)
    return bool(parts.scheme in ("http", "https") or url.startswith("//"))


def check_page(page: Path, root: Path) -> tuple[list[str], bool]:
    parser = _PageParser()
    parser.feed(page.read_text(encoding="utf-8", errors="replace"))
    rel = page.relative_to(root).as_posix()
    problems: list[str] = []
    local_scripts: set[str] = set()
    for tag, _rel, url in parser.loads:
        if _is_remote(url):
            problems.append(f"{rel}: <{tag}> loads a remote resource: {url}")
            continue
        parts = urlsplit(url)
        if parts.scheme or not parts.path:
            continue  # data:, javascript:, fragment-only
        target = (page.parent / parts.path).resolve()
        if tag == "script":
            local_scripts.add(target.name)
        if tag in ("script", "link") and not target.exists():
            problems.append(f"{rel}: <{tag}> points to a missing file: {url}")
        elif tag == "link" and target.suffix == ".css":
            for m in CSS_REMOTE.finditer(target.read_text(encoding="utf-8", errors="replace")):
                problems.append(f"{rel}: stylesheet {url} loads a remote resource: {m.group(2)}")
    for m in CSS_REMOTE.finditer("".join(parser.styles)):
        problems.append(f"{rel}: a <style> block loads a remote resource: {m.group(2)}")
    if parser.has_widget_state:
        for name in ("require.js", "embed-amd.js"):
            if name not in local_scripts:
                problems.append(f"{rel}: has widget state but does not load the local {name}")
    if parser.has_widget_view and LIVE_SCRIPT not in local_scripts:
        problems.append(f"{rel}: shows widgets but does not load the local {LIVE_SCRIPT}")
    if parser.has_dropdown and "togglebutton.js" not in local_scripts:
        problems.append(f"{rel}: has a dropdown block but does not load togglebutton.js")
    return problems, parser.has_widget_state


def check_live_runtime(root: Path) -> list[str]:
    """Pyodide core files present; every wheel of the lock file present with its sha256; the
    Python snapshot ``python-memory.json`` names present and of this lock file."""
    folder = root / LIVE_DIR / "pyodide"
    problems = [
        f"{LIVE_DIR}/pyodide/{name} is missing"
        for name in PYODIDE_CORE
        if not (folder / name).is_file()
    ]
    lock_path = folder / "pyodide-lock.json"
    if not lock_path.is_file():
        return [*problems, f"{LIVE_DIR}/pyodide/pyodide-lock.json is missing"]
    packages = json.loads(lock_path.read_text())["packages"]
    if not packages:
        problems.append(f"{LIVE_DIR}/pyodide/pyodide-lock.json lists no packages")
    for name, entry in sorted(packages.items()):
        wheel = folder / entry["file_name"]
        if not wheel.is_file():
            problems.append(f"lock file package {name}: {entry['file_name']} is missing")
            continue
        digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
        if digest != entry["sha256"]:
            problems.append(
                f"lock file package {name}: {entry['file_name']} has sha256 {digest}, "
                f"the lock file says {entry['sha256']}"
            )
    # the shipped Python snapshot (tools/build_snapshot.py), when the manifest names one: it
    # must be there (the page would ask for it) and belong to this lock file (the page would
    # ignore another and start Python on every first visit)
    manifest = folder / "python-memory.json"
    named = json.loads(manifest.read_text()).get("file") if manifest.is_file() else None
    if named:
        want = snapshot_name(lock_path.read_bytes())
        if named != want:
            problems.append(f"python-memory.json names {named}, not this lock file's {want}")
        elif not (folder / named).is_file():
            problems.append(f"python-memory.json names {named}, which is missing")
    return problems


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("html_dir", nargs="?", default="_build/html", type=Path)
    args = ap.parse_args(argv)
    root: Path = args.html_dir
    pages = sorted(p for p in root.rglob("*.html") if "_static" not in p.relative_to(root).parts)
    if not pages:
        print(f"check_site: no HTML pages under {root}", file=sys.stderr)
        return 1
    problems: list[str] = []
    widget_pages = 0
    for page in pages:
        page_problems, has_widgets = check_page(page, root)
        problems += page_problems
        widget_pages += has_widgets
    if widget_pages:
        problems += check_live_runtime(root)
    how_to_read = root / "book" / "how_to_read.html"
    if how_to_read.exists():
        parser = _PageParser()
        parser.feed(how_to_read.read_text(encoding="utf-8"))
        if not parser.has_dropdown:
            problems.append("book/how_to_read.html: the folded worked-solution example is gone")
    else:
        problems.append("book/how_to_read.html was not built")
    for problem in problems:
        print(f"check_site: {problem}", file=sys.stderr)
    if problems:
        print(f"check_site: {len(problems)} problem(s) in {root}", file=sys.stderr)
        return 1
    print(
        f"check_site: {len(pages)} pages, {widget_pages} with widgets; "
        "every script, stylesheet and font is served locally; the live-calculator runtime "
        "matches its lock file"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
