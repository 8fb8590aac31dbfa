"""Sphinx extension: load the live-calculator script on every page that shows a widget.

Listed in ``_config.yml`` (``sphinx: local_extensions``). On each HTML page whose body
displays stored widget state (a ``application/vnd.jupyter.widget-view+json`` tag), it adds

    <script defer src="<relative>/_static/shardlab-live/shardlab-live.js"></script>

at the end of the page body. No notebook carries per-page markup: the script finds the
calculators in the page's widget state itself (``tools/live/shardlab-live.js``). The
files come from ``tools/build_live.py`` (``make book-build`` runs it first); a build
without them warns, which ``jupyter-book build -W`` turns into an error.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sphinx.application import Sphinx
from sphinx.util import logging

VIEW_MIME = "application/vnd.jupyter.widget-view+json"
SCRIPT = "shardlab-live/shardlab-live.js"
logger = logging.getLogger(__name__)


def _static_has_script(app: Sphinx) -> bool:
    for folder in app.config.html_static_path:
        if (Path(app.confdir) / folder / SCRIPT).is_file():
            return True
    return False


def add_live_script(
    app: Sphinx, pagename: str, templatename: str, context: dict[str, Any], doctree: Any
) -> None:
    body = context.get("body") or ""
    if VIEW_MIME not in body:
        return
    if not _static_has_script(app):
        logger.warning(
            "shardlab live: %s shows widgets but no html_static_path holds %s; "
            "run tools/build_live.py (make book-build does)",
            pagename,
            SCRIPT,
        )
        return
    src = context["pathto"](f"_static/{SCRIPT}", 1)
    context["body"] = body + f'\n<script defer src="{src}"></script>\n'


def setup(app: Sphinx) -> dict[str, Any]:
    app.connect("html-page-context", add_live_script)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
