"""accounting.compute: FLOPs per token, recomputation, time, MFU, collective roofline."""

from __future__ import annotations

import math

import pytest
from shardlab.accounting import comm
from shardlab.accounting import compute as C


def gpt(L=96, h=12288, s=2048, V=51200):
    """A GPT-style layer as Korthikanti et al. and Narayanan et al. count it."""
    return C.ModelShape(L, h, 96, 96, 4 * h, V, s, gated=False, dropout=True, norm="layernorm")


def test_forward_backward_step_per_token():
    n, L, s, d = 7e9, 32, 4096, 4096
    fwd = C.flops_per_token(n, L, s, d, "forward")
    assert fwd == 2 * n + 4 * L * s * d
    assert C.flops_per_token(n, L, s, d, "backward") == 2 * fwd
    assert C.flops_per_token(n, L, s, d, "step") == 6 * n + 12 * L * s * d
    # a causal kernel skips half the score matrix: only the attention term halves
    assert C.flops_per_token(n, L, s, d, "step", causal=True) == 6 * n + 6 * L * s * d
    assert C.six_n(n) == 6 * n
    assert C.attention_flops_per_token(L, s, d) == 4 * L * s * d


def test_model_flops_equal_the_megatron_formulas():
    """Narayanan et al. (2021), eq. 3 and Korthikanti et al. (2022), Sec. 5: per iteration
    72 B L s h^2 (1 + s/(6h) + V/(12 h L)) model FLOPs; full recomputation gives
    96 B L s h^2 (1 + s/(6h) + V/(16 h L)); selective adds the attention core's forward."""
    L, h, s, V = 96, 12288, 2048, 51200
    m = gpt(L, h, s, V)
    per_token = 72 * L * h * h * (1 + s / (6 * h) + V / (12 * h * L))
    assert m.flops_per_token("step") == pytest.approx(per_token, rel=1e-12)
    full = m.flops_per_token("step") + m.recompute_flops_per_token("full")
    assert full == pytest.approx(96 * L * h * h * (1 + s / (6 * h) + V / (16 * h * L)), rel=1e-12)
    assert m.recompute_flops_per_token("selective") == 4 * L * s * h
    assert m.recompute_flops_per_token("none") == 0


def test_llama3_405b_shape():
    m = C.ModelShape(**C.LLAMA3_405B)
    h, kv = 16384, 8 * 128
    layer = 2 * h * h + 2 * h * kv + 3 * h * 53248 + 2 * h
    assert m.layer_params == layer
    assert m.n_params == 126 * layer + 2 * 128256 * h + h
    assert round(m.n_params / 1e9, 1) == 405.9  # the "405B"
    # 6N per token uses the matmul weights (not the embedding lookup, not the norms)
    assert m.matmul_params == 126 * (layer - 2 * h) + 128256 * h
    # the planner's saved activations see the gated MLP and the 8 K/V heads (issue 15)
    assert m.activation_layer == {"ffn": 53248, "gated": True, "kv_heads": 8, "dropout": False,
                                  "norm": "rmsnorm"}


def test_moe_counts_top_k_experts_per_token():
    dense = C.ModelShape(4, 64, 4, 4, 256, 100, 32)
    moe = C.ModelShape(4, 64, 4, 4, 256, 100, 32, experts=8, top_k=2)
    assert moe.layer_params == dense.layer_params + 7 * dense.mlp_params + 64 * 8
    assert moe.layer_matmul_params == dense.layer_matmul_params + dense.mlp_params + 64 * 8


def test_time_and_mfu():
    assert C.compute_time(1e15, 1e15, 0.5) == 2.0
    assert C.compute_time(0, 1e15) == 0.0
    # a step of F model FLOPs on G GPUs in T seconds
    assert C.mfu(6e18, 10.0, 1000, 1e15) == pytest.approx(0.6)


def test_roofline_uses_comm_alpha_beta():
    r = C.collective_roofline("all_reduce", 1e9, 8, 3, 5e-6, 100e9, 4e14, 1e15, 0.5)
    assert r.comm_time == comm.collectives_time("all_reduce", 1e9, 8, 3, 5e-6, 100e9)
    assert r.bytes_sent == 3 * comm.sent_bytes("all_reduce", 1e9, 8)
    assert r.compute_time == C.compute_time(4e14, 1e15, 0.5)
    assert r.hidden == min(r.comm_time, r.compute_time)
    assert r.exposed == pytest.approx(max(0.0, r.comm_time - r.compute_time))
    assert r.bound == ("communication" if r.comm_time > r.compute_time else "compute")
    assert r.balance == 1e15 * 0.5 / 100e9


@pytest.mark.parametrize("flops", [1e9, 1e11, 5e12, 1e14])
def test_roofline_bound_matches_intensity_against_balance(flops):
    """With alpha = 0 the collective is compute-bound exactly when its FLOPs per byte reach
    the machine balance peak*efficiency/beta."""
    r = C.collective_roofline("all_gather", 2e9, 16, 1, 0.0, 50e9, flops, 1e15, 0.5)
    assert (r.bound == "compute") == (r.intensity >= r.balance)
    assert 0.0 <= r.overlap <= 1.0


def test_roofline_without_traffic():
    r = C.roofline("tp", 0.0, 0.0, 1e12, 1e15)
    assert r.exposed == 0 and r.overlap == 1.0 and math.isinf(r.intensity)


@pytest.mark.parametrize(
    "call, needle",
    [
        (lambda: C.compute_time(1e9, 1e15, 1.5), "efficiency=1.5"),
        (lambda: C.compute_time(1e9, 0), "peak_flops=0"),
        (lambda: C.flops_per_token(1e9, 2, 8, 8, phase="sideways"), "phase='sideways'"),
        (lambda: C.recompute_flops_per_token("partial", 1, 1, 1, 1), "mode='partial'"),
        (lambda: C.mfu(1e9, 0, 8, 1e15), "step_time=0"),
        (lambda: C.ModelShape(2, 100, 3, 3, 10, 10, 10), "hidden=100"),
        (lambda: C.ModelShape(2, 64, 8, 3, 10, 10, 10), "kv_heads=3"),
        (lambda: C.ModelShape(2, 64, 8, 8, 10, 10, 10, experts=2, top_k=3), "top_k=3"),
        (lambda: C.ModelShape(2, 64, 8, 8, 10, 10, 10, norm="batchnorm"), "norm='batchnorm'"),
        (lambda: C.ModelShape(0, 64, 8, 8, 10, 10, 10), "layers=0"),
    ],
)
def test_bad_input_names_the_values(call, needle):
    with pytest.raises(ValueError) as exc:
        call()
    assert needle in str(exc.value)
