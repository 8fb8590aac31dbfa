"""tools/check_site.py on a small synthetic site: remote hosts and a broken live runtime fail."""

from __future__ import annotations

import hashlib
import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _check_site():
    spec = importlib.util.spec_from_file_location("check_site", ROOT / "tools" / "check_site.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


CHAPTER = """<html><head>
<link rel="stylesheet" href="../_static/theme.css">
<script src="../_static/require.js"></script><script src="../_static/embed-amd.js"></script>
</head><body>
<script type="application/vnd.jupyter.widget-state+json">{"state": {}}</script>
<script type="application/vnd.jupyter.widget-view+json">{"model_id": "abc"}</script>
<script defer src="../_static/shardlab-live/shardlab-live.js"></script>
</body></html>"""


@pytest.fixture
def site(tmp_path):
    static = tmp_path / "_static"
    (static / "shardlab-live" / "pyodide").mkdir(parents=True)
    for name in ("require.js", "embed-amd.js", "togglebutton.js", "shardlab-live/shardlab-live.js"):
        (static / name).write_text("// js\n")
    (static / "theme.css").write_text("body { font-family: sans-serif; }\n")
    pyodide = static / "shardlab-live" / "pyodide"
    for name in ("pyodide.mjs", "pyodide.asm.mjs", "pyodide.asm.wasm", "python_stdlib.zip"):
        (pyodide / name).write_bytes(b"core")
    wheel = b"not really a wheel"
    (pyodide / "comm-0.2.3-py3-none-any.whl").write_bytes(wheel)
    lock = {
        "info": {},
        "packages": {
            "comm": {
                "file_name": "comm-0.2.3-py3-none-any.whl",
                "sha256": hashlib.sha256(wheel).hexdigest(),
            }
        },
    }
    (pyodide / "pyodide-lock.json").write_text(json.dumps(lock))
    (tmp_path / "book").mkdir()
    (tmp_path / "book" / "how_to_read.html").write_text(
        '<div class="dropdown"></div><script src="../_static/togglebutton.js"></script>'
    )
    (tmp_path / "book" / "ch.html").write_text(CHAPTER)
    return tmp_path


def run(site: Path, capsys) -> tuple[int, str]:
    rc = _check_site().main([str(site)])
    return rc, capsys.readouterr().err


def test_clean_site_passes(site, capsys):
    assert run(site, capsys) == (0, "")


def test_remote_font_stylesheet_fails(site, capsys):
    page = site / "book" / "ch.html"
    font = '<link rel="stylesheet" href="https://fonts.googleapis.com/css?family=Roboto">'
    page.write_text(CHAPTER.replace("</head>", font + "</head>"))
    rc, err = run(site, capsys)
    assert rc == 1 and "loads a remote resource: https://fonts.googleapis.com" in err


@pytest.mark.parametrize(
    "css",
    [
        '@import url("https://fonts.googleapis.com/css2?family=Inter");',
        "@font-face { src: url(//cdn.example.org/f.woff2); }",
    ],
)
def test_stylesheet_importing_from_another_host_fails(site, capsys, css):
    (site / "_static" / "theme.css").write_text(css)
    rc, err = run(site, capsys)
    assert rc == 1 and "stylesheet ../_static/theme.css loads a remote resource" in err


def test_style_block_importing_from_another_host_fails(site, capsys):
    page = site / "book" / "ch.html"
    style = "<style>@import 'https://fonts.example.org/a.css';</style>"
    page.write_text(CHAPTER.replace("</head>", style + "</head>"))
    rc, err = run(site, capsys)
    assert rc == 1 and "<style> block loads a remote resource" in err


def test_widget_page_without_live_script_fails(site, capsys):
    page = site / "book" / "ch.html"
    page.write_text(CHAPTER.replace("shardlab-live/shardlab-live.js", "other.js"))
    (site / "_static" / "other.js").write_text("")
    rc, err = run(site, capsys)
    assert rc == 1 and "does not load the local shardlab-live.js" in err


def test_wheel_differing_from_the_lock_file_fails(site, capsys):
    wheel = site / "_static" / "shardlab-live" / "pyodide" / "comm-0.2.3-py3-none-any.whl"
    wheel.write_bytes(b"tampered")
    rc, err = run(site, capsys)
    assert rc == 1 and "comm-0.2.3-py3-none-any.whl has sha256" in err


def test_missing_pyodide_core_fails(site, capsys):
    (site / "_static" / "shardlab-live" / "pyodide" / "pyodide.asm.wasm").unlink()
    rc, err = run(site, capsys)
    assert rc == 1 and "pyodide.asm.wasm is missing" in err


def _manifest(site: Path, name: str) -> Path:
    pyodide = site / "_static" / "shardlab-live" / "pyodide"
    (pyodide / "python-memory.json").write_text(json.dumps({"file": name}))
    return pyodide


def test_shipped_snapshot_of_this_lock_file_passes(site, capsys):
    pyodide = site / "_static" / "shardlab-live" / "pyodide"
    digest = hashlib.sha256((pyodide / "pyodide-lock.json").read_bytes()).hexdigest()
    _manifest(site, f"python-memory-{digest}.bin.gz")
    (pyodide / f"python-memory-{digest}.bin.gz").write_bytes(b"gz")
    assert run(site, capsys)[0] == 0
    (pyodide / f"python-memory-{digest}.bin.gz").unlink()  # named, but not shipped
    rc, err = run(site, capsys)
    assert rc == 1 and "which is missing" in err


def test_snapshot_of_another_lock_file_fails(site, capsys):
    pyodide = _manifest(site, "python-memory-" + "0" * 64 + ".bin.gz")
    (pyodide / ("python-memory-" + "0" * 64 + ".bin.gz")).write_bytes(b"gz")
    rc, err = run(site, capsys)
    assert rc == 1 and "not this lock file's" in err


def test_no_snapshot_named_passes(site, capsys):
    _manifest(site, None)
    assert run(site, capsys)[0] == 0
