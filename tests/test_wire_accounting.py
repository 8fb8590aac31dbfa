"""accounting.wire: the backends' own algorithms beside the ring model (pure Python)."""

from __future__ import annotations

import pytest
from shardlab import accounting as acc
from shardlab.accounting import wire


@pytest.mark.parametrize(
    "d, root", [(d, root) for d in (1, 2, 3, 4, 5, 8, 13) for root in (0, 1, 4) if root < d]
)
def test_binomial_tree_sends_each_copy_once(d, root):
    kids = [acc.binomial_children(r, root, d) for r in range(d)]
    assert sum(kids) == d - 1  # every rank but the root receives exactly one copy
    assert kids[root] == (d - 1).bit_length()  # ceil(log2 D)
    leaves = [r for r in range(d) if kids[r] == 0]
    assert len(leaves) >= (d - 1) // 2


def test_gloo_versus_ring():
    v = 1_000_000
    for d in (2, 3, 4):
        ring_rs = acc.ring_sent_bytes("reduce_scatter", v, d)
        assert acc.gloo_sent_bytes("reduce_scatter", v, d) == 2 * ring_rs
        assert acc.gloo_sent_bytes("reduce_scatter", v, d) == acc.ring_sent_bytes(
            "all_reduce", v, d
        )
        for op in ("all_reduce", "all_gather", "all_to_all"):
            assert acc.gloo_sent_bytes(op, v, d) == acc.ring_sent_bytes(op, v, d)
        total = sum(acc.gloo_sent_bytes("broadcast", v, d, r, 0) for r in range(d))
        assert total == (d - 1) * v
    assert [acc.gloo_sent_bytes("broadcast", v, 4, r, 0) for r in range(4)] == [2 * v, v, 0, 0]
    assert acc.gloo_sent_bytes("all_reduce", v, 1) == 0


def test_nccl_ring_model():
    v = 8.0
    for d in (2, 3, 4):
        for op in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all"):
            assert wire.nccl_sent_bytes(op, v, d) == acc.ring_sent_bytes(op, v, d)
        chain = [wire.nccl_sent_bytes("broadcast", v, d, r, 1) for r in range(d)]
        assert chain.count(0.0) == 1 and chain[0] == 0.0 and sum(chain) == (d - 1) * v
    assert acc.backend_sent_bytes("nccl", "reduce_scatter", v, 4) == 6.0
    assert acc.backend_sent_bytes("gloo", "reduce_scatter", v, 4) == 12.0


def test_p2p_control_bytes():
    assert wire.gloo_p2p_control_bytes(1) == (48, 96)
    assert wire.gloo_p2p_control_bytes(0, recvs=1) == (48, 48)
    assert wire.gloo_p2p_control_bytes(3, 3) == (288, 432)


@pytest.mark.parametrize(
    "call, msg",
    [
        (lambda: acc.gloo_sent_bytes("broadcast", 8, 4, rank=4), "rank=4 and root=0"),
        (lambda: acc.binomial_children(0, 5, 4), "root=5 must both be < group_size=4"),
        (lambda: acc.gloo_sent_bytes("gather", 8, 4), "op"),
        (lambda: acc.backend_sent_bytes("mpi", "all_reduce", 8, 4), "backend='mpi'"),
        (lambda: acc.gloo_sent_bytes("all_reduce", -1, 4), "nbytes=-1"),
        (lambda: wire.gloo_p2p_control_bytes(sends=-1), "sends=-1"),
    ],
)
def test_bad_input_names_the_values(call, msg):
    with pytest.raises(ValueError, match=msg):
        call()
