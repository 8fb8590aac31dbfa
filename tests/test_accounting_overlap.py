"""accounting.overlap: each layout's traffic against the compute it can hide behind.

Hand-worked numbers use rate = 600 TFLOP/s achieved (989 x ~0.6) and round link figures.
"""

from __future__ import annotations

import pytest
from shardlab.accounting import overlap as ov

RATE = 600e12


def test_ddp_break_even_is_d_minus_one_over_d_rate_over_beta():
    # DDP, q = 2: 2 q N (D-1)/D = 4 N (7/8) bytes against 4 N T FLOPs:
    # T* = (7/8) x 600e12 / 50e9 = 10,500 tokens per rank per step
    assert ov.dp_break_even_tokens("ddp", 8, RATE, 50e9) == pytest.approx(10_500)
    at = ov.dp("ddp", 7e9, 8, 10_500, RATE, 50e9)
    assert at.ratio == pytest.approx(1.0) and at.exposed_s == pytest.approx(0.0, abs=1e-9)
    # half the tokens: twice the ratio, and the exposed time is the other half of the traffic
    half = ov.dp("ddp", 7e9, 8, 5_250, RATE, 50e9)
    assert half.ratio == pytest.approx(2.0) and half.bound == "communication"
    assert half.exposed_s == pytest.approx(half.comm_s / 2)


def test_zero_layouts_hide_behind_the_whole_step():
    # ZeRO-1/2: reduce-scatter + all-gather = the same 2 q N (D-1)/D, behind 6 N T: 2/3 of DDP's
    # threshold; ZeRO-3: 3 q N (D-1)/D behind 6 N T: the same as DDP's
    ddp = ov.dp_break_even_tokens("ddp", 16, RATE, 25e9)
    assert ov.dp_break_even_tokens("zero2", 16, RATE, 25e9) == pytest.approx(ddp * 2 / 3)
    assert ov.dp_break_even_tokens("zero3", 16, RATE, 25e9) == pytest.approx(ddp)
    assert ddp == pytest.approx(15 / 16 * 600e12 / 25e9)  # 22,500


def test_tp_break_even_width():
    # q (t-1) rate / (9 beta): t = 8 over NVLink-class 300 GB/s -> 2 x 7 x 2000 / 9 = 3,111 wide
    h_star = ov.tp_break_even_hidden(8, RATE, 300e9)
    assert h_star == pytest.approx(28_000 / 9)
    for h, bound in ((2048, "communication"), (8192, "compute")):
        assert ov.tp(h, 8, 4096, RATE, 300e9).bound == bound
    assert ov.tp(16384, 8, 1, RATE, 300e9).ratio == pytest.approx(h_star / 16384)


def test_pp_is_cheap():
    # 2 q T h over 6 (12 h^2) L_s T: q rate / (36 h L_s beta) = 2 x 600e12 / (36 x 8192 x 4 x 50e9)
    got = ov.pp(8192, 4, 4096, RATE, 50e9)
    assert got.ratio == pytest.approx(2 * 600e12 / (36 * 8192 * 4 * 50e9))


def test_cp_break_even_sequence():
    # Llama 3 405B heads (128 Q, 8 K/V), c = 16, 50 GB/s, causal:
    # 6 q (c-1) (8/128) rate / (12 x 1/2 x beta) = 6 x 2 x 15 / 16 x 600e12 / (6 x 50e9) = 22,500
    s_star = ov.cp_break_even_seq(128, 8, 16, RATE, 50e9)
    assert s_star == pytest.approx(22_500)
    # at 131,072 tokens the ring passes fit (ratio s*/s); at the break-even it is 1
    assert ov.cp(1, 131_072, 128, 8, 128, 16, RATE, 50e9).ratio == pytest.approx(s_star / 131_072)


def test_ep_break_even_ffn():
    # 2 q (ep-1)/ep rate / (3 M beta): ep = 8, gated (M = 3), 50 GB/s:
    # 2 x 2 x 7/8 x 600e12 / (9 x 50e9) = 4,666.7
    f_star = ov.ep_break_even_ffn(8, RATE, 50e9)
    assert f_star == pytest.approx(4 * 7 / 8 * 600e12 / (9 * 50e9))
    assert ov.ep(4096, 2048, 2, 8, 4096, RATE, 50e9).ratio == pytest.approx(f_star / 2048)


def test_latency_rounds_add_to_the_traffic():
    got = ov.ratio("x", 1e6, 1e12, RATE, 1e9, alpha=1e-5, rounds=14)
    assert got.comm_s == pytest.approx(14e-5 + 1e-3)


@pytest.mark.parametrize(
    "call, needle",
    [
        (lambda: ov.dp("fsdp", 1e9, 8, 1e4, RATE, 50e9), "layout='fsdp'"),
        (lambda: ov.tp(1024, 0, 1, RATE, 1e9), "t=0"),
        (lambda: ov.ratio("x", 1, 1, RATE, 0), "beta=0"),
        (lambda: ov.cp_break_even_seq(8, 3, 4, RATE, 1e9, causal="yes"), "causal="),
    ],
)
def test_bad_input_is_one_sentence(call, needle):
    with pytest.raises(ValueError, match=needle):
        call()
