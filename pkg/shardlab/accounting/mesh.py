"""Device meshes for combined parallelism: ``G = D * t * p * c``, ranks, groups, MoE folding.

Lecture 8, "Real runs combine layouts"; Grattafiori et al., *The Llama 3 Herd of Models*,
Sec. 3.3.2 and Table 4; Megatron Core MoE documentation, "MoE Parallel Folding".

Axis order, innermost (fastest-varying rank) first: **tp, cp, pp, dp** - the order the
Llama 3 report uses, so tensor-parallel peers are adjacent ranks (the same server) and
data parallelism spans the slowest links::

    rank = ((dp_i * pp + pp_i) * cp + cp_i) * tp + tp_i

A group along an axis is the set of ranks that differ only in that axis' coordinate; there
are ``G / degree`` such groups, each of ``degree`` ranks. Sequence parallelism reuses the tp
group and is not a factor. Llama 3 405B: ``8*1*16*128`` (8K context) and ``8*16*16*8``
(128K context), both ``16,384`` GPUs.

**MoE parallel folding.** Expert layers re-partition the *same* ranks: within one pipeline
stage, the ``dp*cp*tp`` ranks that run attention are folded into ``edp * ep * etp``
(expert-tensor innermost, then expert, then expert-data). EP is therefore not another
factor of G: ``ep * etp`` must divide ``dp * cp * tp`` and ``edp = dp*cp*tp / (ep*etp)``.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import _validate as v

AXES = ("tp", "cp", "pp", "dp")  # innermost first
EXPERT_AXES = ("etp", "ep", "edp")  # innermost first


@dataclass(frozen=True)
class Coords:
    dp: int
    pp: int
    cp: int
    tp: int

    def as_dict(self) -> dict[str, int]:
        return {"dp": self.dp, "pp": self.pp, "cp": self.cp, "tp": self.tp}


def _axes_arg(axis: str | tuple[str, ...], allowed: tuple[str, ...]) -> tuple[str, ...]:
    names = (axis,) if isinstance(axis, str) else tuple(axis)
    if not names:
        raise ValueError("axis=() names no axis")
    for a in names:
        v.choice("axis", a, allowed)
    if len(set(names)) != len(names):
        raise ValueError(f"axis={axis!r} repeats an axis")
    return names


def _groups(sizes: dict[str, int], order: tuple[str, ...], names: tuple[str, ...], ranks):
    """Group positions of a mixed-radix index (``order`` innermost first) that differ only in
    the axes ``names``; map positions through ``ranks``; return sorted rank lists."""
    stride, step = {}, 1
    for a in order:
        stride[a] = step
        step *= sizes[a]
    offsets, bases = [0], [0]
    for a in order:
        spread = [stride[a] * i for i in range(sizes[a])]
        if a in names:
            offsets = [o + x for o in offsets for x in spread]
        else:
            bases = [b + x for b in bases for x in spread]
    return sorted(sorted(ranks[b + o] for o in offsets) for b in bases)


def _product(sizes: list[int]):
    """All index tuples of a grid with the given sizes (last index fastest)."""
    if not sizes:
        yield ()
        return
    for head in range(sizes[0]):
        for tail in _product(sizes[1:]):
            yield (head, *tail)


@dataclass(frozen=True)
class Mesh:
    """A validated dense mesh of ``G = dp * tp * pp * cp`` ranks (tp innermost)."""

    G: int
    dp: int
    tp: int
    pp: int
    cp: int = 1

    def __post_init__(self) -> None:
        g = v.positive_int("G", self.G)
        for name in ("dp", "tp", "pp", "cp"):
            d = v.positive_int(name, getattr(self, name))
            v.divides(name, d, "G", g)
            object.__setattr__(self, name, d)
        object.__setattr__(self, "G", g)
        prod = self.dp * self.tp * self.pp * self.cp
        if prod != g:
            raise ValueError(
                f"dp*tp*pp*cp = {self.dp}*{self.tp}*{self.pp}*{self.cp} = {prod} != G={g}"
            )

    @property
    def sizes(self) -> dict[str, int]:
        return {"tp": self.tp, "cp": self.cp, "pp": self.pp, "dp": self.dp}

    def rank_to_coords(self, rank: int) -> Coords:
        r = v.nonneg_int("rank", rank)
        if r >= self.G:
            raise ValueError(f"rank={r} is outside 0..{self.G - 1} (G={self.G})")
        tp_i, r = r % self.tp, r // self.tp
        cp_i, r = r % self.cp, r // self.cp
        pp_i, dp_i = r % self.pp, r // self.pp
        return Coords(dp=dp_i, pp=pp_i, cp=cp_i, tp=tp_i)

    def coords_to_rank(self, dp: int = 0, pp: int = 0, cp: int = 0, tp: int = 0) -> int:
        c = {}
        for name, x in (("dp", dp), ("pp", pp), ("cp", cp), ("tp", tp)):
            c[name] = v.nonneg_int(name, x)
            if c[name] >= self.sizes[name]:
                raise ValueError(f"{name}={c[name]} is outside 0..{self.sizes[name] - 1}")
        return ((c["dp"] * self.pp + c["pp"]) * self.cp + c["cp"]) * self.tp + c["tp"]

    def groups(self, axis: str | tuple[str, ...]) -> list[list[int]]:
        """Rank lists of every group along ``axis`` (or a tuple of axes, e.g. ``("dp","cp")``)."""
        names = _axes_arg(axis, AXES)
        return _groups(self.sizes, AXES, names, range(self.G))

    def group_of(self, rank: int, axis: str | tuple[str, ...]) -> list[int]:
        """The ranks in ``rank``'s group along ``axis``."""
        c = self.rank_to_coords(rank).as_dict()
        names = _axes_arg(axis, AXES)
        fixed = {a: c[a] for a in AXES if a not in names}
        out = []
        for idx in _product([self.sizes[a] for a in names]):
            out.append(self.coords_to_rank(**fixed, **dict(zip(names, idx))))
        return sorted(out)

    def check_model(self, layers: int, heads: int, seq_len: int | None = None) -> None:
        """Raise ``ValueError`` if the model cannot be laid out on this mesh."""
        n_layers = v.positive_int("layers", layers)
        n_heads = v.positive_int("heads", heads)
        if self.pp > n_layers:
            raise ValueError(f"pp={self.pp} stages exceed layers={n_layers}")
        if n_heads % self.tp:
            raise ValueError(f"heads={n_heads} are not divisible by tp={self.tp}")
        if seq_len is not None:
            s = v.positive_int("seq_len", seq_len)
            if s % self.cp:
                raise ValueError(f"cp={self.cp} does not divide seq_len={s}")

    def as_rows(self) -> list[dict[str, object]]:
        """One row per axis: degree, number of groups, the first group's ranks."""
        return [
            {
                "axis": a,
                "degree": self.sizes[a],
                "n_groups": self.G // self.sizes[a],
                "first_group": self.group_of(0, a),
            }
            for a in AXES
        ]


@dataclass(frozen=True)
class MoeFold:
    """Expert-layer groups folded over the ranks of ``mesh`` (same pp stages)."""

    mesh: Mesh
    ep: int
    etp: int
    edp: int

    @property
    def sizes(self) -> dict[str, int]:
        return {"etp": self.etp, "ep": self.ep, "edp": self.edp}

    def _stage_ranks(self, pp_i: int) -> list[int]:
        # The ranks of stage pp_i in increasing order: dp outermost, then cp, then tp.
        m = self.mesh
        return [
            ((d * m.pp + pp_i) * m.cp + c) * m.tp + t
            for d in range(m.dp)
            for c in range(m.cp)
            for t in range(m.tp)
        ]

    def _stage_index(self, rank: int) -> tuple[int, int]:
        """(pp coordinate, position of ``rank`` among its stage's ranks), in O(1)."""
        c = self.mesh.rank_to_coords(rank)
        return c.pp, (c.dp * self.mesh.cp + c.cp) * self.mesh.tp + c.tp

    def expert_coords(self, rank: int) -> dict[str, int]:
        """``{"pp", "edp", "ep", "etp"}`` coordinates of ``rank`` in the expert layout."""
        pp_i, j = self._stage_index(rank)
        edp_i, rest = divmod(j, self.etp * self.ep)
        return {"pp": pp_i, "edp": edp_i, "ep": rest // self.etp, "etp": rest % self.etp}

    def group_of(self, rank: int, axis: str | tuple[str, ...]) -> list[int]:
        """The ranks in ``rank``'s expert group along ``axis`` (without listing every group)."""
        names = _axes_arg(axis, EXPERT_AXES)
        pp_i, _ = self._stage_index(rank)
        c = self.expert_coords(rank)
        stride = {"etp": 1, "ep": self.etp, "edp": self.etp * self.ep}
        fixed = sum(c[a] * stride[a] for a in EXPERT_AXES if a not in names)
        stage = self._stage_ranks(pp_i)
        out = []
        for idx in _product([self.sizes[a] for a in names]):
            j = fixed + sum(i * stride[a] for a, i in zip(names, idx))
            out.append(stage[j])
        return sorted(out)

    def groups(self, axis: str | tuple[str, ...]) -> list[list[int]]:
        """Rank lists of every expert group along ``axis`` in ``("etp", "ep", "edp")``."""
        names = _axes_arg(axis, EXPERT_AXES)
        out = []
        for pp_i in range(self.mesh.pp):
            out += _groups(self.sizes, EXPERT_AXES, names, self._stage_ranks(pp_i))
        return sorted(out)


def moe_fold(mesh: Mesh, ep: int, etp: int = 1, num_experts: int | None = None) -> MoeFold:
    """Fold expert parallelism over ``mesh``: ``edp = dp*cp*tp / (ep*etp)`` per stage."""
    if not isinstance(mesh, Mesh):
        raise ValueError(f"mesh={mesh!r} must be a Mesh")
    e = v.positive_int("ep", ep)
    et = v.positive_int("etp", etp)
    per_stage = mesh.dp * mesh.cp * mesh.tp
    if per_stage % (e * et):
        raise ValueError(
            f"ep*etp = {e}*{et} = {e * et} does not divide dp*cp*tp = "
            f"{mesh.dp}*{mesh.cp}*{mesh.tp} = {per_stage}"
        )
    if num_experts is not None:
        ne = v.positive_int("num_experts", num_experts)
        v.divides("ep", e, "num_experts", ne)
    return MoeFold(mesh, e, et, per_stage // (e * et))
