"""Hidden tests of per-parameter FSDP: one 4-rank launch (public checks, FSDP2, fp16, peaks).

On 4 ranks gloo's ring adds the four partial gradients in an order that depends on the
chunk, so against the split reference only fp32 rounding is allowed (the tolerances of
``test_fsdp_perparam.py``). FSDP2 pads, packs and reduces exactly as this mode does (one
reduce-scatter of the packed, dim-0 padded gradients, then a division by D), so it must be
equal bit for bit (seen on 2 and 4 ranks, fp32 and with ``MixedPrecisionPolicy(bf16, fp32)``).
"""

from __future__ import annotations

import math

import pytest
from _workers_fsdp import LR
from shardlab.runtime import launch

ADAMW_ZERO_GRAD_TOL = LR["adamw"] / 100
TOL = {"sgd": 1e-6, "adamw": 1e-5}


@pytest.fixture(scope="module")
def extra():
    return launch("_workers_fsdp_perparam:extra_checks_pp", 4, quiet=True)[0]


def test_equal_to_pytorch_fsdp2_bitwise(extra):
    assert len(extra["pytorch"]) == 5  # plain/tied x AdamW/SGD, and AdamW in bf16
    for key, cmp in extra["pytorch"].items():
        assert cmp["bitwise"], (key, cmp)


def test_four_ranks_close_to_references(extra):
    for (kind, opt), run in extra["runs"].items():
        for ref in ("split", "full"):
            got = run[ref]
            assert got["max_abs_nonzero_grad"] <= TOL[opt], (kind, opt, ref, got)
            assert got["max_abs"] <= (TOL[opt] if opt == "sgd" else ADAMW_ZERO_GRAD_TOL)
    assert extra["leaves"]["max_abs_nonzero_grad"] <= TOL["adamw"]
    assert extra["mixed"]["split"]["max_abs_nonzero_grad"] <= TOL["adamw"]
    assert extra["fp16"]["max_abs_nonzero_grad"] <= TOL["adamw"], extra["fp16"]
    assert extra["clip"]["max_abs"] <= TOL["sgd"], extra["clip"]


def test_four_ranks_shards_bytes_and_padding(extra):
    for name, shape in extra["original"].items():
        local = (math.ceil(shape[0] / 4), *shape[1:])
        assert extra["registered"][name][0] == local, name
        assert extra["registered"][name][2] == (local, extra["registered"][name][1])
    (row,) = extra["modes"]
    assert row["sent_bytes"] == row["sent_predicted"], row
    assert row["state_bytes"] == row["state_predicted"], row
    assert row["N_padded"] > row["N_padded_flat_units"] > row["N"]  # both pad on 4 ranks
    b = extra["mixed_bytes"]
    for op in ("all_gather", "reduce_scatter", "all_reduce"):
        assert b[f"measured_{op}"] == b[f"predicted_{op}"], (op, b)


def test_four_ranks_peak_memory(extra):
    """Within 7 % of ``predict_peak`` on 4 ranks (seen 0.940-1.061): the two moments the
    model does not resolve (``predicted_peak_pp``'s docstring) are each about one block, and
    on 4 ranks a block is 14 % of the peak; resharding lowers the peak."""
    rows = {r["run"]: r for r in extra["memory"]}
    for r in rows.values():
        assert 0.93 <= r["ratio"] <= 1.07, r
    lean = rows["reshard=True prefetch=False"]["measured_peak"]
    assert lean < rows["reshard=False prefetch=False"]["measured_peak"]
