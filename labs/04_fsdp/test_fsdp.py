"""Public tests of the FSDP lab (2 launches: 2 ranks and 4 ranks; each returns one report).

Tolerances, and why:

* against the split reference (one process computing the D per-rank gradients, adding them
  and dividing by D): on 2 ranks **bitwise**, because every operation is the same and a sum
  of two numbers does not depend on order. On 4 ranks gloo's ring adds the four partial
  gradients in an order that depends on the chunk, so only fp32 rounding separates them.
* against the single-process full-batch run: the weight gradient of a layer is a sum over
  the batch; one big sum and D partial sums round differently (~1e-7 relative). SGD keeps
  that size: ``atol = 1e-6`` (seen: <= 2e-8). Adam divides each gradient by its own RMS, so a
  gradient that is pure rounding noise becomes an update of size ~lr: attention's key bias
  has an exactly zero gradient (softmax ignores a constant shift), and there we allow
  ``lr / 100`` (seen: <= 1.1e-5 with lr = 1e-2); every other parameter ``1e-5``
  (seen: <= 1.2e-6).
"""

from __future__ import annotations

import pytest
import torch
from _workers_fsdp import LR
from fsdp import FSDPConfig, blocks_policy, build_units
from fsdp_units import padded_numel
from shardlab.grading.outside import record
from shardlab.runtime import launch
from torch import nn

ADAMW_ZERO_GRAD_TOL = LR["adamw"] / 100
ADAMW_TOL, SGD_TOL = 1e-5, 1e-6


@pytest.fixture(scope="module")
def report2():
    return launch("_workers_fsdp:check_all", 2, "full", quiet=True)[0]


@pytest.fixture(scope="module")
def report4():
    return launch("_workers_fsdp:check_all", 4, "small", quiet=True)[0]


def test_config_validation():
    with pytest.raises(ValueError, match="reshard_after_forward"):
        FSDPConfig(reshard_after_forward=1)
    with pytest.raises(ValueError, match="compute_dtype"):
        FSDPConfig(compute_dtype=torch.int8)
    with pytest.raises(ValueError, match="unit_policy"):
        FSDPConfig(unit_policy="blocks")


def test_padding_and_policy():
    assert [padded_numel(n, 4) for n in (1, 4, 5, 1330)] == [4, 4, 8, 1332]
    assert blocks_policy("blocks.3", nn.Linear(1, 1))
    assert blocks_policy("model.blocks.0", nn.Linear(1, 1))
    assert not blocks_policy("blocks", nn.ModuleList())
    assert not blocks_policy("blocks.0.attn", nn.Linear(1, 1))


def test_tied_params_across_units_raise():
    from _workers_fsdp import make_model

    model = make_model("tied")
    cfg = FSDPConfig(unit_policy=lambda n, m: blocks_policy(n, m) or n == "lm_head")
    with pytest.raises(ValueError, match="tied parameters must live in one unit"):
        build_units(model, None, cfg)


def _record_params(rep, what):
    """The parameters after the steps of every run, to the grader: compared with the
    reference solution's outside the sandbox (rubric ``[outside]``; a no-op elsewhere)."""
    for (kind, opt), run in rep["runs"].items():
        record(f"{what} {kind}-{opt} D{rep['world']}", run["params"])


def test_bitwise_equal_to_split_reference_on_2_ranks(report2):
    _record_params(report2, "params")
    for key, run in report2["runs"].items():
        assert run["split"]["bitwise"], (key, run["split"])


def test_close_to_full_batch(report2, report4):
    _record_params(report4, "params")
    for rep in (report2, report4):
        for (kind, opt), run in rep["runs"].items():
            full = run["full"]
            if opt == "sgd":
                assert full["max_abs"] <= SGD_TOL, (rep["world"], kind, full)
            else:
                assert full["max_abs_nonzero_grad"] <= ADAMW_TOL, (rep["world"], kind, full)
                assert full["max_abs"] <= ADAMW_ZERO_GRAD_TOL, (rep["world"], kind, full)
            assert run["split"]["max_abs"] <= (SGD_TOL if opt == "sgd" else ADAMW_TOL)


def test_units_tied_and_frozen(report2):
    for (kind, opt), run in report2["runs"].items():
        record(f"units {kind}-{opt}", [run[k] for k in ("units", "root_params", "n_flats")])
    plain = report2["runs"][("plain", "adamw")]
    assert plain["units"] == ["root", "blocks.0", "blocks.1"]
    tied = report2["runs"][("tied", "adamw")]
    assert "tok_emb.weight" in tied["root_params"]  # lm_head.weight is the same tensor
    assert "lm_head.weight" not in tied["root_params"]
    assert report2["runs"][("frozen", "adamw")]["n_flats"] == 5  # 2 units get a frozen flat


def test_reshard_and_prefetch_do_not_change_results(report2):
    assert report2["same_results"] == {(a, b): True for a in (True, False) for b in (True, False)}


def test_mixed_precision_matches_same_casts(report2):
    mixed = report2["mixed"]["torch.bfloat16"]
    record("params bf16 D2", mixed["params"])
    assert mixed["split"]["bitwise"], mixed  # tolerance 0 on 2 ranks: same casts, same sums
    assert mixed["full_fp32"]["max_abs"] > 0  # bf16 compute really differs from fp32


def test_grads_have_param_shape_and_dtype(report2):
    record("grads", [[list(a), str(b), list(c), str(d)] for a, b, c, d in report2["grads"]])
    for gshape, gdtype, pshape, pdtype in report2["grads"]:
        assert gshape == pshape and gdtype == pdtype == torch.float32


def test_model_state_bytes_equal_accounting(report2, report4):
    assert report4["state"]["padding"] > 0  # 4 ranks: a block is not divisible by 4
    for rep in (report2, report4):
        st = rep["state"]
        record(f"state D{rep['world']}", {k: st[k] for k in sorted(st) if k.startswith("meas")})
        assert st["measured_bytes"] == st["predicted_bytes"], st
        assert st["measured_gathered_left"] == 0, st  # no gathered copy survives a step


def test_sent_bytes_per_step_equal_formula(report2, report4):
    for rep in (report2, report4):
        sent = [[row["measured_bytes"], row["all_gathers"]] for row in rep["comm"]]
        record(f"comm D{rep['world']}", sent)
        for row in rep["comm"]:
            assert row["measured_bytes"] == row["predicted_bytes"], row
        on, off = rep["comm"]
        assert on["all_gathers"] == 2 * off["all_gathers"]


def test_peak_memory_matches_prediction(report2):
    """Measured peak of one step (``MemoryTrace``, rank 0) / ``predict_peak``: within 5 % for
    all four reshard/prefetch settings, and prefetching adds exactly one gathered block.

    Why 5 %: every predicted term is the lifetime of real tensors (``_workers_fsdp.
    predicted_peak``): weight shards and AdamW moments all step; gradient shards only from
    their unit's reduce-scatter on (``zero_grad()`` frees them, so none exists at the
    peak); gathered blocks by the schedule, the root all step; the logits' gradients and the
    head's saved tensors only at the start of backward. What is left is below the model's
    resolution: inside the last block's backward (the peak with resharding) the model
    counts the block's whole gradient where the run holds the parts computed so far, the
    gradients of that layer's activations and the root's head gradients, which wait for
    its embedding gradient (seen: +1.8 % and +1.9 %); without resharding the peak is the
    start of backward and the difference is AdamW's step counters and the loss scalars
    (seen: +0.02 %). One gathered block is 8 % of the peak, so a wrong schedule fails.
    """
    rows = {r["run"]: r for r in report2["memory"]}
    assert len(rows) == 4
    for r in rows.values():
        assert 0.95 <= r["ratio"] <= 1.05, r
    on, off = rows["reshard=True prefetch=True"], rows["reshard=True prefetch=False"]
    block = on["predicted_terms"]["gathered_params"] - off["predicted_terms"]["gathered_params"]
    assert on["measured_peak"] - off["measured_peak"] == block > 0
    assert on["predicted_peak"] - off["predicted_peak"] == block


def test_reduce_scatter_without_overlap_trains_the_same_and_holds_one_gradient_less():
    """``overlap_reduce_scatter=False`` waits for each unit's reduce-scatter at once instead
    of keeping it in flight during the next unit's backward: the same collectives on the same
    tensors (weights bitwise equal, bytes equal), and at the peak (inside a block's backward)
    the previous block's gradient, the in-flight reduce-scatter's input, is gone: exactly one
    block's padded gradient less (measured 253.8 -> 241.2 MB at 25 M, benchmark_fsdp.py)."""
    on, off = (launch("_workers_fsdp:overlap_rows", 2, quiet=True)[0][k] for k in (True, False))
    assert on["weights"].keys() == off["weights"].keys()
    assert all(torch.equal(on["weights"][k], off["weights"][k]) for k in on["weights"])
    assert on["sent"] == off["sent"] > 0
    assert on["peak"] - off["peak"] == on["block_bytes"], (on["peak"], off["peak"])
