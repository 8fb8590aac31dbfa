"""Hidden tests of Lab 01 (instructor only): more sizes and dtypes, uneven chunks, exact
integer sums, balance of the ring, the ``group`` argument."""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # lab folder

import _workers_collectives as W  # noqa: E402
from shardlab.grading.outside import record  # noqa: E402
from shardlab.runtime import launch  # noqa: E402

DTYPES = ["float64", "bfloat16", "int32", "int64_large"]
UNEVEN3 = [1, 2, 4, 5, 8, 10, 11, 100, 101, 3001, 3002]  # none divisible by 3


def _record(results, keys=("rs", "ag", "ar")):
    """Hand the results to the grader, compared with the reference's outside the sandbox."""
    for per_rank in results:
        for c in per_rank:
            for k in keys:
                name = f"{k} {c['dtype']} D{c['world']} rank{c['rank']} numel{c['numel']}"
                record(name, c["values"][k])


def _failures(results, keys=("rs", "ag", "ar")):
    return [
        f"D={c['world']} rank {c['rank']} {c['dtype']} numel={c['numel']} {k}: {c[k]}"
        for per_rank in results
        for c in per_rank
        for k in keys
        if c[k]
    ]


@pytest.fixture(scope="module")
def dtype_results():
    """D=3, every dtype of DTYPES on a few sizes, one launch."""
    per_rank = launch(W.check_dtypes, 3, DTYPES, [1, 3, 7, 96, 257], 5, True, timeout=180)
    return {dt: [r[i] for r in per_rank] for i, dt in enumerate(DTYPES)}


@pytest.fixture(scope="module")
def uneven3():
    return launch(W.check_collectives, 3, UNEVEN3, "float32", 11, True, True, timeout=120)


@pytest.mark.parametrize("dtype", DTYPES)
def test_many_dtypes(dtype_results, dtype):
    _record(dtype_results[dtype])
    bad = _failures(dtype_results[dtype])
    assert not bad, "\n".join(bad[:8])


def test_integer_sum_is_exact(dtype_results):
    """int64 values near 2**60: any detour through floating point changes the sum."""
    _record(dtype_results["int64_large"])
    _record(dtype_results["int32"])
    bad = _failures(dtype_results["int64_large"]) + _failures(dtype_results["int32"])
    assert not bad, "\n".join(bad[:8])


def test_uneven_three_ranks(uneven3):
    """Chunks of unequal size on 3 ranks: a wrong chunk index or length shows up as wrong values."""
    _record(uneven3)
    bad = _failures(uneven3)
    assert not bad, "\n".join(bad[:8])


def test_uneven_bytes_balanced(uneven3):
    """Sum over ranks is exactly 2V(D-1); no rank sends more than 2(D-1) largest chunks."""
    d = 3
    for i, numel in enumerate(UNEVEN3):
        per_rank = [uneven3[r][i]["sent_bytes"] for r in range(d)]
        ops = sorted({op for r in range(d) for op in uneven3[r][i]["ops"]})
        record(f"sent and ops numel{numel}", [sum(per_rank), ops])
        v = 4 * numel
        assert sum(per_rank) == 2 * v * (d - 1), (numel, per_rank)
        biggest = 4 * -(-numel // d)
        assert max(per_rank) <= 2 * (d - 1) * biggest, (numel, per_rank)
        assert not any(uneven3[r][i]["ops"] for r in range(d))


def test_group_argument():
    errors = launch(W.check_subgroup, 3, [0, 2], [1, 5, 64, 99], timeout=120)
    bad = [e for per_rank in errors for e in per_rank]
    assert not bad, "\n".join(bad[:8])
