"""Predicted peak: term bookkeeping, FSDP unit lifetimes, layout helper, validation."""

import pytest
from shardlab.accounting.memory import model_state
from shardlab.accounting.peak import (
    TERMS,
    WORKSPACE_TERMS,
    adam_workspace,
    fsdp_gathered_units_alive,
    logits_workspace,
    predict_layout_peak,
    predict_peak,
)


@pytest.mark.parametrize("n", [1, 2, 5])
@pytest.mark.parametrize("prefetch", [0, 1, 2, True, False])
def test_units_alive(n, prefetch):
    k = int(prefetch)
    for phase in ("forward", "backward"):
        assert fsdp_gathered_units_alive(prefetch, True, n, phase) == min(1 + k, n)
        assert fsdp_gathered_units_alive(prefetch, False, n, phase) == n


def test_terms_and_phase():
    r = predict_peak(100, [10, 20, 30], 60, buffer_bytes=5, prefetch=1)
    assert set(r.terms) == set(TERMS)
    assert r.total == sum(r.terms.values()) == 100 + 50 + 60 + 5
    assert (r.phase_of_peak, r.unit_of_peak) == ("backward", 2)
    assert len(r.timeline) == 6
    fwd0 = r.timeline[0]
    assert fwd0.alive_units == (0, 1) and fwd0.terms["activations"] == 20
    assert r.as_rows()[-1]["bytes"] == r.total


def test_no_reshard_holds_every_unit():
    units = [10, 20, 30]
    keep = predict_peak(0, units, [1, 1, 1], reshard_after_forward=False)
    assert keep.terms["gathered_params"] == 60
    reshard = predict_peak(0, units, [1, 1, 1])
    assert reshard.terms["gathered_params"] == 30
    g = predict_peak(0, units, 0, grad_unit_bytes=[1, 2, 3])
    assert g.terms["unsharded_grads"] == 3 and g.phase_of_peak == "backward"


def test_no_units_is_sum():
    r = predict_peak(1000, [], 200, 30)
    assert r.total == 1230 and r.terms["gathered_params"] == 0


def test_layout_helper():
    n, d = 7_000_000_000, 8
    ddp = predict_layout_peak(n, d, "ddp", activation_bytes=1e9)
    assert ddp.total == model_state(n, d, "ddp").total + 1e9
    z3 = predict_layout_peak(n, d, "zero3", activation_bytes=1e9, n_units=28, prefetch=1)
    assert z3.terms["persistent"] == 14e9
    assert z3.terms["gathered_params"] == 2 * 2 * n / 28  # current + prefetched, 2 B weights
    assert z3.terms["unsharded_grads"] == 2 * n / 28
    one = predict_layout_peak(n, d, "zero3", n_units=1)  # one unit gathers the whole model
    assert one.terms["gathered_params"] == 14e9


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(persistent_bytes=-1, unit_bytes=[], activation_bytes=0), "persistent_bytes=-1"),
        (dict(persistent_bytes=0, unit_bytes=[1, -2], activation_bytes=0), r"unit_bytes\[1\]"),
        (dict(persistent_bytes=0, unit_bytes=[1], activation_bytes=[1, 2]), "n_units=1"),
        (dict(persistent_bytes=0, unit_bytes=[1], activation_bytes=0, prefetch=-1), "prefetch"),
        (dict(persistent_bytes=0, unit_bytes=5, activation_bytes=0), "unit_bytes=5"),
        (
            dict(persistent_bytes=0, unit_bytes=[1], activation_bytes=0, reshard_after_forward=0),
            "reshard_after_forward=0",
        ),
    ],
)
def test_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        predict_peak(**kwargs)


def test_helper_validation():
    with pytest.raises(ValueError, match="phase='optim'"):
        fsdp_gathered_units_alive(1, True, 4, "optim")
    with pytest.raises(ValueError, match="n_units=0"):
        predict_layout_peak(10, 2, "zero3", n_units=0)
    with pytest.raises(ValueError, match="dp=0"):
        predict_layout_peak(10, 0, "zero3")


def test_workspace_terms_absent_unless_given():
    old = predict_peak(100, [10, 20], 6, buffer_bytes=1)
    assert set(old.terms) == set(TERMS) and len(old.timeline) == 4
    assert predict_peak(1000, [], 200, 30).terms == {
        "persistent": 1000, "gathered_params": 0, "unsharded_grads": 0, "activations": 200,
        "buffers": 30,
    }


def test_backward_workspace_joins_all_activations():
    # no units: one moment, start of backward, every activation alive plus the workspace
    r = predict_peak(1000, [], 200, 30, backward_workspace_bytes=50)
    assert r.total == 1280 and r.phase_of_peak == "backward"
    assert r.terms["backward_workspace"] == 50 and set(r.terms) == set(TERMS) | {
        "backward_workspace"
    }
    # units: only the first backward moment (last unit, all activations) carries it
    u = predict_peak(0, [10, 10, 10], [1, 1, 1], backward_workspace_bytes=100)
    ws = [(p.phase, p.unit, p.terms["backward_workspace"]) for p in u.timeline]
    assert [w for w in ws if w[2]] == [("backward", 2, 100)]
    assert (u.phase_of_peak, u.unit_of_peak, u.total) == ("backward", 2, 10 + 3 + 100)


def test_optimizer_workspace_moment():
    # step moment = persistent + buffers + workspace, no activations, no gathered units
    r = predict_peak(1000, [], 200, 30, optimizer_workspace_bytes=250)
    assert [p.phase for p in r.timeline] == ["forward", "optimizer"]
    assert r.phase_of_peak == "optimizer" and r.total == 1280
    assert r.terms["activations"] == 0 and r.terms["optimizer_workspace"] == 250
    r = predict_peak(1000, [], 200, 30, optimizer_workspace_bytes=100)
    assert r.phase_of_peak == "forward" and r.total == 1230
    z3 = predict_layout_peak(1000, 2, "zero3", "fp32", n_units=2, optimizer_workspace_bytes=1)
    assert z3.timeline[-1].terms["gathered_params"] == 0 and len(z3.timeline) == 5
    both = predict_layout_peak(
        100, 2, "ddp", "fp32", activation_bytes=10, backward_workspace_bytes=5,
        optimizer_workspace_bytes=400,
    )
    assert both.total == 1600 + 400 and set(both.terms) == set(TERMS) | set(WORKSPACE_TERMS)


def test_workspace_helpers():
    assert logits_workspace(2, 16, 256) == 2 * 2 * 16 * 256 * 4
    assert adam_workspace([10, 30, 20]) == 2 * 4 * 30  # single-tensor: two temps of one
    assert adam_workspace([10, 30, 20], foreach=True) == 4 * 60  # one temp per tensor
    assert adam_workspace([], 2) == 0
    with pytest.raises(ValueError, match="vocab_size=0"):
        logits_workspace(1, 1, 0)
    with pytest.raises(ValueError, match="numels"):
        adam_workspace(5)
    with pytest.raises(ValueError, match="optimizer_workspace_bytes=-1"):
        predict_peak(0, [], 0, optimizer_workspace_bytes=-1)


def test_grad_shards_appear_after_their_unit():
    # unit i's shard exists from the end of its backward: backward at i holds units i+1..n-1
    r = predict_peak(100, [10, 10, 10], 0, grad_shard_bytes=[1, 2, 4])
    assert "grad_shards" in r.terms and "optimizer_workspace" not in r.terms
    got = [(p.phase, p.unit, p.terms["grad_shards"]) for p in r.timeline]
    assert got == [
        ("forward", 0, 0), ("forward", 1, 0), ("forward", 2, 0),
        ("backward", 2, 0), ("backward", 1, 4), ("backward", 0, 6), ("optimizer", None, 7),
    ]
    opt = r.timeline[-1]
    assert opt.total == 100 + 7 and opt.terms["gathered_params"] == 0
    both = predict_peak(0, [10, 10], 0, grad_shard_bytes=6, optimizer_workspace_bytes=5)
    assert both.timeline[-1].terms["grad_shards"] == 6 and both.timeline[-1].total == 11
    assert (both.total, both.unit_of_peak) == (10 + 3, 0)  # unit 0 gathered + unit 1's shard
    none = predict_peak(50, [], 10, grad_shard_bytes=[3, 4])  # no units: optimizer only
    assert [p.terms["grad_shards"] for p in none.timeline] == [0, 7]
    with pytest.raises(ValueError, match=r"grad_shard_bytes\[1\]"):
        predict_peak(0, [1, 1], 0, grad_shard_bytes=[1, -1])


@pytest.mark.parametrize("reshard", [True, False])
def test_backward_workspace_before_units(reshard):
    units, acts = [10, 20, 30], [1, 2, 3]
    r = predict_peak(
        0, units, acts, prefetch=1, reshard_after_forward=reshard, grad_unit_bytes=[7, 7, 7],
        backward_workspace_bytes=100, backward_workspace_at="before_units",
        head_activation_bytes=40,
    )
    start = r.timeline[3]  # right after the last forward moment
    assert (start.phase, start.unit) == ("backward", None)
    assert start.terms["backward_workspace"] == 100 and start.terms["unsharded_grads"] == 0
    assert start.terms["activations"] == 6 + 40  # every unit's and the head's
    assert start.alive_units == (() if reshard else (0, 1, 2))
    assert start.terms["gathered_params"] == (0 if reshard else 60)
    last = r.timeline[4]  # the last unit's backward: its gradient, no workspace, no head
    assert (last.unit, last.terms["backward_workspace"], last.terms["activations"]) == (2, 0, 6)
    assert last.terms["unsharded_grads"] == 7
    assert (r.phase_of_peak, r.unit_of_peak) == ("backward", None)
    # the default puts workspace and head activations on the last unit's backward
    d = predict_peak(0, units, acts, backward_workspace_bytes=100, head_activation_bytes=40)
    assert len(d.timeline) == 6 and d.timeline[3].terms["activations"] == 46
    assert d.timeline[3].terms["backward_workspace"] == 100
    # head activations alone also make the start moment; with no units they simply add
    h = predict_peak(0, units, acts, backward_workspace_at="before_units", head_activation_bytes=5)
    assert h.timeline[3].unit is None and "backward_workspace" not in h.terms
    assert predict_peak(0, [], 10, head_activation_bytes=5).total == 15
    with pytest.raises(ValueError, match="backward_workspace_at='start'"):
        predict_peak(0, units, acts, backward_workspace_at="start")
    with pytest.raises(ValueError, match="head_activation_bytes=-1"):
        predict_peak(0, units, acts, head_activation_bytes=-1)
