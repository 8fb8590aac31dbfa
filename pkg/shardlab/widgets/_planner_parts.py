"""Parts of the planner calculator (:mod:`.planner`): input parsers and the report's tables.

Nothing here computes a byte, a FLOP or a second: every number is a field of the
:class:`~shardlab.accounting.planner.Plan`.
"""

from __future__ import annotations

import math
from typing import Any

from shardlab.accounting import planner as acc
from shardlab.accounting.memory import OBJECTS, Recipe

from ._common import GB, Table, fmt_pct, parse_number

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
def parse_recipe_bytes(text: Any) -> Recipe | None:
    """``"2,2,4,4,4"`` -> a custom :class:`Recipe` (bytes per parameter of weights, gradients,
    master weights, first and second moments); ``None`` or ``""``: no custom recipe."""
    if text is None or text == "":
        return None
    parts = [x for x in str(text).split(",")]
    if len(parts) != 5:
        raise ValueError(f"recipe_bytes={text!r} must be five numbers W,G,M,M1,M2 (bytes per "
                         "parameter of weights, gradients, master weights, moments 1 and 2)")
    vals = [parse_number(f"recipe_bytes[{i}]", x) for i, x in enumerate(parts)]
    return Recipe("custom " + ",".join(f"{x:g}" for x in vals), **dict(zip(OBJECTS[:5], vals)))


def _whole(name: str, value: Any) -> int:
    x = parse_number(name, value)
    if not float(x).is_integer():
        raise ValueError(f"{name}={value!r} must be a whole number")
    return int(x)


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
            if key in ("sp", "reshard"):
                if value.lower() not in ("on", "off", "true", "false"):
                    raise ValueError(f"mark {item.strip()!r}: {key} is on or off")
                fields[key] = value.lower() in ("on", "true")
            else:
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


def _ranking_table(pl: acc.Plan, shown: list, moe: bool, n_top: int) -> Table:
    cols = ["rank", "t", "c", "p", "D", *(["ep"] if moe else []), "ZeRO", "HSDP", "recompute",
            "SP", "m", "v", "peak GB", "step s", "MFU", "HFU", "bubble s", "exposed comm s",
            "tokens/s"]
    rows = []
    for c in shown:
        lay = c.layout
        exposed = sum(c.times[f"exposed_{a}"] for a in acc.AXES)
        rows.append([pl.rank_of(c), lay.t, lay.c, lay.p, lay.D, *([lay.ep] if moe else []),
                     lay.zero, f"×{lay.replicas}" if lay.replicas > 1 else "-", lay.recompute,
                     "-" if lay.t == 1 else ("on" if lay.sp else "off"),
                     lay.m, lay.v, _gb(c.peak), _s(c.step_time), fmt_pct(c.mfu), fmt_pct(c.hfu),
                     _s(c.times["bubble"]), _s(exposed),
                     f"{c.tokens_per_s:,.0f}"])
    return Table(cols, rows, title=f"Feasible layouts ranked by predicted step time (top "
                 f"{min(n_top, len(pl.feasible))} of {len(pl.feasible):,}; marked ones added)",
                 highlight=frozenset(i for i, c in enumerate(shown) if pl.rank_of(c) > n_top))


def _memory_table(pl: acc.Plan, shown: list) -> Table:
    cols = ["rank", "stage", *(name for _, name in MEMORY_TERMS), "peak", "budget"]
    rows = [[pl.rank_of(c), c.peak_stage, *(_gb(c.memory.get(k, 0.0)) for k, _ in MEMORY_TERMS),
             _gb(c.peak), _gb(c.budget)] for c in shown]
    return Table(cols, rows, title="Per-rank peak memory by term, GB (the fuller of the first "
                 "and last pipeline stage)")


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
                 "hidden behind compute)")


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
             ex[reason].detail if reason in ex else ""] for reason in acc.REASONS]
    return Table(["reason", "rejected", "example", "why"], rows,
                 title="Rejected layouts by reason (* = every value of that field)")
