"""Hidden tests of the context-parallel lab: one 4-rank launch (GQA and MQA shapes, batch 2,
zig-zag balance, all-gather memory, ring attention on sub-groups of the world).

Tolerance against full attention: ``1e-5``, as in ``test_context.py`` (same reason)."""

from __future__ import annotations

import pytest
from _workers_context import GQA_CASES, compare, memory_prediction, predicted_bytes, reference
from ring_attention import CPConfig, unshard
from shardlab.runtime import launch

TOL = 1e-5


@pytest.fixture(scope="module")
def hidden():
    return launch("_workers_context:hidden_report", 4, quiet=True)


def test_gqa_mqa_mha_equal_full_attention(hidden):
    for i, (cfg, variant) in enumerate(GQA_CASES):
        rows = [rank["runs"][i] for rank in hidden]
        err = compare(rows, cfg)
        assert max(err.values()) <= TOL, (cfg, variant, err)


def test_gqa_bytes_scale_with_kv_heads(hidden):
    for i, (cfg, variant) in enumerate(GQA_CASES):
        for rank in hidden:
            for phase in ("forward", "backward"):
                assert rank["runs"][i]["sent"][phase] == predicted_bytes(cfg, variant, phase)
    mqa, mha = GQA_CASES[0][0], GQA_CASES[1][0]
    per_token_mqa = predicted_bytes(mqa, "ring", "forward") / (mqa.batch * mqa.s)
    per_token_mha = predicted_bytes(mha, "ring", "forward") / (mha.batch * mha.s)
    assert per_token_mha / per_token_mqa == (4 * 8) / (1 * 16)  # kv_heads x head_dim


def test_zigzag_balances_causal_work(hidden):
    """Score elements each rank computed in one causal forward (s=64, c=4): contiguous ranks
    do 1, 2, 3, 4 blocks' worth; zig-zag ranks 2.5 each."""
    n2 = (64 // 4) ** 2 * 4  # one (n x n) block for 4 heads
    contiguous = [rank["work"][False] for rank in hidden]
    zigzag = [rank["work"][True] for rank in hidden]
    assert contiguous == [n2, 2 * n2, 3 * n2, 4 * n2]
    assert zigzag == [5 * n2 // 2] * 4
    assert sum(zigzag) == sum(contiguous)


def test_all_gather_memory_within_one_buffer_of_prediction(hidden):
    """Measured peak of the all-gather forward is the prediction, or above it by at most one
    gathered K (or V) buffer: gloo may release the all-gather's output buffer a moment late
    on its worker thread (seen on some ranks in some runs, never more than one buffer)."""
    for rank in hidden:
        for row in rank["memory"]:
            cfg = CPConfig(s=row["s"], c=4, causal=False)
            pred = memory_prediction(cfg, "all_gather")
            late = pred["kv_buffers"] / 2
            assert pred["total"] <= row["measured"] <= pred["total"] + late, (row, pred)


def test_ring_on_subgroups(hidden):
    cfg = CPConfig(s=32, c=2, causal=True, zigzag=True)
    for first in (0, 1):  # group [0, 2] and group [1, 3]
        rows = [hidden[first]["sub"], hidden[first + 2]["sub"]]
        ref = reference(cfg, rows[0]["seed"])
        for name in ("out", "dq", "dk", "dv"):
            got = unshard([row[name] for row in rows], cfg.zigzag)
            assert (got - ref[name]).abs().max().item() <= TOL, (first, name)
