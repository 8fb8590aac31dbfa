"""Hidden tests of the MoE lab: one 4-rank launch (heavy drops, k = E, near-empty messages,
capacity sweep). Same tolerances as test_expert.py (float64: 1e-12 relative)."""

from __future__ import annotations

import _workers_expert as W
import moe as M
import pytest
from shardlab.accounting import expert as acc

HEAVY = M.MoEConfig(hidden=8, ffn=8, num_experts=8, top_k=2, capacity_factor=0.5, ep=4)
ALL_K = M.MoEConfig(hidden=6, ffn=10, num_experts=4, top_k=4, capacity_factor=2.0, ep=4)
TINY = M.MoEConfig(hidden=4, ffn=4, num_experts=8, top_k=1, capacity_factor=0.01, ep=4)
CASES = [(HEAVY, 16, 5, "float64"), (ALL_K, 8, 6, "float64"), (TINY, 6, 7, "float64")]
CFS = [0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 4.0]
ERRS = ["err_y", "err_aux", "err_dx", "err_drouter", "err_dw1", "err_dw2"]


@pytest.fixture(scope="module")
def ep4(tmp_path_factory):
    res = W.launch_once(
        tmp_path_factory, "hidden-ep4", W.check_many, 4, CASES, (HEAVY, 16, CFS), timeout=150
    )
    return [[r["cases"][i] for r in res] for i in range(len(CASES))], [r["sweep"] for r in res]


def _check_values(ranks):
    tol = 1e-12 * max(1.0, ranks[0]["scale"])
    bad = [(r["rank"], k, r[k]) for r in ranks for k in ERRS if r[k] > tol]
    assert not bad, bad


def test_four_ranks_heavy_drops(ep4):
    ranks = ep4[0][0]
    assert ranks[0]["dropped"] > 0.3 * 4 * 16 * 2  # cf = 0.5 drops at least a third
    assert ranks[0]["kept"] == ranks[0]["ref_kept"]
    _check_values(ranks)


def test_top_k_equals_experts_drops_nothing(ep4):
    ranks = ep4[0][1]
    assert ranks[0]["dropped"] == 0
    assert all(c == 8 for row in ranks[0]["kept"] for c in row)  # every token to every expert
    _check_values(ranks)


def test_nearly_empty_messages(ep4):
    """Capacity 1: most all-to-all messages are empty, some ranks send nothing at all."""
    ranks = ep4[0][2]
    assert ranks[0]["capacity"] == 1
    assert sum(map(sum, ranks[0]["kept"])) <= 8
    _check_values(ranks)


def test_bytes_four_ranks(ep4):
    for (cfg, _, _, _), ranks in zip(CASES, ep4[0]):
        both = acc.a2a_sent_bytes(ranks[0]["kept"], cfg.hidden, 8, backward=True)
        for r in ranks:
            assert r["sent"]["forward"] * 2 == both[r["rank"]]
            assert r["sent"]["backward"] * 2 == both[r["rank"]]


def test_dropped_against_capacity_factor(ep4):
    sweep = ep4[1]
    rows = sweep[0]
    assert [r["cf"] for r in rows] == CFS
    drops = [r["dropped"] for r in rows]
    assert drops == sorted(drops, reverse=True) and drops[-1] == 0 and drops[0] > 0
    for i, row in enumerate(rows):
        cap = acc.capacity(4 * 16, 8, 2, row["cf"])
        assert row["capacity"] == cap
        assert row["dropped"] == sum(max(0, c - cap) for c in row["counts"])
        assert row["kept"] == [min(c, cap) for c in row["counts"]]
        # the rows each rank's experts received add up to every kept copy
        assert sum(s[i]["rows_in"] for s in sweep) == sum(row["kept"])
        fwd = acc.a2a_sent_bytes(row["kept_matrix"], 8, 4)
        assert [s[i]["sent"] for s in sweep] == fwd
