"""Lab 03's two forms of the gradient reduce-scatter carry the same thing: ZeRO-1 and ZeRO-2
trained with the list form (``list_form_min_mb=0``: every chunk as ``D`` row views) and with
the single-tensor form (``inf``: every chunk packed) end with the same weights on every rank
and send the same bytes (gloo's algorithm, ``accounting.wire``), and each path issues the
collective it says it does. The labs' other tests run small buckets, which take the single
form (:data:`shardlab.runtime.collective_forms.LIST_FORM_MIN_MB`); this file keeps the list form tested as well. Two
and four ranks, uneven owners, chunks smaller than a tensor (ZeRO-1) and several buckets
(ZeRO-2), AdamW, three steps on different batches."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "labs" / "03_zero"))

FORMS = {"list": 0.0, "single": math.inf}


def _train(stage: str, min_mb: float, steps: int = 3) -> dict:
    import torch
    from _workers_zero import state
    from shardlab.models import OPTIMIZERS, lm_loss, rank_slice, step_batch, tiny_gpt
    from shardlab.runtime import CommTrace
    from zero1 import ShardedOptimizer
    from zero2 import ZeRO2

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = tiny_gpt("plain")
    cls, kw = OPTIMIZERS["adamw"]
    if stage == "zero1":
        params = [p for p in model.parameters() if p.requires_grad]
        opt = ShardedOptimizer(params, cls, bucket_size_mb=0.01, overlap_gather=True,
                               list_form_min_mb=min_mb, **kw)
        wrapped, finish = model, lambda: None
    else:
        wrapped = ZeRO2(model, cls, bucket_size_mb=0.01, list_form_min_mb=min_mb, **kw)
        opt, finish = wrapped, wrapped.finish_gradient_synchronization
    ops: set[str] = set()
    backend = 0
    for s in range(steps):
        with CommTrace() as tr:
            opt.zero_grad()
            lm_loss(wrapped, *rank_slice(step_batch(model.config, s))).backward()
            finish()
            opt.step()
            opt.wait_for_weights()
        ops |= {r.c10d for r in tr.records}  # the dispatcher operator
        backend += tr.backend_bytes()
    return {"state": state(model), "ops": sorted(ops), "backend": backend}


def _both(stage: str) -> dict:
    return {form: _train(stage, mb) for form, mb in FORMS.items()}


@pytest.mark.parametrize("ranks", [2, 4])
@pytest.mark.parametrize("stage", ["zero1", "zero2"])
def test_list_and_single_forms_train_the_same_and_send_the_same(stage, ranks):
    import torch
    from shardlab.runtime import launch

    res = launch("test_zero_collective_forms:_both", ranks, stage, quiet=True, timeout=300)
    for rank, r in enumerate(res):
        lst, single = r["list"], r["single"]
        assert lst["backend"] == single["backend"] > 0, (rank, lst["backend"], single["backend"])
        list_rs, single_rs = "c10d.reduce_scatter_", "c10d._reduce_scatter_base_"
        assert list_rs in lst["ops"] and single_rs not in lst["ops"], lst["ops"]
        assert single_rs in single["ops"] and list_rs not in single["ops"], single["ops"]
        for k, v in single["state"].items():
            assert torch.equal(v, res[0]["single"]["state"][k]), (rank, k)  # ranks agree
            assert torch.equal(lst["state"][k], res[0]["list"]["state"][k]), (rank, k)
            # the sums of each element run in gloo's order either way: equal on 2 ranks; on
            # 4 the pieces' all-reduces may add in another order (rounding, 3 steps of AdamW)
            if ranks == 2:
                assert torch.equal(lst["state"][k], v), (rank, k)
            else:
                torch.testing.assert_close(lst["state"][k], v, rtol=1.2e-5, atol=1.2e-5)
