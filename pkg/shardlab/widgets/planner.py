"""Layout planner calculator: model shape + cluster -> ranked layouts (over ``accounting.planner``).

``planner_report`` computes (:func:`shardlab.accounting.planner.plan`), ``render_planner``
returns HTML (stacked step-time bars + tables), ``planner_calculator`` wraps it in
ipywidgets. Nothing here computes a byte, a FLOP or a second: every number is a field of the
:class:`~shardlab.accounting.planner.Plan`. Defaults: Llama 3 405B at 8K context on 16,384
GPUs of 80 GB, the Llama 3 mesh marked.
"""

from __future__ import annotations

from typing import Any

from shardlab.accounting import compute as cmp
from shardlab.accounting import gemm
from shardlab.accounting import planner as acc

from ._common import GB, Report, build_calculator, html_report, parse_number, svg_stacked_bars
from ._planner_parts import (
    TIME_TERMS,
    _clean,
    _comm_table,
    _examples,
    _memory_table,
    _ranking_table,
    _rejected_table,
    _whole,
    parse_mark,
    parse_recipe_bytes,
)

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
# ``shardlab plan --device``: memory, dense bf16 peak and HBM bandwidth of a data sheet
# (accounting.gemm.DEVICES, which cites them)
DEVICE_OPTIONS = {key: {"gpu_memory_gb": d.memory / GB, "peak_tflops": d.peak_flops / 1e12,
                        "hbm_tbps": d.hbm_bandwidth / 1e12} for key, d in gemm.DEVICES.items()}
SP_CHOICES = {"auto": None, "on": True, "off": False}


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
    hbm_tbps: Any = _C3["hbm_bandwidth"] / 1e12,
    efficiency: Any = gemm.DEFAULT_CAP,
    reserve: Any = acc.DEFAULT_RESERVE,
    max_bubble: Any = 0.25,
    microbatch: Any = 1,
    recipe: str = "mixed-adam-16",
    gated: bool = True,
    dropout: bool = False,
    norm: str = "rmsnorm",
    causal: bool = True,
    sp: str = "auto",
    tied_embeddings: bool = False,
    embedding_in_split: bool = False,
    hsdp: bool = True,
    offload: bool = False,
    pcie_gbps: Any = 25.0,
    host_gbps: Any = 100.0,
    recipe_bytes: Any = None,
    experts: Any = 1,
    top_k: Any = 1,
    top: Any = 10,
    mark: Any = "t=8,c=1,p=16,D=128",
) -> Report:
    """Rank the layouts of a model on a cluster; units: GB = 10^9 bytes, µs, GB/s, TFLOP/s,
    TB/s (``hbm_tbps``: HBM bandwidth of the per-GEMM roofline; 0 = every GEMM at the cap
    ``efficiency``). ``sp``: ``"auto"`` (on where ``t`` divides ``s/c``), ``"on"``, ``"off"``;
    ``recipe_bytes``: ``"W,G,M,M1,M2"`` bytes per parameter (replaces ``recipe``);
    ``offload``: ZeRO-1/2 layouts with their master weights and moments on the host, over a
    PCIe link of ``pcie_gbps`` and host memory of ``host_gbps`` (GB/s)."""
    args = dict(locals())
    text = ("recipe", "gated", "dropout", "norm", "mark", "causal", "sp", "tied_embeddings",
            "embedding_in_split", "recipe_bytes", "hsdp", "offload")
    num = {k: parse_number(k, x) for k, x in args.items() if k not in text}
    if sp not in SP_CHOICES:
        raise ValueError(f"sp={sp!r} is not one of {', '.join(SP_CHOICES)}")
    custom = parse_recipe_bytes(recipe_bytes)
    model = cmp.ModelShape(
        num["layers"], num["hidden"], num["heads"], num["kv_heads"], num["ffn"], num["vocab"],
        num["seq_len"], gated=gated, experts=num["experts"], top_k=num["top_k"],
        dropout=dropout, norm=norm, tied_embeddings=tied_embeddings,
    )
    if num["hbm_tbps"] < 0:
        raise ValueError(f"hbm_tbps={hbm_tbps!r} must be >= 0 (0: no roofline)")
    cluster = acc.Cluster(
        num["gpus"], num["gpu_memory_gb"] * GB, num["gpus_per_node"],
        num["alpha_intra_us"] * 1e-6, num["beta_intra_gbps"] * 1e9,
        num["alpha_inter_us"] * 1e-6, num["beta_inter_gbps"] * 1e9,
        num["peak_tflops"] * 1e12, num["efficiency"],
        num["hbm_tbps"] * 1e12 if num["hbm_tbps"] else None,
    )
    n_top = _whole("top", top)
    if n_top < 1:
        raise ValueError(f"top={top!r} must be at least 1")
    marks = parse_mark(mark)
    pl = acc.plan(model, cluster, num["global_batch"], num["microbatch"], custom or recipe,
                  num["reserve"], num["max_bubble"], causal=causal, sp=SP_CHOICES[sp],
                  embedding_in_split=embedding_in_split, hsdp=hsdp, offload=offload,
                  pcie_bandwidth=num["pcie_gbps"] * 1e9, host_bandwidth=num["host_gbps"] * 1e9)
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
              _comm_table(pl, shown)]
    kind = "causal (masked half skipped)" if causal else "full score matrix"
    eff_note = (
        f"Each GEMM at min({cluster.efficiency:g}, intensity / ridge), ridge = "
        f"{cluster.peak_flops / cluster.hbm_bandwidth:,.0f} FLOP/byte; element-wise kernels at "
        f"{cluster.hbm_bandwidth / 1e12:g} TB/s (accounting.gemm)."
        if cluster.hbm_bandwidth else f"Every GEMM at {cluster.efficiency:g} of the peak."
    )
    notes = [
        f"Model: {model.n_params / 1e9:,.1f}e9 parameters, "
        f"{model.flops_per_token('step', causal) / 1e12:.3f} TFLOP per token per step "
        f"(6N = {cmp.six_n(model.n_params) / 1e12:.3f} TFLOP plus attention, {kind}). "
        f"Budget per GPU {pl.settings['budget_bytes'] / GB:.1f} GB "
        f"({1 - pl.settings['reserve']:.0%} of {num['gpu_memory_gb']:g} GB). " + eff_note
        + f" Recipe {pl.settings['recipe']}. MFU counts the model's FLOPs, HFU adds the "
        "recomputed ones.",
        f"Saved activations per layer (accounting.activations, parameterized): "
        f"{'gated (SwiGLU) MLP, 3' if model.gated else 'GeLU MLP, 2'} tensors {model.ffn:,} wide; "
        f"K and V {model.kv_heads}/{model.heads} of Q's width; "
        f"{'dropout masks' if model.dropout else 'no dropout'}; {model.norm}. "
        f"The Korthikanti constants are the GPT-style case (GeLU MLP of 4h, dropout, "
        f"LayerNorm, K/V heads = heads). The attention kernel assumed materializes the scores "
        f"(a s² b saved without recomputation); with SP, full recomputation keeps the layer "
        f"input split t ways.",
    ]
    if offload:
        notes.append(
            f"ZeRO-Offload on: every ZeRO-1/2 layout keeps its master weights and moments on "
            f"the host (not in the peak) and pays, per step, its gradient shard down and its "
            f"weights up over PCIe at {num['pcie_gbps']:g} GB/s plus the update at "
            f"{num['host_gbps']:g} GB/s of host memory (the 'offload' time, not overlapped; "
            f"accounting.hierarchical.offload_step).")
    bounded = pl.settings.get("bounded")
    if bounded:
        notes.append(
            f"A bounded search: the full search has {bounded['cells']:,} cells (t, c, p, D, v, "
            f"ep), more than the planner costs within a second, so it costed them in the order "
            f"of a lower bound on their step time until no cell left could reach the first "
            f"{bounded['ranked_exactly']} ranks. Those ranks are the full search's; below them "
            f"only the layouts of the {bounded['costed']:,} cells costed are ranked "
            f"({bounded['out_of_memory_whole']:,} cells rejected whole as out of memory, "
            f"{bounded['skipped']:,} not costed; accounting.layout_bound).")
    marked_data = []
    for fields, best, rej in marked:
        label = ", ".join(f"{k}={v}" for k, v in fields.items())
        skipped = pl.find_skipped(**fields) if best is None else []
        if best is not None:
            notes.append(f"Marked {label}: " + pl.explain(best))
        elif skipped:
            why = "; ".join(sorted({r.detail for r in rej})[:4])
            notes.append(f"Marked {label}: not ranked; the bounded search did not cost its "
                         f"{len(skipped):,} cells, every layout of which is slower than rank "
                         f"{bounded['ranked_exactly']}" + (f" (the others: {why})" if why else "")
                         + ".")
        else:
            why = "; ".join(sorted({r.detail for r in rej})[:4]) or "not in the search space"
            notes.append(f"Marked {label}: no feasible variant ({why}).")
        marked_data.append({
            "fields": fields,
            "cells_not_costed": len(skipped),
            "rank": pl.rank_of(best) if best is not None else None,
            "best": best.as_dict() if best is not None else None,
            "explanation": pl.explain(best) if best is not None else None,
            "rejections": [{"layout": r.layout.as_dict(), "reason": r.reason,
                            "detail": r.detail} for r in rej],
        })
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
        )
    data = {
        "model": {**{k: getattr(model, k) for k in ("layers", "hidden", "heads", "kv_heads",
                  "ffn", "vocab", "seq_len", "gated", "experts", "top_k", "dropout", "norm",
                  "tied_embeddings")},
                  "n_params": model.n_params,
                  "flops_per_token": model.flops_per_token("step", causal)},
        "cluster": {k: getattr(cluster, k) for k in ("gpus", "gpu_memory", "gpus_per_node",
                    "alpha_intra", "beta_intra", "alpha_inter", "beta_inter", "peak_flops",
                    "efficiency", "hbm_bandwidth")},
        "global_batch": pl.global_batch,
        "settings": dict(pl.settings),
        "n_feasible": len(pl.feasible),
        "n_rejected": len(pl.rejected),
        "rejected_counts": pl.rejected_counts(),
        "feasible": [c.as_dict() | {"rank": pl.rank_of(c)} for c in shown],
        "marked": marked_data,
        "rejected_examples": [{"layout": r.layout.as_dict(), "reason": r.reason,
                               "detail": r.detail} for r in _examples(pl)],
    }
    return Report(
        title=f"Layout planner: {model.n_params / 1e9:,.0f}e9 parameters, s={model.seq_len:,}, "
        f"batch {pl.global_batch:,} sequences ({pl.global_batch * model.seq_len:,} tokens), "
        f"{cluster.gpus:,} GPUs of "
        f"{num['gpu_memory_gb']:g} GB",
        tables=tables,
        data=_clean(data),
        notes=notes,
        chart_svg=chart,
    )


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
        "peak_tflops": "peak (TFLOP/s)", "hbm_tbps": "HBM (TB/s)", "efficiency": "GEMM cap",
        "reserve": "memory reserve", "max_bubble": "max bubble", "top": "show top",
        "mark": "mark layouts",
    }
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
    controls["causal"] = w.Checkbox(value=bool(vals["causal"]), description="causal attention")
    controls["sp"] = w.Dropdown(options=list(SP_CHOICES), value=vals["sp"],
                                description="sequence par.")
    controls["hsdp"] = w.Checkbox(value=bool(vals["hsdp"]), description="hybrid sharding")
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
            ["gpus", "gpu_memory_gb", "gpus_per_node", "peak_tflops", "hbm_tbps", "efficiency"],
            ["alpha_intra_us", "beta_intra_gbps", "alpha_inter_us", "beta_inter_gbps"],
            ["gated", "dropout", "norm", "causal", "sp", "hsdp", "reserve", "max_bubble", "top"],
            ["mark"],
        ],
    )
