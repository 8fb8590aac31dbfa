"""Compute versus communication: per layout, the traffic's time over the compute it can hide behind.

Every number comes from :mod:`shardlab.accounting.overlap`: ``dp`` (DDP, ZeRO-1/2/3 over the
``D`` data-parallel ranks, against ``4 N T`` or ``6 N T`` FLOPs on the rank's ``N / (t p)``
parameters), ``tp`` (one layer's four all-reduces against its ``6 P b s / t`` FLOPs), ``pp``
(one stage boundary against the stage's compute) and the closed-form break-even sizes
``dp_break_even_tokens`` / ``tp_break_even_hidden``. The ratio ``r = T_comm / T_compute`` is the
bandwidth term only (the latency rounds add to it); ``r > 1``: the axis is
communication-bound and at least ``T_comm - T_compute`` of it is exposed, however the schedule
overlaps it. Units at this surface: achieved rate in TFLOP/s (10^12), bandwidths in GB/s (10^9
bytes per second), converted before accounting is called. Defaults: chapter 10's worked
example (70e9 parameters, h = 8,192, 80 layers; 50 GB/s between servers, 300 GB/s inside).
"""

from __future__ import annotations

import math
from typing import Any

from shardlab.accounting import _validate as chk
from shardlab.accounting import overlap
from shardlab.accounting._validate import MAX_REAL

from ._common import (
    Report,
    Table,
    build_calculator,
    computable,
    fmt_num,
    fmt_round,
    fmt_time,
    html_report,
    parse_number,
    start_values,
    svg_loglog,
    unit_number,
)

TITLE = "Compute versus communication"
DP_LAYOUTS = {"ddp": "DDP", "zero1": "ZeRO-1", "zero2": "ZeRO-2", "zero3": "ZeRO-3 / FSDP"}
TOKEN_ROWS = (1024, 4096, 16384, 65536, 262144)  # tokens per rank of the second table
LABELS = {  # argument -> the field as the reader sees it (its label; error sentences)
    "n_params": "N (parameters)",
    "h": "h (hidden)",
    "layers": "L (layers)",
    "tokens": "T (tokens per rank per step)",
    "dp": "D (data-parallel ranks)",
    "t": "t (tensor ranks)",
    "p": "p (stages)",
    "q": "q (bytes per element)",
    "rate_tflops": "achieved rate (TFLOP/s)",
    "beta_dp_gbps": "β of D and p (GB/s)",
    "beta_tp_gbps": "β of t (GB/s)",
}


def _row(name: str, o: overlap.Overlap, traffic: str, even: str) -> list[str]:
    exposed = fmt_time(o.exposed_s) if o.exposed_s else "0"
    ratio = fmt_num(o.ratio, 3) if math.isfinite(o.ratio) else "∞"
    return [name, traffic, fmt_time(o.comm_s), fmt_time(o.compute_s), ratio, o.bound, exposed, even]


def overlap_report(
    n_params: Any = 70_000_000_000,
    h: Any = 8192,
    layers: Any = 80,
    tokens: Any = 65536,
    dp: Any = 32,
    t: Any = 8,
    p: Any = 1,
    q: Any = 2,
    rate_tflops: Any = 400.0,
    beta_dp_gbps: Any = 50.0,
    beta_tp_gbps: Any = 300.0,
) -> Report:
    """Per layout: seconds of traffic per step and rank, seconds of the compute it can hide
    behind, their ratio, the bound, the least exposed time and the break-even size, at
    ``tokens`` per rank per step; then the data-parallel ratios at other token counts."""

    # accounting's checks with the argument names; the calculator writes them as its labels
    def real(name: str, x: Any) -> float:
        return chk.number(name, parse_number(name, x))

    def whole(name: str, x: Any) -> int:
        return chk.positive_int(name, parse_number(name, x))

    n, tok, qq = real("n_params", n_params), real("tokens", tokens), real("q", q)
    if n < 1:  # a fraction of a parameter: its FLOPs would underflow to a zero compute time
        raise ValueError(f"n_params={n!r} must be at least 1 parameter")
    hh, ll, dd, tt, pp = (
        whole(k, x) for k, x in (("h", h), ("layers", layers), ("dp", dp), ("t", t), ("p", p))
    )
    if pp > ll:
        raise ValueError(f"p={pp} exceeds layers={ll}: a stage needs at least one layer")
    # rates checked in the units typed, so a value too large is refused as typed
    r_tf = unit_number("rate_tflops", rate_tflops, 1e12)
    bdp_gb = unit_number("beta_dp_gbps", beta_dp_gbps, 1e9)
    btp_gb = unit_number("beta_tp_gbps", beta_tp_gbps, 1e9)
    rate, b_dp, b_tp = r_tf * 1e12, bdp_gb * 1e9, btp_gb * 1e9
    n_rank = n / (tt * pp)  # each rank's share of the weights under t-way TP and p stages
    per_stage = math.ceil(ll / pp)
    # Every input is bounded, not the products the formulas form of them: each product is
    # refused under the fields that make it (T x N), not under accounting's name for it
    # (flops=1.18e+30); the sizes are the largest each formula forms (6 N T for ZeRO, 72 h^2
    # FLOPs per layer and token, 3 q N bytes for ZeRO-3, 8 q h T for TP's four all-reduces)
    typed = {"n_params": n, "h": hh, "layers": ll, "tokens": tok, "q": qq, "t": tt, "p": pp,
             "rate_tflops": r_tf, "beta_dp_gbps": bdp_gb, "beta_tp_gbps": btp_gb}

    def bounded(what: str, value: float, *names: str, unit: str = "",
                maximum: float = MAX_REAL) -> float:
        return computable(what, value, {k: typed[k] for k in names}, maximum, unit)

    # accounting counts a rank's parameters exactly, up to 2^53
    bounded("The parameters per rank N / (t p)", n_rank, "n_params", "t", "p",
            maximum=chk.MAX_COUNT)
    bounded("The FLOPs per rank and step, 6 N T / (t p),", 6 * n_rank * tok, "n_params", "tokens")
    bounded("The FLOPs per stage and step, 72 h² T L / p,", 72.0 * hh * hh * per_stage * tok,
            "h", "tokens", "layers")
    bounded("The data-parallel bytes per rank, 3 q N / (t p),", 3 * qq * n_rank, "q", "n_params")
    bounded("The tensor-parallel bytes per layer, 8 q h T,", 8 * qq * hh * tok, "q", "h", "tokens")

    def timed(o: overlap.Overlap, sent: tuple[str, ...], work: tuple[str, ...],
              beta: str) -> overlap.Overlap:
        """``o`` when its times and ratio are numbers to show (a β of 1e-300 GB/s makes the
        traffic's time overflow, a rate of 1e-300 TFLOP/s the compute's): ``sent`` and
        ``work`` name the fields of the bytes and of the FLOPs."""
        bounded("The traffic time", o.comm_s, *sent, beta, unit=" s")
        bounded("The compute time", o.compute_s, *work, "rate_tflops", unit=" s")
        ratio_of = dict.fromkeys((*sent, *work, "rate_tflops", beta))  # each field once
        bounded("The ratio T_comm / T_compute", o.ratio, *ratio_of)
        return o

    def even(value: float, *names: str) -> float:
        return bounded("The break-even size", value, *names, "rate_tflops")

    rows, data = [], {"rows": {}}
    for lay, name in DP_LAYOUTS.items():
        o = timed(overlap.dp(lay, n_rank, dd, tok, rate, b_dp, qq), ("q", "n_params"),
                  ("n_params", "tokens"), "beta_dp_gbps")
        t_even = (even(overlap.dp_break_even_tokens(lay, dd, rate, b_dp, qq), "q",
                       "beta_dp_gbps") if dd > 1 else 0.0)
        rows.append(
            _row(
                name,
                o,
                f"{fmt_round(n_rank)} parameters over D = {dd}",
                f"T* = {fmt_round(t_even)} tokens" if dd > 1 else "no traffic",
            )
        )
        data["rows"][lay] = {
            "comm_s": o.comm_s,
            "compute_s": o.compute_s,
            "ratio": o.ratio,
            "bound": o.bound,
            "exposed_s": o.exposed_s,
            "break_even": t_even,
        }
    # TP and PP: per layer (per stage) and microbatch; the ratio does not depend on T
    sent = ("q", "h", "tokens")  # T x h activations each way, both axes
    o_tp = timed(overlap.tp(hh, tt, tok, rate, b_tp, qq), sent, ("h", "tokens"), "beta_tp_gbps")
    tp_even = (even(overlap.tp_break_even_hidden(tt, rate, b_tp, qq), "q", "t", "beta_tp_gbps")
               if tt > 1 else 0.0)
    tp_say = f"h* = {fmt_round(tp_even)}" if tt > 1 else "no traffic"
    rows.append(_row("TP (one layer)", o_tp, f"4 all-reduces of T × h over t = {tt}", tp_say))
    o_pp = timed(overlap.pp(hh, per_stage, tok, rate, b_dp, qq), sent, ("h", "tokens", "layers"),
                 "beta_dp_gbps")
    if pp == 1:  # one stage: no boundary to cross
        o_pp = overlap.Overlap("pp", 0.0, o_pp.compute_s)
    pp_say = "—" if pp > 1 else "no traffic"
    rows.append(_row("PP (one boundary)", o_pp, f"T × h each way, {per_stage} layers", pp_say))
    for key, o, at in (("tp", o_tp, tp_even), ("pp", o_pp, None)):
        data["rows"][key] = {
            "comm_s": o.comm_s,
            "compute_s": o.compute_s,
            "ratio": o.ratio,
            "bound": o.bound,
            "exposed_s": o.exposed_s,
            "break_even": at,
        }
    one = Table(
        [
            "layout",
            "traffic per step",
            "T_comm",
            "T_compute",
            "ratio",
            "bound",
            "exposed at least",
            "break-even",
        ],
        rows,
        title=f"T = {fmt_round(tok)} tokens per rank per step; {fmt_num(rate / 1e12)} "
        f"TFLOP/s achieved; β {fmt_num(b_dp / 1e9)} GB/s (D, p), "
        f"{fmt_num(b_tp / 1e9)} GB/s (t)",
    )

    def dp_ratio(lay: str, x: float) -> float | None:
        """The ratio at ``x`` tokens for the second table and the chart, or None where ``x``
        (not typed: 1,024 tokens, 64 T) takes it out of the numbers the typed T allows."""
        if 6 * n_rank * x > MAX_REAL:
            return None
        r = overlap.dp(lay, n_rank, dd, x, rate, b_dp, qq).ratio
        return r if r <= MAX_REAL else None

    def cell(r: float | None) -> str:  # "-" keeps the column a numeric (right-aligned) one
        return "-" if r is None else fmt_num(r, 3)

    ts = sorted({*TOKEN_ROWS, round(tok)})
    per_t = [[fmt_round(x), *(cell(dp_ratio(lay, x)) for lay in DP_LAYOUTS)] for x in ts]
    many = Table(
        ["T (tokens)", *(f"ratio {name}" for name in DP_LAYOUTS.values())],
        per_t,
        title="Data-parallel ratio at other token counts (bandwidth term: ∝ 1 / T)",
        highlight=frozenset({ts.index(round(tok))}),
    )
    chart = ""
    if dd > 1:
        xs = [tok / 64 * 4096 ** (i / 39) for i in range(40)]  # T / 64 ... 64 T
        curves = [
            (name, [(x, r) for x in xs if (r := dp_ratio(lay, x)) is not None])
            for lay, name in DP_LAYOUTS.items()
            if lay != "zero2"
        ]  # zero2 = zero1
        curves.append(("r = 1", [(xs[0], 1.0), (xs[-1], 1.0)]))
        chart = svg_loglog(
            curves,
            (tok, data["rows"]["ddp"]["ratio"]),
            title="data-parallel T_comm / T_compute against tokens per rank",
            xlabel="tokens per rank per step",
            ylabel="ratio",
            fmt_x=lambda x: fmt_round(x) if x >= 1 else f"{x:g}",  # 1e30: no invented digits
            fmt_y=lambda y: f"{y:g}",
        )
    bound = [
        name
        for name, r in zip([*DP_LAYOUTS.values(), "TP", "PP"], data["rows"].values())
        if r["ratio"] > 1
    ]
    notes = [
        (
            "Communication-bound at these sizes: " + ", ".join(bound) + ". Each needs at least "
            "its exposed time added to the step, however well it is overlapped."
        )
        if bound
        else "Every axis fits behind its compute at these sizes (a schedule must still overlap it).",
        "DP hides behind the backward (DDP, 4 N T FLOPs) or the whole step (ZeRO, 6 N T); the "
        "ratio falls as 1 / T, so T above the break-even T* hides the traffic. TP's all-reduces "
        "scale with the same b s as its compute: only the width h moves its ratio. ZeRO-2 sends "
        "what ZeRO-1 sends: one curve.",
    ]
    data.update(
        {
            "n_params": n,
            "n_rank": n_rank,
            "h": hh,
            "layers": ll,
            "tokens": tok,
            "dp": dd,
            "t": tt,
            "p": pp,
            "q": qq,
            "rate": rate,
            "beta_dp": b_dp,
            "beta_tp": b_tp,
        }
    )
    return Report(TITLE, [one, many], data, notes, chart)


def render_overlap(**kwargs: Any) -> str:
    """HTML (chart + tables) for :func:`overlap_report`'s arguments."""
    return html_report(overlap_report(**kwargs))


def overlap_calculator(**values: Any):
    """Interactive compute-versus-communication calculator (ipywidgets VBox; ``.update()``):
    :func:`overlap_report`'s keyword arguments as its starting values (its defaults otherwise)."""
    import ipywidgets as w

    start = start_values(overlap_report, values, "overlap_calculator")
    controls: dict[str, Any] = {
        "n_params": w.Text(value=str(start["n_params"]), description=LABELS["n_params"])
    }
    for k in ("h", "layers", "tokens", "dp", "t", "p", "q"):
        controls[k] = w.IntText(value=int(start[k]), description=LABELS[k])
    for k in ("rate_tflops", "beta_dp_gbps", "beta_tp_gbps"):
        controls[k] = w.FloatText(value=float(start[k]), description=LABELS[k])
    return build_calculator(
        TITLE,
        controls,
        render_overlap,
        rows=[
            ["n_params", "h", "layers", "tokens"],
            ["dp", "t", "p", "q"],
            ["rate_tflops", "beta_dp_gbps", "beta_tp_gbps"],
        ],
    )
