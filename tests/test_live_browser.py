"""The live calculators in a real browser: Chromium, the built site, no other host.

Serves ``_build/html`` (``make book-build``, run here if the page is missing) on 127.0.0.1, starts headless Chromium with
every other host unresolvable, opens chapter 2, waits for Python (Pyodide) to make its
calculator live, types a new D into the calculator's input on the page, and checks that
the page then shows the per-rank bytes ``shardlab.accounting.memory.model_state`` gives
for the new D. Every request the page made must have gone to the local server.
Chromium is driven over the DevTools protocol (``--virtual-time-budget`` would not wait
for Pyodide). Prints the time from navigation start to the first live result.

Slow (Pyodide starts in 10-20 s on 2 cores): runs under ``make test-slow``. Needs Debian's
``chromium`` (``.ci/run`` installs it); without it the test is skipped, unless
``SHARDLAB_REQUIRE_BROWSER=1`` (set by ``.ci/run``) makes that a failure.
"""

from __future__ import annotations

import functools
import http.server
import json
import os
import re
import shutil
import subprocess
import threading
import time
from pathlib import Path

import pytest
from shardlab.accounting import memory as acc

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
SITE = ROOT / "_build" / "html"
PAGE = "book/02_memory.html"
READY_TIMEOUT_S = 180
N = 7_000_000_000  # the chapter's calculator: memory_calculator(n_params="7e9", dp=8, ...)
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--disable-dev-shm-usage",
    # every host name fails to resolve; only the IP literal of the local server works
    "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
    "--remote-debugging-port=0",
]


def chromium_path() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    requested: list[str]

    def log_message(self, format, *args):  # noqa: A002 - the base class's name
        self.requested.append(self.path)


@pytest.fixture(scope="module")
def site_url():
    if not (SITE / PAGE).is_file():  # make test builds it; build it here when run alone
        import fcntl

        with open(ROOT / "_build.lock", "w") as lock:  # one build even under pytest-xdist
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not (SITE / PAGE).is_file():
                subprocess.run(["make", "--no-print-directory", "book-build"], cwd=ROOT, check=True)
    requested: list[str] = []
    handler = functools.partial(
        type("Handler", (QuietHandler,), {"requested": requested}), directory=str(SITE)
    )
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", requested
    server.shutdown()
    server.server_close()


class DevTools:
    """The few DevTools-protocol calls this test needs, over one page's websocket."""

    def __init__(self, ws_url: str):
        import websocket  # websocket-client, installed with jupyter_server

        self.ws = websocket.create_connection(ws_url, timeout=60, suppress_origin=True)
        self.next_id = 0
        self.events: list[dict] = []

    def call(self, method: str, **params):
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == self.next_id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg["result"]
            self.events.append(msg)

    def eval(self, expression: str):
        result = self.call(
            "Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True
        )
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression!r} raised {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout: float, what: str):
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            value = self.eval(expression)
            if value:
                return value
            time.sleep(0.25)
        raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")

    def close(self):
        self.ws.close()


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    exe = chromium_path()
    if exe is None:
        if os.environ.get("SHARDLAB_REQUIRE_BROWSER") == "1":
            pytest.fail("chromium is not installed (apt-get install -y chromium)")
        pytest.skip("chromium is not installed (apt-get install -y chromium)")
    profile = tmp_path_factory.mktemp("chromium-profile")
    proc = subprocess.Popen(
        [exe, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "about:blank"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    port_file = profile / "DevToolsActivePort"
    end = time.monotonic() + 60
    while not port_file.exists() or not port_file.read_text().strip():
        if proc.poll() is not None or time.monotonic() > end:
            proc.kill()
            pytest.fail(f"chromium did not start (exit code {proc.poll()})")
        time.sleep(0.1)
    port = int(port_file.read_text().split()[0])
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as r:
        pages = [t for t in json.load(r) if t["type"] == "page"]
    tools = DevTools(pages[0]["webSocketDebuggerUrl"])
    yield tools
    tools.close()
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


# The live memory calculator's "bytes/rank" cells, by layout (the totals table).
TOTALS_JS = """(() => {
  const view = document.querySelector('.shardlab-live-view');
  if (!view) return null;
  for (const table of view.querySelectorAll('table.shardlab-table')) {
    const heads = [...table.querySelectorAll('thead th')].map(th => th.textContent.trim());
    const col = heads.indexOf('bytes/rank');
    if (col < 0) continue;
    const out = {};
    for (const tr of table.querySelectorAll('tbody tr')) {
      const cells = [...tr.children].map(td => td.textContent.trim());
      out[cells[0]] = cells[col];
    }
    return out;
  }
  return null;
})()"""

# display style of the stored (static) calculator view, or null if it was never rendered
STATIC_VIEW_JS = """(() => {
  const el = document.querySelector('.widget-subarea:not(.shardlab-live-view)');
  return el && el.querySelector('table.shardlab-table') ? el.style.display || 'shown' : null;
})()"""

D_INPUT_JS = """(() => {
  const view = document.querySelector('.shardlab-live-view');
  for (const label of view.querySelectorAll('label')) {
    if (label.textContent.trim() === 'D (data-parallel ranks)') {
      const input = label.parentElement.querySelector('input');
      input.focus();
      input.select();
      return input.value;
    }
  }
  return null;
})()"""


def expected_bytes(n: float, d: int) -> dict[str, int]:
    rec = acc.get_recipe("mixed-adam-16")
    return {lay: round(acc.model_state(n, d, lay, rec).total) for lay in acc.LAYOUTS}


def shown_bytes(totals: dict[str, str]) -> dict[str, int]:
    return {lay: int(cell.replace(",", "")) for lay, cell in totals.items()}


def test_live_calculator_recomputes_in_the_browser(site_url, browser):
    base, requested = site_url
    browser.call("Network.enable")
    browser.call("Page.enable")
    browser.call("Runtime.enable")
    browser.call("Page.navigate", url=f"{base}/{PAGE}")
    t0 = time.monotonic()

    # The stored (static) view and the "loading" note come first.
    note = browser.wait_for(
        "document.querySelector('.shardlab-live-status')?.textContent", 30, "the live-status note"
    )
    assert "Live version loading" in note and " s " in note, note

    state = browser.wait_for(
        "window.shardlabLive && window.shardlabLive.state !== 'loading' && window.shardlabLive.state",
        READY_TIMEOUT_S,
        "Python to start",
    )
    live = browser.eval("JSON.parse(JSON.stringify(window.shardlabLive))")
    assert state == "ready", live
    assert live["errors"] == [], live["errors"]
    assert live["calculators"] == 1
    assert all(live["same"].values()), "the live calculator did not reproduce the stored output"
    ready_wall = time.monotonic() - t0
    # The stored view was rendered first and is now hidden behind the live one.
    assert browser.eval(STATIC_VIEW_JS) == "none"

    # The live view shows D=8 (the chapter's inputs), computed by Python.
    before = shown_bytes(browser.eval(TOTALS_JS))
    assert before == expected_bytes(N, 8)

    # Type D=4 into the page's input and press Enter, as a reader would.
    assert browser.eval(D_INPUT_JS) == "8"
    t_edit = time.monotonic()
    browser.call("Input.insertText", text="4")
    for kind in ("keyDown", "keyUp"):
        browser.call(
            "Input.dispatchKeyEvent",
            type=kind,
            key="Enter",
            code="Enter",
            windowsVirtualKeyCode=13,
            nativeVirtualKeyCode=13,
            **({"text": "\r"} if kind == "keyDown" else {}),
        )
    want = expected_bytes(N, 4)
    zero3 = json.dumps(f"{want['zero3']:,}")
    totals = browser.wait_for(
        f"(() => {{ const t = {TOTALS_JS}; return t && t['zero3'] === {zero3} ? t : null; }})()",
        30,
        "the page to show the result for D=4",
    )
    edit_s = time.monotonic() - t_edit
    assert shown_bytes(totals) == want
    assert shown_bytes(totals) != before

    # Nothing was fetched from anywhere but the local server.
    urls = [
        e["params"]["request"]["url"]
        for e in browser.events
        if e.get("method") == "Network.requestWillBeSent"
    ]
    foreign = [u for u in urls if not u.startswith((base + "/", "data:", "blob:"))]
    assert foreign == [], foreign
    assert any(p.endswith("pyodide.asm.wasm") for p in requested)
    # ... and no widget, Pyodide or live-script error reached the console (the theme's own
    # messages, e.g. sphinx-thebe declaring THEBE_JS_URL twice, are not this test's concern).
    errors = [
        json.dumps(e["params"])[:400]
        for e in browser.events
        if e.get("method") == "Runtime.exceptionThrown"
        or (e.get("method") == "Runtime.consoleAPICalled" and e["params"]["type"] == "error")
    ]
    ours = [e for e in errors if re.search(r"shardlab|pyodide|python|embed-amd", e, re.I)]
    assert ours == [], ours
    assert any(p.endswith(".whl") for p in requested)

    print(
        f"\nlive calculator: navigation start -> first live result {live['readyAt'] / 1000:.1f} s "
        f"(page script start -> live {live['readyMs'] / 1000:.1f} s; wall {ready_wall:.1f} s); "
        f"edit -> new result {edit_s:.2f} s; {len(urls)} requests, all to {base}; "
        f"phases (ms from navigation start): {live['phases']}"
    )


def page_calculators(html: str) -> int:
    """How many calculators a built page displays (from its stored widget state)."""
    from shardlab.widgets import live as live_module

    state = re.search(
        r'<script type="application/vnd\.jupyter\.widget-state\+json">(.*?)</script>', html, re.S
    )
    views = re.findall(
        r'<script type="application/vnd\.jupyter\.widget-view\+json">(.*?)</script>', html, re.S
    )
    if not state:
        return 0
    models = json.loads(state.group(1))["state"]
    ids = [json.loads(v)["model_id"] for v in views]
    return sum(live_module._title(models, i) is not None for i in ids)


def test_every_calculator_page_goes_live(site_url, browser):
    base, _ = site_url
    pages = {
        p.relative_to(SITE).as_posix(): n
        for p in sorted(SITE.rglob("*.html"))
        if "_static" not in p.parts and (n := page_calculators(p.read_text(encoding="utf-8")))
    }
    assert len(pages) >= 10, pages  # chapters 1-10 and lab 01 show calculators
    browser.call("Page.enable")
    times = {}
    for page, expected in pages.items():
        browser.call("Page.navigate", url=f"{base}/{page}")
        browser.wait_for(
            "document.readyState === 'complete' && !!window.shardlabLive", 60, f"{page} to load"
        )
        state = browser.wait_for(
            "window.shardlabLive.state !== 'loading' && window.shardlabLive.state",
            READY_TIMEOUT_S,
            f"{page} to go live",
        )
        live = browser.eval("JSON.parse(JSON.stringify(window.shardlabLive))")
        assert state == "ready" and live["errors"] == [], (page, live)
        assert live["calculators"] == expected, (page, live)
        assert len(live["same"]) == expected and all(live["same"].values()), (page, live)
        shown = browser.eval("document.querySelectorAll('.shardlab-live-view').length")
        assert shown == expected, (page, shown)
        times[page] = round(live["readyAt"] / 1000, 1)
    print(f"\nlive calculators per page, navigation start -> live (s): {times}")


def test_stored_view_stays_when_python_cannot_start(site_url, browser):
    base, _ = site_url
    browser.call("Network.enable")
    browser.call("Page.enable")
    browser.call("Network.setBlockedURLs", urls=["*pyodide.asm.wasm"])
    # the page gives up after 180 s by default; 20 s is enough to show the fallback here
    script = browser.call(
        "Page.addScriptToEvaluateOnNewDocument", source="window.shardlabLiveTimeoutMs = 20000;"
    )
    try:
        browser.call("Page.navigate", url=f"{base}/{PAGE}")
        state = browser.wait_for(
            "window.shardlabLive && window.shardlabLive.state !== 'loading' && "
            "window.shardlabLive.state",
            60,
            "the live script to give up",
        )
        assert state == "failed"
        browser.wait_for(STATIC_VIEW_JS, 30, "the stored view")
        assert browser.eval(STATIC_VIEW_JS) == "shown"
        assert browser.eval("document.querySelectorAll('.shardlab-live-view').length") == 0
        note = browser.eval("document.querySelector('.shardlab-live-status').textContent")
        assert (
            note.startswith("Live version unavailable")
            and "computed when the book was built" in note
        )
        assert shown_bytes(
            browser.eval(TOTALS_JS.replace(".shardlab-live-view", ".widget-subarea"))
        ) == (expected_bytes(N, 8))
    finally:
        browser.call("Network.setBlockedURLs", urls=[])
        browser.call("Page.removeScriptToEvaluateOnNewDocument", identifier=script["identifier"])
