"""Plot a profiled step: per rank a compute lane and a communication lane (matplotlib).

:func:`plot_timeline` draws a timeline record (:func:`shardlab.runtime.trace_timeline.
timeline_record`, stored under ``benchmarks/results/traces/``): compute blocks coloured by
phase (forward, backward, optimizer), the union of the collectives below them, and the part
of it no compute overlaps — the *exposed* communication — in red. Each rank's clock starts at
its first recorded step (the ranks' barrier starts every step together).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from shardlab.runtime.trace_timeline import COMM, COMPUTE, STEP, subtract, union

__all__ = ["plot_timeline", "PHASE_COLORS"]

PHASE_COLORS = {"forward": "#4c72b0", "backward": "#dd8452", "optimizer": "#55a868"}
COMM_COLOR, EXPOSED_COLOR = "#8172b3", "#d62728"


def _load(record) -> dict:
    if isinstance(record, str | os.PathLike):
        return json.loads(Path(record).read_text())
    return record


def plot_timeline(record, step: int | None = None, ax=None, title: str | None = None):
    """Draw ``record`` (a dict or the path of its JSON); ``step``: only the ``step``-th
    recorded step (0-based), else all of them. Returns the matplotlib Figure."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    rec = _load(record)
    ranks = sorted({e["rank"] for e in rec["events"]})
    if ax is None:
        _, ax = plt.subplots(figsize=(10, 0.9 + 0.9 * len(ranks)))
    fig, y, ticks, labels = ax.figure, 0.0, [], []
    for r in reversed(ranks):
        evs = [e for e in rec["events"] if e["rank"] == r]
        steps = sorted((e["start"], e["end"]) for e in evs if e["kind"] == STEP)
        if step is not None:
            if not 0 <= step < len(steps):
                raise ValueError(f"step={step} is not one of the {len(steps)} recorded steps.")
            lo, hi = steps[step]
        else:
            lo, hi = steps[0][0], steps[-1][1]
        t0 = steps[0][0] if step is None else lo
        clip = [e for e in evs if e["end"] > lo and e["start"] < hi]

        def ms(iv, lo=lo, hi=hi, t0=t0):  # (start, width) in ms, clipped to [lo, hi]
            return [((max(s, lo) - t0) / 1e3, (min(e, hi) - max(s, lo)) / 1e3) for s, e in iv]

        comp = [(e["start"], e["end"]) for e in clip if e["kind"] == COMPUTE]
        comm = union((e["start"], e["end"]) for e in clip if e["kind"] == COMM)
        for phase, color in PHASE_COLORS.items():
            iv = [(e["start"], e["end"]) for e in clip
                  if e["kind"] == COMPUTE and e["name"] == phase]
            ax.broken_barh(ms(iv), (y + 1.1, 0.8), facecolors=color)
        ax.broken_barh(ms(comm), (y + 0.1, 0.8), facecolors=COMM_COLOR)
        ax.broken_barh(ms(subtract(comm, comp)), (y + 0.1, 0.8), facecolors=EXPOSED_COLOR)
        for s, _ in steps:
            if lo <= s <= hi:
                ax.axvline((s - t0) / 1e3, color="0.6", lw=0.6, ls=":")
        ticks += [y + 0.5, y + 1.5]
        labels += [f"rank {r} comm", f"rank {r} compute"]
        y += 2.4
    ax.set_yticks(ticks, labels)
    ax.set_xlabel("time since the step started (ms)")
    handles = [Patch(color=c, label=p) for p, c in PHASE_COLORS.items()]
    handles += [Patch(color=COMM_COLOR, label="communication (hidden)"),
                Patch(color=EXPOSED_COLOR, label="exposed communication")]
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.3), ncol=5,
              frameon=False, fontsize=8)
    ax.set_title(title or f"{rec.get('layout', '')} — {rec.get('command', '')}", fontsize=9)
    fig.tight_layout()
    return fig
