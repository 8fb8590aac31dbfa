"""Model-parallel diagrams: TP linear splits, SP regions, ring attention blocks, MoE dispatch."""

from __future__ import annotations

from shardlab.accounting import _validate as chk

from ._data_parallel import _colour


def _box(ax, x, y, w, h, text, colour="#f0f0f0", fs=8):
    from matplotlib.patches import FancyBboxPatch

    ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.02", fc=colour, ec="k", lw=0.7))
    ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=fs)


def _arrow(ax, x0, y0, x1, y1, text="", colour="k"):
    ax.annotate("", (x1, y1), (x0, y0), arrowprops={"arrowstyle": "->", "color": colour, "lw": 1})
    if text:
        ax.text((x0 + x1) / 2, (y0 + y1) / 2 + 0.12, text, ha="center", fontsize=8, color=colour)


def _blank(ax):
    ax.set_axis_off()
    ax.set_aspect("auto")


def tp_linear_splits(t: int = 2):
    """Column-parallel A (split by output columns) then row-parallel B (split by input rows).

    ``f`` (identity forward, all-reduce backward) enters the pair; ``g`` (all-reduce forward,
    identity backward) leaves it: one all-reduce each way per MLP or attention block.
    """
    import matplotlib.pyplot as plt

    t = chk.positive_int("t", t)
    fig, ax = plt.subplots(figsize=(10, 0.9 * t + 1.6))
    _blank(ax)
    ax.set_xlim(0, 10)
    ax.set_ylim(-0.6, t + 0.6)
    mid = t / 2
    _box(ax, 0.1, mid - 0.35, 1.0, 0.7, "X\n(b·s, h)\nreplicated")
    _box(ax, 1.6, mid - 0.3, 0.6, 0.6, "f", "#fff2b3", 10)
    _arrow(ax, 1.1, mid, 1.6, mid)
    for r in range(t):
        y = t - 1 - r + 0.1
        _arrow(ax, 2.2, mid, 2.9, y + 0.4)
        _box(ax, 2.9, y, 1.6, 0.8, f"X·A{r}\nA{r}: (h, 4h/{t})", _colour(r) + "55")
        _box(ax, 4.8, y, 0.9, 0.8, "GeLU\nlocal", _colour(r) + "33")
        _box(ax, 6.0, y, 1.6, 0.8, f"Y{r}·B{r}\nB{r}: (4h/{t}, h)", _colour(r) + "55")
        _arrow(ax, 4.5, y + 0.4, 4.8, y + 0.4)
        _arrow(ax, 5.7, y + 0.4, 6.0, y + 0.4)
        _arrow(ax, 7.6, y + 0.4, 8.0, mid)
    _box(ax, 8.0, mid - 0.3, 0.6, 0.6, "g", "#fff2b3", 10)
    _box(ax, 8.9, mid - 0.35, 1.0, 0.7, "Z = Σ partial\n(b·s, h)")
    _arrow(ax, 8.6, mid, 8.9, mid)
    ax.text(
        5.0,
        -0.45,
        "f: identity forward, all-reduce of dX backward    g: all-reduce of the partial sums "
        "forward, identity backward",
        ha="center",
        fontsize=8,
    )
    ax.set_title(f"Column-parallel then row-parallel linear over t={t} ranks (colour = rank)")
    fig.tight_layout()
    return fig


def sp_regions():
    """One transformer layer under TP + SP: where the sequence is sharded and where heads are."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(11, 2.6))
    _blank(ax)
    ax.set_xlim(0, 11)
    ax.set_ylim(0, 2.6)
    sp, tp, comm = "#c7e9c0", "#c6dbef", "#fff2b3"
    steps = [
        ("LayerNorm\n(s/t, b, h)", sp),
        ("all-gather\nseq → full", comm),
        ("attention\nheads a/t", tp),
        ("reduce-scatter\nfull → s/t", comm),
        ("dropout + add\n(s/t, b, h)", sp),
        ("LayerNorm\n(s/t, b, h)", sp),
        ("all-gather", comm),
        ("MLP\n4h/t columns", tp),
        ("reduce-scatter", comm),
        ("dropout + add\n(s/t, b, h)", sp),
    ]
    w = 0.95
    for i, (text, col) in enumerate(steps):
        _box(ax, 0.1 + i * 1.08, 1.0, w, 0.9, text, col, 7)
        if i:
            _arrow(ax, 0.1 + i * 1.08 - 0.13, 1.45, 0.1 + i * 1.08, 1.45)
    for x, text, col in [(0.1, "sequence-parallel region:\nactivations hold s/t positions", sp),
                         (3.8, "tensor-parallel region: full sequence,\n1/t of the heads / MLP columns", tp),
                         (7.5, "all-gather forward = reduce-scatter\nbackward (and the mirror)", comm)]:
        _box(ax, x, 0.1, 3.3, 0.6, text, col, 7)
    ax.set_title(
        "Sequence parallelism: the all-reduce of g becomes reduce-scatter + all-gather, the "
        "same bytes, and LayerNorm/dropout activations shrink by t",
        fontsize=9,
    )
    fig.tight_layout()
    return fig


def ring_attention(c: int = 4):
    """Causal block matrix (query chunk x key chunk): which rank computes it, at which ring step.

    Left: contiguous layout, rank ``i`` holds chunk ``i`` (the last rank does ``c`` blocks, the
    first one). Right: zig-zag, rank ``i`` holds chunks ``i`` and ``2c-1-i``: equal work.
    """
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    c = chk.positive_int("c", c)
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.6))
    layouts = {
        f"contiguous: {c} chunks": ({i: [i] for i in range(c)}, c),
        f"zig-zag: {2 * c} chunks": ({i: [i, 2 * c - 1 - i] for i in range(c)}, 2 * c),
    }
    for ax, (title, (owner_chunks, n)) in zip(axes, layouts.items()):
        owner = {ch: r for r, chs in owner_chunks.items() for ch in chs}
        work = [0.0] * c
        area = (c / n) ** 2  # a block's work in units of a contiguous-layout block
        for q in range(n):
            for k in range(q + 1):  # causal: query chunk q sees key chunks 0..q
                r = owner[q]
                step = (r - owner[k]) % c  # K/V of rank owner[k] reaches r after this many hops
                work[r] += area * (1 if k < q else 0.5)  # the diagonal block is half masked
                ax.add_patch(
                    Rectangle(
                        (k, n - 1 - q), 1, 1, color=_colour(r), alpha=0.35 + 0.15 * (step % 4)
                    )
                )
                ax.text(k + 0.5, n - 0.5 - q, str(step), ha="center", va="center", fontsize=7)
        ax.set_xlim(0, n)
        ax.set_ylim(0, n)
        ax.set_aspect("equal")
        ax.set_xticks([i + 0.5 for i in range(n)], [str(i) for i in range(n)], fontsize=7)
        ax.set_yticks(
            [n - 0.5 - i for i in range(n)], [f"q{i}→r{owner[i]}" for i in range(n)], fontsize=7
        )
        ax.set_xlabel("key chunk (number = ring step at which its K/V arrive)")
        ax.set_title(
            f"{title}\nwork per rank (contiguous blocks): " + ", ".join(f"{w:g}" for w in work),
            fontsize=9,
        )
    fig.suptitle(f"Causal ring attention over c={c} ranks (colour = rank computing the block)")
    fig.tight_layout()
    return fig


def moe_dispatch(
    tokens_per_rank: tuple[tuple[int, ...], ...] = (
        (2, 1, 0, 1),
        (0, 2, 1, 1),
        (1, 0, 3, 0),
        (1, 1, 0, 2),
    ),
):
    """Tokens of each rank sent to the experts' ranks (all-to-all) and back (second all-to-all).

    ``tokens_per_rank[src][e]`` tokens of rank ``src`` are routed to expert ``e``. The
    dispatch all-to-all sends them to the expert's rank, the return all-to-all brings each
    output back to the token's own rank, where the router weights combine them.
    """
    import matplotlib.pyplot as plt

    src_n = len(tokens_per_rank)
    n_exp = len(tokens_per_rank[0]) if src_n else 0
    if src_n == 0 or n_exp == 0 or any(len(row) != n_exp for row in tokens_per_rank):
        raise ValueError(f"tokens_per_rank must be a non-empty rectangle, got {tokens_per_rank!r}")
    fig, ax = plt.subplots(figsize=(9, 0.8 * max(src_n, n_exp) + 1.2))
    _blank(ax)
    h = max(src_n, n_exp)
    ax.set_xlim(0, 9)
    ax.set_ylim(-0.3, h + 0.3)
    for r in range(src_n):
        y = h - 1 - r * h / src_n
        _box(ax, 0.2, y, 1.4, 0.7, f"rank {r}\n{sum(tokens_per_rank[r])} tokens", _colour(r) + "55")
        _box(ax, 7.4, y, 1.4, 0.7, f"rank {r}\ncombine", _colour(r) + "55")
    for e in range(n_exp):
        y = h - 1 - e * h / n_exp
        where = f" on rank {e * src_n // n_exp}" if n_exp >= src_n else ""
        got = sum(row[e] for row in tokens_per_rank)
        _box(ax, 3.8, y, 1.4, 0.7, f"expert {e}{where}\n{got} tokens", "#eeeeee", 7)
    for r in range(src_n):
        for e in range(n_exp):
            k = tokens_per_rank[r][e]
            if not k:
                continue
            ys, ye = h - 1 - r * h / src_n + 0.35, h - 1 - e * h / n_exp + 0.35
            ax.annotate(
                "",
                (3.8, ye),
                (1.6, ys),
                arrowprops={"arrowstyle": "->", "color": _colour(r), "lw": 0.6 + 0.6 * k},
            )
            ax.annotate(
                "",
                (7.4, ys),
                (5.2, ye),
                arrowprops={
                    "arrowstyle": "->",
                    "color": _colour(r),
                    "lw": 0.6 + 0.6 * k,
                    "ls": "--",
                },
            )
    ax.text(2.7, h + 0.05, "all-to-all (dispatch)", ha="center", fontsize=8)
    ax.text(6.3, h + 0.05, "all-to-all (return)", ha="center", fontsize=8)
    ax.set_title(
        "Expert parallelism: uneven split sizes per pair of ranks; line width = tokens", fontsize=9
    )
    fig.tight_layout()
    return fig
