"""Device-mesh calculator: G = D·t·p·c, rank lookup, group table, MoE folding.

All ranks, coordinates and groups come from :class:`shardlab.accounting.mesh.Mesh` and
:func:`shardlab.accounting.mesh.moe_fold`. Listing every group costs O(G) per axis, so the
full per-axis listing is shown for small meshes only (``G <= FULL_LISTING_MAX``); larger
meshes show the first group and the looked-up rank's group on each axis, each described by
its first and last ranks (:func:`axis_group`), so any G answers at once.
"""

from __future__ import annotations

from typing import Any

from shardlab.accounting import _validate as chk
from shardlab.accounting import mesh as acc

from ._common import Report, Table, build_calculator, html_report, parse_number

FULL_LISTING_MAX = 64  # list every group of every axis up to this many ranks
EXPERT_DETAIL_MAX = 1024  # expert coordinates/groups per rank up to this many ranks
GROUP_JSON_MAX = 4096  # a group's ranks listed in the JSON up to this many


def axis_group(mesh: acc.Mesh, rank: int, axis: str) -> range:
    """``rank``'s group along one axis as a ``range`` (equal to ``mesh.group_of(rank, axis)``):
    its members are evenly spaced by the product of the inner axes' degrees (tp innermost,
    then cp, pp, dp), so a group of 10^9 ranks costs nothing to describe."""
    stride = {"tp": 1, "cp": mesh.tp, "pp": mesh.tp * mesh.cp, "dp": mesh.tp * mesh.cp * mesh.pp}
    c = mesh.rank_to_coords(rank).as_dict()
    base = rank - c[axis] * stride[axis]
    return range(base, base + stride[axis] * mesh.sizes[axis], stride[axis])


def _ranks_data(ranks: range) -> list[int] | dict[str, int]:
    """A group for ``--json``: its ranks up to GROUP_JSON_MAX of them, else first/step/count."""
    if len(ranks) <= GROUP_JSON_MAX:
        return list(ranks)
    return {"first": ranks.start, "step": ranks.step, "count": len(ranks)}


def ranks_str(ranks: list[int], limit: int = 16) -> str:
    """``0, 8, 16, …, 120 (16 ranks)`` style abbreviation of a rank list."""
    if len(ranks) <= limit:
        return ", ".join(map(str, ranks))
    head = ", ".join(map(str, ranks[:6]))
    tail = ", ".join(map(str, ranks[-2:]))
    return f"{head}, …, {tail} ({len(ranks)} ranks)"


def mesh_report(
    G: Any = 16384,
    dp: Any = None,
    tp: Any = 8,
    pp: Any = 16,
    cp: Any = 1,
    rank: Any = None,
    ep: Any = None,
    etp: Any = 1,
) -> Report:
    """Mesh checks, per-axis group table, optional rank lookup and MoE folding.

    ``dp=None`` means ``G / (tp·cp·pp)`` (must divide). ``ep`` enables MoE parallel folding
    with ``etp`` expert-tensor ranks.
    """
    g = chk.positive_int("G", parse_number("G", G))  # 8.5 ranks: said as such, not "divide"
    t = chk.positive_int("tp", parse_number("tp", tp))
    p = chk.positive_int("pp", parse_number("pp", pp))
    c = chk.positive_int("cp", parse_number("cp", cp))
    if dp is None or dp == "":
        other = t * p * c
        if not isinstance(g, int) or not isinstance(other, int) or other <= 0 or g % other:
            raise ValueError(f"tp*cp*pp = {t}*{c}*{p} = {t * c * p} does not divide G={g}")
        d = g // other
    else:
        d = parse_number("dp", dp)
    mesh = acc.Mesh(g, d, t, p, c)
    r = None if rank is None or rank == "" else parse_number("rank", rank)
    coords = mesh.rank_to_coords(r) if r is not None else None

    cols = ["axis", "degree", "groups", "first group (rank 0's)"]
    if r is not None:
        cols.append(f"rank {r}'s group")
    rows, data_axes = [], {}
    for a in acc.AXES:
        first = axis_group(mesh, 0, a)
        row = [a, mesh.sizes[a], mesh.G // mesh.sizes[a], ranks_str(first)]
        entry: dict[str, Any] = {
            "degree": mesh.sizes[a],
            "n_groups": mesh.G // mesh.sizes[a],
            "first_group": _ranks_data(first),
        }
        if r is not None:
            mine = axis_group(mesh, r, a)
            row.append(ranks_str(mine))
            entry["rank_group"] = _ranks_data(mine)
        rows.append(row)
        data_axes[a] = entry
    tables = [
        Table(
            cols,
            rows,
            title=f"G = dp·tp·pp·cp = {d}·{t}·{p}·{c} = {g} ranks (tp innermost, then cp, pp, dp)",
        )
    ]
    data: dict[str, Any] = {
        "G": g,
        "dp": d,
        "tp": t,
        "pp": p,
        "cp": c,
        "axes": data_axes,
    }
    if coords is not None:
        cd = coords.as_dict()
        tables.append(
            Table(
                ["rank", *acc.AXES],
                [[r, *(cd[a] for a in acc.AXES)]],
                title=f"Coordinates of rank {r}",
            )
        )
        data["rank"] = r
        data["coords"] = cd
    if g <= FULL_LISTING_MAX:
        listing = []
        for a in acc.AXES:
            for i, grp in enumerate(mesh.groups(a)):
                listing.append([a, i, ", ".join(map(str, grp))])
        tables.append(Table(["axis", "group", "ranks"], listing, title="Every group"))
        data["groups"] = {a: mesh.groups(a) for a in acc.AXES}

    notes = []
    if ep is not None and ep != "":
        e = parse_number("ep", ep)
        et = parse_number("etp", etp)
        fold = acc.moe_fold(mesh, e, et)
        sizes = fold.sizes
        frows = [[a, sizes[a], (g // sizes[a])] for a in acc.EXPERT_AXES]
        ftable = Table(
            ["expert axis", "degree", "groups"],
            frows,
            title=f"MoE parallel folding per pipeline stage: dp·cp·tp = {d * c * t} = "
            f"edp·ep·etp = {fold.edp}·{fold.ep}·{fold.etp} (EP is not a factor of G)",
        )
        tables.append(ftable)
        fdata: dict[str, Any] = {"ep": fold.ep, "etp": fold.etp, "edp": fold.edp}
        if r is not None and g <= EXPERT_DETAIL_MAX:  # O(G / pp) lookups
            ec = fold.expert_coords(r)
            fdata["expert_coords"] = ec
            egroups = {a: fold.group_of(r, a) for a in acc.EXPERT_AXES}
            fdata["rank_expert_groups"] = egroups
            tables.append(
                Table(
                    ["expert axis", "coordinate", f"rank {r}'s expert group"],
                    [[a, ec[a], ranks_str(egroups[a])] for a in acc.EXPERT_AXES],
                    title=f"Rank {r} in the expert layout (pipeline stage {ec['pp']})",
                )
            )
        if g <= EXPERT_DETAIL_MAX:
            if g <= FULL_LISTING_MAX:
                fdata["groups"] = {a: fold.groups(a) for a in acc.EXPERT_AXES}
                tables.append(
                    Table(
                        ["expert axis", "group", "ranks"],
                        [
                            [a, i, ", ".join(map(str, grp))]
                            for a in acc.EXPERT_AXES
                            for i, grp in enumerate(fdata["groups"][a])
                        ],
                        title="Every expert group",
                    )
                )
        else:
            notes.append(
                f"Expert coordinates of single ranks are listed for G <= {EXPERT_DETAIL_MAX}."
            )
        data["moe_fold"] = fdata
    if g > FULL_LISTING_MAX:
        notes.append(f"Every group is listed for G <= {FULL_LISTING_MAX}.")
    return Report(
        title=f"Device mesh of {g} ranks: dp={d}, tp={t}, pp={p}, cp={c}",
        tables=tables,
        data=data,
        notes=notes,
    )


def render_mesh(**kwargs: Any) -> str:
    """HTML tables for :func:`mesh_report`'s arguments."""
    return html_report(mesh_report(**kwargs))


def mesh_calculator(
    G: int = 16384,
    dp: int = 128,
    tp: int = 8,
    pp: int = 16,
    cp: int = 1,
    rank: int = 12345,
    moe: bool = False,
    ep: int = 8,
    etp: int = 1,
):
    """Interactive device-mesh calculator (ipywidgets VBox; ``.update()`` re-renders)."""
    import ipywidgets as w

    def it(value: int, desc: str) -> Any:
        return w.IntText(value=int(value), description=desc, layout=w.Layout(width="200px"))

    controls: dict[str, Any] = {
        "G": it(G, "G (GPUs)"),
        "dp": it(dp, "D (data)"),
        "tp": it(tp, "t (tensor)"),
        "pp": it(pp, "p (pipeline)"),
        "cp": it(cp, "c (context)"),
        "rank": it(rank, "look up rank"),
        "moe": w.Checkbox(value=moe, description="MoE parallel folding"),
        "ep": it(ep, "ep (expert)"),
        "etp": it(etp, "etp (expert tensor)"),
    }

    def convert(vals: dict[str, Any]) -> dict[str, Any]:
        vals = dict(vals)
        if not vals.pop("moe"):
            vals["ep"] = None
        return vals

    return build_calculator(
        "Device mesh",
        controls,
        render_mesh,
        convert,
        rows=[["G", "dp", "tp", "pp", "cp"], ["rank", "moe", "ep", "etp"]],
    )
