"""Layout planner calculator: model shape + cluster -> ranked layouts (over ``accounting.planner``).

``planner_report`` computes (:func:`shardlab.accounting.planner.plan`), ``render_planner``
returns HTML (stacked step-time bars + tables), ``planner_calculator`` wraps it in
ipywidgets. Nothing here computes a byte, a FLOP or a second: every number is a field of the
:class:`~shardlab.accounting.planner.Plan`. Defaults: Llama 3 405B at 8K context on 16,384
GPUs of 80 GB, the Llama 3 mesh marked.
"""

from __future__ import annotations

import math
from typing import Any

from shardlab.accounting import compute as cmp
from shardlab.accounting import planner as acc

from ._common import (
    GB,
    Report,
    Table,
    build_calculator,
    fmt_pct,
    html_report,
    parse_number,
    svg_stacked_bars,
)

MEMORY_TERMS = (
    ("persistent", "state"),
    ("gathered_params", "gathered"),
    ("unsharded_grads", "grads"),
    ("activations", "activations"),
    ("recompute_scratch", "recompute scratch"),
    ("backward_workspace", "logits workspace"),
)
TIME_TERMS = ("compute", "recompute", "bubble", *(f"exposed_{a}" for a in acc.AXES))
MARK_KEYS = acc.FIELDS
_L3 = cmp.LLAMA3_405B
_C3 = acc.LLAMA3_CLUSTER


def _preset(key: str) -> dict[str, Any]:
    cfg = acc.LLAMA3_CONFIGS[key]
    mark = ",".join(f"{k}={v}" for k, v in cfg["layout"].items())
    return {"seq_len": cfg["seq_len"], "global_batch": cfg["global_batch"], "mark": mark}


# Named starting points for the CLI (``shardlab plan --preset``) and the book: Llama 3 405B
# (model shape, the 16,384-GPU cluster) at the two context lengths of its report, its mesh
# marked. Explicit arguments override them.
PRESETS = {"llama3-405b-8k": _preset("8k"), "llama3-405b-128k": _preset("128k")}


def parse_mark(text: Any) -> list[dict[str, Any]]:
    """``"t=8,c=1,p=16,D=128; t=8,c=16,p=16,D=8"`` -> one dict of layout fields per mark."""
    if text is None or text == "":
        return []
    if isinstance(text, dict):
        return [dict(text)]
    if isinstance(text, list | tuple):
        return [m for item in text for m in parse_mark(item)]
    out = []
    for part in str(text).split(";"):
        if not part.strip():
            continue
        fields: dict[str, Any] = {}
        for item in part.split(","):
            key, eq, value = item.partition("=")
            key = key.strip()
            if not eq or key not in MARK_KEYS:
                raise ValueError(
                    f"mark {item.strip()!r} is not FIELD=VALUE with FIELD one of "
                    f"{', '.join(MARK_KEYS)}"
                )
            value = value.strip()
            fields[key] = value if key == "recompute" else parse_number(key, value)
        out.append(fields)
    return out


def _clean(x: Any) -> Any:
    """JSON-safe copy: infinities become None."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_clean(v) for v in x]
    return x


def _gb(x: float) -> str:
    return f"{x / GB:,.1f}"


def _s(x: float) -> str:
    return f"{x:.2f}"


def planner_report(
    layers: Any = _L3["layers"],
    hidden: Any = _L3["hidden"],
    heads: Any = _L3["heads"],
    kv_heads: Any = _L3["kv_heads"],
    ffn: Any = _L3["ffn"],
    vocab: Any = _L3["vocab"],
    seq_len: Any = _L3["seq_len"],
    global_batch: Any = 2048,
    gpus: Any = _C3["gpus"],
    gpu_memory_gb: Any = _C3["gpu_memory"] / GB,
    gpus_per_node: Any = _C3["gpus_per_node"],
    alpha_intra_us: Any = _C3["alpha_intra"] * 1e6,
    beta_intra_gbps: Any = _C3["beta_intra"] / 1e9,
    alpha_inter_us: Any = _C3["alpha_inter"] * 1e6,
    beta_inter_gbps: Any = _C3["beta_inter"] / 1e9,
    peak_tflops: Any = _C3["peak_flops"] / 1e12,
    efficiency: Any = 0.6,
    reserve: Any = 0.1,
    max_bubble: Any = 0.25,
    microbatch: Any = 1,
    recipe: str = "mixed-adam-16",
    gated: bool = True,
    dropout: bool = False,
    norm: str = "rmsnorm",
    experts: Any = 1,
    top_k: Any = 1,
    top: Any = 10,
    mark: Any = "t=8,c=1,p=16,D=128",
) -> Report:
    """Rank the layouts of a model on a cluster; units: GB = 10^9 bytes, µs, GB/s, TFLOP/s."""
    args = dict(locals())
    text = ("recipe", "gated", "dropout", "norm", "mark")
    num = {k: parse_number(k, x) for k, x in args.items() if k not in text}
    model = cmp.ModelShape(
        num["layers"], num["hidden"], num["heads"], num["kv_heads"], num["ffn"], num["vocab"],
        num["seq_len"], gated=gated, experts=num["experts"], top_k=num["top_k"],
        dropout=dropout, norm=norm,
    )  # fmt: skip
    cluster = acc.Cluster(
        num["gpus"], num["gpu_memory_gb"] * GB, num["gpus_per_node"],
        num["alpha_intra_us"] * 1e-6, num["beta_intra_gbps"] * 1e9,
        num["alpha_inter_us"] * 1e-6, num["beta_inter_gbps"] * 1e9,
        num["peak_tflops"] * 1e12, num["efficiency"],
    )  # fmt: skip
    n_top = int(parse_number("top", top))
    if n_top < 1:
        raise ValueError(f"top={top!r} must be at least 1")
    marks = parse_mark(mark)
    pl = acc.plan(model, cluster, num["global_batch"], num["microbatch"], recipe,
                  num["reserve"], num["max_bubble"])  # fmt: skip
    shown = list(pl.feasible[:n_top])
    marked = []
    for fields in marks:
        found = pl.find(**fields)
        best = found[0] if found else None
        if best is not None and best not in shown:
            shown.append(best)
        marked.append((fields, best, pl.find_rejected(**fields)))
    moe = model.experts > 1
    tables = [_ranking_table(pl, shown, moe, n_top), _memory_table(pl, shown),
              _comm_table(pl, shown)]  # fmt: skip
    notes = [
        f"Model: {model.n_params / 1e9:,.1f}e9 parameters, "
        f"{model.flops_per_token('step', True) / 1e12:.3f} TFLOP per token per step "
        f"(6N = {cmp.six_n(model.n_params) / 1e12:.3f} TFLOP plus causal attention). "
        f"Budget per GPU {pl.settings['budget_bytes'] / GB:.1f} GB "
        f"({1 - pl.settings['reserve']:.0%} of {num['gpu_memory_gb']:g} GB).",
        f"Saved activations per layer (accounting.activations, parameterized): "
        f"{'gated (SwiGLU) MLP, 3' if model.gated else 'GeLU MLP, 2'} tensors {model.ffn:,} wide; "
        f"K and V {model.kv_heads}/{model.heads} of Q's width; "
        f"{'dropout masks' if model.dropout else 'no dropout'}; {model.norm}. "
        f"The Korthikanti constants are the GPT-style case (GeLU MLP of 4h, dropout, "
        f"LayerNorm, K/V heads = heads).",
    ]
    marked_data = []
    for fields, best, rej in marked:
        label = ", ".join(f"{k}={v}" for k, v in fields.items())
        if best is not None:
            notes.append(f"Marked {label}: " + pl.explain(best))
        else:
            why = "; ".join(sorted({r.detail for r in rej})[:4]) or "not in the search space"
            notes.append(f"Marked {label}: no feasible variant ({why}).")
        marked_data.append({
            "fields": fields,
            "rank": pl.rank_of(best) if best is not None else None,
            "best": best.as_dict() if best is not None else None,
            "explanation": pl.explain(best) if best is not None else None,
            "rejections": [{"layout": r.layout.as_dict(), "reason": r.reason,
                            "detail": r.detail} for r in rej],
        })  # fmt: skip
    tables.append(_rejected_table(pl))
    if not pl.feasible:
        notes.append("No layout is feasible under these inputs; the rejected table says why.")
    chart = ""
    if shown:
        chart = svg_stacked_bars(
            [f"#{pl.rank_of(c)}" for c in shown],
            [(k.replace("_", " "), [c.times[k] for c in shown]) for k in TIME_TERMS
             if any(c.times[k] for c in shown)],
            unit="seconds per step",
            title="Predicted step time by term (rank in the ranking)",
            totals_labels=[f"{c.step_time:.2f} s" for c in shown],
        )  # fmt: skip
    data = {
        "model": {**{k: getattr(model, k) for k in ("layers", "hidden", "heads", "kv_heads",
                  "ffn", "vocab", "seq_len", "gated", "experts", "top_k", "dropout", "norm")},
                  "n_params": model.n_params,
                  "flops_per_token": model.flops_per_token("step", True)},
        "cluster": {k: getattr(cluster, k) for k in ("gpus", "gpu_memory", "gpus_per_node",
                    "alpha_intra", "beta_intra", "alpha_inter", "beta_inter", "peak_flops",
                    "efficiency")},
        "global_batch": pl.global_batch,
        "settings": dict(pl.settings),
        "n_feasible": len(pl.feasible),
        "n_rejected": len(pl.rejected),
        "rejected_counts": pl.rejected_counts(),
        "feasible": [c.as_dict() | {"rank": pl.rank_of(c)} for c in shown],
        "marked": marked_data,
        "rejected_examples": [{"layout": r.layout.as_dict(), "reason": r.reason,
                               "detail": r.detail} for r in _examples(pl)],
    }  # fmt: skip
    return Report(
        title=f"Layout planner: {model.n_params / 1e9:,.0f}e9 parameters, s={model.seq_len:,}, "
        f"batch {pl.global_batch:,} sequences, {cluster.gpus:,} GPUs of "
        f"{num['gpu_memory_gb']:g} GB",
        tables=tables,
        data=_clean(data),
        notes=notes,
        chart_svg=chart,
    )


def _ranking_table(pl: acc.Plan, shown: list, moe: bool, n_top: int) -> Table:
    cols = ["rank", "t", "c", "p", "D", *(["ep"] if moe else []), "ZeRO", "recompute", "m",
            "v", "peak GB", "step s", "MFU", "bubble s", "exposed comm s", "tokens/s"]  # fmt: skip
    rows = []
    for c in shown:
        lay = c.layout
        exposed = sum(c.times[f"exposed_{a}"] for a in acc.AXES)
        rows.append([pl.rank_of(c), lay.t, lay.c, lay.p, lay.D, *([lay.ep] if moe else []),
                     lay.zero, lay.recompute, lay.m, lay.v, _gb(c.peak), _s(c.step_time),
                     fmt_pct(c.mfu), _s(c.times["bubble"]), _s(exposed),
                     f"{c.tokens_per_s:,.0f}"])  # fmt: skip
    return Table(cols, rows, title=f"Feasible layouts ranked by predicted step time (top "
                 f"{min(n_top, len(pl.feasible))} of {len(pl.feasible):,}; marked ones added)",
                 highlight=frozenset(i for i, c in enumerate(shown) if pl.rank_of(c) > n_top))  # fmt: skip


def _memory_table(pl: acc.Plan, shown: list) -> Table:
    cols = ["rank", "stage", *(name for _, name in MEMORY_TERMS), "peak", "budget"]
    rows = [[pl.rank_of(c), c.peak_stage, *(_gb(c.memory.get(k, 0.0)) for k, _ in MEMORY_TERMS),
             _gb(c.peak), _gb(c.budget)] for c in shown]  # fmt: skip
    return Table(cols, rows, title="Per-rank peak memory by term, GB (the fuller of the first "
                 "and last pipeline stage)")  # fmt: skip


def _comm_table(pl: acc.Plan, shown: list) -> Table:
    cols = ["rank", *(f"{a} s (hidden)" for a in acc.AXES), "bound by"]
    rows = []
    for c in shown:
        cells = []
        for a in acc.AXES:
            r = c.comm[a]
            cells.append("-" if not r.comm_time else f"{r.comm_time:.2f} ({r.overlap:.0%})")
        worst = max(acc.AXES, key=lambda a: c.comm[a].exposed)
        bound = "compute" if not c.comm[worst].exposed else f"{worst} traffic"
        rows.append([pl.rank_of(c), *cells, bound])
    return Table(cols, rows, title="Communication per step per axis: α–β seconds (share "
                 "hidden behind compute)")  # fmt: skip


def _examples(pl: acc.Plan) -> list:
    """One rejection per reason: the closest to fitting for out-of-memory, else the first."""
    out = []
    for reason in acc.REASONS:
        rs = [r for r in pl.rejected if r.reason == reason]
        if rs:
            out.append(min(rs, key=lambda r: r.over_bytes) if reason == "out of memory" else rs[0])
    return out


def _rejected_table(pl: acc.Plan) -> Table:
    counts = pl.rejected_counts()
    ex = {r.reason: r for r in _examples(pl)}
    rows = [[reason, counts[reason], ex[reason].layout.label if reason in ex else "",
             ex[reason].detail if reason in ex else ""] for reason in acc.REASONS]  # fmt: skip
    return Table(["reason", "rejected", "example", "why"], rows,
                 title="Rejected layouts by reason (* = every value of that field)")  # fmt: skip


def render_planner(**kwargs: Any) -> str:
    """HTML (step-time bars + tables) for :func:`planner_report`'s arguments."""
    return html_report(planner_report(**kwargs))


def planner_calculator(**defaults: Any):
    """Interactive planner (ipywidgets VBox; ``.update()`` re-renders). Keyword arguments
    override :func:`planner_report`'s defaults (Llama 3 405B at 8K on 16,384 GPUs)."""
    import inspect

    import ipywidgets as w

    params = inspect.signature(planner_report).parameters
    vals = {k: defaults.get(k, p.default) for k, p in params.items()}
    labels = {
        "layers": "L (layers)", "hidden": "h (hidden)", "heads": "heads",
        "kv_heads": "K/V heads", "ffn": "f (FFN width)", "vocab": "V (vocabulary)",
        "seq_len": "s (tokens)", "global_batch": "batch (sequences)", "gpus": "G (GPUs)",
        "gpu_memory_gb": "GPU memory (GB)", "gpus_per_node": "GPUs per node",
        "alpha_intra_us": "α node (µs)", "beta_intra_gbps": "β node (GB/s)",
        "alpha_inter_us": "α network (µs)", "beta_inter_gbps": "β network (GB/s)",
        "peak_tflops": "peak (TFLOP/s)", "efficiency": "achievable fraction",
        "reserve": "memory reserve", "max_bubble": "max bubble", "top": "show top",
        "mark": "mark layouts",
    }  # fmt: skip
    controls: dict[str, Any] = {}
    for k, desc in labels.items():
        v = vals[k]
        lay = w.Layout(width="230px" if k != "mark" else "420px")
        if k == "mark":
            controls[k] = w.Text(value=str(v or ""), description=desc, layout=lay)
        elif (
            isinstance(v, float)
            and not float(v).is_integer()
            or k in ("efficiency", "reserve", "max_bubble")
        ):
            controls[k] = w.FloatText(value=float(v), description=desc, layout=lay)
        else:
            controls[k] = w.IntText(value=int(v), description=desc, layout=lay)
    controls["gated"] = w.Checkbox(value=bool(vals["gated"]), description="gated (SwiGLU) MLP")
    controls["dropout"] = w.Checkbox(value=bool(vals["dropout"]), description="dropout")
    controls["norm"] = w.Dropdown(
        options=["rmsnorm", "layernorm"], value=vals["norm"], description="norm"
    )
    fixed = {k: vals[k] for k in params if k not in controls}

    def convert(values: dict[str, Any]) -> dict[str, Any]:
        return {**fixed, **values}

    return build_calculator(
        "Layout planner",
        controls,
        render_planner,
        convert,
        rows=[
            ["layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "seq_len", "global_batch"],
            ["gpus", "gpu_memory_gb", "gpus_per_node", "peak_tflops", "efficiency"],
            ["alpha_intra_us", "beta_intra_gbps", "alpha_inter_us", "beta_inter_gbps"],
            ["gated", "dropout", "norm", "reserve", "max_bubble", "top"],
            ["mark"],
        ],
    )
