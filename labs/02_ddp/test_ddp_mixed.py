"""Public tests for ddp_mixed.py: the lecture's 16-byte recipe (and its 12-byte variant) on this
lab's bucketed DDP, one 2-rank launch.

Bytes: nothing is sharded, so per rank the measured bytes equal
``accounting.memory.model_state(N, D, "ddp", recipe)`` exactly, object by object (bf16
parameters, bf16 bucket gradients, fp32 master, moments), and the distinct storages add up to
the same (the buckets are the only gradient copy).

Bit for bit: ranks agree; on 2 ranks DDP equals one process accumulating the two half-batch
gradients of ``loss / 2`` in bf16 (one rounding of the sum either way, /2 exact); the 1-process
16-byte run equals plain ``torch.optim.AdamW`` on fp32 masters. Against one process with the
whole batch in one backward, the bf16 gradients round differently: losses within 4 fp32 ulps
at step 0 (equal weights) and 2**-11 relative over 8 steps (``LOSS_RTOL``; derivation in
labs/03_zero/test_mixed_precision.py).
"""

from __future__ import annotations

import pytest
import torch
from _workers_ddp_mixed import LOSS_RTOL, RECIPES, STEP0_RTOL, STEPS
from ddp_mixed import MasterAdamW
from shardlab.accounting import memory
from shardlab.runtime import launch


@pytest.fixture(scope="module")
def two():
    return launch("_workers_ddp_mixed:suite", 2, timeout=180)


def _get(res, key, recipe, rank=0):
    run = res[rank][key][recipe]
    assert not isinstance(run, str), f"rank {rank}, {key} {recipe} raised:\n{run}"
    return run


def test_master_adamw_validates():
    p = torch.nn.Parameter(torch.zeros(3, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="moment_dtype"):
        MasterAdamW([p], moment_dtype=torch.float16)
    with pytest.raises(ValueError, match="masters has 1 tensors"):
        MasterAdamW([p], masters=[torch.zeros(4)])


@pytest.mark.parametrize("recipe", RECIPES)
def test_model_state_bytes_equal_accounting(two, recipe):
    for r in range(2):
        run = _get(two, "ddp", recipe, r)
        pred = memory.model_state(run["n_params"], 2, "ddp", recipe)
        st = run["state"]
        for obj, b in st["per_object"].items():
            assert b == pred.per_object[obj], (recipe, obj, b, pred.per_object[obj])
        assert st["total"] == pred.total and st["storages"] == pred.total, (recipe, st)


@pytest.mark.parametrize("recipe", RECIPES)
def test_bitwise_ranks_and_single_process_microbatches(two, recipe):
    run, ref = _get(two, "ddp", recipe), _get(two, "single_accum", recipe)
    assert run["weights"].dtype == torch.bfloat16
    other = _get(two, "ddp", recipe, 1)
    assert torch.equal(run["weights"], other["weights"]) and run["losses"] == other["losses"]
    assert torch.equal(run["weights"], ref["weights"]) and run["losses"] == ref["losses"]


@pytest.mark.parametrize("recipe", RECIPES)
def test_loss_trajectory_close_to_single_process(two, recipe):
    got = torch.tensor(_get(two, "ddp", recipe)["losses"], dtype=torch.float64)
    ref = torch.tensor(_get(two, "single", recipe)["losses"], dtype=torch.float64)
    assert len(ref) == STEPS
    torch.testing.assert_close(got[0], ref[0], rtol=STEP0_RTOL, atol=0)
    torch.testing.assert_close(got, ref, rtol=LOSS_RTOL, atol=0, msg=recipe)


def test_sixteen_byte_recipe_equals_pytorch_adamw(two):
    ours, theirs = _get(two, "single", "mixed-adam-16"), two[0]["torch"]
    assert not isinstance(theirs, str), theirs
    assert torch.equal(ours["weights"], theirs["weights"]) and ours["losses"] == theirs["losses"]
