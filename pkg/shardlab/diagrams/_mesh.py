"""The device mesh ``G = D t p c`` with one rank's groups along each axis highlighted."""

from __future__ import annotations

from shardlab.accounting.mesh import Mesh

AXIS_COLOURS = {"tp": "#d62728", "cp": "#9467bd", "pp": "#2ca02c", "dp": "#1f77b4"}


def mesh_groups(dp: int = 2, tp: int = 4, pp: int = 2, cp: int = 1, rank: int = 5):
    """Every rank as a cell (``tp`` innermost, as in :class:`Mesh`); ``rank``'s groups outlined.

    Rows are ``(dp, pp)`` pairs, columns ``(cp, tp)`` pairs, so the tensor group is a run of
    neighbours in one row (one fast domain) and the data group a column.
    """
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    mesh = Mesh(dp * tp * pp * cp, dp=dp, tp=tp, pp=pp, cp=cp)
    groups = {a: set(mesh.group_of(rank, a)) for a in ("tp", "cp", "pp", "dp")}
    cols, rows = cp * tp, dp * pp
    fig, ax = plt.subplots(figsize=(max(4.0, 0.7 * cols + 2.5), 0.6 * rows + 1.5))
    for g in range(mesh.G):
        co = mesh.rank_to_coords(g)
        x, y = co.cp * tp + co.tp, rows - 1 - (co.dp * pp + co.pp)
        ax.add_patch(Rectangle((x, y), 1, 1, fc="#ffffff", ec="#bbbbbb", lw=0.6))
        ax.text(x + 0.5, y + 0.5, str(g), ha="center", va="center", fontsize=8,
                weight="bold" if g == rank else "normal")
        for k, (axis, col) in enumerate(AXIS_COLOURS.items()):
            if g in groups[axis] and mesh.sizes[axis] > 1:
                inset = 0.06 + 0.07 * k  # nested outlines: a rank can be in several groups
                ax.add_patch(Rectangle((x + inset, y + inset), 1 - 2 * inset, 1 - 2 * inset,
                                       fill=False, ec=col, lw=1.6))
    for axis, col in AXIS_COLOURS.items():
        ax.plot([], [], color=col, lw=2, label=f"{axis} group of rank {rank} ({len(groups[axis])})")
    ax.set_xlim(0, cols)
    ax.set_ylim(0, rows)
    ax.set_aspect("equal")
    ax.set_xticks(
        [i + 0.5 for i in range(cols)], [f"c{i // tp} t{i % tp}" for i in range(cols)], fontsize=7
    )
    ax.set_yticks(
        [rows - 0.5 - j for j in range(rows)],
        [f"d{j // pp} p{j % pp}" for j in range(rows)],
        fontsize=7,
    )
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    ax.set_title(f"G = D·t·p·c = {dp}·{tp}·{pp}·{cp} = {mesh.G} ranks", fontsize=10)
    fig.tight_layout()
    return fig
