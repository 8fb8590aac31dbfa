"""Communication calculator: collectives under the α–β model, and per-step volumes.

Units at this surface: α in microseconds per round, β in GB/s (10^9 bytes per second);
they are converted to seconds and bytes/s before calling
:func:`shardlab.accounting.comm.alpha_beta_time`, which computes every number shown.

Machine presets: a lab measures α and β on the machine at hand and hands them to
:func:`set_machine_preset` (``alpha`` seconds per round, ``beta`` bytes per second, the units
of ``accounting.comm``), or writes them to a JSON file ``{"alpha": s, "beta": bytes/s}``
(``{"alpha_us": ..., "beta_gbps": ...}`` is accepted too) whose path is passed to
:func:`comm_calculator` as ``machine_json``. The preset then appears as "this machine".
"""

from __future__ import annotations

import json
import os
from typing import Any

from shardlab.accounting import comm as acc
from shardlab.accounting._validate import MAX_REAL

from ._common import (
    Report,
    Table,
    build_calculator,
    computable,
    fmt_fixed,
    fmt_int,
    fmt_num,
    fmt_time,
    html_report,
    parse_number,
    svg_loglog,
    unit_number,
)
from ._svg import log_grid

THIS_MACHINE = "this machine"
CUSTOM = "custom"
# Illustrative (α µs, β GB/s) pairs for the preset dropdown; inputs, not results.
PRESETS: dict[str, tuple[float, float]] = {
    "illustrative: intra-node NVLink-class (α=3 µs, β=300 GB/s)": (3.0, 300.0),
    "illustrative: inter-node 400 Gb/s NIC (α=10 µs, β=50 GB/s)": (10.0, 50.0),
    "illustrative: PCIe / TCP-class (α=50 µs, β=10 GB/s)": (50.0, 10.0),
}
_machine: dict[str, tuple[float, float]] = {}


def set_machine_preset(alpha: float, beta: float) -> tuple[float, float]:
    """Register measured α (seconds per round) and β (bytes per second) as "this machine".

    Returns the preset in display units (α µs, β GB/s). Calculators built afterwards offer it.
    """
    a = parse_number("alpha (s)", alpha)
    b = parse_number("beta (bytes/s)", beta)
    if a < 0 or b <= 0:
        raise ValueError(f"alpha={a!r} must be >= 0 and beta={b!r} must be > 0")
    _machine[THIS_MACHINE] = (a * 1e6, b / 1e9)
    return _machine[THIS_MACHINE]


def load_machine_preset(path: str | os.PathLike[str]) -> tuple[float, float]:
    """Read a JSON file with ``alpha``/``beta`` (s, bytes/s) or ``alpha_us``/``beta_gbps``."""
    with open(path) as f:
        d = json.load(f)
    if "alpha_us" in d and "beta_gbps" in d:
        return set_machine_preset(float(d["alpha_us"]) * 1e-6, float(d["beta_gbps"]) * 1e9)
    if "alpha" in d and "beta" in d:
        return set_machine_preset(d["alpha"], d["beta"])
    raise ValueError(f"{os.fspath(path)} has no alpha/beta (or alpha_us/beta_gbps) entries")


def presets() -> dict[str, tuple[float, float]]:
    """All presets by name: "this machine" first (when set), then the illustrative ones."""
    return {**_machine, **PRESETS}


def comm_report(
    op: str = "all_reduce",
    nbytes: Any = 1e9,
    ranks: Any = 8,
    alpha_us: Any = 5.0,
    beta_gbps: Any = 100.0,
    algo: str = "ring",
) -> Report:
    """Per-rank sent bytes, rounds and α–β time of every collective (``op`` highlighted)."""
    # every input is read under its own argument name (the widget's control, the CLI's
    # option); α and β are checked in their units before the conversion to s and bytes/s
    nb = parse_number("nbytes", nbytes)
    d = parse_number("ranks", ranks)
    a_us = unit_number("alpha_us", alpha_us, 1e-6, allow_zero=True)
    b_gbps = unit_number("beta_gbps", beta_gbps, 1e9)
    alpha, beta = a_us * 1e-6, b_gbps * 1e9
    if op not in acc.COLLECTIVES:
        raise ValueError(f"op={op!r} is not one of {', '.join(acc.COLLECTIVES)}")
    if algo not in acc.ALGOS:
        raise ValueError(f"algo={algo!r} is not one of {', '.join(acc.ALGOS)}")

    rows, data = [], {}
    for c in acc.COLLECTIVES:
        entry: dict[str, Any] = {}
        cells: list[Any] = [c]
        for al in acc.ALGOS:
            sent = acc.sent_bytes(c, nb, d, al)
            r = acc.rounds(c, d, al)
            # each term bounded under the fields that make it (1e30 bytes over 1e-300 GB/s
            # is no time to show as "inf s")
            computable("The latency, rounds × α,", r * alpha, {"ranks": d, "alpha_us": a_us},
                       unit=" s")
            computable("The transfer time, bytes sent / β,", sent / beta,
                       {"nbytes": nb, "beta_gbps": b_gbps}, unit=" s")
            t = acc.alpha_beta_time(c, nb, d, alpha, beta, al)
            entry[al] = {"sent_bytes": sent, "rounds": r, "seconds": t}
            cells += [fmt_int(sent), r, fmt_time(t)]
        data[c] = entry
        rows.append(cells)
    table = Table(
        [
            "collective",
            "ring sent B/rank",
            "ring rounds",
            "ring time",
            "tree critical-path B",
            "tree rounds",
            "tree time",
        ],
        rows,
        title=f"V = {fmt_int(nb)} bytes (full tensor), D = {d}, α = {fmt_num(a_us)} µs, "
        f"β = {fmt_num(b_gbps)} GB/s",
        highlight=frozenset({acc.COLLECTIVES.index(op)}),
    )
    sel = data[op][algo]
    # the chart spans the size typed; its end stays within accounting's bound on a size
    lo, hi = max(min(nb, 1e3), 1.0), min(max(nb * 10, 1e4), MAX_REAL)
    curves = [
        (al, [(x, acc.alpha_beta_time(op, x, d, alpha, beta, al)) for x in log_grid(lo, hi, 25)])
        for al in acc.ALGOS
    ]
    chart = svg_loglog(
        curves,
        (nb, sel["seconds"]),
        title=f"{op} on D={d}: time against message size",
        xlabel="message size V (bytes, full tensor)",
        ylabel="time",
    )
    latency = sel["rounds"] * alpha
    notes = [
        f"{op} ({algo}): T = {sel['rounds']} rounds × α + {fmt_int(sel['sent_bytes'])} B / β "
        f"= {fmt_time(latency)} + {fmt_time(sel['seconds'] - latency)} = {fmt_time(sel['seconds'])}."
    ]
    return Report(
        title=f"Collectives under the α–β model (selected: {op}, {algo})",
        tables=[table],
        data={
            "op": op,
            "algo": algo,
            "nbytes": nb,
            "ranks": d,
            "alpha_s": alpha,
            "beta_bytes_per_s": beta,
            "selected": sel,
            "collectives": data,
        },
        notes=notes,
        chart_svg=chart,
    )


def step_report(
    n_params: Any = 7_000_000_000,
    dp: Any = 8,
    q: Any = 2,
    layout: str | None = None,
    microbatches: Any = 1,
    sync_every_microbatch: bool = True,
) -> Report:
    """Per-rank sent bytes per optimizer step for DDP, ZeRO-1/2/3 (``layout`` highlighted)."""
    n = parse_number("n_params", n_params)
    d = parse_number("dp", dp)
    qq = parse_number("q", q)
    m = parse_number("microbatches", microbatches)
    if layout is not None and layout not in acc.STEP_LAYOUTS:
        raise ValueError(f"layout={layout!r} is not one of {', '.join(acc.STEP_LAYOUTS)}")
    cases = [(lay, True) for lay in acc.STEP_LAYOUTS] + [("zero3", False)]
    vols = {
        (lay, rs): acc.grad_accum_volume(lay, n, d, qq, m, sync_every_microbatch, rs)
        for lay, rs in cases
    }
    ddp = vols[("ddp", True)]
    names = {(lay, rs): lay if rs else "zero3 (no reshard)" for lay, rs in cases}
    rows = [
        [names[k], fmt_int(vol), fmt_fixed(vol / 1e9, 3), fmt_num(vol / ddp) if ddp else "-"]
        for k, vol in vols.items()
    ]
    hl = frozenset({i for i, (lay, rs) in enumerate(cases) if lay == layout and rs})
    sync = "sync every microbatch" if sync_every_microbatch else "sync once per update"
    return Report(
        title=f"Per-rank sent bytes per optimizer step: N={n:,}, D={d}, q={qq} B, m={m} ({sync})",
        tables=[Table(["layout", "bytes/rank", "GB", "× DDP"], rows, highlight=hl)],
        data={
            "n_params": n,
            "dp": d,
            "q": qq,
            "microbatches": m,
            "sync_every_microbatch": sync_every_microbatch,
            "layout": layout,
            "bytes_per_rank": {names[k]: vol for k, vol in vols.items()},
        },
        notes=["zero3 reshards after forward (gathers again for backward) unless marked."],
    )


def render_comm(**kwargs: Any) -> str:
    """HTML (time-vs-size chart + collective table) for :func:`comm_report`'s arguments."""
    return html_report(comm_report(**kwargs))


def render_step_volume(**kwargs: Any) -> str:
    """HTML table for :func:`step_report`'s arguments."""
    return html_report(step_report(**kwargs))


def comm_calculator(
    op: str = "all_reduce",
    nbytes: Any = "1e9",
    ranks: int = 8,
    alpha_us: float = 5.0,
    beta_gbps: float = 100.0,
    algo: str = "ring",
    machine_json: str | os.PathLike[str] | None = None,
    preset: str | None = None,
):
    """Interactive α–β calculator (ipywidgets VBox; ``.update()`` re-renders).

    ``machine_json``: path of the JSON file a lab wrote with the fitted α and β; when it
    exists, "this machine" is selected as the preset.
    """
    import ipywidgets as w

    if machine_json is not None and os.path.exists(machine_json):
        load_machine_preset(machine_json)
        preset = preset or THIS_MACHINE
    options = [CUSTOM, *presets()]
    if preset is not None:
        if preset not in options:
            raise ValueError(f"preset={preset!r} is not one of {', '.join(options)}")
        alpha_us, beta_gbps = presets()[preset]
    controls: dict[str, Any] = {
        "op": w.Dropdown(options=acc.COLLECTIVES, value=op, description="collective"),
        "nbytes": w.Text(value=str(nbytes), description="size V (bytes)"),
        "ranks": w.IntText(value=int(ranks), description="D (ranks)"),
        "algo": w.ToggleButtons(options=acc.ALGOS, value=algo, description="algorithm"),
        "preset": w.Dropdown(options=options, value=preset or CUSTOM, description="preset"),
        "alpha_us": w.FloatText(value=float(alpha_us), description="α (µs/round)"),
        "beta_gbps": w.FloatText(value=float(beta_gbps), description="β (GB/s)"),
    }

    def convert(vals: dict[str, Any]) -> dict[str, Any]:
        vals = dict(vals)
        vals.pop("preset")
        return vals

    box = build_calculator(
        "Collectives under the α–β model",
        controls,
        render_comm,
        convert,
        rows=[["op", "nbytes", "ranks", "algo"], ["preset", "alpha_us", "beta_gbps"]],
        aliases={"group_size": "ranks"},
    )

    def apply_preset(change: Any) -> None:
        if change["new"] in presets():
            a, b = presets()[change["new"]]
            controls["alpha_us"].value = a
            controls["beta_gbps"].value = b

    controls["preset"].observe(apply_preset, names="value")
    return box
