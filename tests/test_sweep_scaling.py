"""``tools/sweep_scaling.py --quick``: one launch per layout (ddp, zero2, fsdp, tp) and rank
count (1 and 2) at the smallest sweep size; the results file has the schema, every row's
measured peak agrees with the layout's prediction within the lab's own band, the bytes sent
equal the prediction, and :func:`render` / :func:`table` draw it.

Peak bands (measured / predicted, every rank):

* ddp, fsdp: 0.95-1.05, the band of each lab's ``test_peak_memory_matches_prediction``
  (``labs/02_ddp/test_ddp.py``, ``labs/04_fsdp/test_fsdp.py``);
* zero2: the runner predicts the worst case, ``max_in_flight + 1`` (= 3) full-size bucket
  buffers alive (two being reduce-scattered, one filling); fewer are alive when a reduce-scatter
  finishes before the next bucket fills (always on one rank). So ``predicted - 2 buckets <=
  measured <= 1.05 predicted``, a bucket at most ``bucket_mb`` MiB at this size (no parameter is
  larger) plus its padding (seen: 0.90-0.93 of predicted, one bucket alive);
* tp: lab 06 has no peak test; ``tests/test_train_cli.py`` (``PEAK_BAND["tp"]``) states why
  the runner's prediction is high: it keeps every gradient in the persistent term, while at
  the peak (early in backward) only part of them exist, "over by at most 4 N_local bytes".
  That bound, not the 0.90 that fits its tiny model, is what is checked here: ``predicted - 4
  N_local <= measured <= 1.01 predicted`` (seen: 0.866 and 0.878 of predicted).

Bytes sent are compared with ``==``, as the labs' volume tests and ``tests/test_train_cli.py``
do (0 on one rank: a degree-1 group has no peer).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.append(str(ROOT / "tools"))  # the ranks import the tool by this name too
import sweep_scaling  # noqa: E402

ROW_KEYS = {
    "layout", "size", "n_params", "ranks", "step_s", "peak_bytes_measured",
    "peak_bytes_predicted", "state_bytes_predicted", "sent_bytes_measured",
    "sent_bytes_predicted",
}
FILE_KEYS = {"benchmark", "command", "config", "machine", "date", "torch", "load", "idle",
             "per_launch", "summary"}
BAND = {"ddp": (0.95, 1.05), "fsdp": (0.95, 1.05)}
MAX_IN_FLIGHT = 2  # labs/03_zero/zero2.py's default, which the runner uses


def _check_peak(r: dict) -> None:
    meas, pred = r["peak_bytes_measured"], r["peak_bytes_predicted"]
    if r["layout"] == "tp":
        n_local = r["params_held"]
        assert pred - 4 * n_local <= meas <= 1.01 * pred, r
        return
    if r["layout"] == "zero2":
        bucket = r["bucket_mb"] * 2**20 + 4 * r["ranks"]  # + padding to a multiple of D
        assert pred - MAX_IN_FLIGHT * bucket <= meas <= 1.05 * pred, r
        return
    lo, hi = BAND[r["layout"]]
    assert lo <= meas / pred <= hi, r
    assert lo <= r["peak_ratio_worst"] <= hi, r  # the other rank too


def test_quick_sweep_matches_predictions(tmp_path):
    sweep_scaling.main(["--quick", "--save", "--results-dir", str(tmp_path)])
    data = json.loads((tmp_path / "scaling_sweep.json").read_text())
    assert FILE_KEYS <= set(data)
    rows = data["per_launch"]
    assert {(r["layout"], r["ranks"]) for r in rows} == {
        (lay, d) for lay in sweep_scaling.LAYOUTS for d in (1, 2)
    }
    for r in rows:
        assert ROW_KEYS <= set(r), r
        assert r["step_s"] > 0 and r["n_params"] == sweep_scaling.n_params(r["size"])
        _check_peak(r)
        assert r["sent_bytes_measured"] == r["sent_bytes_predicted"], r
        assert (r["sent_bytes_measured"] == 0) == (r["ranks"] == 1), r
        assert r["state_bytes_predicted"] < r["peak_bytes_predicted"], r
    for layout in sweep_scaling.LAYOUTS:  # sharding halves what a rank holds
        one, two = (next(r for r in rows if r["layout"] == layout and r["ranks"] == d)
                    for d in (1, 2))
        if layout != "ddp":
            assert two["state_bytes_predicted"] < one["state_bytes_predicted"]
        assert two["peak_bytes_measured"] < one["peak_bytes_measured"]

    from matplotlib.figure import Figure

    path = tmp_path / "scaling_sweep.json"
    for layout in sweep_scaling.LAYOUTS:
        fig = sweep_scaling.render(path, layout)
        assert isinstance(fig, Figure) and len(fig.axes) == 2
        assert all(ax.get_xscale() == ax.get_yscale() == "log" for ax in fig.axes)
        text = sweep_scaling.table(data, layout)
        assert text.splitlines()[0] == layout and len(text.splitlines()) == 4
