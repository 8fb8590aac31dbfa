"""Tensor-parallel diagrams: attention split by heads, and one whole transformer layer under TP."""

from __future__ import annotations

from shardlab.accounting import _validate as chk

from ._data_parallel import _colour
from ._model_parallel import _arrow, _blank, _box


def head_owners(heads: int = 8, t: int = 2) -> list[int]:
    """``owner[i]`` = the tensor-parallel rank that computes head ``i``: ``a/t`` consecutive heads
    per rank (with their columns of W_Q, W_K, W_V and rows of W_O). ``t`` must divide ``a``."""
    a = chk.positive_int("a (heads)", heads)
    t = chk.positive_int("t", t)
    chk.divides("t", t, "a (heads)", a)
    return [i // (a // t) for i in range(a)]


def tp_attention_heads(heads: int = 8, t: int = 2):
    """Attention under TP: Q/K/V column-split by whole heads, softmax local, W_O row-split, g sums."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    owner = head_owners(heads, t)
    a, t = len(owner), max(owner) + 1
    per = a // t
    fig, ax = plt.subplots(figsize=(11, 1.0 * t + 1.8))
    _blank(ax)
    ax.set_xlim(0, 11)
    ax.set_ylim(-0.7, t + 0.6)
    mid = t / 2
    _box(ax, 0.1, mid - 0.35, 1.0, 0.7, "X\n(b·s, h)\nreplicated")
    _box(ax, 1.4, mid - 0.3, 0.5, 0.6, "f", "#fff2b3", 10)
    _arrow(ax, 1.1, mid, 1.4, mid)
    for r in range(t):
        y = t - 1 - r + 0.1
        mine = [i for i in range(a) if owner[i] == r]
        _arrow(ax, 1.9, mid, 2.3, y + 0.4)
        _box(ax, 2.3, y, 1.9, 0.8, f"Q, K, V of heads {mine[0]}–{mine[-1]}\ncolumns of W_Q, W_K, W_V"
             f"\n(h, {per}·h/{a}) each", _colour(r) + "55", 7)
        # one square per head: the core runs on each head alone, no communication
        for k, i in enumerate(mine):
            ax.add_patch(Rectangle((4.5 + k * 1.9 / per, y + 0.1), 1.9 / per * 0.85, 0.6,
                                   color=_colour(r), alpha=0.6))
            ax.text(4.5 + (k + 0.42) * 1.9 / per, y + 0.4, f"h{i}", ha="center", va="center",
                    fontsize=6)
        ax.text(5.45, y + 0.78, "softmax(QKᵀ/√d)·V per head, local", ha="center", fontsize=6)
        _box(ax, 6.7, y, 1.8, 0.8, f"rows of W_O for\nheads {mine[0]}–{mine[-1]}\n→ partial (b·s, h)",
             _colour(r) + "55", 7)
        _arrow(ax, 4.2, y + 0.4, 4.5, y + 0.4)
        _arrow(ax, 6.4, y + 0.4, 6.7, y + 0.4)
        _arrow(ax, 8.5, y + 0.4, 8.9, mid)
    _box(ax, 8.9, mid - 0.3, 0.5, 0.6, "g", "#fff2b3", 10)
    _box(ax, 9.7, mid - 0.35, 1.2, 0.7, "Z = Σ partial\n(b·s, h)")
    _arrow(ax, 9.4, mid, 9.7, mid)
    ax.text(5.5, -0.55, f"a={a} heads over t={t} ranks: {per} whole heads each; t must divide a "
            "(and the K/V heads of grouped-query attention)", ha="center", fontsize=8)
    ax.set_title("Attention split by heads: column-parallel Q/K/V, local softmax, row-parallel "
                 "output projection (colour = rank)", fontsize=9)
    fig.tight_layout()
    return fig


# One TP transformer layer: (label, region, collective in forward, collective in backward).
# region: "replicated" (every rank computes the whole tensor), "split" (1/t per rank), "comm".
TP_LAYER_STEPS: tuple[tuple[str, str, str | None, str | None], ...] = (
    ("LayerNorm\n(b·s, h)", "replicated", None, None),
    ("f", "comm", None, "all-reduce"),
    ("Q, K, V\nheads a/t", "split", None, None),
    ("attention core\nper head", "split", None, None),
    ("W_O rows\npartial sum", "split", None, None),
    ("g", "comm", "all-reduce", None),
    ("dropout\n+ residual", "replicated", None, None),
    ("LayerNorm\n(b·s, h)", "replicated", None, None),
    ("f", "comm", None, "all-reduce"),
    ("A: 4h/t\ncolumns", "split", None, None),
    ("GeLU\nlocal", "split", None, None),
    ("B: 4h/t rows\npartial sum", "split", None, None),
    ("g", "comm", "all-reduce", None),
    ("dropout\n+ residual", "replicated", None, None),
)


def tp_layer_collectives() -> dict[str, int]:
    """All-reduces one TP layer issues: ``{"forward": 2, "backward": 2}`` (the ``g``s and ``f``s).

    ``comm.tp_volume`` prices exactly these four all-reduces of a ``b·s·h`` tensor.
    """
    return {
        "forward": sum(s[2] == "all-reduce" for s in TP_LAYER_STEPS),
        "backward": sum(s[3] == "all-reduce" for s in TP_LAYER_STEPS),
    }


def tp_layer():
    """A whole transformer layer under tensor parallelism: what is split, what is replicated,
    and where the four all-reduces of a layer sit."""
    import matplotlib.pyplot as plt

    colours = {"replicated": "#e0e0e0", "split": "#c6dbef", "comm": "#fff2b3"}
    fig, ax = plt.subplots(figsize=(12, 2.9))
    _blank(ax)
    n = len(TP_LAYER_STEPS)
    step = 12.0 / n
    ax.set_xlim(0, 12)
    ax.set_ylim(-0.2, 2.9)
    prev_right = None
    for i, (text, region, fwd, bwd) in enumerate(TP_LAYER_STEPS):
        x = 0.05 + i * step
        w = step * (0.5 if region == "comm" else 0.88)
        if region == "comm":
            x += step * 0.19
        _box(ax, x, 1.2, w, 0.9, text, colours[region], 7 if region != "comm" else 10)
        if fwd:
            ax.text(x + w / 2, 2.25, f"fwd:\n{fwd}", ha="center", fontsize=6.5, color="#08519c")
        if bwd:
            ax.text(x + w / 2, 0.85, f"bwd: {bwd}", ha="center", fontsize=6.5, color="#a50f15")
        if prev_right is not None:
            _arrow(ax, prev_right, 1.65, x, 1.65)
        prev_right = x + w
    _box(ax, 0.05, 0.0, 3.6, 0.55, "replicated: every rank computes the full (b·s, h) tensor",
         colours["replicated"], 7)
    _box(ax, 4.0, 0.0, 3.6, 0.55, "split over t: 1/t of the heads or MLP columns, full sequence",
         colours["split"], 7)
    k = tp_layer_collectives()
    _box(ax, 7.95, 0.0, 4.0, 0.55, f"{k['forward']} all-reduces forward (g), {k['backward']} "
         "backward (f), each of b·s·h elements", colours["comm"], 7)
    ax.set_title("One transformer layer under tensor parallelism (Megatron-LM): attention block, "
                 "then MLP block, each entered by f and left by g", fontsize=9)
    fig.tight_layout()
    return fig
