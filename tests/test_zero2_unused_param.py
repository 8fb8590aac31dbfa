"""ZeRO-2 with a parameter that gets no gradient: its bucket still goes out (at the end of
backward) and carries zeros for it, not whatever the fresh bucket buffer held. The buffer is
``torch.empty`` (a memset of every bucket per step was a visible share of ZeRO-2's CPU time),
so ``finish_gradient_synchronization`` must zero the slots no gradient reached; the allocator
is primed with NaN-filled memory of the bucket's size so that a missed slot shows.
Both collective forms (the standard reduce-scatter and the gloo in-place all-reduce)."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "labs" / "03_zero"))


def _model():
    import torch
    from shardlab.models import tiny_gpt
    from torch import nn

    class WithUnused(nn.Module):
        def __init__(self):
            super().__init__()
            self.gpt = tiny_gpt("plain")
            torch.manual_seed(0)  # the same initial weights in every process
            self.unused = nn.Linear(64, 64)  # never called: no gradient, ever
            self.config = self.gpt.config

        def forward(self, idx):
            return self.gpt(idx)

    return WithUnused()


def _train(gloo_form_min_mb: float, steps: int = 2) -> dict:
    import torch
    from shardlab.models import OPTIMIZERS, lm_loss, rank_slice, step_batch
    from zero2 import ZeRO2

    torch.set_num_threads(1)
    model = _model()
    cls, kw = OPTIMIZERS["adamw"]
    # one bucket holds everything, so the unused parameter shares it with used ones
    z = ZeRO2(model, cls, bucket_size_mb=64, gloo_form_min_mb=gloo_form_min_mb, **kw)
    numel = z.buckets[0].padded
    for s in range(steps):
        junk = torch.full((numel,), float("nan"))  # freed memory the next empty() may reuse
        del junk
        z.zero_grad()
        lm_loss(z, *rank_slice(step_batch(model.config, s))).backward()
        z.finish_gradient_synchronization()
        z.step()
    z.wait_for_weights()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _reference(steps: int = 2) -> dict:
    """One process, full batch, the unused parameter stepped with a zero gradient (ZeRO-2
    steps every shard it owns, as DDP would all-reduce zeros for it)."""
    import torch
    from shardlab.models import OPTIMIZERS, lm_loss, step_batch

    model = _model()
    cls, kw = OPTIMIZERS["adamw"]
    opt = cls([p for p in model.parameters() if p.requires_grad], **kw)
    for s in range(steps):
        opt.zero_grad()
        lm_loss(model, *step_batch(model.config, s)).backward()
        for p in model.unused.parameters():
            p.grad = torch.zeros_like(p)
        opt.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("form_min_mb", [math.inf, 0.0], ids=["standard", "gloo"])
def test_a_parameter_without_gradient_is_reduced_as_zeros(form_min_mb):
    import torch
    from shardlab.runtime import launch

    res = launch("test_zero2_unused_param:_train", 2, form_min_mb, quiet=True, timeout=240)
    ref = _reference()
    for rank, state in enumerate(res):
        for k, v in ref.items():
            assert torch.isfinite(state[k]).all(), (rank, k)
            assert torch.equal(state[k], res[0][k]), (rank, k)  # every rank the same weights
            # the unused parameter (gradient 0 everywhere) matches one process exactly; the
            # used ones sum in another order than one process (AdamW can turn an ulp of a
            # near-zero gradient into a visible step), so they are not compared here
            if k.startswith("unused"):
                assert torch.equal(state[k], v), (rank, k)
