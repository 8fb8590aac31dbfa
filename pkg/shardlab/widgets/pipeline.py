"""Pipeline calculator: closed-form bubbles and a Gantt chart of the generated schedule.

Closed forms come from :mod:`shardlab.accounting.pipeline` (``bubble_ratio``,
``idle_fraction``, ``utilization``, ``bubble_time``); the schedule from
``schedule(kind, p, m, v)`` and its timing from ``simulate``; a bad ``(kind, p, m, v)`` gets
``check_kind``'s sentence (``v > 1`` needs ``interleaved``). Costs are in arbitrary time
units per microbatch for a whole rank's layers.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from shardlab.accounting import pipeline as acc

from ._common import (
    Report,
    Table,
    build_calculator,
    computable,
    fmt_num,
    fmt_pct,
    fmt_round,
    html_report,
    parse_number,
    svg_gantt,
    value_text,
)

SCHEDULE_CHOICES = acc.KINDS
# the (p-1)/(v m) family describes neither zero bubble nor the V schedules (simulated only)
NOT_CLOSED_FORM = ("zb-h1", *acc.V_KINDS)
# The simulator walks every action and the chart draws each one: beyond this many actions
# (about 0.25 s of simulation and drawing on a 2-core machine) the report gives the closed
# forms only, so every calculator update and CLI call answers within a second.
MAX_SIMULATED_ACTIONS = 20_000


def _order(k: str) -> tuple[int, str]:
    return acc.ACTION_KINDS.index(k.split()[0]), k


def _closed_forms(kind, pp, mm, v_closed, cc):
    """Bubble ratio, idle fraction, utilization and idle time per stage (None for zb-h1 when
    its closed form is undefined, BW > F + BI: the simulator is then the only answer)."""
    try:
        btime = acc.bubble_time(kind, pp, cc, v_closed)
    except ValueError:
        btime = None
    return (
        acc.bubble_ratio(pp, mm, v_closed),
        acc.idle_fraction(pp, mm, v_closed),
        acc.utilization(pp, mm, v_closed),
        btime,
    )


def pipeline_report(
    kind: str = "1f1b",
    p: Any = 4,
    m: Any = 8,
    v: Any = 1,
    costs: Mapping[str, Any] | None = None,
    comm: Any = 0.0,
) -> Report:
    """Closed-form bubble numbers next to the simulated schedule (and its Gantt chart)."""
    pp = parse_number("p (stages)", p)
    mm = parse_number("m (microbatches)", m)
    vv = parse_number("v (chunks)", v)
    cc = {k: parse_number(f"cost {k}", x) for k, x in (costs or {}).items()}
    delay = parse_number("comm", comm)
    # the accounting's one check, the sentence the lab's PipeConfig gives too (1f1b with v > 1
    # is refused, not read as interleaved)
    kind, pp, mm, vv = acc.check_kind(kind, pp, mm, vv)
    v_closed = vv if kind == "interleaved" else 1
    n_actions = acc.schedule_size(kind, pp, mm, vv)
    if n_actions > MAX_SIMULATED_ACTIONS:
        return _closed_form_report(kind, pp, mm, vv, v_closed, cc, delay, n_actions)
    sched = acc.schedule(kind, pp, mm, vv)
    sim = acc.simulate(sched, pp, cc, delay)
    ratio, idle, util, btime = _closed_forms(kind, pp, mm, v_closed, cc)

    def closed(x: float) -> str:  # the (p-1)/(v m) family does not describe zero bubble
        return "n/a" if kind in NOT_CLOSED_FORM else fmt_pct(x)

    sim_useful = sum(sim.busy_per_stage) / pp
    sim_idle = sum(sim.idle_per_stage) / pp
    # the costs this schedule's actions take (zero bubble splits B into BI and BW), named as
    # the fields that give them, and the p2p delay where there is one
    used_costs = {**acc.DEFAULT_COSTS, **cc}
    typed = {f"costs[{k!r}]": used_costs[k] for k in acc.ACTION_KINDS
             if any(a.kind == k for acts in sched for a in acts)} | ({"comm": delay} if delay else {})
    if not sim_useful:  # every cost 0 (or lost beside a delay 10^300 times larger)
        said = ", ".join(f"{name}={value_text(x)}" for name, x in typed.items())
        raise ValueError(f"{said}: the {kind} schedule's actions take no time, so it has no "
                         "bubble to measure: give an action a time > 0")
    bubble = computable("The simulated bubble / useful", sim_idle / sim_useful, typed)
    summary = Table(
        ["quantity", "closed form", "simulated"],
        [
            ["bubble / useful", closed(ratio), fmt_pct(bubble)],
            ["idle fraction", closed(idle), fmt_pct(sim.bubble_fraction)],
            ["utilization", closed(util), fmt_pct(1 - sim.bubble_fraction)],
            ["idle time per stage", "n/a" if btime is None else fmt_num(btime), fmt_num(sim_idle)],
            ["makespan", "-", fmt_num(sim.makespan)],
        ],
        title=f"{kind}: p={pp} stages, m={mm} microbatches, v={vv} chunk(s); "
        "closed forms assume balanced stages" + (" and BW <= F + BI" if kind == "zb-h1" else ""),
    )
    stages = Table(
        ["stage", "busy", "idle", "idle share", "peak in flight"],
        [
            [r, fmt_num(b), fmt_num(i), fmt_pct(i / sim.makespan if sim.makespan else 0), k]
            for r, (b, i, k) in enumerate(
                zip(sim.busy_per_stage, sim.idle_per_stage, sim.peak_inflight)
            )
        ],
        title="Simulated per stage (time units; in flight = microbatch chunks started, "
        "backward not finished)",
    )

    def key(a: acc.Action) -> str:  # colour by action kind, and by chunk when interleaved
        return f"{a.kind} chunk {a.chunk}" if vv > 1 else a.kind

    kinds = sorted({key(a) for acts in sched for a in acts}, key=_order)
    chart = svg_gantt(
        [[(s, e, key(a), str(a)) for s, e, a in lane] for lane in sim.timeline],
        [f"stage {r}" for r in range(pp)],
        kinds,
        sim.makespan,
        title=f"{kind} schedule, p={pp}, m={mm}" + (f", v={vv}" if vv > 1 else ""),
    )
    return Report(
        title=f"Pipeline bubble: {kind}, p={pp}, m={mm}, v={vv}",
        tables=[summary, stages],
        data={
            "schedule": kind,
            "p": pp,
            "m": mm,
            "v": vv,
            "costs": used_costs,
            "comm": delay,
            "closed_form": {
                "bubble_ratio": ratio,
                "idle_fraction": idle,
                "utilization": util,
                "bubble_time_per_stage": btime,
            },
            "simulated": {
                "makespan": sim.makespan,
                "bubble_fraction": sim.bubble_fraction,
                "busy_per_stage": list(sim.busy_per_stage),
                "idle_per_stage": list(sim.idle_per_stage),
                "peak_inflight": list(sim.peak_inflight),
            },
            "actions": [[str(a) for a in acts] for acts in sched],
        },
        notes=[f"Costs per microbatch (time units): {used_costs}; comm delay {delay}."],
        chart_svg=chart,
    )


def _closed_form_report(
    kind: str,
    pp: int,
    mm: int,
    vv: int,
    v_closed: int,
    cc: dict[str, float],
    delay: float,
    n_actions: int,
) -> Report:
    """The closed forms alone, for schedules too large to simulate interactively."""
    ratio, idle, util, btime = _closed_forms(kind, pp, mm, v_closed, cc)
    na = "n/a" if kind in NOT_CLOSED_FORM else None
    why = (
        f"Not simulated: this schedule has {fmt_round(n_actions)} actions, more than the "
        f"{MAX_SIMULATED_ACTIONS:,} the calculator simulates (the simulator walks every action); "
        "the closed forms need none."
    )
    summary = Table(
        ["quantity", "closed form", "simulated"],
        [
            ["bubble / useful", na or fmt_pct(ratio), "not simulated"],
            ["idle fraction", na or fmt_pct(idle), "not simulated"],
            ["utilization", na or fmt_pct(util), "not simulated"],
            ["idle time per stage", "n/a" if btime is None else fmt_num(btime), "not simulated"],
        ],
        title=f"{kind}: p={pp} stages, m={mm} microbatches, v={vv} chunk(s); "
        "closed forms assume balanced stages",
    )
    used_costs = {**acc.DEFAULT_COSTS, **cc}
    return Report(
        title=f"Pipeline bubble: {kind}, p={pp}, m={mm}, v={vv}",
        tables=[summary],
        data={
            "schedule": kind,
            "p": pp,
            "m": mm,
            "v": vv,
            "costs": used_costs,
            "comm": delay,
            "closed_form": {
                "bubble_ratio": ratio,
                "idle_fraction": idle,
                "utilization": util,
                "bubble_time_per_stage": btime,
            },
            "simulated": None,
            "actions": None,
            "not_simulated": why,
        },
        notes=[why, f"Costs per microbatch (time units): {used_costs}; comm delay {delay}."],
    )


def render_pipeline(**kwargs: Any) -> str:
    """HTML (Gantt chart + tables) for :func:`pipeline_report`'s arguments."""
    return html_report(pipeline_report(**kwargs))


def pipeline_calculator(
    kind: str = "1f1b",
    p: int = 4,
    m: int = 8,
    v: int = 1,
    costs: Mapping[str, float] | None = None,
    comm: float = 0.0,
):
    """Interactive pipeline-schedule calculator (ipywidgets VBox; ``.update()`` re-renders)."""
    import ipywidgets as w

    c = {**acc.DEFAULT_COSTS, **(costs or {})}

    def ft(value: float, desc: str) -> Any:
        return w.FloatText(value=float(value), description=desc, layout=w.Layout(width="160px"))

    controls: dict[str, Any] = {
        "kind": w.Dropdown(options=acc.KINDS, value=kind, description="schedule"),
        "p": w.IntText(value=int(p), description="p (stages)", layout=w.Layout(width="160px")),
        "m": w.IntText(
            value=int(m), description="m (microbatches)", layout=w.Layout(width="190px")
        ),
        "v": w.IntText(value=int(v), description="v (chunks)", layout=w.Layout(width="160px")),
        "F": ft(c["F"], "F cost"),
        "B": ft(c["B"], "B cost"),
        "BI": ft(c["BI"], "BI cost"),
        "BW": ft(c["BW"], "BW cost"),
        "comm": ft(comm, "p2p delay"),
    }

    def convert(vals: dict[str, Any]) -> dict[str, Any]:
        return {
            "kind": vals["kind"],
            "p": vals["p"],
            "m": vals["m"],
            "v": vals["v"],
            "costs": {k: vals[k] for k in acc.ACTION_KINDS},
            "comm": vals["comm"],
        }

    return build_calculator(
        "Pipeline schedule and bubble",
        controls,
        render_pipeline,
        convert,
        rows=[["kind", "p", "m", "v"], ["F", "B", "BI", "BW", "comm"]],
        aliases={f"costs['{k}']": k for k in acc.ACTION_KINDS} | {"schedule": "kind"},
    )
