"""Korthikanti et al. activation accounting: lecture numbers, scaling properties, validation."""

import math

import pytest
from shardlab.accounting.activations import (
    MODES,
    MiB,
    activation_bytes,
    activation_bytes_per_layer,
    activation_table,
    as_rows,
    layer_terms,
)

LECTURE = dict(s=2048, b=1, h=4096, a=32, t=8)


@pytest.mark.parametrize(
    ("mode", "mib"),
    [("none", 912), ("tp", 184), ("tp_sp", 114), ("tp_sp_selective", 34), ("full_recompute", 16)],
)
def test_lecture_numbers(mode, mib):
    got = activation_bytes_per_layer(**LECTURE, mode=mode)
    assert round(got / MiB) == mib  # as the lecture rounds
    assert got == mib * MiB  # and exactly, for these inputs


def test_exact_formulas():
    s, b, h, a, t = 2048, 1, 4096, 32, 8
    sbh = s * b * h
    assert activation_bytes_per_layer(s, b, h, a, mode="none") == sbh * (34 + 5 * a * s / h)
    assert activation_bytes_per_layer(s, b, h, a, t, "tp") == sbh * (
        10 + 24 / t + 5 * a * s / (h * t)
    )
    assert activation_bytes_per_layer(s, b, h, a, t, "tp_sp") == 114 * sbh / 8
    assert activation_bytes_per_layer(s, b, h, a, t, "tp_sp_selective") == 34 * sbh / t


@pytest.mark.parametrize("t", [1, 2, 4, 8])
@pytest.mark.parametrize(("s", "b", "h", "a"), [(512, 2, 1024, 16), (2048, 1, 4096, 32)])
def test_properties(s, b, h, a, t):
    f = {m: activation_bytes_per_layer(s, b, h, a, t, m) for m in MODES}
    none = activation_bytes_per_layer(s, b, h, a, 1, "none")
    assert math.isclose(f["tp_sp"] * t, none)  # SP removes the replicated floor
    assert f["tp_sp_selective"] <= f["tp_sp"] <= f["tp"] <= none
    assert f["tp"] >= 10 * s * b * h  # the replicated 10 sbh floor under TP alone
    if t == 1:
        assert math.isclose(f["tp"], none) and math.isclose(f["tp_sp"], none)
    for m in MODES:
        assert math.isclose(activation_bytes(24, s, b, h, a, t, m), 24 * f[m])


def test_table_rows():
    rows = as_rows(activation_table(**LECTURE, L=2))
    assert [r["mode"] for r in rows] == list(MODES)
    assert rows[0]["MiB_per_layer"] == 912 and rows[0]["total_bytes"] == 2 * 912 * MiB


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(s=0, b=1, h=64, a=4), "s=0"),
        (dict(s=8, b=-1, h=64, a=4), "b=-1"),
        (dict(s=8, b=1, h=64.5, a=4), "h=64.5"),
        (dict(s=8, b=1, h=64, a=True), "a=True"),
        (dict(s=8, b=1, h=64, a=3), "h=64 .*a=3"),
        (dict(s=8, b=1, h=64, a=4, t=8), "a=4 .*t=8"),
        (dict(s=6, b=1, h=64, a=4, t=4, mode="tp_sp"), "t=4 does not divide s=6"),
        (dict(s=8, b=1, h=64, a=4, mode="flash"), "mode='flash'"),
    ],
)
def test_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        activation_bytes_per_layer(**kwargs)
    with pytest.raises(ValueError, match="L=0"):
        activation_bytes(0, 8, 1, 64, 4)


# --- the same formula with other layers' constants (lab 06's fp32 block) -------------------


def test_defaults_are_the_papers_constants():
    s, b, h, a = 2048, 1, 4096, 32
    sbh = s * b * h
    terms = layer_terms(s, b, h, a)
    assert terms.replicated == 10 * sbh and terms.split == 24 * sbh
    assert terms.attention == 5 * a * s * s * b and terms.layer_input == 2 * sbh
    explicit = dict(q=2, mask_bytes=1, ffn=4 * h, dropout=True, attn_dropout=True)
    for mode in MODES:
        assert activation_bytes_per_layer(s, b, h, a, 8, mode, **explicit) == (
            activation_bytes_per_layer(s, b, h, a, 8, mode)
        )


def test_parameters_change_the_terms_they_name():
    s, b, h, a, f = 16, 2, 32, 4, 96
    sbh = s * b * h
    # fp32 activations, bool masks, MLP width 3h, LayerNorm's two fp32 statistics per token
    lab = dict(q=4, mask_bytes=1, ffn=f, norm_stat_bytes=4)
    terms = layer_terms(s, b, h, a, **lab)
    assert terms.replicated == sbh * (4 * 4 + 2 * 1) + 2 * 2 * 4 * b * s
    assert terms.split == sbh * (4 * 4 + 2 * 4 * f / h)
    assert terms.attention == a * s * s * b * (4 + 1 + 4)
    assert terms.layer_input == 4 * sbh
    # no dropout at all: the masks and the dropped-out scores disappear
    off = layer_terms(s, b, h, a, **lab, dropout=False)
    assert terms.replicated - off.replicated == 2 * sbh
    assert off.attention == a * s * s * b * 4
    # attention dropout alone can be switched off; RMSNorm keeps one statistic per token
    assert layer_terms(s, b, h, a, attn_dropout=False).attention == a * s * s * b * 2
    rms = layer_terms(s, b, h, a, **lab, norm="rmsnorm")
    assert terms.replicated - rms.replicated == 2 * 4 * b * s
    t = 4
    by = {m: activation_bytes_per_layer(s, b, h, a, t, m, **lab) for m in MODES}
    assert by["none"] == terms.replicated + terms.split + terms.attention
    assert by["tp"] == terms.replicated + (terms.split + terms.attention) / t
    assert math.isclose(by["tp_sp"] * t, by["none"])
    assert by["tp_sp_selective"] == (terms.replicated + terms.split) / t
    assert by["full_recompute"] == 4 * sbh
    rows = activation_table(s, b, h, a, t, L=3, **lab)
    assert [r.bytes_per_layer for r in rows] == [by[m] for m in MODES]
    assert activation_bytes(3, s, b, h, a, t, "tp", **lab) == 3 * by["tp"]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(q=0), "q=0"),
        (dict(mask_bytes=-1), "mask_bytes=-1"),
        (dict(ffn=0), "ffn=0"),
        (dict(dropout=1), "dropout=1"),
        (dict(attn_dropout="no"), "attn_dropout='no'"),
        (dict(norm="batchnorm"), "norm='batchnorm'"),
        (dict(norm_stat_bytes=-4), "norm_stat_bytes=-4"),
        (dict(ffn=90), "ffn=90 .*t=4"),
    ],
)
def test_layer_parameter_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        activation_bytes_per_layer(16, 2, 32, 4, 4, "tp", **kwargs)
