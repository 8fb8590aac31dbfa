"""Public tests of HSDP (``FSDP(..., replicate_group=...)``): one 4-rank launch, a 2 x 2 mesh.

Mesh ``(replicate, shard) = (2, 2)`` (``_workers_fsdp_hsdp.hsdp_mesh``): state sharded over
the 2 ranks of a row, replicated over the 2 rows.

* bytes per rank per axis, ring model, = ``accounting.hierarchical.hsdp_step_volume``
  exactly: shard axis 3 q N (S-1)/S (2 q N (S-1)/S without resharding) in all-gathers and
  reduce-scatters over 2 ranks; replicate axis one all-reduce per flat parameter of its
  averaged gradient shard, 2 q (N/S) (R-1)/R, over 2 ranks;
* state per rank = ``memory.model_state(N_padded, S, "zero3", "fp32")`` (ZeRO-3 over the
  shard axis: the replicas do not shrink it), no gathered copy left;
* against one process doing HSDP's arithmetic (``reference_hsdp``): **bitwise**. Every sum
  has two terms (2 shards, then 2 replicas), so gloo's order cannot matter, and the two
  divisions by 2 are exact. Against the full-batch run: the tolerances of ``test_fsdp.py``
  (1e-5 AdamW, lr/100 for the key bias whose gradient is pure rounding noise);
* the replicas hold bitwise the same shards after training.
"""

from __future__ import annotations

import pytest
from _workers_fsdp import LR
from shardlab.runtime import launch


@pytest.fixture(scope="module")
def rep():
    return launch("_workers_fsdp_hsdp:check_hsdp", 4, quiet=True, timeout=240)[0]


def test_hsdp_bitwise_equal_to_reference(rep):
    assert rep["mesh"] == (2, 2)
    run = rep["plain"]
    assert run["split"]["bitwise"], run["split"]
    assert run["replicas_agree"]
    assert run["full"]["max_abs_nonzero_grad"] <= 1e-5, run["full"]
    assert run["full"]["max_abs"] <= LR["adamw"] / 100, run["full"]


def test_hsdp_bytes_per_axis_equal_accounting(rep):
    for row in rep["comm"]:
        got, want = row["measured"], row["predicted"]
        assert got["other"] == [], row  # nothing but gathers, reduce-scatters, all-reduces
        for axis in ("shard", "replicate"):
            assert got[axis]["bytes"] == want[axis], (axis, row)
            assert got[axis]["group_sizes"] == [2], (axis, row)
        assert got["replicate"]["count"] == 3, row  # one all-reduce per flat param (3 units)
    on, off = rep["comm"]
    assert on["measured"]["shard"]["bytes"] == 1.5 * off["measured"]["shard"]["bytes"]


def test_hsdp_state_is_zero3_over_the_shard_axis(rep):
    st = rep["state"]
    assert st["measured_bytes"] == st["predicted_bytes"], st
    assert st["gathered_left"] == 0, st
