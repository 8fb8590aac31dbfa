"""Hidden tests of the FSDP lab: one 2-rank launch (FSDP2, accumulation, fp16, one unit, peaks)."""

from __future__ import annotations

import pytest
from shardlab.runtime import launch

# FSDP2 runs the same arithmetic (fp32 all-gather, sum reduce-scatter, / D) on 2 ranks; we
# allow the full-batch tolerances of test_fsdp.py in case its division order differs.
TOL = {"sgd": 1e-6, "adamw": 1e-5}


@pytest.fixture(scope="module")
def extra():
    return launch("_workers_fsdp:extra_checks", 2, quiet=True)[0]


def test_equal_to_pytorch_fsdp2(extra):
    for (kind, opt), cmp in extra["pytorch"].items():
        assert cmp["max_abs"] <= TOL[opt], (kind, opt, cmp)


def test_grad_accumulation_volume(extra):
    sync, once = extra["accum"]
    for row in (sync, once):
        assert row["measured_bytes"] == row["predicted_bytes"], row
    assert sync["reduce_scatters"] == 4 * once["reduce_scatters"]
    assert extra["accum_same"]["max_abs"] <= TOL["sgd"]


def test_fp16_and_single_unit(extra):
    assert extra["fp16"]["bitwise"], extra["fp16"]
    assert extra["one_unit"]["units"] == 1 and extra["one_unit"]["bitwise"]


def test_peak_memory_ordering_and_prediction(extra):
    """Resharding lowers the peak, prefetching raises it by exactly one block, and the
    measured peak is within 5 % of ``predict_peak`` (why 5 %: the docstring of
    ``test_fsdp.py::test_peak_memory_matches_prediction``)."""
    rows = {r["run"]: r for r in extra["memory"]}
    lean = rows["reshard=True prefetch=False"]["measured_peak"]
    assert lean <= rows["reshard=True prefetch=True"]["measured_peak"]
    assert lean < rows["reshard=False prefetch=False"]["measured_peak"]
    block = rows["reshard=True prefetch=True"]["measured_peak"] - lean
    assert (
        block
        == rows["reshard=True prefetch=True"]["predicted_peak"]
        - (rows["reshard=True prefetch=False"]["predicted_peak"])
    )
    for r in rows.values():
        assert 0.95 <= r["ratio"] <= 1.05, r
