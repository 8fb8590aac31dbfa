"""shardlab.widgets: ipywidgets calculators over ``shardlab.accounting``.

One calculator per area. Each ``*_calculator(**defaults)`` returns an ``ipywidgets.VBox``
(controls above an ``HTML`` output; attributes ``.controls``, ``.output``, ``.update()``).
The output is a plain HTML string (tables + inline SVG chart), rendered once at
construction, so a page built without a running kernel still shows the default result.
Each ``render_*(**kwargs) -> str`` returns that HTML without widgets, and each
``*_report(...)`` returns the :class:`~shardlab.widgets._common.Report` (tables + JSON data)
that the CLI prints. Bad input shows a red sentence, never a traceback.

ipywidgets is imported only when a calculator is built. ``shardlab.widgets.live`` rebuilds
the calculators stored in a built book page under Pyodide, so they stay live in the reader's
browser (``tools/build_live.py``, ``tools/live/shardlab-live.js``).
"""

from .activations import activations_calculator, activations_report, render_activations
from .batch import batch_calculator, batch_report, render_batch
from .comm import (
    comm_calculator,
    comm_report,
    load_machine_preset,
    render_comm,
    render_step_volume,
    set_machine_preset,
    step_report,
)
from .memory import memory_calculator, memory_report, render_memory
from .mesh import mesh_calculator, mesh_report, render_mesh
from .overlap import overlap_calculator, overlap_report, render_overlap
from .pipeline import pipeline_calculator, pipeline_report, render_pipeline
from .planner import planner_calculator, planner_report, render_planner
from .roofline import render_roofline, roofline_calculator, roofline_report

__all__ = [
    "activations_calculator",
    "activations_report",
    "batch_calculator",
    "batch_report",
    "comm_calculator",
    "comm_report",
    "load_machine_preset",
    "memory_calculator",
    "memory_report",
    "mesh_calculator",
    "mesh_report",
    "overlap_calculator",
    "overlap_report",
    "pipeline_calculator",
    "planner_calculator",
    "planner_report",
    "roofline_calculator",
    "roofline_report",
    "pipeline_report",
    "render_activations",
    "render_batch",
    "render_comm",
    "render_memory",
    "render_mesh",
    "render_overlap",
    "render_pipeline",
    "render_planner",
    "render_roofline",
    "render_step_volume",
    "set_machine_preset",
    "step_report",
]
