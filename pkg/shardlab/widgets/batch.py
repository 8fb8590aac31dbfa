"""The batch the optimizer tolerates: tokens per step, the data-parallel bound, the critical batch.

Every number comes from :mod:`shardlab.accounting.batch`: ``tokens_per_step`` (``b m D s``),
``max_data_parallel`` (``D <= B / b``), ``critical_batch_kaplan`` (Kaplan et al.'s fit of
``B_crit`` against the loss) and McCandlish et al.'s trade-off ``steps_to_target`` /
``tokens_to_target``, shown relative to their minima (``S / S_min = 1 + B_crit / B``,
``E / E_min = 1 + B / B_crit``). The mesh is the planner's: ``D = G / (t c p)`` data-parallel
replicas of ``t c p`` model-parallel ranks each, ``m = B / (D b)`` microbatches per replica and
step. Defaults: Llama 3 405B's 8K phase on 16,384 GPUs (``t = 8``, ``p = 16``, 2,048 sequences).
"""

from __future__ import annotations

from typing import Any

from shardlab.accounting import _validate as chk
from shardlab.accounting import batch

from ._common import (
    Report,
    Table,
    build_calculator,
    computable,
    fmt_int,
    fmt_num,
    fmt_round,
    html_report,
    parse_number,
    start_values,
    svg_loglog,
)

TITLE = "The batch the optimizer tolerates"
SCALES = (0.25, 0.5, 1, 2, 4)  # the second table: the batch at these multiples
LABELS = {  # argument -> the field as the reader sees it (its label; error sentences)
    "global_batch": "B (sequences per step)",
    "seq_len": "s (sequence length)",
    "microbatch": "b (microbatch)",
    "gpus": "G (GPUs)",
    "model_ranks": "t·c·p (ranks per replica)",
    "loss": "loss (nats)",
}


def batch_report(
    global_batch: Any = 2048,
    seq_len: Any = 8192,
    microbatch: Any = 1,
    gpus: Any = 16384,
    model_ranks: Any = 128,
    loss: Any = 2.0,
) -> Report:
    """Tokens per step, ``D`` and ``m`` of the mesh, the data-parallel bound ``B / b``, the
    critical batch at ``loss`` and what the batch costs in steps and tokens against it; then
    the same at other multiples of the batch."""

    def whole(name: str, x: Any) -> int:
        return chk.positive_int(name, parse_number(name, x))

    B, s, b, G, mp = (whole(k, x) for k, x in (("global_batch", global_batch),
                                                ("seq_len", seq_len), ("microbatch", microbatch),
                                                ("gpus", gpus), ("model_ranks", model_ranks)))
    nats = chk.number("loss", parse_number("loss", loss))
    chk.divides("model_ranks", mp, "gpus", G)
    D = G // mp
    d_max = batch.max_data_parallel(B, b)
    if D > d_max:
        raise ValueError(f"D = {D:,} replicas (gpus={G:,} / model_ranks={mp:,}) exceed the "
                         f"{d_max:,} that global_batch={B:,} / microbatch={b:,} allows: every "
                         f"data-parallel replica needs at least one microbatch per step (raise "
                         f"the batch or the ranks per replica)")
    if B % (D * b):
        raise ValueError(f"global_batch={B:,} is not a multiple of D = {D:,} times the "
                         f"microbatch of {b:,}: the replicas would get unequal microbatch counts")
    m = B // (D * b)
    # b m D s is B s (B = m D b): refused under the two fields typed, not as accounting's
    # product of four (two of them derived) past 2^53
    computable("The tokens per step B × s", B * s, {"global_batch": B, "seq_len": s},
               maximum=chk.MAX_COUNT, unit=" tokens")
    tokens = batch.tokens_per_step(b, m, D, s)
    crit = batch.critical_batch_kaplan(nats)
    s_rel = batch.steps_to_target(tokens, 1, crit)  # S / S_min
    e_rel = batch.tokens_to_target(tokens, 1, crit) / crit  # E / E_min (E_min = S_min B_crit)
    one = Table(
        ["quantity", "value"],
        [
            ["tokens per step b·m·D·s", fmt_int(tokens)],
            ["D = G / (t·c·p) data-parallel replicas", fmt_int(D)],
            ["largest D this batch allows, B / b", fmt_int(d_max)],
            ["m = B / (D·b) microbatches per replica", fmt_int(m)],
            ["critical batch B_crit at this loss (tokens)", fmt_round(crit)],
            ["B / B_crit", fmt_num(tokens / crit, 3)],
            ["steps to the target, S / S_min", fmt_num(s_rel, 3)],
            ["tokens to the target, E / E_min", fmt_num(e_rel, 3)],
        ],
        title=f"{fmt_int(B)} sequences of {fmt_int(s)} tokens on {fmt_int(G)} GPUs; loss "
        f"{fmt_num(nats)} nats",
    )
    rows = []
    for k in SCALES:
        tk = tokens * k
        rows.append([fmt_num(k), fmt_round(B * k) if B * k >= 1 else fmt_num(B * k),
                     fmt_round(tk), fmt_int(min(G // mp, int(B * k // b))),
                     fmt_num(batch.steps_to_target(tk, 1, crit), 3),
                     fmt_num(batch.tokens_to_target(tk, 1, crit) / crit, 3)])
    many = Table(["× batch", "sequences", "tokens per step", "D possible", "S / S_min",
                  "E / E_min"], rows,
                 title="The same run at other batches (the mesh's D, or fewer if B / b is less)",
                 highlight=frozenset({SCALES.index(1)}))
    xs = [2 ** (i / 4) for i in range(-28, 29)]  # B / B_crit from 1/128 to 128
    chart = svg_loglog(
        [("S / S_min (steps)", [(x, 1 + 1 / x) for x in xs]),
         ("E / E_min (tokens)", [(x, 1 + x) for x in xs])],
        (tokens / crit, s_rel),
        title="steps and tokens to the target against B / B_crit",
        xlabel="B / B_crit", ylabel="× the minimum",
        fmt_x=lambda x: f"{x:g}", fmt_y=lambda y: f"{y:g}",
    )
    where = ("below the critical batch: a larger batch would need fewer steps at little "
             "extra data" if tokens < crit / 2 else
             "above the critical batch: a larger batch buys few steps and costs data"
             if tokens > 2 * crit else "near the critical batch: steps and tokens both "
             "within 3x of their minima")
    notes = [
        f"This batch is {where}. The critical batch is Kaplan et al.'s fit "
        "B* / L^(1/0.21) with B* = 2·10^8 tokens, for their models; it grows as the loss falls, "
        "which is why runs raise the batch as they train.",
        "D is bounded by the batch (B / b replicas at most), not by memory: at a fixed batch, "
        "more GPUs must go to t, c or p, or the batch must grow.",
    ]
    data = {"tokens_per_step": tokens, "dp": D, "dp_max": d_max, "microbatches": m,
            "b_crit": crit, "steps_rel": s_rel, "tokens_rel": e_rel, "loss": nats}
    return Report(TITLE, [one, many], data, notes, chart)


def render_batch(**kwargs: Any) -> str:
    """HTML (chart + tables) for :func:`batch_report`'s arguments."""
    return html_report(batch_report(**kwargs))


def batch_calculator(**values: Any):
    """Interactive batch calculator (ipywidgets VBox; ``.update()``): :func:`batch_report`'s
    keyword arguments as its starting values (its defaults otherwise)."""
    import ipywidgets as w

    start = start_values(batch_report, values, "batch_calculator")
    controls: dict[str, Any] = {
        k: w.IntText(value=int(start[k]), description=LABELS[k])
        for k in ("global_batch", "seq_len", "microbatch", "gpus", "model_ranks")
    }
    controls["loss"] = w.FloatText(value=float(start["loss"]), description=LABELS["loss"])
    return build_calculator(TITLE, controls, render_batch,
                            rows=[["global_batch", "seq_len", "microbatch"],
                                  ["gpus", "model_ranks", "loss"]])
