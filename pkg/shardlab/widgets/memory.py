"""Model-state memory calculator: recipe x layout x D x N (over ``accounting.memory``).

``memory_report`` computes, ``render_memory`` returns HTML (tables + stacked-bar SVG),
``memory_calculator`` wraps it in ipywidgets. All numbers come from
:func:`shardlab.accounting.memory.model_state`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from shardlab.accounting import _validate as chk
from shardlab.accounting import memory as acc

from ._common import (
    Report,
    Table,
    build_calculator,
    fmt_fixed,
    fmt_int,
    fmt_num,
    html_report,
    parse_number,
    svg_stacked_bars,
)

CUSTOM = "custom"
LAYOUT_CHOICES = ("all", *acc.LAYOUTS)


def fmt_gb(x: float) -> str:
    """GB or GiB with two decimals; below 0.01 three significant digits, and past the digits a
    float holds seven (:func:`fmt_fixed`)."""
    return fmt_fixed(x, 2) if x >= 0.01 or x == 0 else f"{x:.3g}"


def make_recipe(
    recipe: str | acc.Recipe = "mixed-adam-16", custom: Mapping[str, float] | None = None
) -> acc.Recipe:
    """A named recipe, a :class:`Recipe`, or ``"custom"`` built from ``custom`` bytes/param.

    ``custom`` maps object names (``weights``, ``grads``, ``master``, ``moment1``,
    ``moment2``, ``grad_accum``) to bytes per parameter. With a named recipe, the given
    entries override that recipe's values (the result is named ``custom``).
    """
    if isinstance(recipe, acc.Recipe):
        base = recipe
    elif recipe == CUSTOM:
        base = acc.RECIPES["mixed-adam-16"]
    else:
        base = acc.get_recipe(recipe)
    if recipe != CUSTOM and not custom:
        return base
    values = {obj: base.bytes_of(obj) for obj in acc.OBJECTS}
    for key, val in (custom or {}).items():
        if key not in acc.OBJECTS:
            raise ValueError(f"custom object {key!r} is not one of {', '.join(acc.OBJECTS)}")
        # checked under the object's own name (the widget's field, the CLI's option) before
        # Recipe would name it "weights (recipe 'custom')"
        values[key] = chk.nonneg_number(key, parse_number(key, val))
    return acc.Recipe(CUSTOM, **values)


def memory_report(
    n_params: Any = 7_000_000_000,
    dp: Any = 8,
    recipe: str | acc.Recipe = "mixed-adam-16",
    layout: str = "all",
    custom: Mapping[str, float] | None = None,
) -> Report:
    """Per-rank persistent model state for each layout (or one), per object and in total."""
    n = parse_number("n_params", n_params)
    d = parse_number("dp", dp)
    rec = make_recipe(recipe, custom)
    if layout not in LAYOUT_CHOICES:
        raise ValueError(f"layout={layout!r} is not one of {', '.join(LAYOUT_CHOICES)}")
    layouts = acc.LAYOUTS if layout == "all" else (layout,)
    states = [acc.model_state(n, d, lay, rec) for lay in layouts]
    objects = [o for o in acc.OBJECTS if rec.bytes_of(o) > 0]

    per_object = Table(
        ["object", "B/param", *(s.layout for s in states)],
        [
            [o, fmt_num(rec.bytes_of(o)), *(fmt_int(s.per_object[o]) for s in states)]
            for o in objects
        ]
        + [["total", fmt_num(rec.total), *(fmt_int(s.total) for s in states)]],
        title=f"Bytes per rank by object (N={n:,}, D={d}, recipe {rec.name})",
        highlight=frozenset({len(objects)}),
    )
    totals = Table(
        ["layout", "sharded over D", "B/param/rank", "bytes/rank", "GB", "GiB"],
        [
            [
                s.layout,
                ", ".join(o for o in objects if o in s.sharded) or "nothing",
                fmt_num(s.bytes_per_param),
                fmt_int(s.total),
                fmt_gb(s.total_gb),
                fmt_gb(s.total_gib),
            ]
            for s in states
        ],
        title="Totals per rank (GB = 10^9 bytes, GiB = 2^30 bytes)",
    )
    data = {
        "n_params": n,
        "dp": d,
        "recipe": rec.as_dict(),
        "layouts": {
            s.layout: {
                "per_object_bytes": dict(s.per_object),
                "sharded": sorted(s.sharded),
                "total_bytes": s.total,
                "total_gb": s.total_gb,
                "total_gib": s.total_gib,
                "bytes_per_param": s.bytes_per_param,
            }
            for s in states
        },
    }
    chart = svg_stacked_bars(
        [s.layout for s in states],
        [(o, [s.per_object[o] / acc.GB for s in states]) for o in objects],
        unit="GB per rank",
        title=f"Model state per rank, N={n:,}, D={d}, {rec.name}",
        totals_labels=[f"{fmt_gb(s.total_gb)} GB" for s in states],
    )
    return Report(
        title=f"Model state per rank: N={n:,} parameters, D={d}, recipe {rec.name}",
        tables=[per_object, totals],
        data=data,
        notes=[
            "Only the objects a layout shards are divided by D; activations, gathered "
            "parameters and buffers are not model state."
        ],
        chart_svg=chart,
    )


def render_memory(**kwargs: Any) -> str:
    """HTML (stacked bars + tables) for :func:`memory_report`'s arguments."""
    return html_report(memory_report(**kwargs))


def memory_calculator(
    n_params: Any = "7e9",
    dp: int = 8,
    recipe: str = "mixed-adam-16",
    layout: str = "all",
    custom: Mapping[str, float] | None = None,
):
    """Interactive model-state calculator (ipywidgets VBox; ``.update()`` re-renders)."""
    import ipywidgets as w

    base = make_recipe("mixed-adam-16" if recipe == CUSTOM else recipe, None)
    init = {o: base.bytes_of(o) for o in acc.OBJECTS}
    init.update(custom or {})
    controls: dict[str, Any] = {
        "n_params": w.Text(value=str(n_params), description="N (parameters)"),
        "dp": w.IntText(value=int(dp), description="D (data-parallel ranks)"),
        "recipe": w.Dropdown(options=[*acc.RECIPES, CUSTOM], value=recipe, description="recipe"),
        "layout": w.Dropdown(options=LAYOUT_CHOICES, value=layout, description="layout"),
    }
    for o in acc.OBJECTS:
        controls[o] = w.FloatText(
            value=float(init[o]), description=f"{o} (B/param)", layout=w.Layout(width="170px")
        )

    def convert(vals: dict[str, Any]) -> dict[str, Any]:
        custom_vals = {o: vals[o] for o in acc.OBJECTS} if vals["recipe"] == CUSTOM else None
        return {
            "n_params": vals["n_params"],
            "dp": vals["dp"],
            "recipe": vals["recipe"],
            "layout": vals["layout"],
            "custom": custom_vals,
        }

    box = build_calculator(
        "Model-state memory per rank",
        controls,
        render_memory,
        convert,
        rows=[["n_params", "dp", "recipe", "layout"], list(acc.OBJECTS)],
    )
    custom_row = box.children[2]

    def show_custom(*_: Any) -> None:
        custom_row.layout.display = "flex" if controls["recipe"].value == CUSTOM else "none"

    controls["recipe"].observe(show_custom, names="value")
    show_custom()
    return box
