"""Memory choices of the planner (issue 25, items 2 and 5): sequence parallelism on/off and full
recomputation's checkpoint, Korthikanti's TP + selective row, FSDP without resharding after
forward, tied embeddings under pipelining, a non-gated MLP, a custom precision recipe, and the
CLI's bad input answered with one sentence."""

from __future__ import annotations

import json

import pytest
from shardlab import cli
from shardlab.accounting import activations as act
from shardlab.accounting import compute as C
from shardlab.accounting import memory
from shardlab.accounting import planner as P

MiB = 2**20
SBH = 2048 * 1 * 4096  # the lecture's layer: s=2048, b=1, h=4096, a=32


def test_full_recompute_checkpoint_split_by_sequence_parallelism():
    """Full recomputation keeps the bf16 layer input, 2 s b h = 16 MiB; under SP each of the
    t = 8 ranks keeps its s/t rows, 2 MiB. The default stays the replicated input (lab 06
    measures it without SP)."""
    args = (2048, 1, 4096, 32, 8, "full_recompute")
    assert act.activation_bytes_per_layer(*args) == 16 * MiB
    assert act.activation_bytes_per_layer(*args, sp=False) == 16 * MiB
    assert act.activation_bytes_per_layer(*args, sp=True) == 2 * MiB
    assert act.activation_bytes(32, *args, sp=True) == 32 * 2 * MiB
    with pytest.raises(ValueError, match="t=8 does not divide s=2044"):
        act.activation_bytes_per_layer(2044, 1, 4096, 32, 8, "full_recompute", sp=True)
    # under SP, full recomputation keeps less than selective (34 s b h / t = 34 MiB)
    assert act.activation_bytes_per_layer(2048, 1, 4096, 32, 8, "tp_sp_selective") == 34 * MiB


def test_tp_selective_is_korthikanti_table_2():
    """Tensor parallel + selective recompute, no SP: s b h (10 + 24/t) = 13 s b h at t = 8."""
    got = act.activation_bytes_per_layer(2048, 1, 4096, 32, 8, "tp_selective")
    assert got == 13 * SBH == 104 * MiB
    assert [r.mode for r in act.activation_table(2048, 1, 4096, 32, 8)] == list(act.MODES)


GPT = dict(layers=8, hidden=4096, heads=32, kv_heads=32, ffn=16384, vocab=51200, seq_len=2048,
           gated=False, dropout=True, norm="layernorm")
SMALL = dict(gpus=16, gpu_memory=80e9, gpus_per_node=8, alpha_intra=5e-6, beta_intra=300e9,
             alpha_inter=10e-6, beta_inter=25e9, peak_flops=312e12, hbm_bandwidth=2039e9)


def _eval(layout: P.Layout, batch: int = 16, **model):
    return P.evaluate(C.ModelShape(**{**GPT, **model}), P.Cluster(**SMALL), layout, batch)


def test_planner_sp_on_and_off_checkpoint_memory():
    """t = 8, p = 1, D = 2, full recomputation: the saved activations are the 8 layers' inputs,
    2 s b h each, whole without SP and an eighth with it; the scratch is one layer's tp or
    tp_sp bytes."""
    on = _eval(P.Layout(2, 8, 1, 1, 1, 1, "full", 8, 1, True))
    off = _eval(P.Layout(2, 8, 1, 1, 1, 1, "full", 8, 1, False))
    assert on.memory["activations"] == 8 * 2 * SBH / 8
    assert off.memory["activations"] == 8 * 2 * SBH
    assert on.memory["recompute_scratch"] == act.activation_bytes_per_layer(
        2048, 1, 4096, 32, 8, "tp_sp")
    assert off.memory["recompute_scratch"] == act.activation_bytes_per_layer(
        2048, 1, 4096, 32, 8, "tp")
    assert off.layout.label.endswith("noSP") and on.step_time < off.step_time
    sel = _eval(P.Layout(2, 8, 1, 1, 1, 1, "selective", 8, 1, False))
    assert sel.memory["activations"] == 8 * 13 * SBH  # tp_selective, 10 + 24/8


def test_fsdp_without_reshard_keeps_every_layer_gathered():
    """ZeRO-3 with reshard=False: all 8 layers gathered at the start of backward (2 with
    resharding), one parameter all-gather per layer and microbatch instead of two."""
    keep = _eval(P.Layout(16, 1, 1, 1, 1, 3, "full", 1, 1, True, False))
    free = _eval(P.Layout(16, 1, 1, 1, 1, 3, "full", 1, 1))
    layer_bf16 = 2 * C.ModelShape(**GPT).layer_params
    assert free.memory["gathered_params"] == 2 * layer_bf16
    assert keep.memory["gathered_params"] == 8 * layer_bf16
    assert keep.layout.label.endswith("keep")
    assert keep.comm["dp"].bytes_sent < free.comm["dp"].bytes_sent
    with pytest.raises(ValueError, match="reshard=False needs zero=3"):
        _eval(P.Layout(16, 1, 1, 1, 1, 1, "full", 1, 1, True, False))


def test_tied_embeddings_under_pipelining_keep_a_copy_on_the_last_stage():
    """Tied: one V x h matrix. Without pipelining the rank holds it once (no separate head);
    with p = 2 the last stage keeps a copy for the output projection, as Megatron does."""
    V_h = 51200 * 4096
    one = _eval(P.Layout(16, 1, 1, 1, 1, 0, "full", 1, 1), tied_embeddings=True)
    one_untied = _eval(P.Layout(16, 1, 1, 1, 1, 0, "full", 1, 1))
    per_param = memory.get_recipe("mixed-adam-16").total
    assert one_untied.memory["persistent"] - one.memory["persistent"] == V_h * per_param
    two = _eval(P.Layout(8, 1, 2, 1, 1, 0, "full", 8, 1), 64, tied_embeddings=True)
    two_untied = _eval(P.Layout(8, 1, 2, 1, 1, 0, "full", 8, 1), 64)
    assert two.peak_stage == "last" and two_untied.peak_stage == "last"
    assert two.memory["persistent"] == two_untied.memory["persistent"]


def test_non_gated_mlp_saves_two_f_wide_tensors():
    """GeLU MLP: input and output of the activation, 2 f-wide tensors; SwiGLU saves 3. At
    f = 4h, q = 2 and t = 8 with SP that is 16 vs 24 s b h / t per layer."""
    gelu = _eval(P.Layout(2, 8, 1, 1, 1, 1, "none", 8, 1))
    swiglu = _eval(P.Layout(2, 8, 1, 1, 1, 1, "none", 8, 1), gated=True)
    assert swiglu.memory["activations"] - gelu.memory["activations"] == 8 * 2 * 4 * SBH / 8


def test_custom_recipe_bytes_reach_the_state(capsys):
    """--recipe-bytes 2,4,4,4,4: 18 bytes per parameter of DDP state (fp32 gradients)."""
    rc = cli.main(["plan", "--top", "1", "--json", "--layers", "8", "--hidden", "4096",
                   "--heads", "32", "--kv-heads", "32", "--ffn", "16384", "--vocab", "51200",
                   "--seq-len", "2048", "--global-batch", "16", "--gpus", "16",
                   "--recipe-bytes", "2,4,4,4,4", "--mark", "t=1,p=1,D=16,zero=0,recompute=full"])
    assert rc == 0
    data = json.loads(capsys.readouterr().out)
    assert data["settings"]["recipe"] == "custom 2,4,4,4,4"
    best = data["marked"][0]["best"]
    model = C.ModelShape(8, 4096, 32, 32, 16384, 51200, 2048)
    assert best["memory"]["persistent"] == 18 * model.n_params - 18 * 4096  # no final norm


def main_rc(argv: list[str]) -> int:
    try:
        return cli.main(argv)
    except SystemExit as exc:
        return int(exc.code)


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--max-bubble", "2"], "--max-bubble 2 must be an idle fraction in [0, 1]"),
        (["--top", "2.5"], "--top 2.5 must be a whole number"),
        (["--layers", "100000"], "at most 1,024 layers"),
        (["--layers", "1e9"], "--layers 1e9"),
        (["--gpus", "1e100"], "--gpus 1e100"),
        (["--hidden", "1e300"], "--hidden 1e300"),
        (["--recipe-bytes", "2,2,4"], "must be five numbers"),
        (["--recipe-bytes", "2,4,4,4,4", "--recipe", "fp32"], "choose one"),
        (["--hbm-tbps", "-1"], "--hbm-tbps -1"),
        (["--mark", "t=8,sp=maybe"], "sp is on or off"),
    ],
)
def test_bad_plan_input_one_sentence(capsys, argv, needle):
    assert main_rc(["plan", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("shardlab plan: ") and needle in err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_embedding_counted_as_a_stage_layer():
    """Llama 3 405B, p = 16, v = 1: 126 layers take ceil(126/16) = 8 per stage; with the
    embedding and the head counted as layers, ceil(128/16) = 8 slots, so the first and the last
    stage hold 7 transformer layers (Llama 3 removes one layer from each, 126 = 16*8 - 2): the
    fuller stage's state is one layer's ZeRO-1 share smaller."""
    model = C.ModelShape(**C.LLAMA3_405B)
    cluster = P.Cluster(**P.LLAMA3_CLUSTER)
    lay = P.Layout(128, 8, 16, 1, 1, 1, "full", 16, 1)
    plain = P.evaluate(model, cluster, lay, 2048, max_bubble=0.5)
    split = P.evaluate(model, cluster, lay, 2048, max_bubble=0.5, embedding_in_split=True)
    per_layer = (model.attn_params + model.mlp_params + 2 * model.hidden) / 8
    assert split.memory["persistent"] < plain.memory["persistent"]
    assert plain.memory["persistent"] - split.memory["persistent"] == pytest.approx(
        memory.model_state(round(per_layer), 128, "zero1").total, rel=1e-6)
    pl = P.plan(model, cluster, 2048, embedding_in_split=True)
    assert pl.settings["embedding_in_split"] is True and pl.feasible
