"""Assemble what the book's live calculators load in the reader's browser, offline.

Run by ``make book-build`` before ``jupyter-book build``::

    .venv/bin/python tools/build_live.py [--dest book/_live] [--cache .cache/live]

Writes ``DEST/shardlab-live/`` (an ``html_static_path`` of ``_config.yml``, so Sphinx copies
it to ``_build/html/_static/shardlab-live/``):

* ``shardlab-live.js`` — the page script (``tools/live/shardlab-live.js``), and the files every
  page loads (``PAGE_FILES``: the Python worker, accessible button names, calculator CSS, the
  require.js path of the widget fonts, the favicon);
* ``pyodide/`` — the Pyodide runtime from the npm package ``pyodide@PYODIDE_VERSION``
  (``pyodide.mjs``, ``pyodide.asm.mjs``, ``pyodide.asm.wasm``, ``python_stdlib.zip``),
  the wheels listed in ``tools/live/requirements-pyodide.txt`` (downloaded from PyPI for
  Python 3.14, each checked against its pinned sha256), a ``shardlab`` wheel built here
  from ``pkg/shardlab`` (pure Python, reproducible: fixed timestamps, sorted entries), a
  ``kernelless_ipython`` wheel of ``tools/live/kernelless_ipython/`` (the few IPython names
  ipywidgets imports, as IPython answers them outside a shell, instead of IPython and its eight
  dependencies), and ``pyodide-lock.json``: the npm package's lock-file header with a ``packages`` table of
  exactly these wheels and their sha256, which Pyodide checks before installing them.

Downloads are cached under ``--cache`` (git-ignored); with a warm cache the script uses
no network and takes well under a second. Files are rewritten only when their bytes
change. Needs ``npm`` (for the Pyodide package) and pip (in this interpreter).
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import io
import json
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PYODIDE_VERSION = "314.0.6"  # the version jupyterlite-pyodide-kernel 0.8.6 expects
PYODIDE_TGZ_SHA256 = "d78ac549b28a2a58600cd06f44e017024151775f8c6b2d73fab1475400d38ea2"
PYODIDE_PYTHON = "3.14"
PYODIDE_FILES = ("pyodide.mjs", "pyodide.asm.mjs", "pyodide.asm.wasm", "python_stdlib.zip")
REQUIREMENTS = ROOT / "tools" / "live" / "requirements-pyodide.txt"
KERNELLESS_IPYTHON = ROOT / "tools" / "live" / "kernelless_ipython"
PAGE_SCRIPT = ROOT / "tools" / "live" / "shardlab-live.js"
# also served from _static/shardlab-live/ (tools/sphinx_shardlab_live.py, _config.yml)
PAGE_FILES = ("shardlab-worker.js", "shardlab-page.js", "shardlab-live.css", "require-config.js", "favicon.svg")
ZIP_DATE = (2026, 1, 1, 0, 0, 0)
_REQ = re.compile(r"^([A-Za-z0-9_.-]+)==(\S+)\s+--hash=sha256:([0-9a-f]{64})\s*$")


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def canonical(name: str) -> str:
    """PEP 503 name, as Pyodide keys its lock file."""
    return re.sub(r"[-_.]+", "-", name).lower()


def read_requirements(path: Path = REQUIREMENTS) -> list[tuple[str, str, str]]:
    """``(name, version, sha256)`` per pinned line; anything else is an error."""
    out = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = _REQ.match(line)
        if not m:
            raise ValueError(
                f"{path}:{n}: expected 'name==version --hash=sha256:HEX', got {line!r}"
            )
        out.append(m.groups())
    return out


def fetch_pyodide(cache: Path) -> Path:
    """The npm tarball of Pyodide (cached, sha256-checked)."""
    tgz = cache / f"pyodide-{PYODIDE_VERSION}.tgz"
    if not tgz.exists() or sha256(tgz) != PYODIDE_TGZ_SHA256:
        if shutil.which("npm") is None:
            raise SystemExit("build_live: npm not found (Debian: apt-get install -y npm)")
        print(f"build_live: fetching pyodide@{PYODIDE_VERSION} from the npm registry")
        subprocess.run(
            [
                "npm",
                "pack",
                "--silent",
                f"pyodide@{PYODIDE_VERSION}",
                "--pack-destination",
                str(cache),
            ],
            check=True,
            stdout=subprocess.DEVNULL,
        )
    got = sha256(tgz)
    if got != PYODIDE_TGZ_SHA256:
        raise SystemExit(f"build_live: {tgz} has sha256 {got}, expected {PYODIDE_TGZ_SHA256}")
    return tgz


def cached_wheel(wheels: Path, name: str, version: str, digest: str) -> Path | None:
    prefix = f"{name.replace('-', '_')}-{version}-".lower()
    for whl in wheels.glob("*.whl"):
        if whl.name.lower().startswith(prefix) and sha256(whl) == digest:
            return whl
    return None


def fetch_wheels(cache: Path) -> list[Path]:
    """The pinned wheels (cached; pip checks every hash when it downloads)."""
    wheels = cache / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    reqs = read_requirements()
    if any(cached_wheel(wheels, *r) is None for r in reqs):
        print(f"build_live: downloading {len(reqs)} wheels for Python {PYODIDE_PYTHON} from PyPI")
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
             "--only-binary=:all:", "--python-version", PYODIDE_PYTHON, "--platform", "any",
             "--implementation", "py", "--require-hashes", "-r", str(REQUIREMENTS),
             "-d", str(wheels)],
            check=True,
        )
    out = []
    for r in reqs:
        whl = cached_wheel(wheels, *r)
        if whl is None:
            raise SystemExit(f"build_live: no wheel of {r[0]}=={r[1]} with sha256 {r[2]}")
        out.append(whl)
    return out


def _wheel(name: str, version: str, summary: str, src: Path, top: str) -> tuple[str, bytes]:
    """A reproducible pure-Python wheel of the package ``src/top`` (file name, bytes)."""
    dist_info = f"{name}-{version}.dist-info"
    files: dict[str, bytes] = {}
    for path in sorted((src / top).rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
            files[path.relative_to(src).as_posix()] = path.read_bytes()
    files[f"{dist_info}/METADATA"] = (
        f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\nSummary: {summary}\n"
    ).encode()
    files[f"{dist_info}/WHEEL"] = (
        b"Wheel-Version: 1.0\nGenerator: tools/build_live.py\nRoot-Is-Purelib: true\n"
        b"Tag: py3-none-any\n"
    )
    files[f"{dist_info}/top_level.txt"] = f"{top}\n".encode()
    record = []
    for arc, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{arc},sha256={digest},{len(data)}")
    record.append(f"{dist_info}/RECORD,,")
    files[f"{dist_info}/RECORD"] = ("\n".join(record) + "\n").encode()
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for arc, data in files.items():
            info = zipfile.ZipInfo(arc, date_time=ZIP_DATE)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            zf.writestr(info, data)
    return f"{name}-{version}-py3-none-any.whl", buf.getvalue()


def shardlab_wheel() -> tuple[str, bytes]:
    """A reproducible wheel of ``pkg/shardlab`` (file name, bytes)."""
    # (a regex, not tomllib: the environment may be Python 3.10)
    meta = dict(
        re.findall(
            r'^(name|version|description) = "(.*)"$',
            (ROOT / "pkg" / "pyproject.toml").read_text(),
            re.M,
        )
    )
    return _wheel(meta["name"], meta["version"], meta.get("description", ""), ROOT / "pkg",
                  "shardlab")


def kernelless_ipython_wheel() -> tuple[str, bytes]:
    """The page's ``IPython``: the names ipywidgets imports, as outside a shell
    (``tools/live/kernelless_ipython/IPython/__init__.py`` says why)."""
    return _wheel("kernelless_ipython", "1.0", "IPython's names without a shell, for a page",
                  KERNELLESS_IPYTHON, "IPython")


def wheel_entry(file_name: str, data: bytes) -> dict:
    """A ``pyodide-lock.json`` package entry for a pure-Python wheel."""
    name, version = file_name.split("-")[:2]
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        tops = {n.split("/")[0] for n in zf.namelist()}
    imports = sorted(
        t[:-3] if t.endswith(".py") else t
        for t in tops
        if not t.endswith((".dist-info", ".data")) and (t.endswith(".py") or "." not in t)
    )
    return {
        "name": canonical(name),
        "version": version,
        "file_name": file_name,
        "install_dir": "site",
        "sha256": hashlib.sha256(data).hexdigest(),
        "package_type": "package",
        "imports": imports,
        "depends": [],  # the page loads every package of this lock file explicitly
        "unvendored_tests": False,
        "shared_library": False,
    }


def snapshot_name(lock_bytes: bytes) -> str:
    """The shipped Python snapshot's file name (``tools/build_snapshot.py``): the lock file's
    SHA-256, as the worker's ``snapshotKey`` makes it, so another build's is never restored."""
    return f"python-memory-{hashlib.sha256(lock_bytes).hexdigest()}.bin.gz"


def snapshot_manifest(file_name: str | None) -> bytes:
    """``pyodide/python-memory.json``: the shipped Python snapshot's file name, or null."""
    return (json.dumps({"file": file_name}) + "\n").encode()


def write_if_changed(path: Path, data: bytes) -> bool:
    if path.exists() and path.read_bytes() == data:
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return True


def build(dest: Path, cache: Path) -> dict[str, bytes]:
    cache.mkdir(parents=True, exist_ok=True)
    out: dict[str, bytes] = {"shardlab-live.js": PAGE_SCRIPT.read_bytes()}
    for name in PAGE_FILES:
        out[name] = (PAGE_SCRIPT.parent / name).read_bytes()
    with tarfile.open(fetch_pyodide(cache)) as tf:
        for name in PYODIDE_FILES:
            out[f"pyodide/{name}"] = tf.extractfile(f"package/{name}").read()
        npm_lock = json.load(tf.extractfile("package/pyodide-lock.json"))
    wheels = {p.name: p.read_bytes() for p in fetch_wheels(cache)}
    for name, data in (shardlab_wheel(), kernelless_ipython_wheel()):
        wheels[name] = data
    packages = {}
    for file_name, data in sorted(wheels.items()):
        entry = wheel_entry(file_name, data)
        packages[entry["name"]] = entry
        out[f"pyodide/{file_name}"] = data
    lock = {"info": npm_lock["info"], "packages": packages}
    out["pyodide/pyodide-lock.json"] = (json.dumps(lock, indent=1, sort_keys=True) + "\n").encode()

    root = dest / "shardlab-live"
    # the Python snapshot of this lock file (tools/build_snapshot.py) stays, another's goes;
    # python-memory.json names it for the page (null: none, and the page asks for none)
    snapshot = "pyodide/" + snapshot_name(out["pyodide/pyodide-lock.json"])
    shipped = (root / snapshot).is_file()
    out["pyodide/python-memory.json"] = snapshot_manifest(Path(snapshot).name if shipped else None)
    changed = [rel for rel, data in out.items() if write_if_changed(root / rel, data)]
    for path in sorted(root.rglob("*"), reverse=True):  # drop files no longer produced
        rel = path.relative_to(root).as_posix()
        if path.is_file() and rel not in out and rel != snapshot:
            path.unlink()
        elif path.is_dir() and not any(path.iterdir()):
            path.rmdir()
    size = sum(len(d) for d in out.values())
    print(
        f"build_live: {root} ready: Pyodide {PYODIDE_VERSION}, {len(packages)} wheels, "
        f"{size / 1e6:.1f} MB ({len(changed)} file(s) updated)"
    )
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dest", type=Path, default=ROOT / "book" / "_live")
    ap.add_argument("--cache", type=Path, default=ROOT / ".cache" / "live")
    args = ap.parse_args(argv)
    build(args.dest, args.cache)
    return 0


if __name__ == "__main__":
    sys.exit(main())
