"""The planner's saved activations come from the parameterized accounting: hand-computed bytes
of one GPT-style and one Llama-style layer (gated MLP, grouped-query attention), and the
Llama-style inputs of ``shardlab plan`` moving the prediction the way they should."""

from __future__ import annotations

import json

import pytest
from shardlab import cli
from shardlab.accounting import activations as act
from shardlab.accounting import compute as C
from shardlab.accounting import peak
from shardlab.accounting import planner as P

MiB = 2**20


def test_gpt_style_layer_is_korthikanti():
    """GPT-style: GeLU MLP of 4h, dropout, LayerNorm, full multi-head attention. The lecture's
    layer (s=2048, b=1, h=4096, a=32, t=8): 114 MiB with SP, 34 MiB with selective
    recomputation, i.e. s b h / t (34 + 5 a s / h) and 34 s b h / t."""
    gpt = C.ModelShape(layers=1, hidden=4096, heads=32, kv_heads=32, ffn=16384, vocab=51200,
                       seq_len=2048, gated=False, dropout=True, norm="layernorm")
    kw = gpt.activation_layer
    sbh_t = 2048 * 4096 // 8  # 1,048,576 elements per rank
    assert act.activation_bytes_per_layer(2048, 1, 4096, 32, 8, "tp_sp", **kw) == 114 * MiB
    assert act.activation_bytes_per_layer(2048, 1, 4096, 32, 8, "tp_sp", **kw) == sbh_t * (
        34 + 5 * 32 * 2048 / 4096
    )
    assert act.activation_bytes_per_layer(2048, 1, 4096, 32, 8, "tp_sp_selective", **kw) == (
        34 * sbh_t
    )
    # the planner's recompute scratch of this layer: the attention core (80 MiB) / all (114)
    assert P.recompute_scratch(2048, 1, 4096, 32, 8, "selective", **kw) == 80 * MiB
    assert P.recompute_scratch(2048, 1, 4096, 32, 8, "full", **kw) == 114 * MiB


# Llama 3 405B layer at 8K context, t = 8 (q = 2 bytes, no dropout, RMSNorm statistics
# neglected). s b h = 8192 * 16384 = 134,217,728 elements; per tensor-parallel rank 16,777,216.
#   replicated  4 q sbh                                  =  8     sbh  (norm inputs, QKV/MLP in)
#   split       q sbh (2 + 2 * 8/128 + 3 * 53248/16384)  = 23.75  sbh  (Q, attention out; K, V
#                                                                       1/16 of Q; 3 MLP tensors)
#   attention   a s^2 b q = 128 * 8192^2 * 2             = 17,179,869,184 bytes (softmax output)
SBH_T = 16_777_216
LLAMA_SELECTIVE = 31.75 * SBH_T  # 532,676,608 bytes per rank per layer
LLAMA_TP_SP = LLAMA_SELECTIVE + 17_179_869_184 / 8  # 2,680,160,256
LLAMA_FULL = 2 * 8192 * 16384  # layer input only: 268,435,456 (bf16, replicated)


def llama_8k() -> C.ModelShape:
    return C.ModelShape(**C.LLAMA3_405B)


def test_llama_style_layer_by_hand():
    kw = llama_8k().activation_layer
    assert LLAMA_SELECTIVE == 532_676_608 and LLAMA_TP_SP == 2_680_160_256
    got = {m: act.activation_bytes_per_layer(8192, 1, 16384, 128, 8, m, **kw)
           for m in ("tp_sp_selective", "tp_sp", "full_recompute")}
    assert got == {"tp_sp_selective": LLAMA_SELECTIVE, "tp_sp": LLAMA_TP_SP,
                   "full_recompute": LLAMA_FULL}
    # the Korthikanti constants would have said 29 s b h / t: no third MLP tensor, full K/V
    plain = act.activation_bytes_per_layer(8192, 1, 16384, 128, 8, "tp_sp_selective",
                                           ffn=53248, dropout=False, norm="rmsnorm")
    assert plain == 29 * SBH_T
    # gated adds one f-wide tensor (2 * 53248/16384 = 6.5 sbh), GQA removes 2 * (1 - 8/128) * 2
    assert got["tp_sp_selective"] - plain == (6.5 - 3.75) * SBH_T


def test_kv_heads_below_t_are_replicated():
    """t = 8 > 2 K/V heads: every tensor-parallel rank holds one K/V head (t heads in all)."""
    one_head = act.activation_bytes_per_layer(64, 1, 512, 8, 8, "tp_sp_selective", kv_heads=2)
    per_rank_heads = act.activation_bytes_per_layer(64, 1, 512, 8, 8, "tp_sp_selective",
                                                    kv_heads=8)
    assert one_head == per_rank_heads
    with pytest.raises(ValueError, match="t=4 and kv_heads=6"):
        act.activation_bytes_per_layer(64, 1, 480, 12, 4, "tp_sp", kv_heads=6)
    with pytest.raises(ValueError, match="kv_heads=3 does not divide heads a=8"):
        act.layer_terms(64, 1, 512, 8, kv_heads=3)


def test_planner_llama_mesh_uses_the_llama_layer():
    """The 8K mesh's full-recompute candidate under sequence parallelism: activations = the
    layer input, split t = 8 ways (issue 25 item 2: Megatron shards it), of 2 layers per chunk x
    the chunks in flight; its scratch = one layer's whole tp_sp bytes, gated MLP and 8 K/V heads
    included. With the input split, the fuller stage is the last one (49 chunks in flight and
    the fp32 logits gradient). Selective recomputation does not fit (first stage, 64 chunks)."""
    model, cluster = llama_8k(), P.Cluster(**P.LLAMA3_CLUSTER)
    lay = P.Layout(128, 8, 16, 1, 1, 3, "full", 16, 4)
    c = P.evaluate(model, cluster, lay, 2048)
    assert isinstance(c, P.Candidate) and c.peak_stage == "last"
    assert P.inflight_chunks(16, 16, 4, 0) == 64 and P.inflight_chunks(16, 16, 4, 15) == 49
    assert c.memory["activations"] == LLAMA_FULL / 8 * 2 * 49
    assert c.memory["recompute_scratch"] == LLAMA_TP_SP
    ws = c.memory["backward_workspace"]
    assert ws == peak.logits_workspace(1, 8192, 128256 // 8, 4)  # vocabulary-parallel, fp32
    sel = P.evaluate(model, cluster, P.Layout(128, 8, 16, 1, 1, 3, "selective", 16, 4), 2048)
    assert isinstance(sel, P.Rejection) and sel.reason == "out of memory"
    # first stage of selective vs last stage of full: the same state (embedding = head), the
    # activations, the scratch and the workspace by hand
    want = (LLAMA_SELECTIVE * 128 + (LLAMA_TP_SP - LLAMA_SELECTIVE)) - (
        LLAMA_FULL / 8 * 98 + LLAMA_TP_SP + ws
    )
    assert sel.over_bytes + c.budget - c.peak == pytest.approx(want, rel=1e-12)
    assert f"out of memory by {sel.over_bytes / 1e9:.1f} GB" in sel.detail


def _plan_json(capsys, *extra: str) -> dict:
    rc = cli.main(["plan", "--top", "1", "--json", "--mark", "t=8,c=1,p=16,D=128,zero=3,"
                   "recompute=full,v=4", *extra])
    assert rc == 0
    return json.loads(capsys.readouterr().out)


def test_cli_kv_heads_and_gated_move_the_prediction(capsys):
    """``--kv-heads`` and ``--gated`` reach the saved activations: the marked layout's
    recompute scratch (one layer's tp_sp bytes per rank) changes by the hand-computed K/V and
    MLP terms."""
    base = _plan_json(capsys)
    mha = _plan_json(capsys, "--kv-heads", "128")
    gelu = _plan_json(capsys, "--no-gated")

    def scratch(data):
        return data["marked"][0]["best"]["memory"]["recompute_scratch"]

    assert scratch(base) == LLAMA_TP_SP
    assert scratch(mha) - scratch(base) == 2 * 2 * (1 - 8 / 128) * SBH_T  # K and V full width
    assert scratch(base) - scratch(gelu) == 2 * 53248 / 16384 * SBH_T  # the third f-wide tensor
