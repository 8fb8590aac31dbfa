"""accounting.batch: tokens per step, the data-parallel bound, McCandlish et al.'s trade-off,
Kaplan et al.'s critical batch, and the planner per phase of a batch ramp (hand-worked)."""

from __future__ import annotations

import pytest
from shardlab.accounting import batch, compute, planner


def test_tokens_and_the_data_parallel_bound():
    assert batch.tokens_per_step(1, 16, 128, 8192) == 16_777_216  # Llama 3, 8K phase
    assert batch.tokens_per_step(2, 4, 8, 2048) == 131_072
    assert batch.max_data_parallel(2048) == 2048
    assert batch.max_data_parallel(2048, 4) == 512
    assert batch.max_data_parallel(10, 3) == 3
    with pytest.raises(ValueError, match="microbatch=8 exceeds global_batch=4"):
        batch.max_data_parallel(4, 8)
    with pytest.raises(ValueError, match="dp=0"):
        batch.tokens_per_step(1, 1, 0, 1)


def test_steps_and_tokens_trade_off_as_mcCandlish():
    # S = S_min (1 + Bc/B), E = S_min (B + Bc); at B = Bc both are twice their minima
    assert batch.steps_to_target(1e6, 1000, 1e6) == 2000
    assert batch.tokens_to_target(1e6, 1000, 1e6) == 2e9  # = 2 E_min, E_min = 1000 x 1e6
    assert batch.steps_to_target(4e6, 1000, 1e6) == 1250
    assert batch.tokens_to_target(2.5e5, 1000, 1e6) == 1.25e9
    # (S/S_min - 1)(E/E_min - 1) = 1 at any batch
    for B in (1e4, 3e5, 1e6, 7e7):
        s = batch.steps_to_target(B, 1, 2e6)
        e = batch.tokens_to_target(B, 1, 2e6) / 2e6
        assert (s - 1) * (e - 1) == pytest.approx(1, rel=1e-12)
    assert batch.time_to_target(1e6, 2.5, 1000, 1e6) == 5000
    with pytest.raises(ValueError, match="batch_tokens=0"):
        batch.steps_to_target(0, 1, 1)


def test_kaplan_critical_batch():
    assert batch.critical_batch_kaplan(1) == 2e8
    assert batch.critical_batch_kaplan(2) == pytest.approx(2e8 / 2 ** (1 / 0.21), rel=1e-12)
    # halving the loss multiplies B_crit by 2^(1/0.21), about 27
    ratio = batch.critical_batch_kaplan(2) / batch.critical_batch_kaplan(4)
    assert ratio == pytest.approx(2 ** (1 / 0.21), rel=1e-12) and 27 < ratio < 27.3
    with pytest.raises(ValueError, match="loss=-1"):
        batch.critical_batch_kaplan(-1)


@pytest.mark.parametrize("loss, alpha_b, said", [
    (1e-300, 0.21, "of more than 1e+30 tokens: too large"),  # L^(1/0.21) underflows to 0
    (1e-30, 0.21, "of 1.44e+151 tokens, more than 1e+30"),
    (10, 1e-3, "of less than the smallest float: too small"),  # L^1000 overflows
])
def test_a_critical_batch_out_of_a_floats_range_is_refused_naming_the_loss(loss, alpha_b, said):
    """Kaplan's fit far from a few nats leaves a float's range: a sentence naming the loss,
    not a ZeroDivisionError or OverflowError (issue 30)."""
    with pytest.raises(ValueError, match=f"loss={loss!r} gives a critical batch") as err:
        batch.critical_batch_kaplan(loss, alpha_b=alpha_b)
    assert said in str(err.value)


def test_phase_and_validation():
    ph = batch.Phase("8M", 1e9, 1024, 8192)
    assert ph.batch_tokens == 8_388_608 and ph.steps == pytest.approx(1e9 / 8_388_608)
    with pytest.raises(ValueError, match="global_batch=0"):
        batch.Phase("x", 1e9, 0, 8192)
    model = compute.ModelShape(8, 512, 8, 8, 2048, 1000, 1024)
    cluster = planner.Cluster(8, 80e9, 8, 3e-6, 300e9, 10e-6, 50e9, 989e12)
    with pytest.raises(ValueError, match="phases is empty"):
        batch.ramp(model, cluster, [])
    with pytest.raises(ValueError, match="must be an accounting.batch.Phase"):
        batch.ramp(model, cluster, [(1, 2, 3)])


def test_ramp_plans_each_phase_and_says_when_the_mesh_changes():
    """A small model on one node of 8: at 8 sequences the batch allows D up to 8; at 2
    sequences at most D = 2, so the mesh must change (the planner's best of each phase is
    its plan at that phase's batch and sequence)."""
    model = compute.ModelShape(8, 512, 8, 8, 2048, 1000, 1024)
    cluster = planner.Cluster(8, 80e9, 8, 3e-6, 300e9, 10e-6, 50e9, 989e12)
    phases = [batch.Phase("short", 1e9, 8, 1024), batch.Phase("long", 1e9, 2, 4096)]
    got = batch.ramp(model, cluster, phases)
    for ph, r in zip(phases, got):
        import dataclasses

        want = planner.plan(dataclasses.replace(model, seq_len=ph.seq_len), cluster,
                            ph.global_batch)
        assert r.best.layout == want.feasible[0].layout and r.feasible == len(want.feasible)
        assert r.seconds == pytest.approx(ph.steps * want.feasible[0].step_time, rel=1e-12)
        assert r.best.layout.D <= ph.global_batch
    assert not got[0].reshard
    first, second = (r.best.layout for r in got)
    assert got[1].reshard == ((first.D, first.t, first.p, first.c)
                              != (second.D, second.t, second.p, second.c))
