"""Public tests for ddp.py: one 2-rank launch and one 4-rank launch run every case.

Tolerance against the single-process run: the full-batch gradient sums the per-example
terms in one order; D ranks sum B/D terms each and then the all-reduce adds D partial sums,
so each gradient element differs by a few units of fp32 rounding (eps = 2**-23). SGD passes
that on scaled by lr; AdamW's m/sqrt(v) is scale-free, so a relative gradient error of k*eps
moves a weight by about lr*k*eps per step. We allow rtol = atol = 16 * eps * STEPS
(5.7e-6); measured worst case with the tiny GPT: 17 eps absolute (AdamW). Against
PyTorch's DDP on 2 ranks the result is bitwise equal: a + b == b + a and dividing by 2 is
exact, so no order question arises.
(The model is the package's tiny GPT. Its attention key bias has an exactly-zero true
gradient; the computed one is ~1e-13 of rounding noise, far below AdamW's eps = 1e-8, so
it moves that bias by ~lr * 1e-5 and stays inside the tolerance.)

Peak memory (rank 0 of the 2-rank launch, one AdamW step of a small GPT traced by
MemoryTrace) must be within 5% of ``predicted_peak`` in ``_workers_ddp``: every byte at the
peak is predicted (model state, saved activations, the two logits-sized gradients at the
start of backward) except the loss scalars and AdamW's 4-byte step counters, so the
measured ratio is 1.000; 5% leaves room for a different but reasonable implementation,
not for a second copy of the gradients (which would add 18% here).
"""

from __future__ import annotations

import pytest
import torch
from _workers_ddp import CASES, STEPS, make_model, predicted_peak
from ddp import DDP, DDPConfig, make_buckets, unique_trainable_params
from shardlab.accounting import comm, memory
from shardlab.grading.outside import record
from shardlab.runtime import launch

EPS = torch.finfo(torch.float32).eps
TOL = {"rtol": 16 * EPS * STEPS, "atol": 16 * EPS * STEPS}
FP32_ADAMW = memory.RECIPES["fp32"]  # weights 4, grads 4, m 4, v 4 bytes per parameter


@pytest.fixture(scope="module")
def two():
    return launch("_workers_ddp:suite", 2, timeout=180)


@pytest.fixture(scope="module")
def four():
    cases = [c for c in CASES if c[0] in ("plain-sgd-bucketed", "tied-adamw-bucketed")]
    return launch("_workers_ddp:suite", 4, cases=cases, profile=False, timeout=180)


def _record_states(res, name):
    """Every rank's parameters after the steps, to the grader: compared with the reference
    solution's outside the sandbox (rubric ``[outside]``; a no-op elsewhere)."""
    for r, st in enumerate(r["correctness"]["runs"][name] for r in res):
        record(f"{name} D{len(res)} rank{r}", st if isinstance(st, dict) else None)


def _check_case(res, name):
    _record_states(res, name)
    runs = [r["correctness"]["runs"][name] for r in res]
    for r, st in enumerate(runs):
        assert not isinstance(st, str), f"rank {r} raised in case {name}:\n{st}"
    ref = res[0]["correctness"]["ref"][name]
    for r, st in enumerate(runs):
        for k in ref:
            assert torch.equal(st[k], runs[0][k]), f"{name}: {k} differs between rank 0 and {r}"
            torch.testing.assert_close(st[k], ref[k], **TOL, msg=f"{name}: {k} vs single process")


def test_config_validation():
    with pytest.raises(ValueError, match="bucket_size_mb"):
        DDPConfig(bucket_size_mb=0)
    with pytest.raises(ValueError, match="broadcast_from"):
        DDPConfig(broadcast_from=-1)


def test_buckets_and_unique_params():
    plain = make_model("plain")
    n_plain = len(unique_trainable_params(plain))
    assert n_plain == len(list(plain.parameters()))
    tied = make_model("tied")
    ps = unique_trainable_params(tied)
    assert len(ps) == n_plain - 1  # tok_emb / lm_head weight once
    assert sum(p is tied.tok_emb.weight for p in ps) == 1
    frozen = make_model("frozen")
    ps = unique_trainable_params(frozen)
    assert all(p.requires_grad for p in ps) and len(ps) == n_plain - 1
    assert all(p is not frozen.pos_emb.weight for p in ps)
    ps = unique_trainable_params(plain)
    buckets = make_buckets(ps, 300)  # bytes
    assert [p for b in buckets for p in b] == list(reversed(ps))
    for b in buckets:  # no bucket exceeds the limit unless it holds a single large tensor
        assert len(b) == 1 or sum(p.numel() * 4 for p in b) <= 300
    assert len(make_buckets(ps, 1e9)) == 1


@pytest.mark.parametrize("kind", ["plain", "tied", "frozen"])
def test_matches_single_process(two, kind):
    for name, *_ in CASES:
        if name.startswith(kind) and "no-sync" not in name:
            _check_case(two, name)


def test_no_sync_accumulation(two):
    for name, *_ in CASES:
        if "no-sync" in name:
            _check_case(two, name)


def test_bitwise_equal_to_pytorch_ddp(two):
    mine = two[0]["correctness"]["runs"]["plain-adamw-per-param"]
    theirs = two[0]["correctness"]["torch"]["plain-adamw"]
    record("plain-adamw-per-param rank0", mine if isinstance(mine, dict) else None)
    for k in theirs:
        assert torch.equal(mine[k], theirs[k]), k


def test_four_ranks(four):
    for name in four[0]["correctness"]["runs"]:
        _check_case(four, name)


@pytest.mark.parametrize("D", [2, 4])
def test_model_state_bytes(two, four, D):
    for rank, m in enumerate(two if D == 2 else four):
        meas = m["measure"]
        pred = memory.model_state(meas["n_params"], D, "ddp", FP32_ADAMW).per_object
        st = meas["state"]
        record(f"state D{D} rank{rank}", {k: st[k] for k in sorted(st)})
        for obj in ("weights", "grads", "moment1", "moment2"):
            assert st[obj] == pred[obj], (obj, st[obj], pred[obj])
        assert pred["master"] == 0 and st["optimizer_other"] == 0


@pytest.mark.parametrize("D", [2, 4])
def test_sent_bytes_per_step(two, four, D):
    for rank, m in enumerate(two if D == 2 else four):
        meas = m["measure"]
        record(f"step D{D} rank{rank}", [meas["step_ops"], meas["step_sent"]])
        assert meas["step_ops"] == ["all_reduce"]
        assert meas["step_sent"] == comm.step_volume("ddp", meas["n_params"], D, q=4)


def test_grad_accumulation_volume(two):
    for rank, m in enumerate(two):
        meas = m["measure"]
        record(f"accum rank{rank}", [meas[f"accum_sent_sync={s}"] for s in (True, False)])
        n, mb = meas["n_params"], meas["microbatches"]
        for sync in (True, False):
            pred = comm.grad_accum_volume("ddp", n, 2, 4, mb, sync_every_microbatch=sync)
            assert meas[f"accum_sent_sync={sync}"] == pred


def test_ddp_is_module_wrapper():
    # Construction needs a process group; check the public shape without one.
    assert issubclass(DDP, torch.nn.Module)
    assert hasattr(DDP, "no_sync") and hasattr(DDP, "finish_gradient_synchronization")


def test_peak_memory_matches_prediction(two):
    prof = two[0]["profile"]
    tl = prof["timeline"]
    pk = predicted_peak(prof, "ddp", 2)
    assert 0.95 <= tl.peak / pk.total <= 1.05, (tl.peak, pk.total, tl.peak_breakdown, pk.terms)
    # the gradients are the buckets: as many bytes as the formula's grads, never more
    grads = memory.model_state(prof["n_params"], 2, "ddp", FP32_ADAMW).per_object["grads"]
    assert max(tl.bytes["gradients"]) == grads
    step = pk.timeline[-1]  # the optimizer moment is predicted too
    assert step.phase == "optimizer"
    assert 0.95 <= tl.phase_peak("optimizer") / step.total <= 1.05
