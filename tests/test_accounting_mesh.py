"""Device mesh: G = D t p c, rank <-> coordinates, groups, Llama 3 meshes, MoE folding."""

import itertools

import pytest
from shardlab.accounting.mesh import AXES, Coords, Mesh, moe_fold

LLAMA3 = [(16384, 128, 8, 16, 1), (16384, 8, 8, 16, 16)]  # (G, dp, tp, pp, cp)


@pytest.mark.parametrize(("G", "dp", "tp", "pp", "cp"), LLAMA3)
def test_llama3_405b(G, dp, tp, pp, cp):
    m = Mesh(G, dp=dp, tp=tp, pp=pp, cp=cp)
    assert m.dp * m.tp * m.pp * m.cp == 16384
    assert m.groups("tp")[0] == list(range(8))  # tp innermost: one 8-GPU server
    last = m.rank_to_coords(G - 1)
    assert last == Coords(dp=dp - 1, pp=pp - 1, cp=cp - 1, tp=tp - 1)
    for axis in AXES:
        assert len(m.groups(axis)) == G // m.sizes[axis]


def test_llama3_mesh_values():
    assert [(dp, tp, pp, cp) for _, dp, tp, pp, cp in LLAMA3] == [(128, 8, 16, 1), (8, 8, 16, 16)]


MESHES = [(1, 1, 1, 1), (2, 1, 1, 1), (2, 2, 2, 2), (3, 2, 1, 2), (1, 4, 2, 1), (2, 3, 4, 1)]


@pytest.mark.parametrize(("dp", "tp", "pp", "cp"), MESHES)
def test_roundtrip_and_groups(dp, tp, pp, cp):
    G = dp * tp * pp * cp
    m = Mesh(G, dp, tp, pp, cp)
    for r in range(G):
        c = m.rank_to_coords(r)
        assert m.coords_to_rank(**c.as_dict()) == r
        assert r == ((c.dp * pp + c.pp) * cp + c.cp) * tp + c.tp
    for axes in itertools.chain.from_iterable(itertools.combinations(AXES, k) for k in range(1, 5)):
        groups = m.groups(axes)
        size = 1
        for a in axes:
            size *= m.sizes[a]
        assert all(len(g) == size for g in groups)
        assert sorted(r for g in groups for r in g) == list(range(G))  # a partition
        for g in groups:  # ranks in a group differ only along the named axes
            fixed = [a for a in AXES if a not in axes]
            coords = [m.rank_to_coords(r).as_dict() for r in g]
            assert all(all(c[a] == coords[0][a] for a in fixed) for c in coords)
            assert m.group_of(g[-1], axes) == g


def test_moe_folding():
    m = Mesh(16, dp=4, tp=2, pp=2, cp=1)
    f = moe_fold(m, ep=4, etp=1, num_experts=8)
    assert (f.ep, f.etp, f.edp) == (4, 1, 2)
    # folding re-partitions each stage's ranks: nothing is multiplied into G
    for axis in ("ep", "etp", "edp"):
        groups = f.groups(axis)
        assert sorted(r for g in groups for r in g) == list(range(16))
    stage0 = sorted(r for r in range(16) if m.rank_to_coords(r).pp == 0)
    assert f.groups(("edp", "ep", "etp"))[0] == stage0
    assert f.groups("ep")[0] == stage0[:4]
    assert f.expert_coords(stage0[5]) == {"pp": 0, "edp": 1, "ep": 1, "etp": 0}
    # ep=8 over dp*cp*tp=8 ranks per stage is allowed although ep > dp
    assert moe_fold(m, ep=8).edp == 1


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ((16, 3, 2, 2), "dp=3 does not divide G=16"),
        ((16, 2, 2, 2), r"dp\*tp\*pp\*cp = 2\*2\*2\*1 = 8 != G=16"),
        ((0, 1, 1, 1), "G=0"),
        ((16, 0, 4, 4), "dp=0"),
        ((16, 4, 2.5, 2), "tp=2.5"),
        ((16, True, 4, 4), "dp=True"),
    ],
)
def test_mesh_validation(args, match):
    with pytest.raises(ValueError, match=match):
        Mesh(*args)


def test_other_validation():
    m = Mesh(8, 2, 2, 2)
    with pytest.raises(ValueError, match="rank=8"):
        m.rank_to_coords(8)
    with pytest.raises(ValueError, match="tp=2"):
        m.coords_to_rank(tp=2)
    with pytest.raises(ValueError, match="axis='ep'"):
        m.groups("ep")
    with pytest.raises(ValueError, match="pp=2 stages exceed layers=1"):
        m.check_model(layers=1, heads=4)
    with pytest.raises(ValueError, match="heads=3 are not divisible by tp=2"):
        m.check_model(layers=4, heads=3)
    m.check_model(layers=4, heads=4, seq_len=16)
    with pytest.raises(ValueError, match=r"ep\*etp = 3\*1 = 3 does not divide dp\*cp\*tp"):
        moe_fold(m, ep=3)
    with pytest.raises(ValueError, match="ep=4 does not divide num_experts=6"):
        moe_fold(m, ep=4, num_experts=6)
    rows = m.as_rows()
    assert [r["axis"] for r in rows] == list(AXES) and rows[0]["first_group"] == [0, 1]


def test_moe_group_of_matches_group_lists_and_is_fast_for_llama_scale():
    from shardlab.accounting.mesh import Mesh, moe_fold

    fold = moe_fold(Mesh(G=32, dp=2, tp=2, pp=2, cp=4), ep=4, etp=2)
    for axis in ("etp", "ep", "edp", ("ep", "etp")):
        groups = fold.groups(axis)
        for rank in range(32):
            mine = fold.group_of(rank, axis)
            assert rank in mine and mine in groups
    # O(group) lookup on the 16,384-GPU mesh: the 64 ranks of rank 12345's expert group.
    big = moe_fold(Mesh(G=16384, dp=128, tp=8, pp=16, cp=1), ep=64)
    group = big.group_of(12345, "ep")
    assert len(group) == 64 and 12345 in group
    assert all(big.expert_coords(r)["ep"] == i for i, r in enumerate(group))
