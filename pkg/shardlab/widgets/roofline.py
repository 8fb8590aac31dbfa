"""Roofline calculator: one matrix product against a device's peak and memory bandwidth.

Every number shown comes from :mod:`shardlab.accounting.gemm`: ``matmul_flops``,
``matmul_bytes``, ``gemm_intensity``, ``ridge``, ``gemm_bound``, ``roofline_flops`` and the
planner's per-product model ``gemm_efficiency`` / ``gemm_time`` (``min(cap, I / ridge)`` of the
peak). Units at this surface: peak in TFLOP/s (10^12), bandwidth in GB/s (10^9 bytes per
second); they are converted before accounting is called. The presets are the planner's
data-sheet devices (``gemm.DEVICES``); "custom" keeps what is typed (a CPU's fitted roofline,
for instance).
"""

from __future__ import annotations

import math
from typing import Any

from shardlab.accounting import gemm
from shardlab.accounting._validate import MAX_REAL

from ._common import (
    Report,
    Table,
    build_calculator,
    computable,
    fmt_int,
    fmt_num,
    fmt_pct,
    fmt_time,
    html_report,
    parse_number,
    svg_loglog,
    unit_number,
)
from ._svg import log_grid

TITLE = "Roofline of one matrix product"
CUSTOM = "custom"
PRESETS: dict[str, tuple[float, float]] = {
    f"{key}: {dev.name}": (dev.peak_flops / 1e12, dev.hbm_bandwidth / 1e9)
    for key, dev in gemm.DEVICES.items()
}
DEFAULT_PRESET = next(name for name in PRESETS if name.startswith("h100:"))
DTYPES: dict[str, int] = {"bf16 (2 B)": 2, "fp32 (4 B)": 4, "fp8 (1 B)": 1}
ROWS_OF_M = (1, 8, 64, 512, 4096)  # token counts of the second table (same k and n)


def fmt_rate(flops_per_s: float) -> str:
    """FLOP/s in the unit that reads best (GFLOP/s, TFLOP/s, PFLOP/s)."""
    for unit, scale in (("PFLOP/s", 1e15), ("TFLOP/s", 1e12), ("GFLOP/s", 1e9)):
        if flops_per_s >= scale:
            return f"{flops_per_s / scale:.3g} {unit}"
    return f"{flops_per_s / 1e9:.3g} GFLOP/s"


def roofline_report(
    m: Any = 1024,
    k: Any = 4096,
    n: Any = 4096,
    q: Any = 2,
    peak_tflops: Any = 989.0,
    bandwidth_gbps: Any = 3350.0,
    cap: Any = gemm.DEFAULT_CAP,
) -> Report:
    """FLOPs, bytes, intensity, bound, efficiency and time of one ``m x k`` by ``k x n``
    product in ``q``-byte elements, and the same weight against other token counts ``m``."""
    m, k, n, q = (parse_number(name, x) for name, x in (("m", m), ("k", k), ("n", n), ("q", q)))
    # checked in the units typed (TFLOP/s, GB/s), under the argument names the widget labels
    pt = unit_number("peak_tflops", peak_tflops, 1e12)
    bg = unit_number("bandwidth_gbps", bandwidth_gbps, 1e9)
    peak, bw = pt * 1e12, bg * 1e9
    if peak / bw > MAX_REAL:  # the ridge, which accounting bounds, of a vanishing bandwidth
        raise ValueError(f"peak_tflops={pt!r} over bandwidth_gbps={bg!r} puts the ridge at "
                         f"{peak / bw:.3g} FLOP/byte, beyond {MAX_REAL:g}: raise the bandwidth")
    c = parse_number("cap", cap)
    flops, nbytes = gemm.matmul_flops(m, k, n), gemm.matmul_bytes(m, k, n, q)
    intensity = gemm.gemm_intensity(m, k, n, q)
    ridge = gemm.ridge(peak, bw)
    eff = gemm.gemm_efficiency(intensity, ridge, c)
    # the time F / (efficiency x peak): a product of 1e30 rows at 1e-300 TFLOP/s (or a cap
    # of 1e-300) takes no time a float holds; refused under the fields that make it
    attained = eff * peak
    computable("The time F / (efficiency × peak)", flops / attained if attained else math.inf,
               {"m": m, "k": k, "n": n, "peak_tflops": pt, "cap": c}, unit=" s")
    seconds = gemm.gemm_time(m, k, n, peak, bw, c, q)
    bound = gemm.gemm_bound(intensity, ridge)
    one = Table(
        ["quantity", "value"],
        [
            ["FLOPs 2mkn", fmt_int(flops)],
            ["bytes q(mk + kn + mn)", fmt_int(nbytes)],
            ["arithmetic intensity (FLOP/byte)", fmt_num(intensity)],
            ["ridge peak / bandwidth (FLOP/byte)", fmt_num(ridge)],
            ["bound", bound],
            [
                "roofline min(peak, I × bandwidth)",
                fmt_rate(gemm.roofline_flops(intensity, peak, bw)),
            ],
            [f"planner's efficiency min({fmt_num(c)}, I / ridge)", fmt_pct(eff)],
            ["time max(F / (cap × peak), bytes / bandwidth)", fmt_time(seconds)],
        ],
        title=f"m = {m:,}, k = {k:,}, n = {n:,}, {q}-byte elements; peak {fmt_rate(peak)}, "
        f"bandwidth {fmt_num(bw / 1e9)} GB/s",
    )
    ms = sorted({*ROWS_OF_M, m})
    per_m = []
    for mm in ms:
        i = gemm.gemm_intensity(mm, k, n, q)
        per_m.append([fmt_int(mm), fmt_num(i), gemm.gemm_bound(i, ridge),
                      fmt_pct(gemm.gemm_efficiency(i, ridge, c)),
                      fmt_time(gemm.gemm_time(mm, k, n, peak, bw, c, q))])
    many = Table(["m (tokens)", "intensity", "bound", "efficiency", "time"], per_m,
                 title=f"The same {k:,} × {n:,} weight against other token counts m",
                 highlight=frozenset({ms.index(m)}))
    # the chart's span, within accounting's bound on an intensity (a ridge of 1e30 FLOP/byte
    # is a value to show, not a chart end to refuse: intensity=3e+31)
    xs = log_grid(min(intensity, ridge) / 30, min(max(intensity, ridge) * 30, MAX_REAL), 40)
    chart = svg_loglog(
        [
            ("roofline", [(x, gemm.roofline_flops(x, peak, bw)) for x in xs]),
            (
                f"planner (cap {fmt_num(c)})",
                [(x, gemm.gemm_efficiency(x, ridge, c) * peak) for x in xs],
            ),
        ],
        (intensity, eff * peak),
        title="attainable FLOP/s against arithmetic intensity",
        xlabel="arithmetic intensity (FLOP/byte)",
        ylabel="FLOP/s",
        fmt_x=lambda x: f"{x:g}",
        fmt_y=fmt_rate,
    )
    # the planner's time max(F / (cap peak), bytes / bw) is the bytes' time below cap x ridge
    planner_bound = gemm.gemm_bound(intensity, c * ridge)
    notes = [
        f"Against the roofline the product is {bound}-bound (intensity {fmt_num(intensity)} "
        f"FLOP/byte, ridge {fmt_num(ridge)}). In the planner's model its "
        f"{'bytes' if planner_bound == 'memory' else 'FLOPs at the cap'} set the time: "
        f"{fmt_pct(eff)} of the peak."
    ]
    data = {"m": m, "k": k, "n": n, "q": q, "peak_flops": peak, "bandwidth": bw, "cap": c,
            "flops": flops, "bytes": nbytes, "intensity": intensity, "ridge": ridge,
            "bound": bound, "efficiency": eff, "seconds": seconds}
    return Report(TITLE, [one, many], data, notes, chart)


def render_roofline(**kwargs: Any) -> str:
    """HTML (roofline chart + tables) for :func:`roofline_report`'s arguments."""
    return html_report(roofline_report(**kwargs))


def roofline_calculator(
    m: int = 1024,
    k: int = 4096,
    n: int = 4096,
    q: int = 2,
    preset: str | None = DEFAULT_PRESET,
    peak_tflops: float | None = None,
    bandwidth_gbps: float | None = None,
    cap: float = gemm.DEFAULT_CAP,
):
    """Interactive roofline calculator (ipywidgets VBox; ``.update()`` re-renders).

    A named ``preset`` fills peak and bandwidth from ``gemm.DEVICES`` unless they are given;
    ``preset="custom"`` (or ``None``) takes ``peak_tflops`` and ``bandwidth_gbps`` as typed.
    """
    import ipywidgets as w

    preset = preset or CUSTOM
    options = [CUSTOM, *PRESETS]
    if preset not in options:
        raise ValueError(f"preset={preset!r} is not one of {', '.join(options)}")
    default_peak, default_bw = PRESETS.get(preset, PRESETS[DEFAULT_PRESET])
    if q not in DTYPES.values():
        raise ValueError(f"q={q!r} is not one of {', '.join(map(str, DTYPES.values()))} bytes")
    controls: dict[str, Any] = {
        "m": w.IntText(value=int(m), description="m (rows)"),
        "k": w.IntText(value=int(k), description="k"),
        "n": w.IntText(value=int(n), description="n"),
        "q": w.Dropdown(options=list(DTYPES.items()), value=q, description="dtype"),
        "preset": w.Dropdown(options=options, value=preset, description="device"),
        "peak_tflops": w.FloatText(
            value=float(default_peak if peak_tflops is None else peak_tflops),
            description="peak (TFLOP/s)",
        ),
        "bandwidth_gbps": w.FloatText(
            value=float(default_bw if bandwidth_gbps is None else bandwidth_gbps),
            description="bandwidth (GB/s)",
        ),
        "cap": w.FloatText(value=float(cap), description="cap"),
    }

    def convert(vals: dict[str, Any]) -> dict[str, Any]:
        vals = dict(vals)
        vals.pop("preset")
        return vals

    box = build_calculator(TITLE, controls, render_roofline, convert,
                           rows=[["m", "k", "n", "q"],
                                 ["preset", "peak_tflops", "bandwidth_gbps", "cap"]])

    def apply_preset(change: Any) -> None:
        if change["new"] in PRESETS:
            controls["peak_tflops"].value, controls["bandwidth_gbps"].value = PRESETS[change["new"]]

    controls["preset"].observe(apply_preset, names="value")
    return box
