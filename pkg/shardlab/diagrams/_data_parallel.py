"""Data-parallel diagrams: the ring all-reduce step by step, the FSDP unit lifecycle."""

from __future__ import annotations

from shardlab.accounting import _validate as chk

# One colour per rank (tab10 order), reused by every diagram so "rank r" looks the same.
RANK_COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
                "#7f7f7f", "#bcbd22", "#17becf")


def _colour(i: int) -> str:
    return RANK_COLOURS[i % len(RANK_COLOURS)]


def ring_states(world: int) -> list[list[list[frozenset[int]]]]:
    """``states[step][rank][chunk]`` = the ranks whose data the chunk holds after ``step``.

    Step 0 is the input. Then, as in lab 01's ``ring_reduce_scatter`` / ``ring_all_gather``
    (``k`` counts from 0 within each phase): reduce-scatter step ``k`` has rank ``r`` send
    its partial chunk ``(r - 1 - k) % D`` to ``r + 1``, which adds it to its own; after
    ``D - 1`` steps rank ``r`` holds the finished chunk ``r``. All-gather step ``k`` has rank
    ``r`` send chunk ``(r - k) % D`` on, and the receiver overwrites its copy.
    """
    d = chk.positive_int("D", world)
    cur = [[frozenset({r}) for _ in range(d)] for r in range(d)]
    states = [cur]
    for s in range(1, 2 * d - 1):
        nxt = [row[:] for row in cur]
        for r in range(d):
            dst = (r + 1) % d
            if s < d:  # reduce-scatter: the receiver adds the partial sum
                c = (r - 1 - (s - 1)) % d
                nxt[dst][c] = cur[dst][c] | cur[r][c]
            else:  # all-gather: the receiver takes the finished chunk
                c = (r - (s - d)) % d
                nxt[dst][c] = cur[r][c]
        cur = nxt
        states.append(cur)
    return states


def ring_allreduce(world: int = 4):
    """Each rank's ``D`` chunks after every step; a chunk's colour bar shows whose data it sums."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    d = chk.positive_int("D", world)
    states = ring_states(d)
    fig, axes = plt.subplots(1, len(states), figsize=(1.35 * len(states), 0.45 * d + 1.1))
    axes = list(axes) if len(states) > 1 else [axes]
    for s, (ax, state) in enumerate(zip(axes, states)):
        for r in range(d):
            for c in range(d):
                owners = sorted(state[r][c])
                w = 1.0 / len(owners)
                for k, o in enumerate(owners):  # stripes: one per rank summed into the chunk
                    ax.add_patch(Rectangle((c + k * w, d - 1 - r), w, 0.9, color=_colour(o)))
                ax.add_patch(Rectangle((c, d - 1 - r), 1, 0.9, fill=False, lw=0.6))
        ax.set_xlim(0, d)
        ax.set_ylim(-0.1, d)
        ax.set_xticks([])
        ax.set_yticks(
            [d - 1 - r + 0.45 for r in range(d)], [f"r{r}" for r in range(d)] if s == 0 else []
        )
        ax.tick_params(length=0)
        for side in ax.spines.values():
            side.set_visible(False)
        phase = "input" if s == 0 else ("RS" if s < d else "AG") + f" {s if s < d else s - d + 1}"
        ax.set_title(phase, fontsize=9)
    fig.suptitle(
        f"Ring all-reduce on D={d}: each row is a rank, each box a chunk; stripes show whose "
        f"data the chunk sums (reduce-scatter: {d - 1} steps, all-gather: {d - 1} steps)",
        fontsize=9,
    )
    fig.tight_layout()
    return fig


# Kinds of interval on the FSDP lifecycle diagram, in legend order.
FSDP_KINDS = ("all-gather", "forward", "backward", "reduce-scatter", "saved activations",
              "gradient shard", "update")


def fsdp_lifecycle_events(
    units: int = 4, prefetch: bool = True
) -> list[tuple[int, str, float, float]]:
    """``(unit, kind, start, end)`` intervals of one FSDP step with reshard after forward.

    Per unit: all-gather, forward, free; the unit's saved activations (or its checkpoint) live
    from the end of its forward to the end of its backward; all-gather again, backward,
    reduce-scatter; the owned gradient shard then lives until the optimizer updates the
    rank's shard of that unit, after the last reduce-scatter. ``kind == "full weights"``
    spans the time the unit's gathered weights exist. The last unit is not freed after its
    forward: its backward comes next (as FSDP does). Times are illustrative (forward 1,
    backward 2, a collective 0.8).
    """
    n = chk.positive_int("units", units)
    chk.flag("prefetch", prefetch)
    lead = 0.6 if prefetch else 0.0  # with prefetch the next gather overlaps this compute
    order = [("forward", i) for i in range(n)] + [("backward", i) for i in reversed(range(n))]
    t, alive_from, fwd_end, events = 0.0, {}, {}, []
    for phase, i in order:
        if i in alive_from:  # still gathered (the last unit between its forward and backward)
            start = t
        else:
            gather = max(0.0, t - lead)
            events.append((i, "all-gather", gather, gather + 0.8))
            alive_from[i] = gather
            start = max(t, gather + 0.8)
        end = start + (1.0 if phase == "forward" else 2.0)
        events.append((i, phase, start, end))
        if phase == "forward":
            fwd_end[i] = end
        else:
            events.append((i, "saved activations", fwd_end[i], end))
            events.append((i, "reduce-scatter", end, end + 0.8))
        if phase == "backward" or i != n - 1:  # free (reshard): the full weights are gone
            events.append((i, "full weights", alive_from.pop(i), end))
        t = end
    update = max(e for _, kind, _, e in events if kind == "reduce-scatter")
    for i in range(n):
        rs_end = next(e for u, kind, _, e in events if u == i and kind == "reduce-scatter")
        events.append((i, "gradient shard", rs_end, update))
        events.append((i, "update", update, update + 0.8))
    return events


def fsdp_lifecycle(units: int = 4, prefetch: bool = True):
    """Per unit: all-gather, forward, free; then all-gather, backward, reduce-scatter, free;
    the saved activations between the unit's forward and backward, and the owned gradient
    shard from its reduce-scatter to the optimizer's update of the rank's shard."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    events = fsdp_lifecycle_events(units, prefetch)
    n = chk.positive_int("units", units)
    fig, ax = plt.subplots(figsize=(10.5, 0.62 * n + 1.9))
    colours = {"all-gather": "#9ecae1", "forward": "#31a354", "backward": "#e6550d",
               "reduce-scatter": "#fdae6b", "saved activations": "#bcbddc",
               "gradient shard": "#fdd0a2", "update": "#756bb1"}
    for i, kind, start, end in events:
        y = n - 1 - i
        if kind == "full weights":
            ax.plot([start, end], [y + 0.38, y + 0.38], color="k", lw=0.8)
        elif kind in ("saved activations", "gradient shard"):  # thin lane under the unit
            ax.barh(y - 0.3, end - start, left=start, color=colours[kind], height=0.16,
                    hatch="///" if kind == "saved activations" else None, edgecolor="#555555",
                    linewidth=0.3)
        else:
            ax.barh(y + 0.05, end - start, left=start, color=colours[kind], height=0.5)
    ax.set_yticks(range(n), [f"unit {n - 1 - y}" for y in range(n)])
    ax.set_xlabel(
        "time (one step); the thin line over a unit spans the time its full weights exist"
    )
    handles = [Patch(color=col, label=name) for name, col in colours.items()]
    ax.legend(handles=handles, ncol=4, fontsize=8, loc="upper center",
              bbox_to_anchor=(0.5, -0.3), frameon=False)
    ax.set_title(
        f"FSDP unit lifecycle, {n} units"
        + (
            " (prefetch: the next unit's all-gather overlaps this unit's compute)"
            if prefetch
            else ""
        )
        + "\nunder each unit: its saved activations wait for its backward; its gradient shard "
        "waits for the update",
        fontsize=10,
    )
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    fig.tight_layout()
    return fig
