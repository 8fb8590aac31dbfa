"""Public tests for zero1.py (ZeRO-1) and zero2.py (ZeRO-2): one 2-rank launch and one 4-rank
launch run every case.

Tolerance against the single-process run (see also labs/02_ddp/test_ddp.py): the gradient
of the global mean is summed in a different order (per rank, then across ranks in the
reduce-scatter), so elements differ by a few fp32 roundings (eps = 2**-23); AdamW turns a
relative gradient error k*eps into a weight error of about lr*k*eps per step. We allow
rtol = atol = 16 * eps * STEPS (5.7e-6); measured: up to 7 eps absolute. On 2 ranks the
reduce-scatter adds exactly two numbers (commutative, and /2 is exact), so ZeRO-1 and
ZeRO-2 equal PyTorch's DDP and ZeroRedundancyOptimizer bitwise there. (Model: the package's tiny GPT;
see labs/02_ddp/test_ddp.py for why its zero-gradient attention key bias stays in tolerance.)

Peak memory per layout (rank 0, one AdamW step of a small GPT under MemoryTrace) must be
within 5% of ``predicted_peak`` in ``_workers_zero``: the model-state formula for the
layout, the saved activations, the logits-sized gradients at the start of backward and
AdamW's workspace at the step cover every byte but the loss scalars and step counters
(measured ratio 1.000 at the peak, 1.002 / 1.019 at the optimizer step). A full-size
(D*S) temporary in ZeRO-1's step adds 30% to the optimizer moment and fails.
"""

from __future__ import annotations

import pytest
import torch
from _workers_zero import STEPS, ZERO1_CASES, ZERO2_CASES, predicted_peak
from shardlab.accounting import comm, memory
from shardlab.grading.outside import record
from shardlab.runtime import launch
from zero1 import assign_owners
from zero2 import ZeRO2Config

EPS = torch.finfo(torch.float32).eps
TOL = {"rtol": 16 * EPS * STEPS, "atol": 16 * EPS * STEPS}
FP32_ADAMW = memory.RECIPES["fp32"]  # weights 4, grads 4, m 4, v 4 bytes per parameter


@pytest.fixture(scope="module")
def two():
    return launch("_workers_zero:suite", 2, timeout=180)


@pytest.fixture(scope="module")
def four():
    return launch(
        "_workers_zero:suite", 4, zero1_cases=ZERO1_CASES[1:2], zero2_cases=ZERO2_CASES[:1],
        profile=False, timeout=180,
    )


def _check(res, stage, name):
    runs = [r["correctness"][stage][name] for r in res]
    for r, st in enumerate(runs):  # to the grader, compared outside the sandbox (rubric)
        record(f"{stage} {name} D{len(res)} rank{r}", st if isinstance(st, dict) else None)
    for r, st in enumerate(runs):
        assert not isinstance(st, str), f"rank {r} raised in {stage} {name}:\n{st}"
    ref = res[0]["correctness"]["ref" + stage[-1]][name]
    for r, st in enumerate(runs):
        for k in ref:
            assert torch.equal(st[k], runs[0][k]), f"{stage} {name}: {k} differs on rank {r}"
            torch.testing.assert_close(st[k], ref[k], **TOL, msg=f"{stage} {name}: {k}")


def test_assign_owners_balanced():
    assert assign_owners([10, 1, 1, 8], 2) == [0, 1, 1, 1]
    assert assign_owners([5, 5, 5, 5], 4) == [0, 1, 2, 3]
    owners = assign_owners([7, 3, 9, 2, 2, 6], 3)
    loads = [sum(n for n, o in zip([7, 3, 9, 2, 2, 6], owners) if o == r) for r in range(3)]
    assert sorted(loads) == [9, 9, 11]
    with pytest.raises(ValueError, match="world_size"):
        assign_owners([1], 0)
    with pytest.raises(ValueError, match="bucket_size_mb"):
        ZeRO2Config(bucket_size_mb=0)


@pytest.mark.parametrize("name", [c[0] for c in ZERO1_CASES])
def test_zero1_matches_single_process(two, name):
    _check(two, "zero1", name)


@pytest.mark.parametrize("name", [c[0] for c in ZERO2_CASES])
def test_zero2_matches_single_process(two, name):
    _check(two, "zero2", name)


def test_bitwise_equal_to_pytorch(two):
    c = two[0]["correctness"]
    mine = [c[z]["plain-adamw"] for z in ("zero1", "zero2")]
    record("zero1/zero2 plain-adamw rank0", [x if isinstance(x, dict) else None for x in mine])
    for theirs in ("ddp-plain-adamw", "zero-plain-adamw"):
        for mine in (c["zero1"]["plain-adamw"], c["zero2"]["plain-adamw"]):
            for k, t in c["torch"][theirs].items():
                assert torch.equal(mine[k], t), (theirs, k)


def test_four_ranks(four):
    for stage in ("zero1", "zero2"):
        for name in four[0]["correctness"][stage]:
            _check(four, stage, name)


@pytest.mark.parametrize("D", [2, 4])
def test_zero1_model_state_bytes(two, four, D):
    res = two if D == 2 else four
    n = res[0]["measure"]["zero1"]["n_params"]
    pred = memory.model_state(n, D, "zero1", FP32_ADAMW).per_object
    for r, m in enumerate(res):
        st = m["measure"]["zero1"]["state"]
        loads = m["measure"]["zero1"]["loads"][r]
        record(f"zero1 state D{D} rank{r}", [{k: st[k] for k in sorted(st)}, loads])
        assert st["weights"] == pred["weights"] and st["grads"] == pred["grads"]
        # Whole tensors are owned, so a rank holds its own load; summed over ranks the
        # moments are exactly D times the balanced formula.
        assert st["moment1"] == 4 * m["measure"]["zero1"]["loads"][r]
    for obj in ("moment1", "moment2"):
        assert sum(m["measure"]["zero1"]["state"][obj] for m in res) == D * pred[obj]


@pytest.mark.parametrize("D", [2, 4])
def test_zero2_model_state_bytes(two, four, D):
    for r, m in enumerate(two if D == 2 else four):
        z = m["measure"]["zero2"]
        record(
            f"zero2 state D{D} rank{r}",
            [
                {k: z["state"][k] for k in sorted(z["state"])},
                z["padded_numel"],
                z["full_grads_after_backward"],
            ],
        )
        assert z["full_grads_after_backward"] == 0, "param.grad must be released"
        assert z["padded_numel"] % D == 0 and z["padded_numel"] >= z["n_params"]
        pred = memory.model_state(z["padded_numel"], D, "zero2", FP32_ADAMW).per_object
        for obj in ("weights", "grads", "moment1", "moment2"):
            assert z["state"][obj] == pred[obj], (obj, z["state"][obj], pred[obj])


@pytest.mark.parametrize("D", [2, 4])
def test_sent_bytes_per_step(two, four, D):
    for r, m in enumerate(two if D == 2 else four):
        z1, z2 = m["measure"]["zero1"], m["measure"]["zero2"]
        record(f"step D{D} rank{r}", [[z["step_ops"], z["step_sent"]] for z in (z1, z2)])
        assert z1["step_ops"] == z2["step_ops"] == ["all_gather", "reduce_scatter"]
        assert z1["step_sent"] == comm.step_volume("zero1", z1["padded_numel"], D, q=4)
        assert z2["step_sent"] == comm.step_volume("zero2", z2["padded_numel"], D, q=4)


def test_grad_accumulation_volume(two):
    for r, m in enumerate(two):
        mb = m["measure"]["microbatches"]
        z1, z2 = m["measure"]["zero1"], m["measure"]["zero2"]
        record(
            f"accum rank{r}", [z[f"accum_sent_sync={s}"] for z in (z1, z2) for s in (True, False)]
        )
        for sync in (True, False):
            pred1 = comm.grad_accum_volume("zero1", z1["padded_numel"], 2, 4, mb, sync)
            assert z1[f"accum_sent_sync={sync}"] == pred1
            pred2 = comm.grad_accum_volume("zero2", z2["padded_numel"], 2, 4, mb, sync)
            assert z2[f"accum_sent_sync={sync}"] == pred2


@pytest.mark.parametrize("layout", ["zero1", "zero2"])
def test_peak_memory_matches_prediction(two, layout):
    prof = two[0]["profile"][layout]
    tl = prof["timeline"]
    pk = predicted_peak(prof, layout, 2)
    assert 0.95 <= tl.peak / pk.total <= 1.05, (tl.peak, pk.total, tl.peak_breakdown, pk.terms)
    step = pk.timeline[-1]
    assert step.phase == "optimizer"
    # gloo's worker thread can drop its reference to the last reduce-scatter input a moment
    # after wait() returns, so under load that bucket buffer may still be alive when the
    # optimizer starts (seen: +32 KiB = one bucket, ratio 1.0515). Allow at most one bucket.
    late = max(prof["buckets"], default=0)
    assert 0.95 * step.total <= tl.phase_peak("optimizer") <= 1.05 * step.total + late
