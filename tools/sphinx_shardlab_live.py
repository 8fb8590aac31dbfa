"""Sphinx extension: the live calculators' script, and a clean console, on every book page.

Listed in ``_config.yml`` (``sphinx: local_extensions``). On each HTML page whose body
displays stored widget state (a ``application/vnd.jupyter.widget-view+json`` tag), it adds to
the page's head

    <script async src="<relative>/_static/shardlab-live/shardlab-live.js"></script>

so that Python starts downloading and compiling before the page's images, math and stored views
are done. (Preload links for the runtime were tried: they hold back the page's load event, and so
the stored views, by the 17 MB they fetch.) No notebook
carries per-page markup: the script finds the calculators in the page's widget state itself
(``tools/live/shardlab-live.js``). The files come from ``tools/build_live.py`` (``make
book-build`` runs it first); a build without them warns, which ``jupyter-book build -W`` turns
into an error.

On every page it also includes ``shardlab-live.css`` (calculator layout: no wrapped numbers, one
scroll bar) and ``shardlab-page.js`` (accessible names of the theme's buttons), and drops a script
that the theme chain adds twice (sphinx-thebe's ``const THEBE_JS_URL`` declared twice is a
``SyntaxError`` on every page). Figures drawn by code get a text alternative
(``sphinx_figure_alt``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sphinx.application import Sphinx
from sphinx.util import logging

VIEW_MIME = "application/vnd.jupyter.widget-view+json"
LIVE = "shardlab-live"
SCRIPT = f"{LIVE}/shardlab-live.js"
logger = logging.getLogger(__name__)


def _static_folder(app: Sphinx) -> Path | None:
    for folder in app.config.html_static_path:
        if (Path(app.confdir) / folder / SCRIPT).is_file():
            return Path(app.confdir) / folder / LIVE
    return None


def add_live_script(
    app: Sphinx, pagename: str, templatename: str, context: dict[str, Any], doctree: Any
) -> None:
    _dedupe_scripts(context)
    # An explicit colour mode: with none (pydata-sphinx-theme's template variable), the theme
    # logs "Got invalid theme mode" on every page. Light: the calculators' charts and tables
    # are drawn for a light page.
    context.setdefault("default_mode", "light")
    body = context.get("body") or ""
    if VIEW_MIME not in body:
        return
    if _static_folder(app) is None:
        logger.warning(
            "shardlab live: %s shows widgets but no html_static_path holds %s; "
            "run tools/build_live.py (make book-build does)",
            pagename,
            SCRIPT,
        )
        return
    pathto = context["pathto"]
    head = [f'<script async src="{pathto(f"_static/{SCRIPT}", 1)}"></script>']
    context["metatags"] = context.get("metatags", "") + "\n" + "\n".join(head) + "\n"


def _dedupe_global_scripts(app: Sphinx, env: Any) -> None:
    """sphinx-thebe's configuration script is registered twice (its own extension and
    jupyter-book both run its setup): drop the copy from the builder's list of page scripts."""
    scripts = getattr(app.builder, "_js_files", None)
    if scripts is not None:
        _dedupe_scripts({"script_files": scripts})


def _dedupe_scripts(context: dict[str, Any]) -> None:
    """Keep the first of identical ``<script>`` entries (same file, same inline body)."""
    scripts = context.get("script_files")
    if not scripts:
        return
    seen: set[str] = set()
    kept = []
    for js in scripts:
        attrs = getattr(js, "attributes", {}) or {}
        name = str(getattr(js, "filename", js) or "")
        name = "" if name in ("", "_static/") else name  # an inline script, however registered
        key = f"{name}|{sorted((k, str(v)) for k, v in attrs.items())}"
        if key in seen:
            continue
        seen.add(key)
        kept.append(js)
    scripts[:] = kept


def setup(app: Sphinx) -> dict[str, Any]:
    app.connect("html-page-context", add_live_script)
    app.connect("env-updated", _dedupe_global_scripts)
    app.add_css_file(f"{LIVE}/shardlab-live.css")
    app.add_js_file(f"{LIVE}/shardlab-page.js", defer="defer")
    app.setup_extension("sphinx_figure_alt")
    return {"version": "1.1", "parallel_read_safe": True, "parallel_write_safe": True}
