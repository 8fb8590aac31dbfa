"""Model-state accounting: lecture numbers, recipe splits, layout properties, validation."""

import math

import pytest
from shardlab.accounting import memory as mem
from shardlab.accounting.memory import (
    GB,
    LAYOUTS,
    RECIPES,
    SHARDED_OBJECTS,
    GiB,
    Recipe,
    model_state,
    state_table,
)

N7B = 7_000_000_000


@pytest.mark.parametrize(
    ("layout", "gb", "bpp"),
    [("ddp", 112, 16), ("zero1", 38.5, 5.5), ("zero2", 26.25, 3.75), ("zero3", 14, 2)],
)
def test_lecture_7b_d8(layout, gb, bpp):
    s = model_state(N7B, 8, layout, "mixed-adam-16")
    assert s.total == gb * GB  # exact in decimal bytes
    assert s.total_gb == gb
    assert s.total_gib == gb * GB / GiB
    assert s.bytes_per_param == bpp


def test_lecture_gib_values():
    gib = [round(s.total_gib, 2) for s in state_table(N7B, 8)]
    assert gib == [104.31, 35.86, 24.45, 13.04]


def test_two_byte_weights_14gb():
    assert model_state(N7B, 1).per_object["weights"] == 14 * GB


def test_recipe_totals():
    assert {k: r.total for k, r in RECIPES.items()} == {
        "mixed-adam-16": 16,
        "low-precision-12": 12,
        "bf16-no-master-10": 10,
        "mixed-fp32-accum": 20,
        "fp32": 16,
    }
    assert RECIPES["fp32"].as_dict() == {
        "name": "fp32",
        "weights": 4,
        "grads": 4,
        "master": 0,
        "moment1": 4,
        "moment2": 4,
        "grad_accum": 0,
    }
    assert RECIPES["bf16-no-master-10"].master == 0
    assert RECIPES["mixed-fp32-accum"].grad_accum == 4


@pytest.mark.parametrize("d", [1, 2, 3, 8, 64, 1000])
def test_lecture_formulas_any_d(d):
    n = 1_000_003
    assert math.isclose(model_state(n, d, "zero1").total, (4 + 12 / d) * n)
    assert math.isclose(model_state(n, d, "zero2").total, (2 + 14 / d) * n)
    assert math.isclose(model_state(n, d, "zero3").total, 16 * n / d)
    # the 12-byte variant: optimizer side is 8 B (4 master + 2 + 2)
    assert math.isclose(model_state(n, d, "zero1", "low-precision-12").total, (4 + 8 / d) * n)
    assert math.isclose(model_state(n, d, "zero3", "low-precision-12").total, 12 * n / d)


@pytest.mark.parametrize("recipe", sorted(RECIPES))
@pytest.mark.parametrize("d", [1, 2, 4, 7, 8, 16, 128])
@pytest.mark.parametrize("n", [1, 12345, N7B])
def test_layout_properties(recipe, d, n):
    rows = {s.layout: s for s in state_table(n, d, recipe)}
    ddp = rows["ddp"].total
    assert math.isclose(rows["zero3"].total * d, ddp)
    assert ddp == n * RECIPES[recipe].total
    totals = [rows[k].total for k in LAYOUTS]
    assert totals == sorted(totals, reverse=True)  # each stage never increases memory
    for s in rows.values():
        for obj, b in s.per_object.items():
            full = n * RECIPES[recipe].bytes_of(obj)
            assert math.isclose(b, full / d if obj in SHARDED_OBJECTS[s.layout] else full)


def test_sharded_objects_nested():
    assert SHARDED_OBJECTS["ddp"] == frozenset()
    assert SHARDED_OBJECTS["zero1"] == {"master", "moment1", "moment2"}
    assert SHARDED_OBJECTS["zero2"] == SHARDED_OBJECTS["zero1"] | {"grads", "grad_accum"}
    assert SHARDED_OBJECTS["zero3"] == SHARDED_OBJECTS["zero2"] | {"weights"}


def test_custom_recipe_and_rows():
    r = Recipe("custom", weights=1, grads=1, master=0, moment1=0.5, moment2=0.5)
    s = model_state(1000, 4, "zero2", r)
    assert s.total == 1000 + 250 + 125 + 125
    rows = s.as_rows()
    assert [row["object"] for row in rows] == [*mem.OBJECTS, "total"]
    assert rows[-1]["bytes"] == s.total
    assert s.summary_row()["layout"] == "zero2"


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ((0, 8), "n_params=0"),
        ((-5, 8), "n_params=-5"),
        ((10.5, 8), "n_params=10.5"),
        ((True, 8), "n_params=True"),
        ((100, 0), "dp=0"),
        ((100, 2.5), "dp=2.5"),
        ((100, False), "dp=False"),
        ((100, 8, "zero4"), "layout='zero4'"),
        ((100, 8, "ddp", "fp8"), "recipe='fp8'"),
    ],
)
def test_validation(args, match):
    with pytest.raises(ValueError, match=match):
        model_state(*args)


def test_recipe_validation():
    with pytest.raises(ValueError, match="weights"):
        Recipe("bad", weights=-1, grads=2, master=4, moment1=4, moment2=4)
    with pytest.raises(ValueError, match="0 bytes"):
        Recipe("zero", 0, 0, 0, 0, 0)
    with pytest.raises(ValueError, match="grads"):
        Recipe("b", 2, True, 4, 4, 4)


def test_integral_float_accepted():
    assert model_state(7e9, 8.0).total == 112 * GB


def test_fsdp_padded_numel_flat_and_per_param():
    # a unit of a (37, 10) embedding, a 10-element bias and a (30, 10) weight on 4 ranks
    shapes = [(37, 10), (10,), (30, 10)]
    assert mem.fsdp_padded_numel(shapes, 4, "flat") == 680  # 680 elements: divisible by 4
    assert mem.fsdp_padded_numel(shapes, 4, "per_param") == 40 * 10 + 12 + 32 * 10
    assert mem.fsdp_padded_numel(shapes, 1, "per_param") == 680  # one rank: no padding
    assert mem.fsdp_padded_numel([(), (3,)], 2, "per_param") == 2 + 4  # 0-d counts as (1,)
    assert mem.fsdp_padded_numel([], 8, "flat") == 0
    for bad, match in (("rows", "mode"), ("flat", "dp")):
        with pytest.raises(ValueError, match=match):
            mem.fsdp_padded_numel(shapes, 0 if match == "dp" else 4, bad)
    with pytest.raises(ValueError, match=r"shapes\[1\]"):
        mem.fsdp_padded_numel([(3,), 5], 2)
