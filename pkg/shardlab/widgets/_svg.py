"""Inline SVG charts of the calculators: stacked bars, horizontal bars, log-log lines, Gantt.

Each function returns one self-contained ``<svg>`` string (no scripts, no CSS files), so a
page built without a running kernel still shows it.
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from ._format import fmt_num, fmt_size, fmt_tick_time

# One colour per stored object / action kind; colour-blind friendly (Okabe-Ito).
PALETTE = (
    "#0072B2",
    "#E69F00",
    "#009E73",
    "#CC79A7",
    "#56B4E9",
    "#D55E00",
    "#F0E442",
    "#999999",
)


def _esc(s: Any) -> str:
    return html.escape(str(s), quote=True)


def nice_ticks(vmax: float, n: int = 5) -> list[float]:
    """Round tick values from 0 to at least ``vmax``: about ``n`` + 1 of them, whatever the
    magnitude (each tick is ``k * step`` rounded to the step's significant digits, so a step
    of 1e-13 or 1e300 neither vanishes nor accumulates rounding)."""
    if vmax <= 0 or not math.isfinite(vmax):
        return [0.0, 1.0]
    raw = vmax / n
    if raw <= 0 or not math.isfinite(raw):  # a subnormal vmax
        return [0.0, vmax]
    mag = 10.0 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    count = math.ceil(vmax * (1 - 1e-12) / step)
    return [float(f"{k * step:.12g}") for k in range(min(count, 2 * n + 2) + 1)]


def _svg_open(width: int, height: int, label: str) -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="{_esc(label)}" '
        'style="font-family:sans-serif;font-size:11px;background:#fff">'
        f"<title>{_esc(label)}</title>"
    )


def _svg_start(width: int, height: int, title: str, x: float) -> list[str]:
    """The opening tag and the bold title line every chart starts with."""
    return [
        _svg_open(width, height, title),
        f'<text x="{x}" y="14" font-weight="bold">{_esc(title)}</text>',
    ]


def svg_stacked_bars(
    categories: Sequence[str],
    series: Sequence[tuple[str, Sequence[float]]],
    unit: str,
    title: str,
    totals_labels: Sequence[str] | None = None,
    width: int = 560,
    height: int = 280,
) -> str:
    """Vertical stacked bars: one bar per category, one segment per series."""
    left, right, top, bottom = 60, 150, 24, 40
    pw, ph = width - left - right, height - top - bottom
    totals = [sum(s[1][i] for s in series) for i in range(len(categories))]
    ticks = nice_ticks(max(totals) if totals else 1.0)
    ymax = ticks[-1] or 1.0
    out = _svg_start(width, height, title, left)
    for t in ticks:
        y = top + ph - ph * t / ymax
        out.append(
            f'<line x1="{left}" x2="{left + pw}" y1="{y:.1f}" y2="{y:.1f}" stroke="#e5e5e5"/>'
            f'<text x="{left - 4}" y="{y + 4:.1f}" text-anchor="end">{fmt_num(t, 3)}</text>'
        )
    out.append(
        f'<text x="12" y="{top + ph / 2:.0f}" transform="rotate(-90 12 {top + ph / 2:.0f})" '
        f'text-anchor="middle">{_esc(unit)}</text>'
    )
    n = max(len(categories), 1)
    slot = pw / n
    bw = min(60.0, slot * 0.6)
    for i, cat in enumerate(categories):
        x = left + slot * i + (slot - bw) / 2
        y = top + ph
        for k, (_, vals) in enumerate(series):
            h = ph * vals[i] / ymax
            if h > 0:
                y -= h
                out.append(
                    f'<rect x="{x:.1f}" y="{y:.1f}" width="{bw:.1f}" height="{h:.1f}" '
                    f'fill="{PALETTE[k % len(PALETTE)]}"/>'
                )
        label = totals_labels[i] if totals_labels else fmt_num(totals[i], 3)
        out.append(
            f'<text x="{x + bw / 2:.1f}" y="{y - 3:.1f}" text-anchor="middle">{_esc(label)}</text>'
            f'<text x="{x + bw / 2:.1f}" y="{top + ph + 14}" text-anchor="middle">{_esc(cat)}</text>'
        )
    out.append(
        f'<line x1="{left}" x2="{left + pw}" y1="{top + ph}" y2="{top + ph}" stroke="#333"/>'
    )
    _legend(out, [s[0] for s in series], left + pw + 12, top)
    out.append("</svg>")
    return "".join(out)


def _legend(out: list[str], names: Iterable[str], x: float, y: float) -> None:
    for k, name in enumerate(names):
        yy = y + 16 * k
        out.append(
            f'<rect x="{x}" y="{yy}" width="10" height="10" fill="{PALETTE[k % len(PALETTE)]}"/>'
            f'<text x="{x + 14}" y="{yy + 9}">{_esc(name)}</text>'
        )


def svg_hbars(
    labels: Sequence[str],
    values: Sequence[float],
    value_labels: Sequence[str],
    title: str,
    unit: str,
    width: int = 560,
    bar_h: int = 22,
) -> str:
    """Horizontal bars, one per label, annotated with ``value_labels``."""
    left, right, top = 130, 90, 24
    height = top + bar_h * len(labels) + 30
    pw = width - left - right
    vmax = max([v for v in values if math.isfinite(v)] or [1.0]) or 1.0
    out = _svg_start(width, height, title, 4)
    for i, (lab, v, vl) in enumerate(zip(labels, values, value_labels)):
        y = top + bar_h * i
        w = pw * v / vmax if math.isfinite(v) else 0
        out.append(
            f'<text x="{left - 6}" y="{y + bar_h * 0.65:.1f}" text-anchor="end">{_esc(lab)}</text>'
            f'<rect x="{left}" y="{y + 3}" width="{w:.1f}" height="{bar_h - 6}" '
            f'fill="{PALETTE[i % len(PALETTE)]}"/>'
            f'<text x="{left + w + 4:.1f}" y="{y + bar_h * 0.65:.1f}">{_esc(vl)}</text>'
        )
    y_axis = top + bar_h * len(labels)
    out.append(
        f'<line x1="{left}" x2="{left}" y1="{top}" y2="{y_axis}" stroke="#333"/>'
        f'<text x="{left}" y="{y_axis + 16}">{_esc(unit)}</text>'
    )
    out.append("</svg>")
    return "".join(out)


def log_grid(lo: float, hi: float, n: int) -> list[float]:
    """``n`` points from ``lo`` to ``hi`` (both > 0) evenly spaced on a log axis. A range so
    wide that ``hi / lo`` overflows (1e-300 to 1e16) is spaced in logarithms; any other keeps
    ``lo * (hi / lo) ** t``, the points the book's stored charts were drawn with."""
    ratio = hi / lo
    if math.isfinite(ratio):
        return [lo * ratio ** (i / (n - 1)) for i in range(n)]
    a, b = math.log10(lo), math.log10(hi)
    return [10.0 ** (a + (b - a) * i / (n - 1)) for i in range(n)]


def svg_loglog(
    curves: Sequence[tuple[str, Sequence[tuple[float, float]]]],
    marker: tuple[float, float] | None,
    title: str,
    xlabel: str,
    ylabel: str,
    width: int = 560,
    height: int = 260,
    fmt_x: Callable[[float], str] = fmt_size,
    fmt_y: Callable[[float], str] = fmt_tick_time,
) -> str:
    """Log-log line chart (used for α–β time against message size)."""
    left, right, top, bottom = 70, 120, 24, 40
    pw, ph = width - left - right, height - top - bottom
    pts = [p for _, c in curves for p in c if p[0] > 0 and p[1] > 0]
    if not pts or not all(math.isfinite(v) for p in pts for v in p):
        return ""  # nothing to draw on a log scale (an infinite point has no place on it)
    x0, x1 = math.log10(min(p[0] for p in pts)), math.log10(max(p[0] for p in pts))
    y0, y1 = math.log10(min(p[1] for p in pts)), math.log10(max(p[1] for p in pts))
    x1 = x1 if x1 > x0 else x0 + 1
    y1 = y1 if y1 > y0 else y0 + 1

    def sx(x: float) -> float:
        return left + pw * (math.log10(x) - x0) / (x1 - x0)

    def sy(y: float) -> float:
        return top + ph - ph * (math.log10(y) - y0) / (y1 - y0)

    out = _svg_start(width, height, title, left)
    for e in range(math.ceil(x0), math.floor(x1) + 1, max(1, math.ceil((x1 - x0) / 6))):
        x = sx(10.0**e)
        out.append(
            f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{top}" y2="{top + ph}" stroke="#eee"/>'
            f'<text x="{x:.1f}" y="{top + ph + 14}" text-anchor="middle">{_esc(fmt_x(10.0**e))}</text>'
        )
    for e in range(math.ceil(y0), math.floor(y1) + 1, max(1, math.ceil((y1 - y0) / 5))):
        y = sy(10.0**e)
        out.append(
            f'<line x1="{left}" x2="{left + pw}" y1="{y:.1f}" y2="{y:.1f}" stroke="#eee"/>'
            f'<text x="{left - 4}" y="{y + 4:.1f}" text-anchor="end">{_esc(fmt_y(10.0**e))}</text>'
        )
    out.append(
        f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="none" stroke="#333"/>'
        f'<text x="{left + pw / 2:.0f}" y="{height - 6}" text-anchor="middle">{_esc(xlabel)}</text>'
        f'<text x="12" y="{top + ph / 2:.0f}" transform="rotate(-90 12 {top + ph / 2:.0f})" '
        f'text-anchor="middle">{_esc(ylabel)}</text>'
    )
    for k, (_, c) in enumerate(curves):
        d = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in c if x > 0 and y > 0)
        out.append(
            f'<polyline points="{d}" fill="none" stroke="{PALETTE[k % len(PALETTE)]}" '
            'stroke-width="2"/>'
        )
    if marker and marker[0] > 0 and marker[1] > 0:
        out.append(
            f'<circle cx="{sx(marker[0]):.1f}" cy="{sy(marker[1]):.1f}" r="4" fill="#D55E00"/>'
        )
    _legend(out, [c[0] for c in curves], left + pw + 12, top)
    out.append("</svg>")
    return "".join(out)


def svg_gantt(
    lanes: Sequence[Sequence[tuple[float, float, str, str]]],
    lane_names: Sequence[str],
    kinds: Sequence[str],
    makespan: float,
    title: str,
    width: int = 680,
    lane_h: int = 22,
) -> str:
    """Gantt chart. ``lanes[i]`` lists (start, end, kind, label) boxes; colours by kind."""
    left, right, top = 64, 100, 24
    height = top + lane_h * len(lanes) + 30
    pw = width - left - right
    span = makespan if makespan > 0 else 1.0
    colour = {k: PALETTE[i % len(PALETTE)] for i, k in enumerate(kinds)}
    out = _svg_start(width, height, title, 4)
    for i, lane in enumerate(lanes):
        y = top + lane_h * i
        out.append(
            f'<rect x="{left}" y="{y + 2}" width="{pw}" height="{lane_h - 4}" fill="#f3f3f3"/>'
            f'<text x="{left - 6}" y="{y + lane_h * 0.65:.1f}" text-anchor="end">'
            f"{_esc(lane_names[i])}</text>"
        )
        for start, end, kind, label in lane:
            x = left + pw * start / span
            w = max(pw * (end - start) / span, 0.5)
            out.append(
                f'<rect x="{x:.1f}" y="{y + 2}" width="{w:.1f}" height="{lane_h - 4}" '
                f'fill="{colour.get(kind, "#777")}" stroke="#fff" stroke-width="0.5"/>'
            )
            if label and w >= 6.5 * len(label) + 2:
                out.append(
                    f'<text x="{x + w / 2:.1f}" y="{y + lane_h * 0.65:.1f}" text-anchor="middle" '
                    f'fill="#fff" font-size="10">{_esc(label)}</text>'
                )
    ya = top + lane_h * len(lanes)
    out.append(
        f'<line x1="{left}" x2="{left + pw}" y1="{ya}" y2="{ya}" stroke="#333"/>'
        f'<text x="{left}" y="{ya + 14}">0</text>'
        f'<text x="{left + pw}" y="{ya + 14}" text-anchor="end">{_esc(fmt_num(makespan))}</text>'
        f'<text x="{left + pw / 2:.0f}" y="{ya + 14}" text-anchor="middle">time (cost units)</text>'
    )
    _legend(out, kinds, left + pw + 12, top)
    out.append("</svg>")
    return "".join(out)
