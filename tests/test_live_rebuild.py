"""Live calculators without a browser: rebuild from stored state, the comm bridge, the runtime.

``shardlab.widgets.live`` is what the book's pages run under Pyodide; here it runs in
CPython on the same stored widget state the pages carry (the notebooks' metadata), and
``tools/build_live.py``'s wheel and lock-file entries are checked offline.
"""

from __future__ import annotations

import hashlib
import importlib.util
import io
import json
import zipfile
from pathlib import Path

import pytest

pytest.importorskip("ipywidgets")

from shardlab.widgets import live  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
STATE_MIME = "application/vnd.jupyter.widget-state+json"
VIEW_MIME = "application/vnd.jupyter.widget-view+json"
NOTEBOOKS = sorted(
    p
    for p in [*ROOT.glob("book/*.ipynb"), *ROOT.glob("labs/*/lab.ipynb")]
    if STATE_MIME in json.loads(p.read_text()).get("metadata", {}).get("widgets", {})
)


def stored(nb_path: Path) -> tuple[dict, list[str]]:
    """(widget state, displayed model ids) of a notebook, as its built page holds them."""
    nb = json.loads(nb_path.read_text())
    state = nb["metadata"]["widgets"][STATE_MIME]
    ids = [
        out["data"][VIEW_MIME]["model_id"]
        for cell in nb["cells"]
        if cell["cell_type"] == "code"
        for out in cell.get("outputs", [])
        if VIEW_MIME in out.get("data", {})
    ]
    return state, ids


@pytest.fixture
def sent(monkeypatch):
    """Install the bridge with a recorder (messages as dicts); undone after the test, so
    other tests in this process get ordinary comms again."""
    import comm
    import ipywidgets.widgets.widget as widget_module

    monkeypatch.setattr(comm, "create_comm", comm.create_comm)
    monkeypatch.setattr(widget_module, "JUPYTER_WIDGETS_ECHO", widget_module.JUPYTER_WIDGETS_ECHO)
    monkeypatch.setattr(live, "_send", None)
    monkeypatch.setenv("JUPYTER_WIDGETS_ECHO", "1")
    messages: list[dict] = []
    live.install_bridge(lambda text: messages.append(json.loads(text)))
    yield messages


def test_titles_name_the_calculators():
    for title, factory in live.CALCULATORS.items():
        box = factory()
        assert box.children[0].value == f"<b>{title}</b>", factory.__name__


def test_the_book_has_calculators_to_rebuild():
    names = {p.relative_to(ROOT).as_posix() for p in NOTEBOOKS}
    assert {"book/02_memory.ipynb", "book/05_pipeline.ipynb", "book/10_combining.ipynb"} <= names


@pytest.mark.parametrize("nb_path", NOTEBOOKS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_stored_calculator_rebuilds_to_its_stored_output(nb_path, sent):
    state, ids = stored(nb_path)
    result = json.loads(live.rebuild_page(json.dumps(state), json.dumps(ids)))
    calculators = [i for i in ids if live._title(state["state"], i) is not None]
    assert calculators, f"{nb_path.name} stores widget state but shows no calculator"
    assert result["errors"] == {}
    assert set(result["views"]) == set(calculators)
    # The live calculator starts from exactly what the page showed (same inputs, same HTML).
    assert result["same"] == {i: True for i in calculators}
    opened = {m["comm_id"] for m in sent if m["msg_type"] == "comm_open"}
    assert set(result["views"].values()) <= opened


def test_rebuilding_renders_once_with_every_stored_input(monkeypatch):
    """The page sets a calculator's stored inputs one by one; each used to re-render (the
    chapter 10 planner: 22 searches, 5.5 s of a repeat visit's 7.3 s in Chromium). Under
    ``renders_held()`` (the factory's render of the defaults included) the rebuild renders
    once, with the stored inputs, and still shows exactly the stored output."""
    from shardlab.widgets import planner

    state, ids = stored(ROOT / "book" / "10_combining.ipynb")
    models = state["state"]
    (box_id,) = [i for i in ids if live._title(models, i) == "Layout planner"]
    changed = sum(
        1 for stored_state, default in zip(
            live._stored_controls(models, box_id),
            [c for row in planner.planner_calculator().children[1:-1] for c in row.children],
            strict=True,
        )
        if stored_state.get("value", stored_state.get("index")) != getattr(
            default, "value" if "value" in stored_state else "index")
    )
    assert changed >= 2, "the stored planner differs from the defaults in too few inputs to tell"
    renders = []
    real = planner.render_planner
    monkeypatch.setattr(planner, "render_planner", lambda **kw: renders.append(1) or real(**kw))
    box = live.rebuild(models, box_id)
    assert len(renders) == 1, f"{len(renders)} renders for {changed} changed inputs"
    assert box.output.value == live.stored_output(models, box_id)
    # outside renders_held() an edit renders at once again
    box.controls["layers"].value = "100"
    assert len(renders) == 2
    # and a calculator built outside the rebuild renders its defaults at once
    planner.planner_calculator()
    assert len(renders) == 3


def test_a_deferred_calculator_shows_its_stored_output_then_is_computed(sent, monkeypatch):
    """With ``defer=True`` (the page) the planner shows its stored output without searching
    (``same`` is null), and ``verify_page()`` then searches once with the stored inputs and
    reports that it reproduced the stored output; a planner the reader edited before the
    verification is not compared (null), and a computed result that differs says so."""
    from shardlab.widgets import planner

    state, ids = stored(ROOT / "book" / "10_combining.ipynb")
    models = state["state"]
    renders = []
    real = planner.render_planner
    monkeypatch.setattr(planner, "render_planner", lambda **kw: renders.append(1) or real(**kw))
    monkeypatch.setattr(live, "_unverified", {})
    result = json.loads(live.rebuild_page(json.dumps(state), json.dumps(ids), True))
    (box_id,) = [i for i in result["views"] if live._title(models, i) == "Layout planner"]
    box = live._live[box_id]
    assert result["same"][box_id] is None and renders == []
    assert box.output.value == live.stored_output(models, box_id)
    assert all(v is True for k, v in result["same"].items() if k != box_id), result["same"]
    assert json.loads(live.verify_page()) == {box_id: True} and len(renders) == 1
    assert json.loads(live.verify_page()) == {}  # once
    # edited before the verification: computed by the edit, not compared
    live.rebuild_page(json.dumps(state), json.dumps([box_id]), True)
    edited = live._live[box_id]
    edited.controls["top"].value = str(int(float(edited.controls["top"].value)) + 1)
    assert json.loads(live.verify_page()) == {box_id: None}
    # a result that differs from the stored one is reported
    monkeypatch.setattr(planner, "render_planner", lambda **kw: real(**kw) + "<p>new</p>")
    live.rebuild_page(json.dumps(state), json.dumps([box_id]), True)
    assert json.loads(live.verify_page()) == {box_id: False}
    assert live._live[box_id].output.value.endswith("<p>new</p>")


def test_an_edit_from_the_page_reaches_the_calculator_and_comes_back(sent):
    state, ids = stored(ROOT / "book" / "02_memory.ipynb")
    result = json.loads(live.rebuild_page(json.dumps(state), json.dumps(ids)))
    (stored_id,) = result["views"]
    box = live._live[stored_id]
    dp = box.controls["dp"]
    sent.clear()
    # what the page's widget manager sends when the reader types 4 into "D"
    live.deliver(dp.model_id, json.dumps({"method": "update", "state": {"value": 4}}))
    assert dp.value == 4
    updates = [m for m in sent if m["msg_type"] == "comm_msg"]
    out = [m for m in updates if m["comm_id"] == box.output.model_id]
    assert len(out) == 1, "the output HTML is sent back once"
    html = out[0]["data"]["state"]["value"]
    assert html == box.output.value
    assert "D=4" in html and "28,000,000,000" in html  # ZeRO-3: 16 B x 7e9 / 4
    # echo updates are off: the page is the only front end
    assert all(m["data"].get("method") != "echo_update" for m in updates)


def test_bad_messages_are_refused_with_a_sentence(sent):
    with pytest.raises(ValueError, match="no widget comm with id 'nope'"):
        live.deliver("nope", json.dumps({"method": "update", "state": {}}))
    state, ids = stored(ROOT / "book" / "02_memory.ipynb")
    models = state["state"]
    with pytest.raises(ValueError, match="is not a shardlab calculator"):
        live.rebuild(models, next(iter(models)))


def _build_live():
    spec = importlib.util.spec_from_file_location("build_live", ROOT / "tools" / "build_live.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_shardlab_wheel_and_lock_entry_are_consistent_and_reproducible():
    bl = _build_live()
    name, data = bl.shardlab_wheel()
    assert bl.shardlab_wheel() == (name, data), "the wheel is not reproducible"
    entry = bl.wheel_entry(name, data)
    assert entry["sha256"] == hashlib.sha256(data).hexdigest()
    assert entry["name"] == "shardlab" and entry["imports"] == ["shardlab"]
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        names = set(zf.namelist())
        record = zf.read(f"shardlab-{entry['version']}.dist-info/RECORD").decode()
    for module in ("shardlab/accounting/memory.py", "shardlab/widgets/live.py"):
        assert module in names
        assert (ROOT / "pkg" / module).read_bytes() == zipfile.ZipFile(io.BytesIO(data)).read(
            module
        )
        assert module in record


def test_requirements_pin_every_wheel_with_a_hash():
    bl = _build_live()
    reqs = bl.read_requirements()
    names = {bl.canonical(n) for n, _, _ in reqs}
    assert {"ipywidgets", "comm", "traitlets"} <= names
    assert "ipython" not in names  # the page's IPython is kernelless_ipython (next test)
    assert all(len(h) == 64 for _, _, h in reqs)


def test_a_selected_machine_preset_survives_trying_another(sent, monkeypatch):
    from shardlab.widgets import comm as comm_widgets

    monkeypatch.setattr(comm_widgets, "_machine", {})
    state, ids = stored(ROOT / "labs" / "01_collectives" / "lab.ipynb")
    result = json.loads(live.rebuild_page(json.dumps(state), json.dumps(ids)))
    (stored_id,) = result["views"]
    c = live._live[stored_id].controls
    if c["preset"].value != comm_widgets.THIS_MACHINE:
        pytest.skip("lab 01 was executed without this_machine.json")
    alpha, beta = c["alpha_us"].value, c["beta_gbps"].value
    other = next(iter(comm_widgets.PRESETS))
    live.deliver(c["preset"].model_id, json.dumps({"method": "update", "state": {"index": 2}}))
    assert c["preset"].value == c["preset"].options[2]
    c["preset"].value = other
    assert (c["alpha_us"].value, c["beta_gbps"].value) == comm_widgets.PRESETS[other]
    c["preset"].value = comm_widgets.THIS_MACHINE
    assert (c["alpha_us"].value, c["beta_gbps"].value) == (alpha, beta)


PRELOAD_PROBE = r"""
import json, sys
from shardlab.widgets import live
pages = json.load(open(sys.argv[1]))  # [(widget state, displayed ids)] of every notebook
live.preload()
before = set(sys.modules)
live.install_bridge(lambda text: None)
boxes = []
same = []  # per rebuilt calculator: its first result equals the stored one
for state, ids in pages:
    same += json.loads(live.rebuild_page(json.dumps(state), json.dumps(ids)))["same"].values()
boxes = list(live._live.values())
edits = 0
for box in boxes:  # every control of every calculator, edited once: its observers run
    for name, control in box.controls.items():
        if getattr(control, "options", None):
            control.index = (control.index + 1) % len(control.options) if control.index is not None else 0
        elif isinstance(control.value, bool):
            control.value = not control.value
        elif isinstance(control.value, str):
            control.value = "3"
        else:
            control.value = control.value + 1
        edits += 1
new = sorted(m for m in set(sys.modules) - before if m.split(".")[0] not in sys.stdlib_module_names)
print(json.dumps({"calculators": len(boxes), "edits": edits, "new": new, "same": same,
                  "ipython": sys.modules["IPython"].__file__}))
"""


KERNELLESS = ROOT / "tools" / "live" / "kernelless_ipython"


@pytest.mark.parametrize("ipython", ["real", "kernelless"])
def test_preload_imports_everything_the_live_page_imports_later(tmp_path, ipython):
    """A repeat visit restores a memory snapshot of Python taken after live.preload(): the
    restored Python has no wheel files, so a module outside the standard library first
    imported after preload() would fail on the page (seen: shardlab.widgets._fields). In a
    fresh interpreter: preload, rebuild every stored calculator of the book, edit every
    control once; nothing outside the standard library may be imported after preload().
    Twice: with the notebooks' IPython, and with the page's (``kernelless_ipython``, which
    the browser build installs instead of IPython): every calculator rebuilds and answers
    every edit with it too, and nothing reaches for a name it lacks."""
    import os
    import subprocess
    import sys

    pages = tmp_path / "pages.json"
    pages.write_text(json.dumps([stored(p) for p in NOTEBOOKS]))
    env = dict(os.environ)
    if ipython == "kernelless":
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(KERNELLESS), env.get("PYTHONPATH")]))
    out = subprocess.run(
        [sys.executable, "-c", PRELOAD_PROBE, str(pages)],
        capture_output=True, text=True, timeout=300, check=True, env=env,
    ).stdout
    got = json.loads(out.splitlines()[-1])
    assert got["calculators"] >= len(live.CALCULATORS) and got["edits"] > 50, got
    assert got["new"] == [], f"imported after preload(): {got['new']}"
    assert got["ipython"].startswith(str(KERNELLESS)) == (ipython == "kernelless"), got
    assert got["same"] and all(got["same"]), got["same"]
