/*
 * shardlab live calculators, the Python side: Pyodide in a Web Worker.
 *
 * shardlab-live.js (the page script) starts this module worker as soon as it runs, so Python
 * downloads, compiles and starts on its own thread while the page's main thread parses the
 * document, typesets the math and renders the stored views: on a 2-core machine both go on
 * at once instead of one after the other, and a calculator's recomputation (chapter 10's
 * planner search takes most of a second) never freezes the page.
 *
 * Messages from the page (each an object with a "type"):
 *   start {pyBase}             start Python: restore the memory snapshot a previous visit
 *                              stored in Cache Storage, or the one the book ships
 *                              (python-memory-<lock sha256>.bin.gz, tools/build_snapshot.py),
 *                              or start it, install the wheels of
 *                              pyodide-lock.json, import what the calculators need
 *                              (shardlab.widgets.live.preload) and copy Python's memory
 *   rebuild {state, views}     (may come before ready: it waits for Python)
 *                              shardlab.widgets.live.rebuild_page(state, views, defer=True):
 *                              a costly calculator shows its stored output at first
 *   verify                     shardlab.widgets.live.verify_page(): compute those now
 *   deliver {seq, commId, data} a widget message from the page to Python
 *   store                      store the snapshot made by this visit (once the page is live)
 * Messages to the page:
 *   phase {name, at}           a step finished, at ms since the epoch (performance.timeOrigin
 *                              differs between a worker and its page)
 *   ready {snapshot}           Python can rebuild; snapshot: bytes restored, or the error
 *   bridge {text}              a widget message from Python (comm_open / comm_msg / comm_close)
 *   rebuilt {result}           rebuild_page's JSON answer
 *   verified {result}          verify_page's JSON answer
 *   delivered {seq, error}     Python handled message seq (error: why it refused it)
 *   stored {bytes, error}      the snapshot was stored (or why not)
 *   failed {message}           Python could not start
 * The bridge messages a call causes are posted before its answer, so the page sees them first.
 */
const SNAPSHOT_CACHE = "shardlab-live-snapshot";
let py = null;
let live = null; // shardlab.widgets.live
let snapshotToStore = null; // [key, bytes] made on this visit, stored once the page is live
let bridged = false;
let started = null; // start()'s promise: a rebuild may arrive while Python is still starting

function phase(name) {
  self.postMessage({ type: "phase", name, at: performance.timeOrigin + performance.now() });
}

// The key is the lock file's SHA-256, which names every wheel's SHA-256 and Pyodide's version,
// so a new book build never restores an old Python (Pyodide also refuses a snapshot of another
// build). Any failure here falls back to starting Python as on a first visit.
async function snapshotKey(pyBase, lockText) {
  const digest = await crypto.subtle.digest("SHA-256", new TextEncoder().encode(lockText));
  const hex = [...new Uint8Array(digest)].map((b) => b.toString(16).padStart(2, "0")).join("");
  return pyBase + "python-memory-" + hex + ".bin";
}

async function readSnapshot(key) {
  if (!self.caches) return null;
  const hit = await (await caches.open(SNAPSHOT_CACHE)).match(key);
  return hit ? new Uint8Array(await hit.arrayBuffer()) : null;
}

// The snapshot the book ships (tools/build_snapshot.py: made at build time the same way a first
// visit makes one, gzipped) under the cache key's name + ".gz", when python-memory.json names
// that file (null: the build has none, and nothing is requested); else null.
async function readShipped(pyBase, key) {
  try {
    const manifest = await (await fetch(pyBase + "python-memory.json")).json();
    if (!manifest.file || pyBase + manifest.file !== key + ".gz" || !self.DecompressionStream) {
      return null;
    }
    const r = await fetch(key + ".gz");
    if (!r.ok) return null;
    const raw = r.body.pipeThrough(new DecompressionStream("gzip"));
    return new Uint8Array(await new Response(raw).arrayBuffer());
  } catch (err) {
    console.warn("shardlab live: the shipped Python snapshot did not load; starting Python", err);
    return null;
  }
}

async function storeSnapshot() {
  if (!snapshotToStore) return 0;
  const [key, bytes] = snapshotToStore;
  snapshotToStore = null;
  const cache = await caches.open(SNAPSHOT_CACHE);
  for (const old of await cache.keys()) await cache.delete(old); // another build's
  await cache.put(key, new Response(bytes, { headers: { "Content-Type": "application/octet-stream" } }));
  return bytes.length;
}

async function start(pyBase) {
  const lockURL = pyBase + "pyodide-lock.json";
  const [{ loadPyodide }, lockText] = await Promise.all([
    import(pyBase + "pyodide.mjs"),
    fetch(lockURL).then((r) => {
      if (!r.ok) throw new Error(`${lockURL}: HTTP ${r.status}`);
      return r.text();
    }),
  ]);
  const lock = JSON.parse(lockText);
  const common = {
    indexURL: pyBase,
    lockFileURL: lockURL,
    packageBaseUrl: pyBase,
    stdout: (s) => console.log("[python]", s),
    stderr: (s) => console.warn("[python]", s),
  };
  const snapshot = {};
  let key = null;
  let saved = null;
  let shipped = false;
  try {
    key = await snapshotKey(pyBase, lockText);
    saved = await readSnapshot(key);
    phase("snapshot-read");
  } catch (err) {
    snapshot.error = String(err); // no Cache Storage (not a secure context): start Python
  }
  if (!saved && key) {
    saved = await readShipped(pyBase, key);
    shipped = saved !== null;
    if (shipped) phase("snapshot-shipped");
  }
  if (saved) {
    try {
      py = await loadPyodide({ ...common, _loadSnapshot: saved });
      live = py.pyimport("shardlab.widgets.live"); // imported before the snapshot
      snapshot.restored = saved.length;
      if (shipped) {
        snapshot.shipped = true;
        snapshotToStore = [key, saved]; // later visits read it from Cache Storage, unzipped
      }
      phase("pyodide+wheels");
      return snapshot;
    } catch (err) {
      console.warn("shardlab live: the stored Python snapshot did not restore; starting Python", err);
      snapshot.error = String(err);
      py = null;
      caches.delete(SNAPSHOT_CACHE).catch(() => {});
    }
  }
  py = await loadPyodide({ ...common, packages: Object.keys(lock.packages), _makeSnapshot: true });
  phase("pyodide+wheels");
  live = py.pyimport("shardlab.widgets.live");
  live.preload();
  phase("preload");
  if (key && self.caches) {
    // The snapshot checks that Pyodide's table of installed packages is still empty, as it is
    // when Python has started (it is the same JavaScript object Python refers to); a restored
    // Python installs nothing, so empty it for the copy and refill it afterwards.
    const installed = py.loadedPackages;
    const names = { ...installed };
    for (const name of Object.keys(names)) delete installed[name];
    try {
      snapshotToStore = [key, py.makeMemorySnapshot()];
    } catch (err) {
      console.warn("shardlab live: no Python snapshot for later visits", err);
      snapshot.error = String(err);
    } finally {
      Object.assign(installed, names);
    }
  }
  return snapshot;
}

function bridge() {
  if (bridged) return;
  bridged = true;
  live.install_bridge((text) => self.postMessage({ type: "bridge", text }));
}

self.onmessage = async (event) => {
  const msg = event.data;
  if (msg.type === "start") {
    try {
      started = start(msg.pyBase);
      const snapshot = await started;
      self.postMessage({ type: "ready", snapshot });
    } catch (err) {
      self.postMessage({ type: "failed", message: String(err && err.message ? err.message : err) });
    }
  } else if (msg.type === "rebuild") {
    try {
      await started; // sent as soon as the page's widget state is parsed, maybe before ready
      bridge();
      phase("rebuild-start");
      const result = live.rebuild_page(msg.state, msg.views, true); // defer the costly ones
      phase("rebuilt-in-python");
      self.postMessage({ type: "rebuilt", result });
    } catch (err) {
      self.postMessage({ type: "failed", message: String(err && err.message ? err.message : err) });
    }
  } else if (msg.type === "verify") {
    try {
      self.postMessage({ type: "verified", result: live.verify_page() });
    } catch (err) {
      self.postMessage({ type: "failed", message: String(err && err.message ? err.message : err) });
    }
  } else if (msg.type === "deliver") {
    let error = null;
    try {
      live.deliver(msg.commId, msg.data);
    } catch (err) {
      error = String(err && err.message ? err.message : err);
    }
    self.postMessage({ type: "delivered", seq: msg.seq, error });
  } else if (msg.type === "store") {
    try {
      self.postMessage({ type: "stored", bytes: await storeSnapshot() });
    } catch (err) {
      self.postMessage({ type: "stored", bytes: 0, error: String(err) });
    }
  }
};
