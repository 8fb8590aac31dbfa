"""Accounting behind issue 28's corrections: recomputation scratch only where it exists
(chapter 2), and full recomputation's checkpoint under sequence parallelism (chapter 7)."""

import pytest
from shardlab.accounting import activations as act
from shardlab.accounting.peak import OPTIONAL_TERMS, TERMS, logits_workspace, predict_peak

MiB = 2**20


def test_recompute_scratch_only_in_its_units_backward():
    rebuilt = [0, 7, 11]
    r = predict_peak(100, [10, 20, 30], [1, 2, 3], recompute_bytes=rebuilt)
    assert set(r.terms) == set(TERMS) | {"recompute_scratch"}
    assert "recompute_scratch" in OPTIONAL_TERMS
    for p in r.timeline:
        want = rebuilt[p.unit] if p.phase == "backward" else 0
        assert p.terms["recompute_scratch"] == want
        assert p.total == sum(p.terms.values())
    # without the option the term is absent and every moment is 11 B lighter or equal
    plain = predict_peak(100, [10, 20, 30], [1, 2, 3])
    assert "recompute_scratch" not in plain.terms
    for with_s, without in zip(r.timeline, plain.timeline):
        assert with_s.total - without.total == with_s.terms["recompute_scratch"]


def test_recompute_scratch_never_meets_the_loss_gradients():
    # the head (last unit) recomputes nothing; the loss's gradients join its backward only
    ws = logits_workspace(1, 4, 10)
    r = predict_peak(0, [1, 1, 1], [1, 1, 1], recompute_bytes=[0, 50, 0],
                     backward_workspace_bytes=ws)
    head = next(p for p in r.timeline if p.phase == "backward" and p.unit == 2)
    mid = next(p for p in r.timeline if p.phase == "backward" and p.unit == 1)
    assert head.terms["backward_workspace"] == ws and head.terms["recompute_scratch"] == 0
    assert mid.terms["backward_workspace"] == 0 and mid.terms["recompute_scratch"] == 50
    maxima = sum(max(p.terms[k] for p in r.timeline) for k in r.terms)
    assert maxima > r.total  # the two terms peak at different moments


def test_recompute_scratch_scalar_and_no_units():
    split = predict_peak(0, [1, 1], [1, 1], recompute_bytes=8)
    assert [p.terms["recompute_scratch"] for p in split.timeline] == [0, 0, 4, 4]
    single = predict_peak(5, [], 3, recompute_bytes=[2, 4])
    assert single.total == 5 + 3 + 6
    with pytest.raises(ValueError, match="recompute_bytes has 1 entries but there are n_units=2"):
        predict_peak(0, [1, 1], [1, 1], recompute_bytes=[3])
    with pytest.raises(ValueError, match="recompute_bytes"):
        predict_peak(0, [1, 1], [1, 1], recompute_bytes=-1)


def test_extended_table_rows():
    s, b, h, a, t = 2048, 1, 4096, 32, 8
    rows = act.activation_table(s, b, h, a, t, extended=True)
    assert [r.key for r in rows] == [
        "none", "tp", "tp_selective", "tp_sp", "tp_sp_selective",
        "full_recompute", "full_recompute_sp",
    ]
    mib = {r.key: r.mib_per_layer for r in rows}
    assert mib == {"none": 912, "tp": 184, "tp_selective": 104, "tp_sp": 114,
                   "tp_sp_selective": 34, "full_recompute": 16, "full_recompute_sp": 2}
    # the default table is unchanged: MODES order, no SP row
    assert [r.key for r in act.activation_table(s, b, h, a, t)] == list(act.MODES)
    with pytest.raises(ValueError, match="extended"):
        act.activation_table(s, b, h, a, t, extended=1)


@pytest.mark.parametrize("t", [1, 2, 4, 8, 16, 32])
def test_full_recompute_under_sp_always_keeps_less_than_selective(t):
    s, b, h, a = 2048, 1, 4096, 32
    sel = act.activation_bytes_per_layer(s, b, h, a, t, "tp_sp_selective")
    full_sp = act.activation_bytes_per_layer(s, b, h, a, t, "full_recompute", sp=True)
    full = act.activation_bytes_per_layer(s, b, h, a, t, "full_recompute")
    assert sel == 17 * full_sp == 34 * s * b * h / t
    assert full == 2 * s * b * h  # replicated without SP: overtaken only once 34/t < 2
    assert (sel < full) == (t > 17)


def test_tp_selective_is_korthikanti_table_2():
    s, b, h, a = 2048, 1, 4096, 32
    for t in (1, 2, 4, 8):
        got = act.activation_bytes_per_layer(s, b, h, a, t, "tp_selective")
        assert got == s * b * h * (10 + 24 / t)


def test_fsdp_keeping_weights_across_microbatches_gathers_once():
    from shardlab.accounting.comm import grad_accum_volume

    n, d, q, m = 7_000_000_000, 8, 2, 8
    u = q * n * (d - 1) / d
    # within one microbatch (no reshard after forward): m gathers; across microbatches: one
    assert grad_accum_volume("zero3", n, d, q, m, False, False) == (m + 1) * u
    assert grad_accum_volume("zero3", n, d, q, m, False, False, keep_weights=True) == 2 * u
    assert grad_accum_volume("zero3", n, d, q, m, True, False, keep_weights=True) == (1 + m) * u
    assert grad_accum_volume("zero3", n, d, q, m, False, False, keep_weights=True) == (
        grad_accum_volume("ddp", n, d, q, m, False)
    )
    assert grad_accum_volume("zero3", n, d, q, 1, True, False, keep_weights=True) == (
        grad_accum_volume("zero3", n, d, q, 1, True, False)
    )
    with pytest.raises(ValueError, match="reshard_after_forward=False"):
        grad_accum_volume("zero3", n, d, q, m, False, True, keep_weights=True)
    with pytest.raises(ValueError, match="layout='zero2'"):
        grad_accum_volume("zero2", n, d, q, m, False, False, keep_weights=True)
