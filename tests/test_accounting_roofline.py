"""Roofline accounting (``accounting.gemm``) against hand-worked cases, the sweep's fit and the
stored sweep chapter 0 renders, and the roofline calculator."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from shardlab import roofline_sweep as rs
from shardlab.accounting import gemm

ROOT = Path(__file__).resolve().parents[1]
STORED = ROOT / "book" / "data" / "roofline_cpu.json"
H100 = gemm.DEVICES["h100"]


def test_flops_and_bytes_of_a_small_product_by_hand():
    # (2 x 3) @ (3 x 4): 8 outputs, each 3 multiplies and 3 adds = 48 FLOPs
    assert gemm.matmul_flops(2, 3, 4) == 48
    # fp32: A 6, B 12, C 8 elements = 26 x 4 bytes
    assert gemm.matmul_bytes(2, 3, 4, q=4) == 104
    assert gemm.gemm_intensity(2, 3, 4, q=4) == 48 / 104
    assert gemm.matmul_bytes(2, 3, 4) == 52  # bf16 by default, as the planner counts


def test_intensity_limits_square_and_matrix_vector():
    # square N in bf16: 2 N^3 / (2 * 3 N^2) = N / 3
    assert gemm.gemm_intensity(4096, 4096, 4096) == pytest.approx(4096 / 3)
    # one row against a 4096 x 4096 fp32 weight: 2 * 4096 / (4 * 4098) -- about 1/2
    assert gemm.gemm_intensity(1, 4096, 4096, q=4) == pytest.approx(8192 / 16392)
    # few rows against a wide weight, bf16: 64 * 8192 / (2 * 64 + 8192), a little under m = 64
    assert gemm.gemm_intensity(64, 8192, 8192) == pytest.approx(64 * 8192 / 8320)


def test_ridge_and_roofline_by_hand():
    assert gemm.ridge(100.0, 5.0) == 20.0
    assert H100.ridge == gemm.ridge(989e12, 3.35e12) == pytest.approx(295.22, abs=0.01)
    # peak 100 FLOP/s, bandwidth 5 B/s, ridge 20 FLOP/B
    assert gemm.roofline_flops(10, 100, 5) == 50  # memory roof: 10 x 5
    assert gemm.roofline_flops(20, 100, 5) == 100  # both roofs meet at the ridge
    assert gemm.roofline_flops(40, 100, 5) == 100  # compute roof
    assert gemm.gemm_bound(10, 20) == "memory"
    assert gemm.gemm_bound(20, 20) == gemm.gemm_bound(40, 20) == "compute"


@pytest.mark.parametrize("m", [1, 8, 64, 177, 512, 4096])
def test_the_planners_efficiency_is_the_capped_roofline(m):
    peak, bw, cap = H100.peak_flops, H100.hbm_bandwidth, 0.6
    i = gemm.gemm_intensity(m, 4096, 4096)
    eff = gemm.gemm_efficiency(i, H100.ridge, cap)
    assert eff == pytest.approx(gemm.roofline_flops(i, cap * peak, bw) / peak)
    t = gemm.gemm_time(m, 4096, 4096, peak, bw, cap)
    flops, nbytes = gemm.matmul_flops(m, 4096, 4096), gemm.matmul_bytes(m, 4096, 4096)
    assert t == pytest.approx(max(flops / (cap * peak), nbytes / bw))


def test_bad_inputs_name_the_value():
    with pytest.raises(ValueError, match="m=0"):
        gemm.matmul_flops(0, 3, 4)
    with pytest.raises(ValueError, match="q=0"):
        gemm.matmul_bytes(2, 3, 4, q=0)
    with pytest.raises(ValueError, match="bandwidth=0"):
        gemm.ridge(1e12, 0)
    with pytest.raises(ValueError, match="intensity=True"):
        gemm.roofline_flops(True, 1, 1)
    with pytest.raises(ValueError, match="ridge=-1"):
        gemm.gemm_bound(1, -1)


def _points(rates_by_intensity):
    return [{"intensity": i, "flops_per_s": r, "family": "skinny"} for i, r in rates_by_intensity]


def test_fit_recovers_a_known_roofline_and_ignores_slow_points():
    # peak 100, bandwidth 10 (ridge 10); the point at I = 8 ran at half its roof
    pts = _points([(1, 10.0), (5, 50.0), (8, 40.0), (50, 100.0), (200, 100.0)])
    fit = rs.fit_roofline(pts)
    assert fit["peak_flops"] == 100.0 and fit["bandwidth"] == 10.0 and fit["ridge"] == 10.0
    assert fit["fraction"] == [1.0, 1.0, 0.5, 1.0, 1.0]
    assert fit["peak_from"] == 3 and fit["bandwidth_from"] == 0
    with pytest.raises(ValueError, match="at least one"):
        rs.fit_roofline([])


def test_fastest_of_keeps_the_fastest_pass_per_shape():
    def one(seconds):
        pts = [rs.point(1, 64, 64, seconds[0], 4), rs.point(32, 32, 32, seconds[1], 4)]
        return {"bytes_per_element": 4, "reps": 3, "points": pts}

    merged = rs.fastest_of([one((2.0, 1.0)), one((1.0, 3.0))])
    assert [p["seconds"] for p in merged["points"]] == [1.0, 1.0] and merged["passes"] == 2
    assert merged["points"][0]["flops_per_s"] == gemm.matmul_flops(1, 64, 64)
    other = {"bytes_per_element": 4, "points": [rs.point(2, 64, 64, 1.0, 4)]}
    with pytest.raises(ValueError, match="same shapes"):
        rs.fastest_of([one((1.0, 1.0)), other])


def test_stored_sweep_says_where_it_ran_and_spans_the_ridge():
    data = rs.load_sweep(STORED)
    for key in ("cpu", "cpu_capability", "cores", "threads", "torch", "date"):
        assert data["machine"][key] not in (None, ""), key
    assert data["dtype"] == "float32" and data["bytes_per_element"] == 4
    fit = rs.fit_roofline(data["points"])
    intensities = [p["intensity"] for p in data["points"]]
    assert min(intensities) < fit["ridge"] < max(intensities)  # both regimes measured
    for p in data["points"]:  # the stored FLOPs and bytes are the accounting's
        assert p["flops"] == gemm.matmul_flops(p["m"], p["k"], p["n"])
        assert p["bytes"] == gemm.matmul_bytes(p["m"], p["k"], p["n"], 4)
    assert all(0 < f <= 1 for f in fit["fraction"])


def test_save_and_load_round_trip_and_refuse_empty(tmp_path):
    data = {"points": _points([(1, 2.0)]), "machine": {}}
    path = rs.save_sweep(data, tmp_path / "sub" / "s.json")
    assert rs.load_sweep(path) == data
    (tmp_path / "empty.json").write_text(json.dumps({"points": []}))
    with pytest.raises(ValueError, match="no measured points"):
        rs.load_sweep(tmp_path / "empty.json")


def test_a_tiny_sweep_runs_and_restores_the_thread_count():
    torch = pytest.importorskip("torch")
    before = torch.get_num_threads()
    data = rs.sweep(((1, 64, 64), (32, 32, 32)), threads=1, reps=1, min_time=0.001)
    assert torch.get_num_threads() == before
    assert data["clock"] == "cpu" and data["machine"]["threads"] == 1
    assert [p["family"] for p in data["points"]] == ["skinny", "square"]
    assert all(p["seconds"] > 0 for p in data["points"])
    with pytest.raises(ValueError, match="clock='gpu'"):
        rs.time_matmul(1, 2, 2, clock="gpu")


def test_plot_has_two_panels():
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = rs.load_sweep(STORED)
    fit = rs.fit_roofline(data["points"])
    fig = rs.plot_roofline(data, fit, cap=0.6, also=(data, fit))
    assert len(fig.axes) == 2
    plt.close(fig)


def test_calculator_report_by_hand():
    pytest.importorskip("ipywidgets")
    from shardlab.widgets import roofline_calculator, roofline_report

    # 8 rows against a 4096 x 4096 bf16 weight on an A100 40 GB (ridge 312e12 / 1555e9)
    r = roofline_report(m=8, k=4096, n=4096, q=2, peak_tflops=312, bandwidth_gbps=1555)
    assert r.data["flops"] == 268_435_456 and r.data["bytes"] == 33_685_504
    assert r.data["bound"] == "memory"
    assert r.data["efficiency"] == pytest.approx(r.data["intensity"] / (312e12 / 1555e9))
    box = roofline_calculator()
    a100 = next(name for name in box.controls["preset"].options if name.startswith("a100-40gb"))
    box.controls["preset"].value = a100
    assert (box.controls["peak_tflops"].value, box.controls["bandwidth_gbps"].value) == (312, 1555)
    box.controls["m"].value = -4
    assert "shardlab-error" in box.output.value and "-4 must be" in box.output.value
