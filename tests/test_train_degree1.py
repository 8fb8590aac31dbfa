"""``shardlab train`` with a degree of 1 on an axis (issue 30): every layout on one rank, and
fsdp+tp with one data-parallel rank (``--ranks 2``, the default tp = 2) or one tensor-parallel
rank. An axis of size 1 has no peer: it sends nothing, and the prediction says so.

Two launches (one rank, two ranks), tiny model, 2 steps each.
"""

from __future__ import annotations

from pathlib import Path

from shardlab.runtime import launch
from shardlab.train.spec import LAYOUTS, TrainSpec, resolve_modules

ROOT = Path(__file__).resolve().parents[1]


def _spec(layout: str, **kw) -> TrainSpec:
    modules, source, labs = resolve_modules(layout, labs=str(ROOT / "labs"))
    kw = {"steps": 2, "threads": 1, **kw}
    return TrainSpec(layout, modules=modules, module_source=source, labs_dir=str(labs), **kw)


def _check(row: dict, spec: TrainSpec) -> None:
    sizes = {"dp": spec.dp, "tp": spec.tp, "pp": spec.ranks if spec.layout == "pp" else 1}
    assert set(row["bytes_predicted"]) == set(LAYOUTS[spec.layout].axes)
    assert row["bytes_measured"] == row["bytes_predicted"], (spec.layout, row)
    for axis, sent in row["bytes_measured"].items():
        assert (sent == 0) == (sizes[axis] == 1), (spec.layout, axis, sent)
    assert row["peak_measured"] > 0 and row["peak_predicted"] > 0


def test_every_layout_on_one_rank():
    specs = [_spec(layout, ranks=1, **({"tp": 1} if layout == "fsdp+tp" else {}))
             for layout in LAYOUTS]
    rows = launch("_train_ranks:run_specs", 1, specs, quiet=True, timeout=240)[0]
    for spec, row in zip(specs, rows):
        _check(row, spec)


def test_fsdp_tp_with_one_rank_on_either_axis():
    specs = [_spec("fsdp+tp", ranks=2), _spec("fsdp+tp", ranks=2, tp=1)]
    assert [(s.dp, s.tp) for s in specs] == [(1, 2), (2, 1)]
    res = launch("_train_ranks:run_specs", 2, specs, quiet=True, timeout=240)
    for k, spec in enumerate(specs):
        for r in range(2):
            _check(res[r][k], spec)
