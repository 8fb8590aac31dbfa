"""Saved-activation calculator (Korthikanti et al.) over ``accounting.activations``.

``activations_report`` computes every mode with
:func:`shardlab.accounting.activations.activation_table`, ``render_activations`` returns
HTML (bars per mode + table), ``activations_calculator`` wraps it in ipywidgets.
"""

from __future__ import annotations

from typing import Any

from shardlab.accounting import activations as acc

from ._common import (
    GiB,
    Report,
    Table,
    build_calculator,
    fmt_fixed,
    fmt_int,
    fmt_num,
    html_report,
    parse_number,
    svg_hbars,
)

MODE_LABELS = {
    "none": "no parallelism",
    "tp": "TP",
    "tp_sp": "TP + SP",
    "tp_sp_selective": "TP + SP + selective",
    "full_recompute": "full recompute",
}


def activations_report(
    s: Any = 2048, b: Any = 1, h: Any = 4096, a: Any = 32, t: Any = 8, layers: Any = 32
) -> Report:
    """Saved-activation bytes per layer and for ``layers`` layers, for every mode."""
    args = {k: parse_number(k, x) for k, x in dict(s=s, b=b, h=h, a=a, t=t, L=layers).items()}
    rows = acc.activation_table(args["s"], args["b"], args["h"], args["a"], args["t"], args["L"])
    base = rows[0].bytes_per_layer
    table = Table(
        ["mode", "bytes/layer", "MiB/layer", f"GiB for L={args['L']}", "× none"],
        [
            [
                r.mode,
                fmt_int(r.bytes_per_layer),
                fmt_num(r.mib_per_layer),
                fmt_fixed(r.total / GiB, 3),
                f"{r.bytes_per_layer / base:.3f}",
            ]
            for r in rows
        ],
        title="Saved activations per rank "
        + ", ".join(f"{k}={v}" for k, v in args.items())
        + " (2-byte activations, 1-byte dropout masks)",
    )
    chart = svg_hbars(
        [MODE_LABELS[r.mode] for r in rows],
        [r.mib_per_layer for r in rows],
        [f"{fmt_num(r.mib_per_layer)} MiB" for r in rows],
        title=f"Saved activations per layer, s={args['s']}, b={args['b']}, h={args['h']}, "
        f"a={args['a']}, t={args['t']}",
        unit="MiB per layer per rank",
    )
    return Report(
        title="Saved activations per layer (Korthikanti et al.)",
        tables=[table],
        data={"inputs": args, "modes": acc.as_rows(rows)},
        notes=["Modelled saved activations, not a measured peak; embeddings are left out."],
        chart_svg=chart,
    )


def render_activations(**kwargs: Any) -> str:
    """HTML (bars + table) for :func:`activations_report`'s arguments."""
    return html_report(activations_report(**kwargs))


def activations_calculator(
    s: int = 2048, b: int = 1, h: int = 4096, a: int = 32, t: int = 8, layers: int = 32
):
    """Interactive activation-memory calculator (ipywidgets VBox; ``.update()`` re-renders)."""
    import ipywidgets as w

    desc = {
        "s": "s (sequence length, tokens)",
        "b": "b (microbatch size)",
        "h": "h (hidden width)",
        "a": "a (attention heads)",
        "t": "t (tensor-parallel degree)",
        "layers": "L (layers)",
    }
    init = dict(s=s, b=b, h=h, a=a, t=t, layers=layers)
    controls = {
        k: w.IntText(value=int(init[k]), description=d, layout=w.Layout(width="230px"))
        for k, d in desc.items()
    }
    return build_calculator(
        "Saved activations per layer",
        controls,
        render_activations,
        rows=[["s", "b", "h"], ["a", "t", "layers"]],
        aliases={"L": "layers"},
    )
