"""Public tests: the lecture's 16-byte recipe on this lab's FSDP (ZeRO-3), one 2-rank launch.

``lecture`` split (bf16 shards and gradients, fp32 master shards and moments in the optimizer):
per rank the bytes equal ``accounting.memory.model_state(N_pad, D, "zero3", "mixed-adam-16")``
object by object (ratio 1.000 as an integer equality), and the distinct storages add up to the
same number (the gathered buffers hold 0 bytes after a step). ``fsdp2`` split (the fp32 shard
is the master, bf16 only while gathered, fp32 gradients): the same total, with the 2 bytes of
stored bf16 weights moved to the gradients.

Bit for bit: ranks agree; on 2 ranks the bf16 reduce-scatter adds two numbers and rounds once
and /2 is exact, which is what one process computes accumulating the two half-batch gradients
of ``loss / 2`` in bf16, stepping fp32 masters with ``torch.optim.AdamW``: equal bitwise.
Against one process with the whole batch in one backward: 4 fp32 ulps at step 0, then
rtol 2**-11 (``LOSS_RTOL``; derivation in labs/03_zero/test_mixed_precision.py).
"""

from __future__ import annotations

import pytest
import torch
from _workers_fsdp_mixed import LOSS_RTOL, STEP0_RTOL, STEPS
from shardlab.accounting import memory
from shardlab.runtime import launch


@pytest.fixture(scope="module")
def two():
    return launch("_workers_fsdp_mixed:suite", 2, timeout=180)


def _get(res, key, rank=0):
    run = res[rank][key]
    assert not isinstance(run, str), f"rank {rank}, {key} raised:\n{run}"
    return run


def test_lecture_split_bytes_equal_accounting(two):
    for r in range(2):
        run = _get(two, "lecture", r)
        pred = memory.model_state(run["padded_numel"], 2, "zero3", "mixed-adam-16")
        st = run["state"]
        for obj, b in st["per_object"].items():
            assert b == pred.per_object[obj], (obj, b, pred.per_object[obj])
        assert st["total"] == pred.total and st["storages"] == pred.total, st


def test_fsdp2_split_has_the_same_total(two):
    for r in range(2):
        run = _get(two, "fsdp2", r)
        pred = memory.model_state(run["padded_numel"], 2, "zero3", "mixed-adam-16")
        st = run["state"]
        assert st["total"] == pred.total and st["storages"] == pred.total, st
        assert st["per_object"]["weights"] == 0  # no stored bf16 copy
        moved = pred.per_object["grads"] + pred.per_object["weights"]
        assert st["per_object"]["grads"] == moved  # fp32 gradient shards: 2 + 2 bytes


def test_bitwise_ranks_and_single_process_microbatches(two):
    run, ref = _get(two, "lecture"), _get(two, "single_accum")
    other = _get(two, "lecture", 1)
    assert run["losses"] == other["losses"] and run["losses"] == ref["losses"]
    assert set(run["weights"]) == set(ref["weights"])
    for name, w in ref["weights"].items():
        assert run["weights"][name].dtype == torch.bfloat16
        assert torch.equal(run["weights"][name], w), name
        assert torch.equal(other["weights"][name], w), name


def test_loss_trajectory_close_to_single_process(two):
    got = torch.tensor(_get(two, "lecture")["losses"], dtype=torch.float64)
    ref = torch.tensor(_get(two, "single")["losses"], dtype=torch.float64)
    assert len(ref) == STEPS
    torch.testing.assert_close(got[0], ref[0], rtol=STEP0_RTOL, atol=0)
    torch.testing.assert_close(got, ref, rtol=LOSS_RTOL, atol=0)
