"""Plot helper: stacked memory timeline per rank (matplotlib)."""

from __future__ import annotations

__all__ = ["plot_memory", "COLORS"]

COLORS = {
    "parameters": "#4c72b0",
    "gradients": "#dd8452",
    "optimizer": "#55a868",
    "activations": "#c44e52",
    "communication": "#8172b3",
    "other": "#b3b3b3",
}

_UNITS = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}


def plot_memory(timelines, predicted_peak=None, unit="KiB", title=None, axes=None, x="event"):
    """Stacked area of live bytes by category, one panel per rank.

    ``timelines``: a :class:`~shardlab.runtime.trace_memory.MemoryTimeline` (or MemoryTrace) or a
    list of them (rank order). ``predicted_peak``: bytes, drawn as a dashed horizontal line
    (a number, or a list with one per rank). ``x``: ``"event"`` (event index, deterministic)
    or ``"time"`` (seconds). Returns the matplotlib Figure."""
    import matplotlib.pyplot as plt

    if unit not in _UNITS:
        raise ValueError(f"unit={unit!r} is not one of {', '.join(_UNITS)}.")
    if x not in ("event", "time"):
        raise ValueError(f"x={x!r} must be 'event' or 'time'.")
    if not isinstance(timelines, (list, tuple)):
        timelines = [timelines]
    timelines = [t.timeline() if hasattr(t, "timeline") else t for t in timelines]
    if not timelines:
        raise ValueError("plot_memory needs at least one timeline.")
    scale = _UNITS[unit]
    n = len(timelines)
    if axes is None:
        fig, axes = plt.subplots(n, 1, figsize=(8, 2.6 * n), sharex=False, squeeze=False)
        axes = [a[0] for a in axes]
    else:
        axes = list(axes) if isinstance(axes, (list, tuple)) else [axes]
        fig = axes[0].figure
    peaks = predicted_peak if isinstance(predicted_peak, (list, tuple)) else [predicted_peak] * n
    for ax, tl, pred in zip(axes, timelines, peaks):
        xs = list(range(len(tl.times))) if x == "event" else list(tl.times)
        cats = [c for c in tl.categories if any(tl.bytes[c])]
        ys = [[b / scale for b in tl.bytes[c]] for c in cats]
        if cats:
            ax.stackplot(xs, ys, labels=cats, colors=[COLORS.get(c) for c in cats], step="post")
        ax.axhline(
            tl.peak / scale,
            color="black",
            lw=0.8,
            ls=":",
            label=f"measured peak {tl.peak / scale:,.1f} {unit}",
        )
        if pred is not None:
            ax.axhline(
                pred / scale,
                color="red",
                lw=1.2,
                ls="--",
                label=f"predicted peak {pred / scale:,.1f} {unit}",
            )
        for idx, name, kind in tl.markers:
            if kind == "start":
                xv = idx if x == "event" else tl.times[idx]
                ax.axvline(xv, color="grey", lw=0.6)
                ax.text(
                    xv, ax.get_ylim()[1] * 0.98, f" {name}", va="top", fontsize=8, color="dimgray"
                )
        ax.set_ylabel(f"live {unit}")
        ax.set_title(title or f"rank {tl.rank}", fontsize=10)
        ax.set_xlabel("allocation event" if x == "event" else "seconds")
        ax.legend(loc="upper left", fontsize=7, ncol=2, framealpha=0.8)
    fig.tight_layout()
    return fig
