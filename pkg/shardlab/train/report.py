"""Measured against predicted, per rank: what ``shardlab train`` prints (text or ``--json``).

For every rank: peak memory (measured by ``MemoryTrace`` on CPU or
``torch.cuda.max_memory_allocated`` on CUDA; predicted by ``accounting.peak``, or
``accounting.stage_peak`` for a pipeline stage, as the lab does), bytes sent per mesh axis (``CommTrace`` against the layout's ``accounting.comm`` /
``accounting.pipeline`` formula), step time, tokens/s and MFU.

The predictions of time come from ``accounting.compute``: the model FLOPs of a step are
``tokens x ModelShape.flops_per_token("step")`` (``6 N_mm + 12 L s h``); a rank does ``1/G``
of them (times ``1 + bubble_ratio(p, m)`` for a pipeline) at ``peak x efficiency``
(``compute_time``), and its predicted bytes cross a link of ``beta`` bytes/s with nothing
hidden: ``T = compute + bytes / beta``. MFU is ``accounting.compute.mfu`` of the measured (or
predicted) step time. The peak FLOP/s is an assumption, printed with the results.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict

from shardlab.accounting import compute
from shardlab.accounting import pipeline as pacc


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else a / b


def summarize(spec, rows: list[dict], peak_tflops: float, how: str, peak_source: str = "") -> dict:
    """The JSON-able report of a run from every rank's row (:func:`shardlab.train.rank.run_rank`)."""
    shape = spec.shape  # an accounting.compute.ModelShape
    tokens = spec.batch * shape.seq_len
    flops = tokens * shape.flops_per_token("step")  # model FLOPs of one step, all ranks
    g, peak = spec.ranks, peak_tflops * 1e12
    bubble = 1.0
    if spec.layout == "pp":
        bubble += pacc.bubble_ratio(spec.ranks, spec.microbatches)
    t_comp = compute.compute_time(flops / g * bubble, peak, spec.efficiency)
    out_rows = []
    for r in rows:
        times = r["step_times"]
        timed = times[2:] or times
        step = statistics.median(timed)
        meas, pred = r["bytes_measured"], r["bytes_predicted"]
        axes = sorted(set(meas) | set(pred))
        t_pred = t_comp + sum(pred.values()) / (spec.beta_gbps * 1e9)
        out_rows.append({
            "rank": r["rank"], **({"coords": r["coords"]} if "coords" in r else {}),
            "peak": {"measured": r["peak_measured"], "predicted": r["peak_predicted"],
                     "ratio": _ratio(r["peak_measured"], r["peak_predicted"]),
                     "source": r["peak_source"], "predicted_terms": r["peak_terms"],
                     "predicted_phase": r["peak_phase"]},
            "bytes": {a: {"measured": meas.get(a, 0.0), "predicted": pred.get(a, 0.0),
                          "ratio": _ratio(meas.get(a, 0.0), pred.get(a, 0.0))} for a in axes},
            "bytes_total": {"measured": sum(meas.values()), "predicted": sum(pred.values()),
                            "ratio": _ratio(sum(meas.values()), sum(pred.values()))},
            "step_time_s": {"measured": step, "predicted": t_pred,
                            "steps_timed": len(timed), "includes_traced_steps": not times[2:]},
            "tokens_per_s": {"measured": tokens / step, "predicted": tokens / t_pred},
            "mfu": {"measured": compute.mfu(flops, step, g, peak),
                    "predicted": compute.mfu(flops, t_pred, g, peak)},
            "params_held": r["params_held"], "device": r["device"], "threads": r["threads"],
            "step_times_s": times, "losses": r["losses"],
        })
    return {
        "layout": spec.layout, "model": spec.model, "shape": asdict(shape), "ranks": g,
        "dp": spec.dp, "tp": spec.tp, "microbatches": spec.microbatches,
        "schedule": spec.schedule if spec.layout == "pp" else None,
        "steps": spec.steps, "batch": spec.batch, "tokens_per_step": tokens,
        "model_flops_per_step": flops, "matmul_params": shape.matmul_params,
        "module_source": spec.module_source, "modules": spec.modules,
        "started_by": how, "backend": rows[0]["backend"],
        "assumptions": {"peak_tflops_per_rank": peak_tflops, "peak_source": peak_source,
                        "efficiency": spec.efficiency,
                        "beta_gbps": spec.beta_gbps},
        "rows": out_rows,
    }


def _mb(x: float) -> str:
    return f"{x / 2**20:9.3f}"


def _r(x: float | None) -> str:
    return "    -" if x is None else f"{x:5.3f}"


def format_text(s: dict) -> str:
    """The report as aligned text (what ``shardlab train`` prints without ``--json``)."""
    a, m = s["assumptions"], s["shape"]
    mods = ", ".join(s["modules"].values())
    lines = [
        f"shardlab train: layout {s['layout']} on {s['ranks']} ranks ({s['backend']}, "
        f"{s['started_by']}), model {s['model']} (layers={m['layers']}, hidden={m['hidden']}, "
        f"heads={m['heads']}, ffn={m['ffn']}, vocab={m['vocab']}, seq_len={m['seq_len']})",
        f"  N_mm = {s['matmul_params']:,} weights in matrix multiplies; model FLOPs per step "
        f"{s['model_flops_per_step']:.4g} (accounting.compute: 6 N_mm + 12 L s h per token)",
        f"  {s['steps']} steps of {s['batch']} sequences = {s['tokens_per_step']:,} tokens; "
        f"{s['module_source']} module(s): {mods}",
        "  step 0 traced for bytes (CommTrace), step 1 for memory; step time = median of "
        "steps 2+ (of every step when fewer than 3)",
        f"  MFU and the predicted time assume a peak of {a['peak_tflops_per_rank']:g} TFLOP/s "
        f"per rank ({a['peak_source']}); predicted time = FLOPs/rank at that peak x "
        f"efficiency {a['efficiency']:g} (--efficiency) + bytes at {a['beta_gbps']:g} GB/s "
        "(--beta-gbps), nothing hidden",
        "",
        f"{'rank':>4} {'peak MiB':>9} {'pred MiB':>9} {'ratio':>5} {'axis':>4} "
        f"{'sent bytes':>12} {'predicted':>12} {'ratio':>5} {'step ms':>8} {'pred ms':>8} "
        f"{'tok/s':>9} {'pred tok/s':>10} {'MFU':>7} {'pred MFU':>8}",
    ]
    for row in s["rows"]:
        p, t, tok, mfu = row["peak"], row["step_time_s"], row["tokens_per_s"], row["mfu"]
        for k, (axis, b) in enumerate(row["bytes"].items()):
            head = (
                f"{row['rank']:>4} {_mb(p['measured'])} {_mb(p['predicted'])} {_r(p['ratio'])}"
                if k == 0
                else " " * 31
            )
            tail = (
                f" {t['measured'] * 1e3:8.2f} {t['predicted'] * 1e3:8.2f} "
                f"{tok['measured']:9.0f} {tok['predicted']:10.0f} "
                f"{mfu['measured']:7.2%} {mfu['predicted']:8.2%}"
                if k == 0
                else ""
            )
            lines.append(f"{head} {axis:>4} {b['measured']:12,.0f} {b['predicted']:12,.0f} "
                         f"{_r(b['ratio'])}{tail}")
    src = s["rows"][0]["peak"]["source"]
    lines.append(f"peak measured by {src}; predicted by shardlab.accounting.peak "
                 "(stage_peak for pp; saved activations measured, every other term a formula)")
    return "\n".join(lines) + "\n"
