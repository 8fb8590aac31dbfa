"""The planner's ZeRO-Offload option (issue 31 §3): ZeRO-1/2 layouts with the optimizer side on
the host. Hand-worked on a 16-GPU ZeRO-2 layout of mixed Adam (2 + 2 + 12 bytes per
parameter): the device keeps 2 N of weights and 2 N / 16 of gradients, so of the persistent
2.875 N bytes the 0.75 N of master weights and moments leave the peak; the step gains
accounting.hierarchical.offload_step's PCIe and host-update time."""

from __future__ import annotations

import json

import pytest
from shardlab import cli
from shardlab.accounting import compute, hierarchical, planner

MODEL = compute.ModelShape(8, 1024, 8, 8, 4096, 32000, 2048)
CLUSTER = planner.Cluster(16, 80e9, 8, 3e-6, 300e9, 10e-6, 50e9, 989e12, hbm_bandwidth=3.35e12)


def _layout(zero):
    return planner.Layout(16, 1, 1, 1, 1, zero, "none", 2, 1, True, True, 1)


def test_zero2_offload_moves_the_optimizer_side_off_the_device():
    off = planner.evaluate(MODEL, CLUSTER, _layout(2), 32, offload=True)
    on = planner.evaluate(MODEL, CLUSTER, _layout(2), 32)
    persistent = on.memory["persistent"]  # 2 N + 2 N / 16 + 12 N / 16 = 2.875 N
    n = persistent / 2.875
    assert on.peak - off.peak == pytest.approx(0.75 * n, rel=1e-12)
    assert off.memory["persistent"] == pytest.approx(2.125 * n, rel=1e-12)
    want = hierarchical.offload_step(round(n), 16, 25e9, 100e9, 3.35e12)
    assert off.times["offload"] == pytest.approx(want.added_seconds, rel=1e-6)
    assert off.step_time - on.step_time == pytest.approx(want.added_seconds, rel=1e-6)
    assert "offload" not in on.times


@pytest.mark.parametrize("zero", [0, 3])
def test_other_stages_are_costed_as_without_offload(zero):
    off = planner.evaluate(MODEL, CLUSTER, _layout(zero), 32, offload=True)
    on = planner.evaluate(MODEL, CLUSTER, _layout(zero), 32)
    assert off.peak == on.peak and off.times["offload"] == 0.0
    assert off.step_time == on.step_time


def test_plan_with_offload_every_candidate_has_the_term_and_a_faster_link_costs_less():
    slow = planner.plan(MODEL, CLUSTER, 32, offload=True, pcie_bandwidth=5e9)
    fast = planner.plan(MODEL, CLUSTER, 32, offload=True, pcie_bandwidth=50e9)
    assert slow.settings["offload"] and slow.settings["pcie_bandwidth"] == 5e9
    assert all("offload" in c.times for c in slow.feasible)
    lay = next(c.layout for c in slow.feasible if c.layout.zero == 2)
    assert fast.find(**lay.as_dict())[0].times["offload"] < slow.find(**lay.as_dict())[0].times[
        "offload"]
    assert planner.plan(MODEL, CLUSTER, 32).settings["offload"] is False
    with pytest.raises(ValueError, match="pcie_bandwidth=0"):
        planner.plan(MODEL, CLUSTER, 32, offload=True, pcie_bandwidth=0)


def test_cli_offload_flag(capsys):
    args = ["plan", "--layers", "8", "--hidden", "1024", "--heads", "8", "--kv-heads", "8",
            "--ffn", "4096", "--vocab", "32000", "--seq-len", "2048", "--global-batch", "32",
            "--gpus", "16", "--top", "2", "--mark", "t=1,p=1,D=16"]
    assert cli.main([*args, "--offload", "--pcie-gbps", "10", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["settings"]["offload"] is True and data["settings"]["pcie_bandwidth"] == 10e9
    assert all("offload" in c["times"] for c in data["feasible"]), data["feasible"][0]
    assert cli.main([*args, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["settings"]["offload"] is False and "pcie_bandwidth" not in data["settings"]
    assert cli.main([*args[:-2], "--offload"]) == 0  # the table says it is on
    assert "ZeRO-Offload on" in capsys.readouterr().out
