/*
 * shardlab live calculators: make the calculators stored in a book page live, offline.
 *
 * The page first shows each calculator from its stored widget state (rendered by
 * @jupyter-widgets/html-manager's embed-amd.js): the values computed when the book was
 * built. This script then starts Pyodide from this site (_static/shardlab-live/pyodide/,
 * built by tools/build_live.py), installs the wheels listed in its pyodide-lock.json
 * (Pyodide checks each sha256), and asks shardlab.widgets.live to rebuild every stored
 * calculator in Python. The rebuilt ipywidgets talk to a widget manager on this page over
 * a kernel-less comm bridge (the Jupyter widget protocol, messages as JSON), so the
 * calculators' own Python callbacks run when the reader edits an input: every number is
 * computed by shardlab.accounting, nothing here. When Python is ready the stored view is
 * swapped for the live one; if anything fails, the stored view stays and the note says why.
 *
 * A later visit (any page of the same build) restores a memory snapshot of that Python,
 * stored in the browser's Cache Storage by the first visit, instead of starting it and
 * importing ipywidgets again (see "A repeat visit restores" below).
 *
 * The script is loaded async from the page's head (tools/sphinx_shardlab_live.py, which also
 * preloads the runtime files): Pyodide starts downloading and compiling at once, before the
 * page's images, math and stored views are done. Edits a reader makes to a stored view while
 * Python is loading are replayed into the live view when it appears (not lost). When an input
 * is refused, the calculator keeps its height (the sentence shows in place of the result).
 *
 * window.shardlabLive reports progress for tests (tests/test_live_browser.py): state
 * ("loading" | "ready" | "failed"), readyAt (ms from navigation start to the live
 * calculators showing Python's first result), readyMs (the same from this script's start),
 * same (stored id -> the live result equals the stored one), errors.
 */
(function () {
  "use strict";
  const STATE_MIME = "application/vnd.jupyter.widget-state+json";
  const VIEW_MIME = "application/vnd.jupyter.widget-view+json";
  // Navigation start to the first live result, measured by tests/test_live_browser.py
  // (test_load_time_cold_and_repeat) and per page in headless Chromium on an idle 2-core
  // machine (README, "Live calculators"): 3.7-4.2 s on a first visit (5.0 s chapter 10),
  // 1.1-1.5 s on a later one (2.4-2.5 s chapter 10, whose planner searches once in Python);
  // on a slower machine of the same kind 5.2-7.9 s and 1.5-2.4 s (chapter 10: 7.8-8.9 s and
  // 3.7-4.2 s); 40-75 s were measured with both cores kept busy by other programs.
  const EXPECTED =
    "measured on 2-core machines: 4-8 s the first time, 1-2.5 s on a later visit " +
    "(chapter 10: 5-9 s and 2.5-4 s), up to a minute while other programs keep it busy; " +
    "17 MB is downloaded the first time, nothing on a later visit";
  // A runtime file that never arrives can leave Pyodide waiting forever: give up after this
  // long and keep the stored views (tests shorten it with window.shardlabLiveTimeoutMs).
  const TIMEOUT_MS = window.shardlabLiveTimeoutMs || 180000;
  const script = document.currentScript;
  const base = new URL(".", script.src).href;
  const pyBase = base + "pyodide/";
  const live = (window.shardlabLive = {
    state: "loading",
    readyMs: null,
    readyAt: null,
    phases: {}, // ms from navigation start at which each step finished
    snapshot: {}, // bytes restored / stored (a repeat visit restores Python's memory), error

    errors: [],
    calculators: 0,
    same: {},
  });

  function phase(name) {
    live.phases[name] = Math.round(performance.now());
  }

  function noteStyle(el, color) {
    el.style.cssText =
      "font:13px sans-serif;margin:4px 0;padding:4px 8px;border-left:3px solid " +
      color +
      ";background:#f7f7f7";
  }

  function setNotes(text, color, state) {
    for (const el of document.querySelectorAll(".shardlab-live-status")) {
      el.textContent = text;
      el.dataset.state = state;
      noteStyle(el, color);
    }
  }

  // Which displayed widgets are calculators: a VBox whose first child is a bold title.
  // (shardlab.widgets.live decides for certain; this only places the "loading" notes.)
  function calculatorViews(models) {
    const out = [];
    for (const tag of document.querySelectorAll(`script[type="${VIEW_MIME}"]`)) {
      let id;
      try {
        id = JSON.parse(tag.textContent).model_id;
      } catch (e) {
        continue;
      }
      const m = models[id];
      if (!m || m.model_name !== "VBoxModel") continue;
      const first = (m.state.children || [])[0];
      const title = first && models[String(first).replace("IPY_MODEL_", "")];
      if (title && title.model_name === "HTMLModel" && /^<b>.*<\/b>$/.test(title.state.value)) {
        out.push({ id, tag });
      }
    }
    return out;
  }

  function requireModule(name) {
    return new Promise((resolve, reject) => window.requirejs([name], resolve, reject));
  }

  // ipywidgets' HTML views typeset with the MathJax 2 call MathJax.Hub.Queue; the book loads
  // MathJax 3, which has no Hub, so every widget view logged a TypeError. Forward the call to
  // MathJax 3's typesetPromise.
  function mathjaxHubShim() {
    const mj = window.MathJax;
    if (!mj || mj.Hub) return;
    mj.Hub = {
      Queue(command) {
        const el = Array.isArray(command) ? command[2] : null;
        const m = window.MathJax;
        if (el && m && typeof m.typesetPromise === "function") m.typesetPromise([el]).catch(() => {});
      },
    };
  }
  // After the deferred MathJax script has run (it replaces window.MathJax), before the stored
  // views render on "load".
  document.addEventListener("DOMContentLoaded", mathjaxHubShim);
  if (document.readyState !== "loading") mathjaxHubShim();

  const domReady = new Promise((resolve) => {
    if (document.readyState !== "loading") resolve();
    else document.addEventListener("DOMContentLoaded", () => resolve());
  });
  const pageLoaded = new Promise((resolve) => {
    if (document.readyState === "complete") resolve();
    else window.addEventListener("load", () => resolve());
  });

  // Fetch Pyodide's loader and lock file now; start Python (seconds of main-thread work) once
  // the document is parsed, so that it does not hold back the page's text and stored views,
  // but before the page's images, math and fonts are done.
  const lockURL = pyBase + "pyodide-lock.json";
  const loader = Promise.all([import(pyBase + "pyodide.mjs"), fetch(lockURL).then((r) => r.text())]);

  // A repeat visit restores a memory snapshot of Python instead of starting it: the first
  // visit starts Python, installs the wheels, imports what the calculators need
  // (shardlab.widgets.live.preload) and, before any JavaScript object is handed to Python,
  // copies Python's memory (Pyodide's makeMemorySnapshot); once the page is live it stores
  // the copy in the browser's Cache Storage. The key is the lock file's SHA-256, which
  // names every wheel's SHA-256 and Pyodide's version, so a new book build never restores
  // an old Python (Pyodide also refuses a snapshot of another build). Any failure here
  // falls back to starting Python as on a first visit.
  const SNAPSHOT_CACHE = "shardlab-live-snapshot";
  let snapshotToStore = null; // [key, bytes] made on this visit, stored once the page is live
  async function snapshotKey(lockText) {
    const digest = await crypto.subtle.digest("SHA-256", new TextEncoder().encode(lockText));
    const hex = [...new Uint8Array(digest)].map((b) => b.toString(16).padStart(2, "0")).join("");
    return pyBase + "python-memory-" + hex + ".bin";
  }
  async function readSnapshot(key) {
    if (!window.caches) return null;
    const hit = await (await caches.open(SNAPSHOT_CACHE)).match(key);
    return hit ? new Uint8Array(await hit.arrayBuffer()) : null;
  }
  async function storeSnapshot() {
    if (!snapshotToStore) return;
    const [key, bytes] = snapshotToStore;
    snapshotToStore = null;
    const cache = await caches.open(SNAPSHOT_CACHE);
    for (const old of await cache.keys()) await cache.delete(old); // another build's
    await cache.put(key, new Response(bytes, { headers: { "Content-Type": "application/octet-stream" } }));
    live.snapshot.stored = bytes.length;
  }

  const pyodideReady = (async () => {
    const [{ loadPyodide }, lockText] = await loader;
    const lock = JSON.parse(lockText);
    const common = {
      indexURL: pyBase,
      lockFileURL: lockURL,
      packageBaseUrl: pyBase,
      stdout: (s) => console.log("[python]", s),
      stderr: (s) => console.warn("[python]", s),
    };
    let key = null;
    let saved = null;
    try {
      key = await snapshotKey(lockText);
      saved = await readSnapshot(key);
      phase("snapshot-read");
    } catch (err) {
      live.snapshot.error = String(err); // no Cache Storage (not a secure context): start Python
    }
    if (saved) {
      // restoring is a fraction of a second of main-thread work: no need to let the
      // document finish parsing first
      try {
        const py = await loadPyodide({ ...common, _loadSnapshot: saved });
        py.pyimport("shardlab.widgets.live"); // imported before the snapshot: nothing to load
        live.snapshot.restored = saved.length;
        phase("pyodide+wheels");
        return py;
      } catch (err) {
        console.warn("shardlab live: the stored Python snapshot did not restore; starting Python", err);
        live.snapshot.error = String(err);
        caches.delete(SNAPSHOT_CACHE).catch(() => {});
      }
    }
    await domReady;
    const py = await loadPyodide({ ...common, packages: Object.keys(lock.packages), _makeSnapshot: true });
    phase("pyodide+wheels");
    py.pyimport("shardlab.widgets.live").preload();
    phase("preload");
    if (key && window.caches) {
      // The snapshot checks that Pyodide's table of installed packages is still empty, as it
      // is when Python has started (it is the same JavaScript object Python refers to); a
      // restored Python installs nothing, so empty it for the copy and refill it afterwards.
      const installed = py.loadedPackages;
      const names = { ...installed };
      for (const name of Object.keys(names)) delete installed[name];
      try {
        snapshotToStore = [key, py.makeMemorySnapshot()];
      } catch (err) {
        console.warn("shardlab live: no Python snapshot for later visits", err);
        live.snapshot.error = String(err);
      } finally {
        Object.assign(installed, names);
      }
    }
    return py;
  })();
  pyodideReady.catch(() => {}); // reported by start(), which awaits it

  // Inputs a reader changes in a stored view before Python is ready: replayed into the live
  // view (same controls, same order) instead of being reset silently.
  function markEdited(e) {
    const el = e.target;
    if (live.state === "loading" && el.closest && el.closest(".widget-subarea:not(.shardlab-live-view)")) {
      el.dataset.shardlabEdited = "1";
    }
  }
  document.addEventListener("input", markEdited, true);
  document.addEventListener("change", markEdited, true);

  async function replayEdits(stored, holder) {
    if (!stored) return 0;
    const sel = "input, select, textarea";
    const from = [...stored.querySelectorAll(sel)];
    if (!from.some((el) => el.dataset.shardlabEdited)) return 0;
    // display_view resolves before a box's children are rendered (they attach a moment
    // later): wait for the live view's controls, up to 5 s, rather than finding none
    let to = [...holder.querySelectorAll(sel)];
    for (let i = 0; i < 100 && to.length < from.length; i++) {
      await new Promise((resolve) => setTimeout(resolve, 50));
      to = [...holder.querySelectorAll(sel)];
    }
    if (from.length !== to.length) return 0;
    let n = 0;
    from.forEach((src, i) => {
      if (!src.dataset.shardlabEdited) return;
      const dst = to[i];
      n += 1;
      if (src.type === "checkbox") {
        if (dst.checked !== src.checked) dst.click();
        return;
      }
      dst.value = src.value;
      dst.dispatchEvent(new Event("input", { bubbles: true }));
      dst.dispatchEvent(new Event("change", { bubbles: true }));
    });
    return n;
  }

  // A refused input shows one sentence instead of the chart and tables: keep the calculator's
  // height meanwhile, so nothing below it moves (issue 30, defect 7).
  function keepHeightOnError(holder) {
    let lastHeight = holder.offsetHeight;
    const check = () => {
      if (holder.querySelector(".shardlab-error")) {
        holder.style.minHeight = lastHeight + "px";
      } else {
        holder.style.minHeight = "";
        lastHeight = holder.offsetHeight;
      }
    };
    new MutationObserver(check).observe(holder, { childList: true, subtree: true, characterData: true });
    check();
  }

  // A comm as @jupyter-widgets/base expects one, carried by direct calls into Python.
  class PageComm {
    constructor(commId, targetName, deliver) {
      this.comm_id = commId;
      this.target_name = targetName;
      this._deliver = deliver;
      this._onMsg = null;
      this._onClose = null;
      this._pending = []; // messages that arrive before the model listens
      this._sent = 0;
    }
    open() {
      return "";
    }
    close() {
      return "";
    }
    on_msg(callback) {
      this._onMsg = callback;
      for (const msg of this._pending.splice(0)) callback(msg);
    }
    on_close(callback) {
      this._onClose = callback;
    }
    receive(msg) {
      if (this._onMsg) this._onMsg(msg);
      else this._pending.push(msg);
    }
    send(data, callbacks) {
      const msgId = `${this.comm_id}-page-${++this._sent}`;
      // Deliver after the model has counted this message as pending, then report the
      // "kernel" idle so its throttle lets the next edit through.
      Promise.resolve().then(() => {
        try {
          this._deliver(this.comm_id, JSON.stringify(data));
        } catch (err) {
          console.error("shardlab live: Python rejected a widget message", err);
          live.errors.push(String(err));
        }
        const status = callbacks && callbacks.iopub && callbacks.iopub.status;
        if (status) status({ content: { execution_state: "idle" }, parent_header: { msg_id: msgId } });
      });
      return msgId;
    }
  }

  function kernelMessage(msgType, msg) {
    return {
      header: { msg_type: msgType },
      parent_header: {},
      metadata: msg.metadata || {},
      content: { comm_id: msg.comm_id, target_name: msg.target_name, data: msg.data },
      buffers: [],
    };
  }

  async function start() {
    const t0 = performance.now();
    phase("script");
    await domReady;
    phase("dom");
    const stateTag = document.querySelector(`script[type="${STATE_MIME}"]`);
    if (!stateTag) return;
    const models = JSON.parse(stateTag.textContent).state;
    const views = calculatorViews(models);
    live.calculators = views.length;
    if (!views.length) return;
    for (const v of views) {
      v.note = document.createElement("div");
      v.note.className = "shardlab-live-status";
      v.tag.parentElement.insertBefore(v.note, v.tag);
    }
    setNotes(
      "Live version loading: Python is starting in your browser (" +
        EXPECTED +
        "). Until it is ready, the calculator shows the values computed when the book was built.",
      "#c90",
      "loading",
    );

    // the widget manager's scripts load while Python starts, not after
    const managerReady = requireModule("@jupyter-widgets/html-manager");
    const pyodide = await pyodideReady;
    phase("python");
    const htmlManager = await managerReady;
    phase("manager");
    const manager = new htmlManager.HTMLManager({
      loader: (name) => Promise.reject(new Error(`shardlab live: no widget module ${name}`)),
    });
    const liveModule = pyodide.pyimport("shardlab.widgets.live");
    phase("import");
    const deliver = (commId, data) => liveModule.deliver(commId, data);
    const comms = new Map();
    const opened = [];
    liveModule.install_bridge((text) => {
      const msg = JSON.parse(text);
      if (msg.msg_type === "comm_open") {
        const comm = new PageComm(msg.comm_id, msg.target_name, deliver);
        comms.set(msg.comm_id, comm);
        opened.push(manager.handle_comm_open(comm, kernelMessage("comm_open", msg)));
      } else if (msg.msg_type === "comm_msg") {
        const comm = comms.get(msg.comm_id);
        if (comm) comm.receive(kernelMessage("comm_msg", msg));
      } else if (msg.msg_type === "comm_close") {
        const comm = comms.get(msg.comm_id);
        if (comm && comm._onClose) comm._onClose(kernelMessage("comm_close", msg));
        comms.delete(msg.comm_id);
      }
    });
    phase("ipywidgets");
    const result = JSON.parse(
      liveModule.rebuild_page(stateTag.textContent, JSON.stringify(views.map((v) => v.id))),
    );
    phase("rebuild");
    await Promise.all(opened);
    await pageLoaded;
    phase("page-load");
    if (live.state !== "loading") return; // timed out meanwhile: keep the stored views
    for (const { id, tag, note } of views) {
      const liveId = result.views[id];
      if (!liveId) {
        const why = result.errors[id] || "not a shardlab calculator";
        live.errors.push(why);
        {
          note.textContent = "Live version unavailable (" + why + "); showing the values computed when the book was built.";
          note.dataset.state = "failed";
          noteStyle(note, "#b00020");
        }
        continue;
      }
      const model = await manager.get_model(liveId);
      const view = await manager.create_view(model);
      const holder = document.createElement("div");
      holder.className = "widget-subarea shardlab-live-view";
      holder.dataset.storedModelId = id;
      tag.parentElement.insertBefore(holder, tag);
      await manager.display_view(view, holder);
      let replayed = 0;
      for (const el of tag.parentElement.querySelectorAll(
        ":scope > .widget-subarea:not(.shardlab-live-view)",
      )) {
        replayed += await replayEdits(el, holder);
        el.style.display = "none"; // the stored view; the live one replaces it
      }
      keepHeightOnError(holder);
      live.same[id] = result.same[id];
      live.replayed = (live.replayed || 0) + replayed;
    }
    live.readyMs = performance.now() - t0; // since this script started
    live.readyAt = performance.now(); // since the page's navigation started
    live.state = "ready";
    const secs = (live.readyMs / 1000).toFixed(1);
    for (const { id, note } of views) {
      if (note.dataset.state === "failed") continue;
      note.textContent =
        "Live: change any input (press Enter or leave the field) and shardlab recomputes " +
        "the result in your browser " +
        "(Python started in " + secs + " s)." +
        (result.same[id] ? "" : " Note: the live result differs from the stored one; the package changed after the chapter was executed.");
      note.dataset.state = "ready";
      noteStyle(note, "#2a7");
    }
  }

  // A calculator's result area scrolls sideways when wider than the column: make every such
  // area (stored or live view) reachable by keyboard (axe: scrollable-region-focusable).
  function focusableScrollers() {
    const areas = ".widget-subarea .widget-html, .widget-subarea .widget-html-content, .shardlab-report";
    for (const el of document.querySelectorAll(areas)) {
      const o = getComputedStyle(el);
      const scrolls = el.scrollWidth > el.clientWidth || el.scrollHeight > el.clientHeight;
      if (el.hasAttribute("tabindex") || !scrolls || !/auto|scroll/.test(o.overflowX + o.overflowY)) continue;
      el.tabIndex = 0;
      el.setAttribute("role", "region");
      el.setAttribute("aria-label", "calculator result");
    }
  }

  function fail(err) {
    if (live.state !== "loading") return;
    console.error("shardlab live:", err);
    live.state = "failed";
    live.errors.push(String(err && err.message ? err.message : err));
    setNotes(
      "Live version unavailable (" + live.errors[live.errors.length - 1] +
        "); showing the values computed when the book was built.",
      "#b00020",
      "failed",
    );
  }

  const timer = setTimeout(
    () => fail(new Error(`Python did not start within ${Math.round(TIMEOUT_MS / 1000)} s`)),
    TIMEOUT_MS,
  );
  start()
    .catch(fail)
    .finally(() => {
      clearTimeout(timer);
      pageLoaded.then(focusableScrollers);
      // after the page is live: writing tens of MB must not delay the first result
      if (live.state === "ready") storeSnapshot().catch((err) => {
        console.warn("shardlab live: could not store the Python snapshot", err);
        live.snapshot.error = String(err);
      });
    });
})();
