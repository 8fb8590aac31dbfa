"""ZeRO diagrams: which objects each stage partitions, and one step's reduce-scatter → update →
all-gather dataflow."""

from __future__ import annotations

from shardlab.accounting import _validate as chk
from shardlab.accounting import memory

from ._data_parallel import _colour
from ._model_parallel import _arrow, _blank, _box

# The objects of the 16-byte recipe, in the order the chapter introduces them.
ZERO_OBJECTS = ("weights", "grads", "master", "moment1", "moment2")
_OBJECT_LABELS = {"weights": "working weights", "grads": "gradients", "master": "master weights",
                  "moment1": "Adam moment 1", "moment2": "Adam moment 2"}
_SHORT = {"weights": "weights", "grads": "gradients", "master": "optimizer state",
          "moment1": "optimizer state", "moment2": "optimizer state"}
_LAYOUT_LABELS = {"ddp": "DDP", "zero1": "ZeRO-1", "zero2": "ZeRO-2", "zero3": "ZeRO-3"}


def zero_held_fractions(dp: int = 4) -> dict[str, dict[str, list[tuple[float, float]]]]:
    """``held[layout][object][rank]`` = the ``(start, end)`` fraction of the object the rank keeps.

    A replicated object is ``(0, 1)`` on every rank; a sharded one (``memory.SHARDED_OBJECTS``)
    is rank ``r``'s slice ``(r/D, (r+1)/D)``.
    """
    d = chk.positive_int("D", dp)
    held: dict[str, dict[str, list[tuple[float, float]]]] = {}
    for layout in memory.LAYOUTS:
        sharded = memory.SHARDED_OBJECTS[layout]
        held[layout] = {
            obj: [(r / d, (r + 1) / d) if obj in sharded else (0.0, 1.0) for r in range(d)]
            for obj in ZERO_OBJECTS
        }
    return held


def zero_partitions(dp: int = 4):
    """One panel per layout: for each object, the part of it every rank keeps (colour = rank)."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    d = chk.positive_int("D", dp)
    held = zero_held_fractions(d)
    fig, axes = plt.subplots(1, len(held), figsize=(11, 0.32 * d * len(ZERO_OBJECTS) * 0.55 + 1.6),
                             sharey=True)
    row_h = 1.0 / (d + 1)
    for ax, (layout, objs) in zip(axes, held.items()):
        for k, obj in enumerate(ZERO_OBJECTS):
            y0 = len(ZERO_OBJECTS) - 1 - k
            for r, (a, b) in enumerate(objs[obj]):
                y = y0 + (d - 1 - r) * row_h + row_h / 2
                ax.add_patch(Rectangle((0, y), 1, row_h * 0.8, fc="none", ec="#bbbbbb", lw=0.4))
                ax.add_patch(Rectangle((a, y), b - a, row_h * 0.8, color=_colour(r)))
        ax.set_xlim(0, 1)
        ax.set_ylim(0, len(ZERO_OBJECTS))
        ax.set_xticks([])
        sharded = memory.SHARDED_OBJECTS[layout]
        before = memory.SHARDED_OBJECTS[memory.LAYOUTS[max(0, memory.LAYOUTS.index(layout) - 1)]]
        added = [_SHORT[o] for o in ZERO_OBJECTS if o in sharded - before]
        first = layout == memory.LAYOUTS[0] or not before
        note = "nothing sharded" if not sharded else ("shards " if first else "also shards ")
        ax.set_title(f"{_LAYOUT_LABELS[layout]}\n{note}{', '.join(dict.fromkeys(added))}",
                     fontsize=8)
        for side in ax.spines.values():
            side.set_visible(False)
        ax.tick_params(length=0)
    axes[0].set_yticks([len(ZERO_OBJECTS) - 0.5 - k for k in range(len(ZERO_OBJECTS))],
                       [_OBJECT_LABELS[o] for o in ZERO_OBJECTS], fontsize=8)
    fig.suptitle(
        f"What each rank keeps of every object, D={d} (one thin bar per rank, colour = rank; a "
        "full bar is a replica, a 1/D piece a shard)",
        fontsize=9,
    )
    fig.tight_layout()
    return fig


def zero_step_states(dp: int = 4) -> list[tuple[str, list[list[frozenset[int] | None]]]]:
    """The gradient/weight chunks each rank holds at the four moments of a ZeRO-1/2 step.

    ``(label, held)`` with ``held[rank][chunk]`` = the ranks whose microbatches the chunk's
    value depends on, or ``None`` if the rank does not hold that chunk. Chunk ``c`` belongs to
    rank ``c``. Moments: local gradients (rank ``r``'s own data only), after the
    reduce-scatter (rank ``r`` holds the sum over all ranks of chunk ``r``), after the update
    of the owned shard (the new weights of chunk ``r`` only), after the all-gather (every
    chunk's new weights everywhere).
    """
    d = chk.positive_int("D", dp)
    everyone = frozenset(range(d))
    local = [[frozenset({r}) for _ in range(d)] for r in range(d)]
    scattered = [[everyone if c == r else None for c in range(d)] for r in range(d)]
    gathered = [[everyone for _ in range(d)] for _ in range(d)]
    return [
        ("local gradients", local),
        ("after reduce-scatter: summed gradient shard", scattered),
        ("after the update: new weight shard", [row[:] for row in scattered]),
        ("after all-gather: new weights everywhere", gathered),
    ]


def zero_step_dataflow(dp: int = 4):
    """Reduce-scatter → update of the owned shard → all-gather, one row per rank."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    d = chk.positive_int("D", dp)
    states = zero_step_states(d)
    fig, ax = plt.subplots(figsize=(11, 0.55 * d + 1.9))
    _blank(ax)
    col_w, gap = 2.0, 0.85
    ax.set_xlim(-0.9, len(states) * (col_w + gap))
    ax.set_ylim(-0.9, d + 0.9)
    arrows = ("reduce-scatter", "Adam on the\nowned shard", "all-gather")
    for s, (label, held) in enumerate(states):
        x0 = s * (col_w + gap)
        for r in range(d):
            y = d - 1 - r
            for c in range(d):
                x = x0 + c * col_w / d
                ax.add_patch(Rectangle((x, y + 0.1), col_w / d, 0.7, fill=False, lw=0.5,
                                       ec="#999999"))
                parts = held[r][c]
                if parts is None:
                    continue
                w = col_w / d / len(parts)
                weights = s == len(states) - 2 or s == len(states) - 1
                for k, o in enumerate(sorted(parts)):  # stripes: whose data the value sums
                    colour = _colour(c) if weights else _colour(o)
                    ax.add_patch(Rectangle((x + k * w, y + 0.1), w, 0.7, color=colour,
                                           alpha=1.0 if weights else 0.75))
            if s == 0:
                ax.text(-0.15, y + 0.45, f"rank {r}", ha="right", va="center", fontsize=8)
        ax.text(x0 + col_w / 2, d + 0.15, label, ha="center", fontsize=8, wrap=True)
        if s < len(arrows):
            _arrow(ax, x0 + col_w + 0.08, d / 2, x0 + col_w + gap - 0.08, d / 2)
            ax.text(x0 + col_w + gap / 2, d / 2 + 0.3, arrows[s], ha="center", fontsize=7)
    _box(ax, 0.0, -0.8, len(states) * (col_w + gap) - gap, 0.5,
         "gradient stripes: whose microbatch the value sums; weight chunks: coloured by their "
         "owner. ZeRO-3 runs the all-gather per unit before it computes instead of after the "
         "update.", "#f7f7f7", 7)
    ax.set_title(
        f"One ZeRO-1/2 step on D={d} ranks: the two halves of an all-reduce with the "
        "optimizer step between them",
        fontsize=9,
    )
    fig.tight_layout()
    return fig
