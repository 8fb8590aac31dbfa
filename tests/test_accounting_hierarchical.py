"""Hierarchical collectives, HSDP volume per axis and ZeRO-Offload against hand-worked cases.

Hand case (two-level cluster): V = 1e9 bytes all-reduced over 32 ranks in 4 domains of 8,
beta 100 GB/s inside a domain and 10 GB/s between domains.

* hierarchical: reduce-scatter inside 1e9 * 7/8 = 875e6, all-reduce of the 125e6 shard
  across 2 * 125e6 * 3/4 = 187.5e6, all-gather inside 875e6. With alpha = 0:
  1.75e9 / 1e11 + 187.5e6 / 1e10 = 0.0175 + 0.01875 = 0.03625 s;
* flat ring over 32 ranks on the slow link: 2e9 * 31/32 = 1.9375e9 bytes, 0.19375 s.
* latency (alpha_in = 1 us, alpha_out = 10 us): 7 + 7 rounds inside, 6 across:
  +14e-6 + 6e-5 = 7.4e-5 s; the flat ring: 62 rounds of 10 us = 6.2e-4 s.
"""

from __future__ import annotations

import pytest
from shardlab.accounting import comm
from shardlab.accounting import hierarchical as H


def test_hierarchical_all_reduce_bytes_per_level():
    levels = H.hierarchical_all_reduce(1e9, 8, 4, 0.0, 1e11, 0.0, 1e10)
    assert [(lv.level, lv.op, lv.group_size) for lv in levels] == [
        ("inner", "reduce_scatter", 8), ("outer", "all_reduce", 4), ("inner", "all_gather", 8)
    ]
    assert [lv.sent_bytes for lv in levels] == [875e6, 187.5e6, 875e6]
    assert H.level_bytes(levels) == {"inner": 1.75e9, "outer": 187.5e6}
    assert sum(lv.seconds for lv in levels) == pytest.approx(0.03625, rel=1e-12)


def test_hierarchical_against_flat_ring():
    hier = H.hierarchical_all_reduce_time(1e9, 8, 4, 0.0, 1e11, 0.0, 1e10)
    flat = H.flat_all_reduce_time(1e9, 8, 4, 0.0, 1e10)
    assert flat == pytest.approx(0.19375, rel=1e-12)
    assert flat / hier == pytest.approx(0.19375 / 0.03625, rel=1e-12)
    lat_h = H.hierarchical_all_reduce_time(0, 8, 4, 1e-6, 1e11, 1e-5, 1e10)
    lat_f = H.flat_all_reduce_time(0, 8, 4, 1e-5, 1e10)
    assert lat_h == pytest.approx(7.4e-5, rel=1e-12)
    assert lat_f == pytest.approx(6.2e-4, rel=1e-12)


def test_one_domain_and_one_rank_domains_reduce_to_the_flat_ring():
    # outer = 1: the all-reduce is a reduce-scatter + all-gather = the flat ring's bytes
    one = H.level_bytes(H.hierarchical_all_reduce(1e6, 4, 1))
    assert one == {"inner": comm.sent_bytes("all_reduce", 1e6, 4), "outer": 0.0}
    # inner = 1: nothing inside; the all-reduce across is the flat ring over the domains
    sing = H.level_bytes(H.hierarchical_all_reduce(1e6, 1, 4))
    assert sing == {"inner": 0.0, "outer": comm.sent_bytes("all_reduce", 1e6, 4)}


def test_hsdp_step_volume_per_axis():
    # N = 1000 padded, 2 shards x 2 replicas, fp32: U = 4 * 1000 * 1/2 = 2000
    assert H.hsdp_step_volume(1000, 2, 2, q=4) == {"shard": 6000.0, "replicate": 2000.0}
    assert H.hsdp_step_volume(1000, 2, 2, 4, reshard_after_forward=False)["shard"] == 4000.0
    # m = 2 with no_sync: (2 * 2 + 1) U on the shard axis; the all-reduce is still once
    assert H.hsdp_step_volume(1000, 2, 2, 4, True, 2, False) == {
        "shard": 10000.0,
        "replicate": 2000.0,
    }
    assert H.hsdp_step_volume(1000, 2, 2, 4, True, 2, True)["shard"] == 12000.0
    # one replica is plain ZeRO-3: nothing on the replicate axis
    assert H.hsdp_step_volume(1000, 2, 1, 4)["replicate"] == 0.0
    # 8 shards x 4 replicas, bf16, N = 8e9: the all-reduce carries 2 (2 N / 8) 3/4
    assert H.hsdp_step_volume(8_000_000_000, 8, 4)["replicate"] == 3e9


def test_replicate_traffic_count_changes_latency_not_bytes():
    t1, b1 = H.hsdp_replicate_traffic(8e9, 8, 4, 1, 1e-5, 1e10)
    t24, b24 = H.hsdp_replicate_traffic(8e9, 8, 4, 24, 1e-5, 1e10)
    assert b1 == pytest.approx(b24, rel=1e-12) and b1 == 1.5e9
    assert t24 - t1 == pytest.approx(23 * 6 * 1e-5, rel=1e-9)


def test_offload_hand_case():
    # 1e9 params on one rank, PCIe 25 GB/s, host 100 GB/s, device 3 TB/s, Adam 32 B/param
    off = H.offload_step(1_000_000_000)
    assert (off.device_bytes, off.host_bytes, off.pcie_bytes) == (4e9, 12e9, 4e9)
    assert off.pcie_seconds == pytest.approx(0.16)
    assert off.host_update_seconds == pytest.approx(0.32)
    assert off.added_seconds == pytest.approx(0.16 + 0.32 - 32e9 / 3e12)
    assert not off.pays
    assert H.offload_step(1_000_000_000, slack_seconds=0.5).pays
    # 8 ranks share the work: each moves and updates an eighth
    assert H.offload_step(1_000_000_000, dp=8).pcie_bytes == 5e8


@pytest.mark.parametrize(
    "call, words",
    [
        (lambda: H.hierarchical_all_reduce(1e6, 0, 4), "inner"),
        (lambda: H.hsdp_step_volume(1001, 2, 2), "shard=2"),
        (lambda: H.hsdp_step_volume(1000, 2, 0), "replicate"),
        (lambda: H.offload_step(0), "n_params"),
    ],
)
def test_bad_inputs_are_sentences(call, words):
    with pytest.raises(ValueError, match=words):
        call()
