"""Public tests of Lab 01: ring collectives against torch.distributed on 2, 3 and 4 ranks.

One launch per group size runs every check on many sizes (starting ranks is the slow part);
the tests below assert on different parts of its results. Run with
``pytest test_collectives.py -q`` from the lab folder.
"""

from __future__ import annotations

import math

import _workers_collectives as W
import collectives as C
import pytest
import torch
from shardlab.accounting.comm import ring_sent_bytes
from shardlab.grading.outside import record
from shardlab.runtime import launch

# divisible and non-divisible by 2, 3, 4; smaller than D; a few larger
SIZES = [1, 2, 3, 4, 5, 7, 12, 13, 64, 1000, 1001, 4099]


@pytest.fixture(scope="module", params=[2, 3, 4], ids=lambda d: f"D{d}")
def launched(request):
    """One launch per group size: the ring checks and the all-to-all checks."""
    return launch(
        W.check_collectives_and_all_to_all, request.param, SIZES, "float32", 0, True, timeout=90
    )


@pytest.fixture(scope="module")
def results(launched):
    """Every rank's per-size summaries for one group size: list (ranks) of lists (sizes)."""
    return [r["rings"] for r in launched]


@pytest.fixture(scope="module")
def a2a(launched):
    """Every rank's all-to-all summaries (one per random split matrix), flattened."""
    return [c for r in launched for c in r["a2a"]]


def _record(results, key):
    """Hand every rank's result of check ``key`` to the grader, which compares it with the
    reference solution's outside the sandbox (rubric ``[outside]``; a no-op elsewhere)."""
    for per_rank in results:
        for c in per_rank:
            record(f"{key} D{c['world']} rank{c['rank']} numel{c['numel']}", c["values"][key])


def _failures(results, key):
    return [
        f"D={c['world']} rank {c['rank']} numel={c['numel']}: {c[key]}"
        for per_rank in results
        for c in per_rank
        if c[key]
    ]


def test_chunk_bounds_match_tensor_split():
    for numel in range(0, 20):
        for d in range(1, 6):
            want = [t.numel() for t in torch.tensor_split(torch.empty(numel), d)]
            assert [hi - lo for lo, hi in C.chunk_bounds(numel, d)] == want


def test_ring_reduce_scatter(results):
    _record(results, "rs")
    bad = _failures(results, "rs")
    assert not bad, "\n".join(bad[:8])


def test_ring_all_gather(results):
    _record(results, "ag")
    bad = _failures(results, "ag")
    assert not bad, "\n".join(bad[:8])


def test_ring_all_reduce(results):
    _record(results, "ar")
    bad = _failures(results, "ar")
    assert not bad, "\n".join(bad[:8])


def test_all_reduce_uses_only_point_to_point(results):
    assert not _failures(results, "ar"), "ring_all_reduce must produce correct results first"
    assert all(c["n_records"] > 0 for per_rank in results for c in per_rank), "no sends traced"
    ops = {op for per_rank in results for c in per_rank for op in c["ops"]}
    record("non-p2p ops", sorted(ops))
    assert not ops, f"ring_all_reduce must use only send/recv, but the trace saw {sorted(ops)}"


def test_all_reduce_sent_bytes(results):
    """Traced bytes sent by the composed all-reduce = ring model, ``2V(D-1)/D`` per rank.

    When D divides the element count every rank sends exactly that. Otherwise chunks differ
    by one element, per-rank bytes differ slightly, and the sum over ranks is still exactly
    ``2V(D-1) = D · ring_sent_bytes``.
    """
    d = len(results)
    for i, numel in enumerate(SIZES):
        per_rank = [results[r][i]["sent_bytes"] for r in range(d)]
        # per-rank bytes of uneven chunks depend on the ring's chunk order: only their sum
        record(f"sent D{d} numel{numel}", per_rank if numel % d == 0 else sum(per_rank))
        v = numel * 4  # float32
        model = ring_sent_bytes("all_reduce", v, d)
        assert sum(per_rank) == 2 * v * (d - 1), (numel, per_rank)
        assert math.isclose(sum(per_rank), d * model, rel_tol=1e-12)
        if numel % d == 0:
            assert all(math.isclose(b, model, rel_tol=1e-12) for b in per_rank), (
                f"numel={numel}, D={d}: traced {per_rank} bytes per rank, model {model}"
            )


def test_all_to_all_matches_all_to_all_single(a2a):
    """Uneven (and some empty) blocks; the result must be bitwise equal to PyTorch's."""
    for c in a2a:
        record(f"a2a D{c['world']} rank{c['rank']} seed{c['seed']}", c["got"])
    bad = [
        f"D={c['world']} rank {c['rank']} splits={c['splits']}: {c['err']}" for c in a2a if c["err"]
    ]
    assert not bad, "\n".join(bad[:8])


def test_all_to_all_point_to_point_bytes(a2a):
    """Only send/recv; each rank sends exactly the rows of its blocks for other ranks."""
    assert not any(c["err"] for c in a2a), "all_to_all must produce correct results first"
    for c in a2a:
        record(f"a2a D{c['world']} rank{c['rank']} seed{c['seed']}", [c["ops"], c["sent_bytes"]])
        assert not c["ops"], f"all_to_all must use only send/recv, the trace saw {c['ops']}"
        assert c["sent_bytes"] == c["expected_bytes"], c
    assert any(c["expected_bytes"] > 0 for c in a2a)
