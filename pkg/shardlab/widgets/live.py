"""Live calculators in the published book: the same calculators, rebuilt in the browser.

A built book page holds each calculator as *stored widget state* (what the notebook showed
when it was executed). ``tools/live/shardlab-live.js`` starts Pyodide on the page, imports
this module and calls :func:`rebuild_page`: every stored calculator is recognised by its
title, built again by its own ``*_calculator()`` function and brought to the stored inputs
by replaying the stored control values through the widgets (so the calculator's observers
run exactly as when a reader types). The rebuilt widgets talk to the page's widget manager
over :class:`BridgeComm`, the Jupyter widget protocol without a kernel: ipywidgets sends
``comm_open``/``update`` messages to a JavaScript function, and the page sends the reader's
edits back through :func:`deliver`. Nothing is computed in JavaScript; every number on a
live page comes from ``shardlab.accounting`` through ``shardlab.widgets``.

This module runs in CPython too (``tests/test_live_rebuild.py`` rebuilds every calculator
stored in the book and checks that it shows the stored output again).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

from . import comm as comm_widgets
from ._common import renders_held
from .activations import activations_calculator
from .batch import batch_calculator
from .comm import comm_calculator
from .memory import memory_calculator
from .mesh import mesh_calculator
from .overlap import overlap_calculator
from .pipeline import pipeline_calculator
from .planner import planner_calculator
from .roofline import roofline_calculator

# Title shown in bold at the top of each calculator -> the function that builds it.
# tests/test_live_rebuild.py checks that each factory still shows this title.
CALCULATORS: dict[str, Callable[..., Any]] = {
    "Model-state memory per rank": memory_calculator,
    "Saved activations per layer": activations_calculator,
    "Collectives under the α–β model": comm_calculator,
    "Pipeline schedule and bubble": pipeline_calculator,
    "Device mesh": mesh_calculator,
    "Layout planner": planner_calculator,
    "Roofline of one matrix product": roofline_calculator,
    "Compute versus communication": overlap_calculator,
    "The batch the optimizer tolerates": batch_calculator,
}
# Every module outside the standard library that the live page imports after this one
# (the calculators import ipywidgets when they are built; the bridge imports comm). The page
# calls preload() before it takes a memory snapshot of Python (shardlab-live.js): a later
# visit restores that snapshot instead of starting Python and importing again, and the
# restored Python has the standard library's files but not the wheels' (the files are not in
# the snapshot), so a module first imported after a restore would not be found. preload()
# also imports every module of this package.
# tests/test_live_rebuild.py checks that rebuilding and editing every stored calculator after
# preload() imports nothing else from outside the standard library.
PRELOAD = ("comm", "comm.base_comm", "ipywidgets", "ipywidgets.widgets.widget", "traitlets")
# Calculators whose first render takes most of a second in Pyodide (the planner searches every
# layout). With ``defer=True`` (the page) :func:`rebuild_page` shows their stored output for
# the stored inputs at once and :func:`verify_page` computes it afterwards, while the page is
# already live: the reader sees the same result a moment sooner, and a difference still shows.
DEFERRED = frozenset({"Layout planner"})
_SELECTION = ("_options_labels", "index")
_live: dict[str, Any] = {}  # stored view model id -> rebuilt calculator (keeps them alive)
# stored view id -> (its stored output, its inputs then) of a deferred calculator not yet computed
_unverified: dict[str, tuple[str, list[Any]]] = {}
_send: Callable[[str], None] | None = None


def _ref(value: Any) -> str | None:
    """``"IPY_MODEL_<id>"`` (how widget state refers to another widget) -> ``<id>``."""
    if isinstance(value, str) and value.startswith("IPY_MODEL_"):
        return value[len("IPY_MODEL_") :]
    return None


def _title(models: dict[str, Any], model_id: str) -> str | None:
    """The calculator title of a stored VBox, or None if the model is not a calculator."""
    model = models.get(model_id)
    if not model or model.get("model_name") != "VBoxModel":
        return None
    children = model["state"].get("children") or []
    first = models.get(_ref(children[0]) or "") if children else None
    if not first or first.get("model_name") != "HTMLModel":
        return None
    value = first["state"].get("value", "")
    if value.startswith("<b>") and value.endswith("</b>"):
        import html

        return html.unescape(value[3:-4])
    return None


def _stored_controls(models: dict[str, Any], box_id: str) -> list[dict[str, Any]]:
    """The stored state of each control of a calculator, in row order."""
    children = [_ref(c) for c in models[box_id]["state"]["children"]]
    out = []
    for row_id in children[1:-1]:  # title first, output last, rows of controls between
        for c in models[row_id]["state"]["children"]:
            out.append(models[_ref(c)]["state"])
    return out


def _apply(widget: Any, stored: dict[str, Any]) -> None:
    """Bring one rebuilt control to its stored value, the way a reader's edit would."""
    if all(k in stored for k in _SELECTION):
        labels = list(stored["_options_labels"])
        if list(widget._options_labels) != labels:
            # e.g. a "this machine" preset registered by an earlier cell of the chapter
            widget.options = labels
        if widget.index != stored["index"]:
            widget.index = stored["index"]
    elif "value" in stored and widget.value != stored["value"]:
        widget.value = stored["value"]


def rebuild(models: dict[str, Any], box_id: str, defer: bool = False) -> Any:
    """Rebuild the stored calculator ``box_id`` (a VBox in ``models``) with its stored inputs.

    ``models`` is the ``"state"`` mapping of a page's widget state (model id -> model).
    Raises ``ValueError`` naming the model when it is not a known calculator or its controls
    do not match the calculator's. ``defer``: show the stored output instead of computing it
    (``box.update()`` computes it later).
    """
    title = _title(models, box_id)
    if title not in CALCULATORS:
        raise ValueError(f"widget {box_id} is not a shardlab calculator (title {title!r})")
    stored = _stored_controls(models, box_id)
    with renders_held():  # one render below, with every stored input, not one per input
        box = CALCULATORS[title]()
        rows = [row.children for row in box.children[1:-1]]
        widgets = [w for row in rows for w in row]
        if len(widgets) != len(stored):
            raise ValueError(
                f"calculator {title!r}: {len(stored)} stored controls but the calculator has "
                f"{len(widgets)}; rebuild the book's notebooks (make execute)"
            )
        for widget, state in zip(widgets, stored, strict=True):
            _apply(widget, state)
    if defer:
        box.output.value = stored_output(models, box_id)
    else:
        box.update()
    if CALCULATORS[title] is comm_calculator:
        _keep_selected_preset(box)
    return box


def _keep_selected_preset(box: Any) -> None:
    """A stored α–β calculator showing a preset this process does not know ("this machine",
    measured by an earlier cell) shows that preset's α and β: register them, so that picking
    the preset again after trying another one restores them. (A machine preset that was
    offered but not selected cannot be recovered: its values are not in the page.)"""
    c = box.controls
    name = c["preset"].value
    if name != comm_widgets.CUSTOM and name not in comm_widgets.presets():
        comm_widgets._machine[name] = (c["alpha_us"].value, c["beta_gbps"].value)


def stored_output(models: dict[str, Any], box_id: str) -> str:
    """The HTML the stored calculator showed (its last child, an HTML widget)."""
    return models[_ref(models[box_id]["state"]["children"][-1])]["state"]["value"]


def preload() -> None:
    """Import :data:`PRELOAD` and every module of ``shardlab.widgets`` (several import
    ipywidgets, so the calculators import them only when built) before the page snapshots
    Python's memory."""
    import importlib
    import pkgutil

    for name in PRELOAD:
        importlib.import_module(name)
    package = __name__.rpartition(".")[0]
    for info in pkgutil.iter_modules(importlib.import_module(package).__path__):
        importlib.import_module(f"{package}.{info.name}")


def rebuild_page(state_json: str, view_ids_json: str, defer: bool = False) -> str:
    """Rebuild every calculator among a page's displayed widgets.

    ``state_json``: the page's ``application/vnd.jupyter.widget-state+json`` text;
    ``view_ids_json``: JSON list of the model ids the page displays. Returns JSON
    ``{"views": {stored id: live id}, "same": {stored id: bool}, "errors": {id: text}}``;
    ``same`` says whether the live calculator reproduced the stored output exactly. With
    ``defer``, a :data:`DEFERRED` calculator shows its stored output and its ``same`` is
    ``null`` until :func:`verify_page` has computed it.
    """
    models = json.loads(state_json)["state"]
    views: dict[str, str] = {}
    same: dict[str, bool] = {}
    errors: dict[str, str] = {}
    for view_id in json.loads(view_ids_json):
        if _title(models, view_id) is None:
            continue
        later = defer and _title(models, view_id) in DEFERRED
        try:
            box = rebuild(models, view_id, defer=later)
        except Exception as exc:  # report it on the page; the stored view stays
            errors[view_id] = f"{exc.__class__.__name__}: {exc}"
            continue
        _live[view_id] = box
        views[view_id] = box.model_id
        if later:
            _unverified[view_id] = (stored_output(models, view_id), _inputs(box))
            same[view_id] = None
        else:
            same[view_id] = box.output.value == stored_output(models, view_id)
    return json.dumps({"views": views, "same": same, "errors": errors})


def _inputs(box: Any) -> list[Any]:
    return [c.value for c in box.controls.values()]


def verify_page() -> str:
    """Compute every calculator :func:`rebuild_page` deferred and say whether each reproduced
    its stored output: JSON ``{stored id: bool}``; the view shows the computed output. One the
    reader edited meanwhile was computed by the edit, for other inputs: ``null`` (not
    compared)."""
    same: dict[str, bool | None] = {}
    for view_id, (stored, inputs) in list(_unverified.items()):
        del _unverified[view_id]
        box = _live[view_id]
        same[view_id] = box.update() == stored if _inputs(box) == inputs else None
    return json.dumps(same)


# --------------------------------------------------------------------------- comm bridge


def _comm_class() -> type:
    from comm.base_comm import BaseComm

    class BridgeComm(BaseComm):
        """A comm whose messages go to the page's JavaScript instead of a kernel socket."""

        def publish_msg(
            self,
            msg_type: str,
            data: dict[str, Any] | None = None,
            metadata: dict[str, Any] | None = None,
            buffers: list[Any] | None = None,
            **keys: Any,
        ) -> None:
            if buffers:  # no calculator has binary traits; refuse rather than drop them
                raise ValueError(f"comm {self.comm_id}: binary buffers are not bridged")
            if _send is None:
                raise RuntimeError("shardlab.widgets.live.install_bridge() was not called")
            msg = {
                "msg_type": msg_type,
                "comm_id": self.comm_id,
                "target_name": keys.get("target_name", self.target_name),
                "data": data or {},
                "metadata": metadata or {},
            }
            _send(json.dumps(msg))

    return BridgeComm


def install_bridge(send: Callable[[str], None]) -> None:
    """Route every widget comm created from now on to ``send(json_message)``.

    Call before the first calculator is built. Echo updates are switched off: the page is
    the only front end, so the value it sent needs no confirmation.
    """
    global _send
    os.environ["JUPYTER_WIDGETS_ECHO"] = "0"
    import comm
    import ipywidgets.widgets.widget as widget_module

    widget_module.JUPYTER_WIDGETS_ECHO = False
    bridge = _comm_class()
    _send = send
    comm.create_comm = lambda **kwargs: bridge(**kwargs)


def deliver(comm_id: str, data_json: str) -> None:
    """Hand a message the page sent on comm ``comm_id`` (JSON ``data``) to its widget."""
    import comm

    target = comm.get_comm_manager().get_comm(comm_id)
    if target is None:
        raise ValueError(f"no widget comm with id {comm_id!r}")
    msg = {
        "header": {"msg_type": "comm_msg"},
        "parent_header": {},
        "metadata": {},
        "content": {"comm_id": comm_id, "data": json.loads(data_json)},
        "buffers": [],
    }
    target.handle_msg(msg)
