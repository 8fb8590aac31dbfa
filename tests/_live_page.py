"""Helpers of the live-calculator browser test (tests/test_live_browser.py), over Playwright.

* :func:`serve` — the built site (``_build/html``) on 127.0.0.1, built first if missing;
* :func:`offline_context` — a browser context in which every request that is not to the local
  server is aborted and counted (Chromium also runs with every other host unresolvable);
* :class:`Console` — every console error and uncaught exception of a page;
* :func:`axe_violations` — axe-core (from the npm registry, ``npm pack axe-core``, cached in
  ``.cache/axe``) injected into the page; its violations by impact;
* :func:`controls`, :func:`type_into` — a live calculator's fields by label, and typing into one
  with real keystrokes.
"""

from __future__ import annotations

import functools
import http.server
import json
import os
import shutil
import subprocess
import sys
import tarfile
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
from build_snapshot import CHROMIUM_ARGS, chromium_path  # noqa: E402,F401  (one copy: the book build's)

SITE = ROOT / "_build" / "html"
AXE_VERSION = "4.14.1"
AXE_TGZ_SHA256 = "e6b0ce02b84d892e2e33e403485e7f3d6c29e2be6df65daf44d89ba564139745"
AXE_CACHE = ROOT / ".cache" / "axe"


def require_chromium() -> str:
    exe = chromium_path()
    if exe is None:
        why = "chromium is not installed (apt-get install -y chromium)"
        if os.environ.get("SHARDLAB_REQUIRE_BROWSER") == "1":
            pytest.fail(why)
        pytest.skip(why)
    return exe


def build_site_if_missing(page: str) -> None:
    if (SITE / page).is_file():  # make test-slow builds it first; build it here when run alone
        return
    import fcntl

    with open(ROOT / "_build.lock", "w") as lock:  # one build even under pytest-xdist
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (SITE / page).is_file():
            subprocess.run(["make", "--no-print-directory", "book-build"], cwd=ROOT, check=True)


class _Quiet(http.server.SimpleHTTPRequestHandler):
    requested: list[str]
    answered: list[tuple[str, int]]  # (path, status): 304 = the browser's cached copy was fresh

    def log_request(self, code="-", size="-"):
        self.answered.append((self.path, int(getattr(code, "value", code))))
        super().log_request(code, size)

    def log_message(self, format, *args):  # noqa: A002 - the base class's name
        self.requested.append(self.path)


def serve():
    """Start a server of ``SITE``; returns ``(base_url, requested_paths, stop)``; ``stop.answered``
    lists ``(path, status)`` of every answered request."""
    requested: list[str] = []
    answered: list[tuple[str, int]] = []
    handler = functools.partial(
        type("Handler", (_Quiet,), {"requested": requested, "answered": answered}),
        directory=str(SITE),
    )
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()

    def stop() -> None:
        server.shutdown()
        server.server_close()

    stop.answered = answered
    return f"http://127.0.0.1:{server.server_address[1]}", requested, stop


def offline_context(browser, base: str, **kwargs):
    """A new context (empty cache) whose non-local requests are aborted; ``ctx.foreign``
    lists them."""
    ctx = browser.new_context(**kwargs)
    ctx.foreign = []

    def route(r):
        url = r.request.url
        if url.startswith((base + "/", "data:", "blob:")):
            r.continue_()
        else:
            ctx.foreign.append(url)
            r.abort()

    ctx.route("**/*", route)
    return ctx


class Console:
    """Console errors and uncaught exceptions of one page, from the moment it is attached."""

    def __init__(self, page):
        self.errors: list[str] = []
        page.on("console", self._console)
        page.on("pageerror", lambda exc: self.errors.append(f"uncaught: {exc}"))

    def _console(self, msg) -> None:
        if msg.type == "error":
            where = (msg.location or {}).get("url", "")
            self.errors.append(f"{msg.text} ({where})")


def axe_source() -> str:
    """axe.min.js of axe-core ``AXE_VERSION`` from the npm registry (cached, sha256-checked)."""
    js = AXE_CACHE / f"axe-{AXE_VERSION}.min.js"
    if js.is_file():
        return js.read_text(encoding="utf-8")
    AXE_CACHE.mkdir(parents=True, exist_ok=True)
    tgz = AXE_CACHE / f"axe-core-{AXE_VERSION}.tgz"
    if not tgz.is_file():
        if shutil.which("npm") is None:
            pytest.fail("npm is needed to fetch axe-core (apt-get install -y npm)")
        subprocess.run(["npm", "pack", "--silent", f"axe-core@{AXE_VERSION}",
                        "--pack-destination", str(AXE_CACHE)], check=True,
                       stdout=subprocess.DEVNULL)
    import hashlib

    got = hashlib.sha256(tgz.read_bytes()).hexdigest()
    assert got == AXE_TGZ_SHA256, f"{tgz}: sha256 {got}, expected {AXE_TGZ_SHA256}"
    with tarfile.open(tgz) as tf:
        text = tf.extractfile("package/axe.min.js").read().decode("utf-8")
    js.write_text(text, encoding="utf-8")
    return text


AXE_RUN = """async () => {
  const r = await axe.run(document, {resultTypes: ['violations']});
  return r.violations.map(v => ({id: v.id, impact: v.impact, help: v.help,
    nodes: v.nodes.slice(0, 4).map(n => n.target.join(' '))}));
}"""


def axe_violations(page, impacts=("serious", "critical")) -> list[dict]:
    page.add_script_tag(content=axe_source())
    return [v for v in page.evaluate(AXE_RUN) if v["impact"] in impacts]


# label text -> current value of each field of one live calculator (toggle buttons: the
# pressed one; checkboxes: true/false)
CONTROLS_JS = """(holder) => {
  const out = {};
  for (const box of holder.querySelectorAll('.widget-inline-hbox')) {
    const label = box.querySelector(':scope > label');
    if (!label) continue;
    const name = label.textContent.trim();
    const input = box.querySelector('input, select, textarea');
    if (input) out[name] = input.type === 'checkbox' ? input.checked : input.value;
  }
  for (const box of holder.querySelectorAll('.widget-toggle-buttons')) {
    const label = box.querySelector('.widget-label');
    const pressed = box.querySelector('.mod-active');
    if (label && pressed) out[label.textContent.trim()] = pressed.textContent.trim();
  }
  return out;
}"""


def views(page):
    return page.locator(".shardlab-live-view")


def title_of(view) -> str:
    return view.locator(".widget-html-content b").first.inner_text().strip()


def controls(view) -> dict:
    return view.evaluate(CONTROLS_JS)


def field(view, label: str):
    box = view.locator(".widget-inline-hbox").filter(
        has=view.page.locator(f"label:text-is({json.dumps(label)})")
    )
    return box.locator("input, select").first


def type_into(view, label: str, text: str, enter: bool = True) -> None:
    """Select the field's text and type ``text`` key by key (then Enter), as a reader does."""
    box = field(view, label)
    box.click()
    box.press("Control+A")
    box.press_sequentially(text)
    if enter:
        box.press("Enter")


def result_text(view) -> str:
    return view.locator(".widget-html-content").last.inner_text()


def run_cli(args: list[str]) -> dict:
    cmd = [str(ROOT / ".venv" / "bin" / "shardlab"), *args, "--json"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, (cmd, done.stdout, done.stderr)
    return json.loads(done.stdout)
