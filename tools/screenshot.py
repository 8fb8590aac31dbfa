"""Screenshot a page of the built book in headless Chromium with the network cut off.

A manual check, not part of ``make test`` (CI machines need not have Chromium):

    .venv/bin/python tools/screenshot.py book/intro.html -o shots/intro.png
    .venv/bin/python tools/screenshot.py book/02_memory.html --dom shots/02_memory.dom.html

It serves ``_build/html`` (``--html-dir``) with ``http.server`` on a free localhost port and
runs Debian's ``chromium`` headless on the page with a fresh ``--user-data-dir``, the flags
that stop it from phoning home, ``--virtual-time-budget=10000`` (so require.js, the widget
manager and MathJax finish before the picture is taken) and a 1280×2400 window. External
hosts are unreachable for the browser: every host name except ``localhost`` resolves to
nothing (``--host-resolver-rules``) and every request not to localhost goes to a proxy on a
closed port, so a page that still loads something from a CDN shows the gap. ``--netns``
is stricter: it re-runs this script inside a new network namespace (``unshare -n``, root)
in which only the loopback interface exists. ``--dom`` also writes the DOM after
scripts ran, which is handy to grep (rendered widgets have ``widget-`` classes, e.g.
``widget-slider``, ``widget-html``; an unrendered one leaves only
``application/vnd.jupyter.widget-view+json`` text).

Install Chromium once with ``apt-get update && apt-get install -y chromium``.

How the offline widget path was verified (repeat after changing the widget set-up):

1. From the checkout's root, make a throwaway book in ``_build/wbook/`` (ignored by git) with
   the book's configuration and JavaScript::

       mkdir -p _build/wbook/book
       cp _config.yml _build/wbook/ && cp book/references.bib _build/wbook/book/
       cp -r book/_widgets_js _build/wbook/book/          # made by `make widget-js`
       printf 'format: jb-book\\nroot: book/widget_test\\n' > _build/wbook/_toc.yml

2. Write ``_build/wbook/book/widget_test.ipynb`` with one code cell
   ``w.VBox([w.IntSlider(value=7, description='D'), w.HTML('<b>...</b>')])`` and store it
   executed with its widget state::

       .venv/bin/python tools/execute_notebooks.py _build/wbook/book/widget_test.ipynb

3. Build it and take the picture with the network off::

       .venv/bin/jupyter-book build _build/wbook --all -W --keep-going
       .venv/bin/python tools/screenshot.py book/widget_test.html \\
           --html-dir _build/wbook/_build/html -o shots/widget_test.png \\
           --dom shots/widget_test.dom.html

4. Look at the PNG: the slider (at 7, labelled D) and the HTML table must be drawn, and the
   math rendered by the local MathJax. ``grep -c widget-slider shots/widget_test.dom.html``
   is non-zero. Then ``rm -rf _build/wbook``.
"""

from __future__ import annotations

import argparse
import functools
import http.server
import os
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-default-apps",
    "--disable-extensions",
    "--hide-scrollbars",
    "--mute-audio",
    # network off for everything but the local server
    "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE localhost",
    "--proxy-server=http://127.0.0.1:9",
    "--proxy-bypass-list=localhost;127.0.0.1",
]


def find_chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    sys.exit("screenshot: chromium not found; install it with `apt-get install -y chromium`")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass


def serve(html_dir: Path) -> tuple[http.server.ThreadingHTTPServer, int]:
    port = free_port()
    handler = functools.partial(_QuietHandler, directory=str(html_dir))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, port


def run_chromium(url: str, extra: list[str], timeout: float, capture: bool = False) -> str:
    with tempfile.TemporaryDirectory(prefix="shardlab-chromium-") as profile:
        cmd = [find_chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *extra, url]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        sys.exit(f"screenshot: chromium failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return proc.stdout if capture else ""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Screenshot a built book page, offline.")
    ap.add_argument("page", help="page path inside the HTML folder, e.g. book/intro.html")
    ap.add_argument("-o", "--out", type=Path, help="PNG to write (default shots/<page>.png)")
    ap.add_argument("--html-dir", type=Path, default=ROOT / "_build" / "html")
    ap.add_argument("--dom", type=Path, help="also write the DOM after scripts ran")
    ap.add_argument("--window-size", default="1280,2400")
    ap.add_argument("--budget-ms", type=int, default=10000, help="--virtual-time-budget")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds per chromium run")
    ap.add_argument("--netns", action="store_true", help="run inside `unshare -n` (no network)")
    args = ap.parse_args(argv)

    if args.netns and os.environ.get("SHARDLAB_IN_NETNS") != "1":
        inner = [sys.executable, str(Path(__file__).resolve()), *(argv or sys.argv[1:])]
        script = "ip link set lo up && exec " + " ".join(shlex.quote(a) for a in inner)
        env = {**os.environ, "SHARDLAB_IN_NETNS": "1"}
        return subprocess.run(["unshare", "-n", "sh", "-c", script], env=env).returncode

    html_dir = args.html_dir.resolve()
    if not (html_dir / args.page).is_file():
        sys.exit(f"screenshot: {html_dir / args.page} does not exist (run `make book-build`)")
    out = args.out or ROOT / "shots" / (Path(args.page).stem + ".png")
    out = out.resolve()
    out.parent.mkdir(parents=True, exist_ok=True)

    server, port = serve(html_dir)
    url = f"http://localhost:{port}/{args.page}"
    common = [f"--virtual-time-budget={args.budget_ms}", f"--window-size={args.window_size}"]
    try:
        run_chromium(url, [*common, f"--screenshot={out}"], args.timeout)
        print(f"screenshot: {url} -> {out}")
        if args.dom:
            dom = run_chromium(url, [*common, "--dump-dom"], args.timeout, capture=True)
            args.dom.parent.mkdir(parents=True, exist_ok=True)
            args.dom.write_text(dom, encoding="utf-8")
            print(f"screenshot: DOM -> {args.dom.resolve()}")
    finally:
        server.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
