"""Hidden tests of the pipeline lab: 3 ranks with uneven stages, and more microbatches and
chunks on 2 ranks, the V schedules included (tolerances: the docstring of test_pipeline.py)."""

from __future__ import annotations

import pytest
from _workers_pipeline import compare, config, launch_checks, reference
from shardlab.accounting import pipeline as acc

UNEVEN = [3, 3, 2]  # 8 layers on 3 ranks: the first two stages carry one layer more
V1 = [("gpipe", 1), ("1f1b", 1), ("zb-h1", 1)]
MANY = [("interleaved", 4), ("zb-h1", 1), ("zbv", 2), ("dualpipev", 2)]  # m = 8 on 2 ranks


@pytest.fixture(scope="module")
def three():
    return launch_checks(3, 6, V1, layers=UNEVEN)


@pytest.fixture(scope="module")
def many():
    return launch_checks(2, 8, MANY, trace=False)


def test_three_uneven_stages_equal_single_process(three):
    ref = reference(m=6, n=12)
    for key in V1:
        runs = [r[key] for r in three]
        assert [b for r in runs for b in r["bounds"]] == [(0, 3), (3, 6), (6, 8)]
        cmp = compare(runs, ref)
        assert cmp["params"] == cmp["params_total"]
        assert cmp["loss"] == cmp["grads"] == cmp["weights"] == 0, (key, cmp)


def test_three_ranks_bytes_and_memory(three):
    cfg = config()
    for kind, v in V1:
        for r, run in enumerate(three):
            sent = run[(kind, v)]["sent"]
            assert sent == acc.p2p_sent_bytes(r, 3, 2, cfg.seq_len, cfg.d_model, 4, 6, v)
            got = run[(kind, v)]  # zb-h1 keeps only the layers' inputs from BI to BW
            pred = acc.inflight_bytes(
                acc.schedule(kind, 3, 6)[r], got["chunk_bytes"], got["kept_bytes"]
            )
            assert 0.95 <= run[(kind, v)]["act_peak"] / pred <= 1.05, (kind, r)


def test_four_chunks_and_eight_microbatches(many):
    ref = reference(m=8, n=16)
    for key in MANY:
        runs = [r[key] for r in many]
        assert [r["order"] for r in runs] == [
            [str(a) for a in acts] for acts in acc.schedule(key[0], 2, 8, key[1])
        ]
        cmp = compare(runs, ref)
        assert cmp["loss"] == cmp["grads"] == cmp["weights"] == 0, (key, cmp)
