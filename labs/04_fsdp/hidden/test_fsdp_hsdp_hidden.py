"""Hidden HSDP tests (one 4-rank launch, 2 x 2 mesh): accumulation, tied and frozen models,
and PyTorch FSDP2 ``fully_shard`` on the same ``(replicate, shard)`` DeviceMesh.

* ``m = 2`` with ``no_sync``: bitwise equal to one process (the reference adds the two
  microbatch gradients of ``loss / 2`` per rank, as ``no_sync`` does; then two-term sums);
  bytes per axis = ``hsdp_step_volume`` with and without syncing every microbatch: the
  replicate all-reduce still runs once per step;
* tied and frozen models: bitwise (the tied weight sits in one flat slot; frozen flats are
  never reduced, on either axis);
* FSDP2 HSDP on the same groups: **bitwise**. It reduce-scatters over the shard axis and
  all-reduces over the replicate axis, two-term sums each, and whether it divides by 4 once
  or by 2 twice the result is exact (powers of two); measured: max |difference| 0.
"""

from __future__ import annotations

import pytest
from shardlab.runtime import launch


@pytest.fixture(scope="module")
def extra():
    return launch("_workers_fsdp_hsdp:extra_hsdp", 4, quiet=True, timeout=240)[0]


def test_hsdp_accumulation_and_models_bitwise(extra):
    for key, run in extra["accum"].items():
        assert run["split"]["bitwise"], (key, run["split"])
        assert run["replicas_agree"], key


def test_hsdp_accumulation_bytes_per_axis(extra):
    once, every = extra["comm"]
    for row in (once, every):
        for axis in ("shard", "replicate"):
            assert row["measured"][axis]["bytes"] == row["predicted"][axis], (axis, row)
    assert once["measured"]["replicate"] == every["measured"]["replicate"]
    assert every["measured"]["shard"]["count"] == once["measured"]["shard"]["count"] + 3


def test_hsdp_equal_to_pytorch_fsdp2(extra):
    assert extra["fsdp2"]["bitwise"], extra["fsdp2"]
