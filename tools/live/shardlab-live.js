/*
 * shardlab live calculators: make the calculators stored in a book page live, offline.
 *
 * The page first shows each calculator from its stored widget state (rendered by
 * @jupyter-widgets/html-manager's embed-amd.js): the values computed when the book was
 * built. This script then starts Python in a Web Worker (shardlab-worker.js: Pyodide from
 * this site, _static/shardlab-live/pyodide/, built by tools/build_live.py, with the wheels
 * listed in its pyodide-lock.json, each sha256 checked) and asks shardlab.widgets.live to
 * rebuild every stored calculator in Python. The rebuilt ipywidgets talk to a widget manager
 * on this page over a kernel-less comm bridge (the Jupyter widget protocol, messages as JSON,
 * carried between the page and the worker by postMessage), so the calculators' own Python
 * callbacks run when the reader edits an input: every number is computed by
 * shardlab.accounting, nothing here. When Python is ready the stored view is swapped for the
 * live one; if anything fails, the stored view stays and the note says why.
 *
 * A later visit (any page of the same build) restores a memory snapshot of that Python,
 * stored in the browser's Cache Storage by the first visit, instead of starting it and
 * importing ipywidgets again (shardlab-worker.js says how).
 *
 * The script is loaded async from the page's head (tools/sphinx_shardlab_live.py) and starts
 * the worker at once: Python downloads, compiles and starts on the worker's thread while this
 * thread parses the page, typesets its math and renders the stored views (on two cores, at the
 * same time), and a recomputation never freezes the page. Edits a reader makes to a stored
 * view while Python is loading are replayed into the live view when it appears (not lost).
 * When an input is refused, the calculator keeps its height (the sentence shows in place of
 * the result).
 *
 * window.shardlabLive reports progress for tests (tests/test_live_browser.py): state
 * ("loading" | "ready" | "failed"), readyAt (ms from navigation start to the live
 * calculators showing Python's first result), readyMs (the same from this script's start),
 * same (stored id -> the live result equals the stored one; null for a costly calculator
 * until it is computed, just after the page is live), verified (every one computed), errors.
 */
(function () {
  "use strict";
  const STATE_MIME = "application/vnd.jupyter.widget-state+json";
  const VIEW_MIME = "application/vnd.jupyter.widget-view+json";
  // Navigation start to the first live result, measured by tests/test_live_browser.py
  // (test_load_time_cold_and_repeat) in headless Chromium on an idle 2-core machine (README,
  // "Live calculators", 2026-12-07, eight runs): 2.5-3.0 s on a first visit, which restores the
  // Python snapshot the book ships (6.8-7.7 s on the same machine when it started Python),
  // 1.5-2.4 s on a later one (chapter 10: 2.2-4.6 s); 40-75 s were measured with both cores
  // kept busy by other programs. Downloads: 14.1 MB of runtime and the 8.0 MB snapshot.
  const EXPECTED =
    "measured on a 2-core machine: about 3 s the first time, 2 s on a later visit " +
    "(chapter 10: 3.5 s), up to a minute while other programs keep it busy; " +
    "22 MB is downloaded the first time, nothing on a later visit";
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
    verified: false, // every deferred calculator computed (live.same complete)
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
      if (isCalculator(models, id)) out.push({ id, tag });
    }
    return out;
  }

  function isCalculator(models, id) {
    const m = models[id];
    if (!m || m.model_name !== "VBoxModel") return false;
    const first = (m.state.children || [])[0];
    const title = first && models[String(first).replace("IPY_MODEL_", "")];
    return Boolean(title && title.model_name === "HTMLModel" && /^<b>.*<\/b>$/.test(title.state.value));
  }

  // Resolves with the first element matching `selector` once the parser is past it (the next
  // node exists, or the document is parsed), or with null if the parsed document has none.
  function whenParsed(selector) {
    return new Promise((resolve) => {
      const check = () => {
        const el = document.querySelector(selector);
        if (el && (el.nextSibling || document.readyState !== "loading")) return resolve(el), true;
        if (document.readyState !== "loading") return resolve(null), true;
        return false;
      };
      if (check()) return;
      const timer = setInterval(() => check() && clearInterval(timer), 15);
    });
  }

  function requireModule(name) {
    return new Promise((resolve, reject) => window.requirejs([name], resolve, reject));
  }

  // The widget manager's modules take about half a second of this thread to evaluate: start as
  // soon as embed-amd.js (in the page's head, after require.js and require-config.js) has
  // defined them, while the rest of the page is still parsed, rather than after it.
  const managerReady = whenParsed('script[src*="embed-amd.js"]').then((amd) => {
    if (!amd || !window.requirejs) throw new Error("the page loads no widget manager (embed-amd.js)");
    return requireModule("@jupyter-widgets/html-manager");
  });
  managerReady.catch(() => {}); // reported by start(), which awaits it

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

  // The document is parsed (every calculator's view tag exists): the live views can replace
  // the stored ones now, not after the deferred scripts (MathJax, the theme's) have run and
  // DOMContentLoaded fired, 0.3-0.4 s later on a 2-core machine.
  const domReady = new Promise((resolve) => {
    if (document.readyState !== "loading") resolve();
    else document.addEventListener("readystatechange", () => resolve(), { once: true });
  });
  const pageLoaded = new Promise((resolve) => {
    if (document.readyState === "complete") resolve();
    else window.addEventListener("load", () => resolve());
  });

  // Python runs in a Web Worker (shardlab-worker.js), started now, while this page is still
  // being parsed: it downloads, compiles and starts Pyodide on its own thread. A repeat visit
  // restores a memory snapshot of Python that the first visit stored in the browser's Cache
  // Storage (the worker explains the key). Calls into Python are messages: each answer is
  // posted after the widget messages the call made, so the page sees those first.
  const answers = { rebuilt: [], verified: [], stored: [] }; // [resolve, reject] of calls waiting
  const delivered = new Map(); // seq of a widget message -> resolve(error or null)
  let deliverSeq = 0;
  let onBridge = null; // handles a widget message from Python (set by start())
  const early = []; // widget messages that came before start() could handle them
  let worker = null;
  const pythonReady = new Promise((resolve, reject) => {
    try {
      worker = new Worker(base + "shardlab-worker.js", { type: "module" });
    } catch (err) {
      reject(err); // no module workers here (or a file:// page): keep the stored views
      return;
    }
    worker.onerror = (e) => reject(new Error(e.message || "the Python worker did not start"));
    worker.onmessage = (e) => {
      const m = e.data;
      if (m.type === "phase") live.phases[m.name] = Math.round(m.at - performance.timeOrigin);
      else if (m.type === "ready") {
        Object.assign(live.snapshot, m.snapshot);
        resolve();
      } else if (m.type === "failed") {
        const err = new Error(m.message);
        reject(err);
        for (const waiting of Object.values(answers)) {
          for (const [, no] of waiting.splice(0)) no(err);
        }
      } else if (m.type === "bridge") {
        if (onBridge) onBridge(m.text);
        else early.push(m.text);
      } else if (m.type === "rebuilt") answers.rebuilt.shift()[0](m.result);
      else if (m.type === "verified") answers.verified.shift()[0](m.result);
      else if (m.type === "stored") {
        if (m.error) answers.stored.shift()[1](new Error(m.error));
        else answers.stored.shift()[0](m.bytes);
      } else if (m.type === "delivered") {
        const done = delivered.get(m.seq);
        delivered.delete(m.seq);
        if (done) done(m.error);
      }
    };
    worker.postMessage({ type: "start", pyBase });
  });
  pythonReady.catch(() => {}); // reported by start(), which awaits it

  function call(type, answer, payload) {
    return new Promise((resolve, reject) => {
      answers[answer].push([resolve, reject]);
      worker.postMessage({ type, ...payload });
    });
  }
  function deliver(commId, data) {
    const seq = ++deliverSeq;
    return new Promise((resolve) => {
      delivered.set(seq, resolve);
      worker.postMessage({ type: "deliver", seq, commId, data });
    });
  }
  // Python rebuilds the calculators as soon as it is ready and the widget state (in the page's
  // head) is parsed, while the page's body is still parsed and the widget manager's modules
  // evaluate: every calculator of the state is displayed once. A costly one (chapter 10's
  // planner) shows its stored output and computes it once the page is live (verify below).
  const rebuiltEarly = whenParsed(`script[type="${STATE_MIME}"]`).then(async (tag) => {
    if (!tag) return null;
    const text = tag.textContent;
    const models = JSON.parse(text).state;
    const ids = Object.keys(models).filter((id) => isCalculator(models, id));
    if (!ids.length) return null;
    // posted now, not after Python's "ready" reaches this (busy) thread: the worker waits
    return call("rebuild", "rebuilt", { state: text, views: JSON.stringify(ids) });
  });
  rebuiltEarly.catch(() => {}); // reported by start(), which awaits it

  async function storeSnapshot() {
    const bytes = await call("store", "stored", {});
    if (bytes) live.snapshot.stored = bytes; // 0: this visit restored, nothing new to store
  }

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

  // A field sized for a 13 px sans-serif value of about ten characters (shardlab.widgets.
  // _fields.field_width) grows when its value is wider: a reader's system font may be wider
  // (chapter 3's "size V (bytes)" cut 14000000000 by 8 px here), or a longer number is typed.
  function fitFields(root) {
    for (const input of root.querySelectorAll(".widget-text input")) {
      const extra = input.scrollWidth - input.clientWidth;
      const box = input.closest(".widget-inline-hbox");
      if (extra > 1 && box) box.style.width = box.getBoundingClientRect().width + extra + 2 + "px";
    }
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
      Promise.resolve()
        .then(() => this._deliver(this.comm_id, JSON.stringify(data)))
        .then((error) => {
          if (error) {
            console.error("shardlab live: Python rejected a widget message", error);
            live.errors.push(String(error));
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

    await pythonReady;
    phase("python");
    const rebuilt = rebuiltEarly; // started before the page was parsed (above)
    const htmlManager = await managerReady;
    phase("manager");
    mathjaxHubShim(); // MathJax may not have run yet: its Hub call is then a no-op
    const manager = new htmlManager.HTMLManager({
      loader: (name) => Promise.reject(new Error(`shardlab live: no widget module ${name}`)),
    });
    const comms = new Map();
    const opened = [];
    onBridge = (text) => {
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
    };
    for (const text of early.splice(0)) onBridge(text);
    phase("ipywidgets");
    const result = JSON.parse(await rebuilt);
    phase("rebuild");
    await Promise.all(opened);
    // No wait for the page's load event (the stored views render then, and on a repeat visit
    // it comes after Python is ready): a stored view rendered after the live one stays hidden
    // (.shardlab-has-live, shardlab-live.css), so nothing moves; edits can only have been made
    // in a stored view that already exists, and those are replayed below.
    pageLoaded.then(() => phase("page-load"));
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
      tag.parentElement.classList.add("shardlab-has-live");
      await manager.display_view(view, holder);
      holder.addEventListener("input", () => fitFields(holder));
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
        (result.same[id] === false ? DIFFERS : "");
      note.dataset.state = "ready";
      noteStyle(note, "#2a7");
    }
    // the deferred calculators compute now, with the page live: same result, or it shows
    const checked = JSON.parse(await call("verify", "verified", {}));
    for (const { id, note } of views) {
      if (!(id in checked)) continue;
      live.same[id] = checked[id];
      if (checked[id] === false && note.dataset.state === "ready") note.textContent += DIFFERS;
    }
    // a box's fields render after display_view resolves: fit them once all are on the page
    for (const holder of document.querySelectorAll(".shardlab-live-view")) fitFields(holder);
    live.verified = true;
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

  const DIFFERS =
    " Note: the live result differs from the stored one; the package changed after the chapter was executed.";

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
