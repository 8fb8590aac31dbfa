"""Ship a Python memory snapshot with the live calculators, so a first visit skips Python's start.

Run by ``make book-build`` after ``tools/build_live.py``::

    .venv/bin/python tools/build_snapshot.py [--dest book/_live]

Why: on a 2-core machine Pyodide takes 4-5 s to start Python and install the wheels, most of a
first visit's 7 s to a live page (measured in headless Chromium on an empty page: fetching and
compiling the 9.6 MB wasm took 0.2-0.35 s, the rest was Python's start). A later visit restores
the memory snapshot the first one left in Cache Storage in under a second. This script makes
that snapshot once, at build time, and ships it gzip-compressed (31 MB of memory, about 8 MB
compressed) as ``pyodide/python-memory-<sha256 of pyodide-lock.json>.bin.gz``, named in
``pyodide/python-memory.json``: the worker (``tools/live/shardlab-worker.js``) asks for it
when its cache holds none and the manifest names its key (without a snapshot the manifest
says null and the page requests nothing that would answer 404). A new build
(another wheel, another Pyodide) has another lock file, hence another name: a stale snapshot
is never restored; ``build_live.py`` keeps only the current one.

How: the snapshot is made by the page's own worker, exactly as a first visit makes it (start
Python, install every wheel of the lock file, ``shardlab.widgets.live.preload()``, copy the
memory), in headless Chromium driven by Playwright, from ``DEST`` served on 127.0.0.1 with no
other host reachable. Without Chromium or Playwright it prints one sentence and ships nothing:
the page then starts Python on a first visit, as before.
"""

from __future__ import annotations

import argparse
import base64
import functools
import http.server
import shutil
import sys
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))

from build_live import snapshot_manifest, snapshot_name  # noqa: E402

# A page that runs the worker as a first visit does and hands back its snapshot, gzipped.
PAGE = """<!doctype html><html><head><meta charset="utf-8"><title>snapshot</title></head><body>
<script>
window.done = null;
const base = new URL("shardlab-live/pyodide/", location.href).href;
const worker = new Worker("shardlab-live/shardlab-worker.js", { type: "module" });
worker.onmessage = async (event) => {
  const msg = event.data;
  if (msg.type === "failed") window.done = { error: msg.message };
  else if (msg.type === "ready") worker.postMessage({ type: "store" });
  else if (msg.type === "stored") {
    if (msg.error || !msg.bytes) { window.done = { error: msg.error || "no snapshot" }; return; }
    const cache = await caches.open("shardlab-live-snapshot");
    const [key] = await cache.keys();
    const raw = await (await cache.match(key)).blob();
    const gz = await new Response(raw.stream().pipeThrough(new CompressionStream("gzip"))).blob();
    const b64 = await new Promise((resolve) => {
      const reader = new FileReader();
      reader.onload = () => resolve(reader.result.split(",")[1]);
      reader.readAsDataURL(gz);
    });
    window.done = { key: key.url, bytes: msg.bytes, gz: b64 };
  }
};
worker.postMessage({ type: "start", pyBase: base });
</script></body></html>
"""


# headless Chromium as this project runs it (here and in tests/_live_page.py): no sandbox
# (CI runs as root), nothing that phones home, every host name but the local server unresolvable
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--disable-dev-shm-usage",
    "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
]


def chromium_path() -> str | None:
    """The system Chromium (Debian's ``chromium``), or None."""
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if found := shutil.which(name):
            return found
    return None


def _serve(root: Path):
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, format, *args):  # noqa: A002 - the base class's name
            pass

        def do_GET(self):  # noqa: N802 - the base class's name
            if self.path.split("?")[0] == "/snapshot.html":
                body = PAGE.encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/html; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            else:
                super().do_GET()

    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(Quiet, directory=str(root))
    )
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def build(dest: Path, timeout_s: float = 300.0) -> Path | None:
    folder = dest / "shardlab-live" / "pyodide"
    lock = folder / "pyodide-lock.json"
    if not lock.is_file():
        raise SystemExit(f"build_snapshot: {lock} is missing (run tools/build_live.py first)")
    out = folder / snapshot_name(lock.read_bytes())
    manifest = folder / "python-memory.json"
    if out.is_file():
        manifest.write_bytes(snapshot_manifest(out.name))
        print(f"build_snapshot: {out.name} is current")
        return out
    exe = chromium_path()
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        sync_playwright = None
    if exe is None or sync_playwright is None:
        why = "Chromium is not installed" if exe is None else "Playwright is not installed"
        print(f"build_snapshot: {why}; the book ships no Python snapshot (a first visit starts "
              "Python in the browser, a few seconds slower)")
        return None
    server = _serve(dest)
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=exe, headless=True, args=CHROMIUM_ARGS)
            page = browser.new_page()
            page.goto(f"http://127.0.0.1:{server.server_address[1]}/snapshot.html")
            page.wait_for_function("window.done !== null", timeout=timeout_s * 1000)
            done = page.evaluate("window.done")
            browser.close()
    finally:
        server.shutdown()
        server.server_close()
    if "error" in done:
        raise SystemExit(f"build_snapshot: the worker made no snapshot: {done['error']}")
    if not done["key"].endswith("/" + out.name[: -len(".gz")]):
        raise SystemExit(f"build_snapshot: the worker's key {done['key']} is not {out.name}")
    data = base64.b64decode(done["gz"])
    for old in folder.glob("python-memory-*.bin.gz"):  # another build's
        old.unlink()
    out.write_bytes(data)
    manifest.write_bytes(snapshot_manifest(out.name))  # the page asks for it from now on
    print(f"build_snapshot: {out.name}: {done['bytes'] / 1e6:.1f} MB of Python memory, "
          f"{len(data) / 1e6:.1f} MB gzipped")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dest", type=Path, default=ROOT / "book" / "_live")
    build(ap.parse_args(argv).dest)
    return 0


if __name__ == "__main__":
    sys.exit(main())
