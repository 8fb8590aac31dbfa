"""Hidden tests for zero1.py and zero2.py: 3 ranks, odd sizes (padding), param groups, a rank
that owns nothing, bucket edge cases. D = 3 is not a power of two, so only the tolerance applies."""

from __future__ import annotations

import math

import pytest
import torch
from _workers_zero import STEPS
from shardlab.accounting import comm, memory
from shardlab.grading.outside import record
from shardlab.runtime import launch

EPS = torch.finfo(torch.float32).eps
TOL = {"rtol": 16 * EPS * STEPS, "atol": 16 * EPS * STEPS}
ZERO1 = [
    ("odd-adamw", "odd", "adamw", False),
    ("odd-sgd-groups", "odd", "sgd", True),
    ("frozen-adamw-groups", "frozen", "adamw", True),
    ("two-adamw", "two", "adamw", False),  # 2 tensors on 3 ranks: one owns nothing
]
ZERO2 = [
    ("odd-adamw", "odd", "adamw", 0.0005, 1),
    ("odd-sgd-tiny-buckets-no-sync", "odd", "sgd", 1e-6, 2),
    ("tied-adamw-one-bucket", "tied", "adamw", 1000.0, 1),
    ("two-adamw", "two", "adamw", 0.0005, 1),
]


@pytest.fixture(scope="module")
def three():
    return launch(
        "_workers_zero:suite", 3, zero1_cases=ZERO1, zero2_cases=ZERO2,
        measure_kw={"kind": "odd", "bucket_size_mb": 1e-6}, profile=False, timeout=240,
    )


def _check(res, stage, name):
    runs = [r["correctness"][stage][name] for r in res]
    for r, st in enumerate(runs):  # to the grader, compared outside the sandbox (rubric)
        record(f"{stage} {name} D3 rank{r}", st if isinstance(st, dict) else None)
    for r, st in enumerate(runs):
        assert not isinstance(st, str), f"rank {r} raised in {stage} {name}:\n{st}"
    ref = res[0]["correctness"]["ref" + stage[-1]][name]
    for st in runs:
        for k in ref:
            assert torch.equal(st[k], runs[0][k]), (stage, name, k)
            torch.testing.assert_close(st[k], ref[k], **TOL, msg=f"{stage} {name}: {k}")


@pytest.mark.parametrize("name", [c[0] for c in ZERO1])
def test_zero1_three_ranks(three, name):
    _check(three, "zero1", name)


@pytest.mark.parametrize("name", [c[0] for c in ZERO2])
def test_zero2_three_ranks(three, name):
    _check(three, "zero2", name)


def test_padding_accounted(three):
    for r, m in enumerate(three):
        z1, z2 = m["measure"]["zero1"], m["measure"]["zero2"]
        keys = ("padded_numel", "step_sent", "accum_sent_sync=True", "accum_sent_sync=False")
        record(
            f"padding rank{r}",
            [[float(z[k]) for k in keys if k in z] for z in (z1, z2)]
            + [{k: z2["state"][k] for k in sorted(z2["state"])}, max(z1["loads"])],
        )
        assert z2["padded_numel"] > z2["n_params"], "odd sizes on 3 ranks need padding"
        assert z2["padded_numel"] % 3 == 0
        pred = memory.model_state(z2["padded_numel"], 3, "zero2", memory.RECIPES["fp32"])
        for obj in ("weights", "grads", "moment1", "moment2"):
            assert z2["state"][obj] == pred.per_object[obj], obj
        assert z1["padded_numel"] == 3 * max(z1["loads"])
        for z, layout in ((z1, "zero1"), (z2, "zero2")):
            pred_sent = comm.step_volume(layout, z["padded_numel"], 3, 4)
            assert math.isclose(z["step_sent"], pred_sent, rel_tol=1e-12)
        for sync in (True, False):
            pred_acc = comm.grad_accum_volume(
                "zero2", z2["padded_numel"], 3, 4, m["measure"]["microbatches"], sync
            )
            assert math.isclose(z2[f"accum_sent_sync={sync}"], pred_acc, rel_tol=1e-12)
