"""Hidden tests of the combined-layouts lab: one 4-rank launch (the groups of both meshes,
PyTorch's FSDP2 + DTensor on the same 2x2 mesh, DP x PP with the GPipe schedule)."""

from __future__ import annotations

import pytest
from shardlab.runtime import launch
from shardlab.runtime.once_per_run import once_per_run

# the same arithmetic as the public FSDP x TP test, so the same bound (see test_combined.py)
PARAM_TOL = 1e-6


@pytest.fixture(scope="module")
def extra(tmp_path_factory):
    """One 4-rank launch per test run, shared by the pytest-xdist workers (each used to
    launch its own)."""
    return once_per_run(
        tmp_path_factory,
        "lab09-hidden-extra",
        lambda: launch("_workers_combined:extra_checks", 4, quiet=True, timeout=280)[0],
    )


def test_groups_are_the_mesh_lines(extra):
    assert len(extra["groups"]) == 4
    for rank_rows in extra["groups"]:
        for layout, axes in rank_rows.items():
            for axis, (got, want) in axes.items():
                assert got == want, (layout, axis, got, want)


def test_equal_to_pytorch_fsdp2_and_dtensor(extra):
    res = extra["pytorch"]
    assert res["names_match"]
    assert res["max_abs_param"] <= PARAM_TOL, res  # PyTorch's run against one process
    assert res["max_abs_vs_ours"] <= 2 * PARAM_TOL, res  # ours against PyTorch's


def test_dp_pp_gpipe_equal_and_bytes(extra):
    rep = extra["gpipe"]
    assert rep["twins_bitwise"]
    for res in rep["pipelines"].values():
        assert res["names_match"] and res["max_abs_param"] <= PARAM_TOL, res
    for row in rep["bytes"]:
        assert row["other_axes"] == [] and row["measured"] == row["predicted"], row
