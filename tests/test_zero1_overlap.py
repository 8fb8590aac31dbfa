"""Lab 03's ZeRO-1 with its weight all-gathers overlapped with the next forward
(``overlap_gather=True``: each chunk waited for by a forward pre-hook just before the first
module that holds one of its tensors) gives bitwise the weights of the synchronous path
(``overlap_gather=False``, every gather finished inside ``step()``): only *when* the gathers
finish moves, not what they carry. Four ranks, uneven owners, chunks far smaller than a tensor
(1 KB), AdamW with two parameter groups, five steps on different batches."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "labs" / "03_zero"))


def _train(overlap: bool, steps: int = 5) -> dict:
    import torch
    from _workers_zero import param_groups, state
    from shardlab.models import OPTIMIZERS, lm_loss, rank_slice, step_batch, tiny_gpt
    from zero1 import ShardedOptimizer

    torch.manual_seed(0)
    model = tiny_gpt("plain")
    cls, kw = OPTIMIZERS["adamw"]
    o = ShardedOptimizer(param_groups(model, True), cls, bucket_size_mb=0.001,
                         overlap_gather=overlap, **kw)
    for s in range(steps):
        o.zero_grad()
        lm_loss(model, *rank_slice(step_batch(model.config, s))).backward()
        o.step()
    o.wait_for_weights()
    return state(model)


def _both() -> dict:
    return {"sync": _train(False), "overlap": _train(True)}


def test_overlapped_gathers_are_bitwise_the_synchronous_ones():
    import torch
    from shardlab.runtime import launch

    res = launch("test_zero1_overlap:_both", 4, quiet=True, timeout=300)
    for rank, r in enumerate(res):
        assert r["sync"].keys() == r["overlap"].keys()
        for k, v in r["sync"].items():
            assert torch.equal(v, r["overlap"][k]), (rank, k)
            assert torch.equal(v, res[0]["sync"][k]), (rank, k)  # every rank holds the same
