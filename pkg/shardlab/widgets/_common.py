"""Shared plumbing for the calculators and the CLI: reports, tables, SVG charts, errors.

A calculator area (memory, activations, ...) computes a :class:`Report` by calling
``shardlab.accounting``; nothing here computes a byte count or a fraction. A report renders
three ways: an aligned text table (CLI), JSON (``--json``), and an HTML fragment with an
inline SVG chart (widgets and book pages). The HTML is a plain string, so a page built
without a running kernel still shows it: the widget state embedded by jupyter-book holds it.

ipywidgets is imported lazily (only by :func:`build_calculator`), so the CLI starts fast.
"""

from __future__ import annotations

import html
import math
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

GB = 1e9
GiB = float(1 << 30)
MiB = float(1 << 20)

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

# --------------------------------------------------------------------------- reports


@dataclass
class Table:
    """A table of already formatted cells. Numeric-looking columns are right-aligned."""

    columns: list[str]
    rows: list[list[Any]]
    title: str = ""
    highlight: frozenset[int] = frozenset()  # row indices shown in bold


@dataclass
class Report:
    """What one calculator computed: tables for people, ``data`` for scripts, a chart (SVG)."""

    title: str
    tables: list[Table]
    data: dict[str, Any]
    notes: list[str] = field(default_factory=list)
    chart_svg: str = ""


# --------------------------------------------------------------------------- numbers


def parse_number(name: str, value: Any) -> int | float:
    """Parse ``7e9``, ``7_000_000_000`` or ``1.5e9`` into an int when integral, else a float.

    Raises ValueError with a sentence naming ``name`` and the value.
    """
    if isinstance(value, bool):
        raise ValueError(f"{name}={value!r} is not a number")
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        x = value
    else:
        text = str(value).strip().replace("_", "").replace(",", "")
        try:
            x = float(text)
        except ValueError:
            raise ValueError(f"{name}={value!r} is not a number") from None
    if not math.isfinite(x):
        raise ValueError(f"{name}={value!r} is not a finite number")
    if x.is_integer() and abs(x) < 2**62:
        return int(x)
    return x


def fmt_int(x: float) -> str:
    """Bytes or counts with thousands separators; non-integers keep one decimal."""
    if float(x).is_integer():
        return f"{int(x):,}"
    return f"{x:,.1f}"


def fmt_num(x: float, digits: int = 4) -> str:
    """A compact number: ``0.375``, ``1.2e-05``, ``38.5``."""
    if x == 0:
        return "0"
    if float(x).is_integer() and abs(x) < 1e15:
        return f"{int(x):,}"
    ax = abs(x)
    if ax >= 1e-3 and ax < 1e7:
        return (
            f"{x:.{digits}g}" if ax < 1 else f"{x:,.{max(digits - 2, 2)}f}".rstrip("0").rstrip(".")
        )
    return f"{x:.{digits - 1}e}"


def fmt_pct(x: float) -> str:
    return f"{100.0 * x:.1f} %"


def fmt_time(seconds: float) -> str:
    """Seconds shown in the unit that reads best (µs, ms, s)."""
    if seconds < 1e-3:
        return f"{seconds * 1e6:.2f} µs"
    if seconds < 1:
        return f"{seconds * 1e3:.3f} ms"
    return f"{seconds:.3f} s"


def fmt_tick_time(seconds: float) -> str:
    """Axis-tick time: ``10 µs``, ``1 ms``, ``100 s`` (powers of ten)."""
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6), ("ns", 1e-9)):
        if seconds >= scale * (1 - 1e-9):
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds:.1e} s"


def fmt_size(nbytes: float) -> str:
    """Decimal units, as bandwidths and the lecture's GB figures use them."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(nbytes) >= scale:
            return f"{nbytes / scale:.4g} {unit}"
    return f"{nbytes:.4g} B"


# --------------------------------------------------------------------------- text output


_NUMERIC = re.compile(
    r"[-+]?(\d{1,3}(,\d{3})+|\d+)?(\.\d+)?([eE][-+]?\d+)?"
    r"( ?(%|µs|ms|s|B|kB|MB|GB|GiB|MiB))?"
)


def _is_numeric(cell: Any) -> bool:
    if isinstance(cell, int | float):
        return True
    s = str(cell).strip()
    return bool(s) and any(ch.isdigit() for ch in s) and _NUMERIC.fullmatch(s) is not None


def text_table(table: Table) -> str:
    """An aligned plain-text table (numbers right-aligned, text left-aligned)."""
    cells = [[str(c) for c in table.columns]] + [[str(c) for c in r] for r in table.rows]
    ncol = len(table.columns)
    widths = [max(len(r[i]) for r in cells) for i in range(ncol)]
    numeric = [
        bool(table.rows) and all(_is_numeric(r[i]) or r[i] in ("", "-") for r in table.rows)
        for i in range(ncol)
    ]
    lines = []
    if table.title:
        lines.append(table.title)
    for k, row in enumerate(cells):
        parts = []
        for i, c in enumerate(row):
            parts.append(c.rjust(widths[i]) if numeric[i] and k > 0 else c.ljust(widths[i]))
        lines.append("  ".join(parts).rstrip())
        if k == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def text_report(report: Report) -> str:
    out = [report.title, ""]
    for t in report.tables:
        out.append(text_table(t))
        out.append("")
    out.extend(report.notes)
    return "\n".join(out).rstrip() + "\n"


# --------------------------------------------------------------------------- HTML output

_TABLE_STYLE = (
    "border-collapse:collapse;font-size:13px;margin:4px 0 10px 0;font-variant-numeric:tabular-nums"
)
_CELL = "padding:2px 10px;border-bottom:1px solid #ddd;"


def html_table(table: Table) -> str:
    numeric = [
        bool(table.rows) and all(_is_numeric(r[i]) or r[i] in ("", "-") for r in table.rows)
        for i in range(len(table.columns))
    ]
    out = [f'<table class="shardlab-table" style="{_TABLE_STYLE}">']
    if table.title:
        out.append(
            f'<caption style="caption-side:top;text-align:left;font-weight:bold;padding:2px 0">'
            f"{html.escape(table.title)}</caption>"
        )
    out.append("<thead><tr>")
    for i, c in enumerate(table.columns):
        align = "right" if numeric[i] else "left"
        out.append(
            f'<th style="{_CELL}text-align:{align};border-bottom:2px solid #888">'
            f"{html.escape(str(c))}</th>"
        )
    out.append("</tr></thead><tbody>")
    for k, row in enumerate(table.rows):
        weight = "font-weight:bold;" if k in table.highlight else ""
        out.append("<tr>")
        for i, c in enumerate(row):
            align = "right" if numeric[i] else "left"
            out.append(f'<td style="{_CELL}{weight}text-align:{align}">{html.escape(str(c))}</td>')
        out.append("</tr>")
    out.append("</tbody></table>")
    return "".join(out)


def html_report(report: Report) -> str:
    """Tables, notes and chart as one self-contained HTML fragment (no scripts, no CSS files)."""
    parts = ['<div class="shardlab-report" style="font-family:sans-serif">']
    parts.append(f'<div style="font-weight:bold;margin:4px 0">{html.escape(report.title)}</div>')
    if report.chart_svg:
        parts.append(f'<div class="shardlab-chart">{report.chart_svg}</div>')
    for t in report.tables:
        parts.append(html_table(t))
    for n in report.notes:
        parts.append(f'<div style="font-size:12px;color:#444">{html.escape(n)}</div>')
    parts.append("</div>")
    return "".join(parts)


def error_html(message: str) -> str:
    """The sentence a widget shows for bad input (red, no traceback)."""
    return (
        '<div class="shardlab-error" style="color:#b00020;font-family:sans-serif;'
        f'font-weight:bold;padding:6px 0">{html.escape(message)}</div>'
    )


def error_message(exc: BaseException) -> str:
    """One sentence for an exception. ValueError messages from accounting name the values."""
    if isinstance(exc, ValueError | TypeError):
        return str(exc) or exc.__class__.__name__
    return f"unexpected {exc.__class__.__name__}: {exc}"


def safe_html(render: Callable[..., str], **kwargs: Any) -> str:
    """``render(**kwargs)``, or the error sentence if the inputs are rejected."""
    try:
        return render(**kwargs)
    except Exception as exc:  # a widget must never show a traceback
        return error_html(error_message(exc))


# --------------------------------------------------------------------------- SVG charts


def _esc(s: Any) -> str:
    return html.escape(str(s), quote=True)


def nice_ticks(vmax: float, n: int = 5) -> list[float]:
    """Round tick values from 0 to at least ``vmax``."""
    if vmax <= 0 or not math.isfinite(vmax):
        return [0.0, 1.0]
    raw = vmax / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    ticks = [0.0]
    while ticks[-1] < vmax * (1 - 1e-12):
        ticks.append(round(ticks[-1] + step, 12))
    return ticks


def _svg_open(width: int, height: int, label: str) -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="{_esc(label)}" '
        'style="font-family:sans-serif;font-size:11px;background:#fff">'
        f"<title>{_esc(label)}</title>"
    )


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
    out = [_svg_open(width, height, title)]
    out.append(f'<text x="{left}" y="14" font-weight="bold">{_esc(title)}</text>')
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
    out = [_svg_open(width, height, title)]
    out.append(f'<text x="4" y="14" font-weight="bold">{_esc(title)}</text>')
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
    if not pts:
        return ""
    x0, x1 = math.log10(min(p[0] for p in pts)), math.log10(max(p[0] for p in pts))
    y0, y1 = math.log10(min(p[1] for p in pts)), math.log10(max(p[1] for p in pts))
    x1 = x1 if x1 > x0 else x0 + 1
    y1 = y1 if y1 > y0 else y0 + 1

    def sx(x: float) -> float:
        return left + pw * (math.log10(x) - x0) / (x1 - x0)

    def sy(y: float) -> float:
        return top + ph - ph * (math.log10(y) - y0) / (y1 - y0)

    out = [_svg_open(width, height, title)]
    out.append(f'<text x="{left}" y="14" font-weight="bold">{_esc(title)}</text>')
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
    out = [_svg_open(width, height, title)]
    out.append(f'<text x="4" y="14" font-weight="bold">{_esc(title)}</text>')
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


# --------------------------------------------------------------------------- widgets


def build_calculator(
    title: str,
    controls: dict[str, Any],
    render: Callable[..., str],
    convert: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
    rows: Sequence[Sequence[str]] | None = None,
):
    """A VBox of ``controls`` above an HTML area showing ``render(**values)``.

    ``convert`` maps the raw control values to ``render``'s keyword arguments (parsing text
    fields); any exception it or ``render`` raises becomes the red sentence. The returned
    box has ``.controls`` (name -> widget), ``.output`` (the HTML widget) and ``.update()``
    (re-render now; returns the HTML). The initial render happens here, so the default
    table/chart is in the widget state before any kernel callback runs.
    """
    import ipywidgets as w

    for c in controls.values():
        if hasattr(c, "style") and hasattr(c.style, "description_width"):
            c.style.description_width = "initial"
    if rows is None:
        rows = [list(controls)]
    row_boxes = [
        w.HBox([controls[n] for n in r], layout=w.Layout(flex_flow="row wrap", grid_gap="4px 12px"))
        for r in rows
    ]
    output = w.HTML()
    box = w.VBox(
        [w.HTML(f"<b>{html.escape(title)}</b>"), *row_boxes, output],
        layout=w.Layout(border="1px solid #ddd", padding="6px"),
    )

    def update(*_: Any) -> str:
        try:
            values = {name: c.value for name, c in controls.items()}
            kwargs = convert(values) if convert else values
            value = render(**kwargs)
        except Exception as exc:  # a widget must never show a traceback
            value = error_html(error_message(exc))
        output.value = value
        return value

    for c in controls.values():
        c.observe(update, names="value")
    box.controls = controls
    box.output = output
    box.update = update
    update()
    return box
