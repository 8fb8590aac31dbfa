"""Shared plumbing for the calculators and the CLI: reports, tables, errors, the widget box.

A calculator area (memory, activations, ...) computes a :class:`Report` by calling
``shardlab.accounting``; nothing here computes a byte count or a fraction. A report renders
three ways: an aligned text table (CLI), JSON (``--json``), and an HTML fragment with an
inline SVG chart (widgets and book pages). The HTML is a plain string, so a page built
without a running kernel still shows it: the widget state embedded by jupyter-book holds it.
Number parsing and formatting live in ``_format``, the SVG charts in ``_svg``; both are
re-exported here, so the calculators import everything from this module.

ipywidgets is imported lazily (only by :func:`build_calculator`), so the CLI starts fast.
"""

from __future__ import annotations

import contextlib
import html
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from shardlab.accounting.activations import MiB
from shardlab.accounting.memory import GB, GiB

from ._format import (
    computable,
    fmt_fixed,
    fmt_int,
    fmt_num,
    fmt_pct,
    fmt_round,
    fmt_size,
    fmt_tick_time,
    fmt_time,
    parse_number,
    unit_number,
    value_text,
)
from ._svg import PALETTE, nice_ticks, svg_gantt, svg_hbars, svg_loglog, svg_stacked_bars

__all__ = [
    "GB",
    "GiB",
    "MiB",
    "PALETTE",
    "Report",
    "Table",
    "build_calculator",
    "computable",
    "error_html",
    "error_message",
    "fmt_fixed",
    "fmt_int",
    "fmt_num",
    "fmt_pct",
    "fmt_round",
    "fmt_size",
    "fmt_tick_time",
    "fmt_time",
    "html_report",
    "html_table",
    "nice_ticks",
    "parse_number",
    "safe_html",
    "svg_gantt",
    "svg_hbars",
    "svg_loglog",
    "svg_stacked_bars",
    "text_report",
    "text_table",
    "unit_number",
    "value_text",
]

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


def _numeric_columns(table: Table) -> list[bool]:
    """Which columns hold only numbers (or blanks); those are right-aligned."""
    return [
        bool(table.rows) and all(_is_numeric(r[i]) or r[i] in ("", "-") for r in table.rows)
        for i in range(len(table.columns))
    ]


def text_table(table: Table) -> str:
    """An aligned plain-text table (numbers right-aligned, text left-aligned)."""
    cells = [[str(c) for c in table.columns]] + [[str(c) for c in r] for r in table.rows]
    ncol = len(table.columns)
    widths = [max(len(r[i]) for r in cells) for i in range(ncol)]
    numeric = _numeric_columns(table)
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
    numeric = _numeric_columns(table)
    # The scrolling wrapper keeps wide tables readable inside a narrow book column; a region
    # that scrolls must be reachable by keyboard (axe: scrollable-region-focusable).
    label = html.escape(table.title or "table", quote=True)
    out = [f'<div style="overflow-x:auto;max-width:100%" tabindex="0" role="region" '
           f'aria-label="{label}">']
    out.append(f'<table class="shardlab-table" style="{_TABLE_STYLE}">')
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
    out.append("</tbody></table></div>")
    return "".join(out)


def html_report(report: Report) -> str:
    """Tables, notes and chart as one self-contained HTML fragment (no scripts, no CSS files)."""
    parts = [
        '<div class="shardlab-report" style="font-family:sans-serif;max-width:100%;'
        'white-space:normal;overflow-x:auto" tabindex="0" role="region" '
        'aria-label="calculator result">'
    ]
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


# --------------------------------------------------------------------------- widgets


_renders_held = [False]


@contextlib.contextmanager
def renders_held():
    """Calculators neither render when built inside nor when their controls change inside:
    the caller renders each once afterwards with ``box.update()`` (the live page's rebuild
    sets a calculator's stored inputs one by one: chapter 10's planner searched 22 times
    instead of once, 4 s in CPython)."""
    _renders_held[0] = True
    try:
        yield
    finally:
        _renders_held[0] = False


def build_calculator(
    title: str,
    controls: dict[str, Any],
    render: Callable[..., str],
    convert: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
    rows: Sequence[Sequence[str]] | None = None,
    aliases: dict[str, str] | None = None,
):
    """A VBox of ``controls`` above an HTML area showing ``render(**values)``.

    ``convert`` maps the raw control values to ``render``'s keyword arguments (parsing text
    fields); any exception it or ``render`` raises becomes the red sentence. The returned
    box has ``.controls`` (name -> widget), ``.output`` (the HTML widget) and ``.update()``
    (re-render now; returns the HTML). The initial render happens here (unless built under
    :func:`renders_held`), so the default table/chart is in the widget state before any
    kernel callback runs.

    Number inputs become :class:`~._fields.NumberField` text boxes (``1e9`` is accepted
    everywhere; a field that does not hold a number is refused naming its label), and an
    error sentence names each field by its label: ``aliases`` maps the internal argument
    names a message may use (``group_size``) to a control name (``ranks``).
    """
    import ipywidgets as w

    from ._fields import NumberField, as_number_fields, name_fields, read_number

    as_number_fields(controls)
    labels = {n: c.description for n, c in controls.items() if getattr(c, "description", "")}
    labels.update({a: labels[n] for a, n in (aliases or {}).items() if n in labels})
    for c in controls.values():
        if hasattr(c, "style") and hasattr(c.style, "description_width"):
            c.style.description_width = "initial"
    if rows is None:
        rows = [list(controls)]
    row_boxes = [
        w.HBox([controls[n] for n in r], layout=w.Layout(flex_flow="row wrap", grid_gap="4px 12px"))
        for r in rows
    ]
    # width 100% + min_width 0 let the flex box shrink to the page column; wide tables then
    # scroll inside the calculator instead of being cut off at the column's edge.
    # (the HTML inside scrolls, in regions a keyboard can reach; this box itself does not)
    output = w.HTML(layout=w.Layout(width="100%", min_width="0"))
    box = w.VBox(
        [w.HTML(f"<b>{html.escape(title)}</b>"), *row_boxes, output],
        layout=w.Layout(border="1px solid #ddd", padding="6px", max_width="100%"),
    )

    def update(*_: Any) -> str:
        if _renders_held[0]:
            return output.value
        try:
            values = {
                name: read_number(c.description, c) if isinstance(c, NumberField) else c.value
                for name, c in controls.items()
            }
            kwargs = convert(values) if convert else values
            value = render(**kwargs)
        except Exception as exc:  # a widget must never show a traceback
            value = error_html(name_fields(error_message(exc), labels))
        output.value = value
        return value

    for c in controls.values():
        c.observe(update, names="value")
    box.controls = controls
    box.output = output
    box.update = update
    if not _renders_held[0]:
        update()
    return box


def start_values(report: Callable[..., Any], values: dict[str, Any], name: str) -> dict[str, Any]:
    """A calculator's starting values: ``report``'s keyword defaults, overridden by ``values``
    (the calculator's own keyword arguments); a name the report does not take is refused."""
    import inspect

    defaults = {k: x.default for k, x in inspect.signature(report).parameters.items()}
    unknown = sorted(set(values) - set(defaults))
    if unknown:
        raise TypeError(f"{name}: no field {', '.join(unknown)}")
    return {**defaults, **values}
