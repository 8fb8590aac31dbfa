"""The pieces behind "every input answered" (issue 30): bounded chart ticks, honest digits,
validated magnitudes, mesh groups described without listing them, JSON without NaN, one
sentence per error (once under torchrun, without ``[Errno N]``)."""

from __future__ import annotations

import itertools
import json
import math

import pytest
from shardlab import cli
from shardlab.accounting import _validate as chk
from shardlab.accounting.mesh import AXES, Mesh
from shardlab.widgets._format import fmt_int
from shardlab.widgets._svg import nice_ticks, svg_loglog
from shardlab.widgets.mesh import axis_group, mesh_report


@pytest.mark.parametrize("vmax", [1.6e-3, 1e-13, 1e-300, 5e-324, 1.0, 7.0, 112e9, 1e300, 1.7e308])
def test_nice_ticks_are_few_and_reach_the_maximum(vmax):
    ticks = nice_ticks(vmax)
    assert 2 <= len(ticks) <= 13
    assert ticks[0] == 0.0 and ticks[-1] >= vmax * (1 - 1e-9)
    assert all(b > a for a, b in zip(ticks, ticks[1:]))  # no step rounded away to 0


def test_nice_ticks_of_a_memory_chart_of_one_parameter_on_10k_ranks():
    assert nice_ticks(16 / 10_000) == [0.0, 0.0005, 0.001, 0.0015, 0.002]


def test_loglog_with_an_infinite_point_draws_nothing_rather_than_raising():
    assert svg_loglog([("ring", [(1.0, 1.0), (10.0, math.inf)])], None, "t", "x", "y") == ""


def test_fmt_int_never_invents_digits():
    assert fmt_int(112_000_000_000) == "112,000,000,000"
    assert fmt_int(2**53 - 1) == "9,007,199,254,740,991"
    assert fmt_int(1e100) == "1.000000e+100"
    assert fmt_int(float(2**60)) == "1.152922e+18"
    assert fmt_int(2**60) == "1,152,921,504,606,846,976"  # an int is exact


def test_counts_and_reals_are_bounded_with_a_sentence():
    assert chk.positive_int("dp", 2**53) == 2**53
    with pytest.raises(ValueError, match=r"dp=9,007,199,254,740,993 is larger than 2\^53"):
        chk.positive_int("dp", 2**53 + 1)
    with pytest.raises(ValueError, match=r"G=1e\+100 is larger than 2\^53"):
        chk.positive_int("G", 1e100)
    assert chk.number("alpha", 1e30) == 1e30
    with pytest.raises(ValueError, match=r"alpha=1e\+308 is larger than 1e\+30"):
        chk.number("alpha", 1e308)
    with pytest.raises(ValueError, match=r"q=-1e\+31 is larger than 1e\+30"):
        chk.number("q", -1e31, positive=False)
    with pytest.raises(ValueError, match="larger than 1e"):
        chk.number("bytes", 10**40)


def test_axis_group_equals_the_listed_group():
    for dp, pp, cp, tp in itertools.product((1, 2, 3), repeat=4):
        mesh = Mesh(dp * pp * cp * tp, dp, tp, pp, cp)
        for rank in range(mesh.G):
            for axis in AXES:
                assert list(axis_group(mesh, rank, axis)) == mesh.group_of(rank, axis)


def test_a_mesh_of_a_billion_ranks_is_summarised():
    rep = mesh_report(G=10**9, dp=None, tp=8, pp=1, cp=1, rank=12345)
    assert rep.data["axes"]["dp"]["first_group"] == {"first": 0, "step": 8, "count": 125_000_000}
    assert rep.data["axes"]["tp"]["rank_group"] == list(range(12344, 12352))
    assert "groups" not in rep.data


def test_json_output_replaces_non_finite_numbers():
    data = {"a": math.nan, "b": [1.0, math.inf, {"c": -math.inf}], "d": 2}
    text = json.dumps(cli._finite(data), allow_nan=False)
    assert json.loads(text) == {"a": None, "b": [1.0, None, {"c": None}], "d": 2}


def test_errno_prefix_is_dropped():
    exc = FileNotFoundError(2, "No such file or directory", "/nowhere/x")
    assert cli._sentence(exc) == "no such file or directory: /nowhere/x."


def test_a_bad_input_is_printed_once_under_torchrun(capsys, monkeypatch):
    argv = ["mesh", "--gpus", "8.5"]
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "3")
    assert cli.main(argv) == 2
    assert capsys.readouterr().err == ""
    monkeypatch.setenv("RANK", "0")
    assert cli.main(argv) == 2
    assert capsys.readouterr().err == "shardlab mesh: --gpus 8.5 must be an integer\n"


def test_negative_numbers_in_every_notation_reach_the_validation(capsys):
    for value in ("-7e9", "-7E+9", "-1_000", "-.5", "-2.5e-3"):
        assert cli.main(["memory", "--params", value]) == 2
        err = capsys.readouterr().err
        assert "expected one argument" not in err and f"--params {value} must be" in err, (
            value,
            err,
        )
