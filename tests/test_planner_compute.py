"""The planner's time model (issue 25, items 3 and 4): causal on/off FLOPs by hand, the per-GEMM
roofline (a memory-bound product below the ridge, a compute-bound one at the cap), the device
presets, the element-wise bytes, MFU next to HFU, and the CLI's --causal / --device."""

from __future__ import annotations

import json

import pytest
from shardlab import cli
from shardlab.accounting import compute as C
from shardlab.accounting import gemm
from shardlab.accounting import planner as P

H100 = gemm.DEVICES["h100"]


def test_device_presets_are_the_data_sheets():
    """Dense bf16 peak (half the 'with sparsity' figure), HBM bandwidth, memory; ridge = their
    ratio in FLOP/byte."""
    want = {"a100-40gb": (312e12, 1555e9, 40e9), "a100-80gb": (312e12, 2039e9, 80e9),
            "h100": (989e12, 3.35e12, 80e9), "h200": (989e12, 4.8e12, 141e9),
            "b200": (2.25e15, 8e12, 180e9)}
    for key, (peak, bw, mem) in want.items():
        d = gemm.DEVICES[key]
        assert (d.peak_flops, d.hbm_bandwidth, d.memory) == (peak, bw, mem)
        assert d.ridge == peak / bw
    assert round(H100.ridge) == 295  # 989e12 / 3.35e12


def test_compute_bound_gemm_runs_at_the_cap():
    """4096^3 in bf16: 2 * 4096^3 FLOPs over 2 * 3 * 4096^2 bytes = 4096/3 = 1,365 FLOP/byte,
    above the H100 ridge (295): the product runs at the cap."""
    i = gemm.gemm_intensity(4096, 4096, 4096)
    assert i == pytest.approx(4096 / 3)
    assert gemm.gemm_efficiency(i, H100.ridge, 0.6) == 0.6
    t = gemm.gemm_time(4096, 4096, 4096, H100.peak_flops, H100.hbm_bandwidth, 0.6)
    assert t == pytest.approx(2 * 4096**3 / (0.6 * 989e12))


def test_memory_bound_gemm_runs_at_the_bandwidth():
    """8 tokens times a 4096 x 4096 weight: 2*8*4096^2 FLOPs over 2*(8*4096 + 4096^2 + 8*4096)
    bytes = 32768/4112 = 7.97 FLOP/byte, far below the ridge: efficiency 7.97/295 = 2.7 %, and
    the time is the bytes over the HBM bandwidth."""
    i = gemm.gemm_intensity(8, 4096, 4096)
    assert i == pytest.approx(32768 / 4112)
    eff = gemm.gemm_efficiency(i, H100.ridge, 0.6)
    assert eff == pytest.approx(i / H100.ridge) and eff < 0.03
    t = gemm.gemm_time(8, 4096, 4096, H100.peak_flops, H100.hbm_bandwidth, 0.6)
    assert t == pytest.approx(2 * (8 * 4096 + 4096**2 + 8 * 4096) / 3.35e12)
    with pytest.raises(ValueError, match="cap=1.5"):
        gemm.gemm_efficiency(100.0, 10.0, 1.5)


def test_layer_gemms_carry_the_model_flops():
    """The products of one layer on one rank add up to the compute model's FLOPs per token times
    the rank's tokens: 2 N_layer (weights, split t ways) + 4 s h (attention, before causal)."""
    m = C.ModelShape(**C.LLAMA3_405B)
    t, c, b = 8, 2, 1
    g = gemm.layer_gemms(m, t, c, b)
    tokens = b * m.seq_len / c / t
    assert sum(x.flops for x in g["weights"]) == pytest.approx(
        2 * m.layer_matmul_params * tokens)
    assert sum(x.flops for x in g["attention"]) == pytest.approx(4 * m.seq_len * m.hidden * tokens)
    assert sum(x.flops for x in g["head"]) == pytest.approx(2 * m.vocab * m.hidden * tokens)


def test_elementwise_bytes_by_hand():
    """GPT layer, s=2048, b=1, h=4096, a=32, t=8, bf16: outside the TP region
    s b h (10 q + 2) = 22 s b h (split t ways with SP only); GeLU 2 q s b f / t = 16 s b h / t;
    scores a s^2 b (2q + 2q + 1) / t = 9 a s^2 b / t."""
    m = C.ModelShape(1, 4096, 32, 32, 16384, 51200, 2048, gated=False, dropout=True,
                     norm="layernorm")
    sbh = 2048 * 4096
    sp = gemm.elementwise_bytes(m, 8, 1, 1, sp=True)
    no_sp = gemm.elementwise_bytes(m, 8, 1, 1, sp=False)
    assert sp["layer"] == 22 * sbh / 8 + 16 * sbh / 8
    assert no_sp["layer"] == 22 * sbh + 16 * sbh / 8
    assert sp["attention"] == no_sp["attention"] == 9 * 32 * 2048**2 / 8


# a tiny model on one GPU, the constant model (every product at the cap): FLOPs by hand
TINY = dict(layers=2, hidden=64, heads=4, kv_heads=4, ffn=256, vocab=1000, seq_len=128,
            gated=False)
N_LAYER = 4 * 64 * 64 + 2 * 64 * 256  # attention 4 h^2 + GeLU MLP 2 h f = 49,152


def _one_gpu(hbm=None, peak=1e12) -> P.Cluster:
    return P.Cluster(1, 80e9, 1, 0.0, 1e12, 0.0, 1e12, peak, 0.6, hbm)


@pytest.mark.parametrize("causal, f", [(True, 0.5), (False, 1.0)])
def test_causal_halves_attention_flops_and_time(causal, f):
    """Forward per token: 2 L N_layer + 4 L s h f + 2 V h = 196,608 + 65,536 f + 128,000."""
    m = C.ModelShape(**TINY)
    fwd_token = 2 * 2 * N_LAYER + 4 * 2 * 128 * 64 * f + 2 * 1000 * 64
    assert m.flops_per_token("forward", causal) == fwd_token
    lay = P.Layout(1, 1, 1, 1, 1, 0, "none", 1, 1)
    c = P.evaluate(m, _one_gpu(), lay, 1, causal=causal)
    assert c.times["compute"] == pytest.approx(3 * fwd_token * 128 / (0.6 * 1e12))
    assert c.mfu == pytest.approx(0.6 * c.times["compute"] / c.step_time)


def test_causal_on_and_off_differ_by_the_attention_term():
    m = C.ModelShape(**TINY)
    assert m.flops_per_token("step", False) - m.flops_per_token("step", True) == 6 * 2 * 128 * 64


def test_hfu_adds_the_recomputed_flops():
    """Full recomputation runs every layer's forward again, 2 L N_layer + 4 L s h f per token:
    HFU / MFU = (model + recomputed) / model FLOPs."""
    m = C.ModelShape(**TINY)
    lay = P.Layout(1, 1, 1, 1, 1, 0, "full", 1, 1)
    c = P.evaluate(m, _one_gpu(), lay, 1)
    model = 3 * (196_608 + 32_768 + 128_000)
    rec = 196_608 + 32_768
    assert c.hfu / c.mfu == pytest.approx((model + rec) / model)
    none = P.evaluate(m, _one_gpu(), P.Layout(1, 1, 1, 1, 1, 0, "none", 1, 1), 1)
    assert none.hfu == none.mfu


def test_roofline_slows_small_products_and_not_large_ones():
    """With the HBM bandwidth given, a tiny model's products (64 wide) fall below the ridge
    and the step is slower than at the cap; Llama 3 405B's layer products stay at the cap."""
    m = C.ModelShape(**TINY)
    lay = P.Layout(1, 1, 1, 1, 1, 0, "none", 1, 1)
    flat = P.evaluate(m, _one_gpu(None, H100.peak_flops), lay, 1)
    roof = P.evaluate(m, _one_gpu(H100.hbm_bandwidth, H100.peak_flops), lay, 1)
    assert roof.times["compute"] > 2 * flat.times["compute"]
    assert roof.gemm_efficiency < 0.3 and flat.gemm_efficiency == pytest.approx(0.6)
    big = C.ModelShape(**C.LLAMA3_405B)
    for g in gemm.layer_gemms(big, 8, 1, 1)["weights"]:
        assert gemm.gemm_efficiency(gemm.gemm_intensity(g.m, g.k, g.n), H100.ridge, 0.6) == 0.6


def _plan_json(capsys, *args: str) -> dict:
    assert cli.main(["plan", "--top", "1", "--json", *args]) == 0
    return json.loads(capsys.readouterr().out)


def test_cli_causal_and_device(capsys):
    causal = _plan_json(capsys)
    full = _plan_json(capsys, "--no-causal")
    m = C.ModelShape(**C.LLAMA3_405B)
    assert causal["model"]["flops_per_token"] == m.flops_per_token("step", True)
    assert full["model"]["flops_per_token"] == m.flops_per_token("step", False)
    assert full["settings"]["causal"] is False
    a100 = _plan_json(capsys, "--device", "a100-80gb")
    assert a100["cluster"]["peak_flops"] == 312e12
    assert a100["cluster"]["hbm_bandwidth"] == pytest.approx(2039e9)
    assert a100["cluster"]["gpu_memory"] == 80e9
    flat = _plan_json(capsys, "--hbm-tbps", "0")
    assert flat["cluster"]["hbm_bandwidth"] is None
    first = flat["feasible"][0]
    assert first["hfu"] >= first["mfu"] > 0
