"""Ranks' functions for mixed_precision.py: model-state bytes per layout x recipe, and the loss
trajectory against a single-process run of the same recipe (importable by name)."""

from __future__ import annotations

import torch
import torch.distributed as dist
from mixed_precision import RECIPES, MixedPrecisionConfig, MixedPrecisionDP
from shardlab.accounting import memory
from shardlab.models import lm_loss, rank_slice, split_microbatches, step_batch, tiny_gpt
from shardlab.testing import stub_or_raise

STEPS = 8
LAYOUTS = memory.LAYOUTS
# Loss tolerance against a single process taking the whole batch in one backward (derivation in
# test_mixed_precision.py): 4 fp32 ulps at step 0 (equal weights), 2**-11 relative for STEPS.
STEP0_RTOL = 4 * torch.finfo(torch.float32).eps
LOSS_RTOL = 2.0**-11


def _nbytes(t: torch.Tensor | None) -> int:
    return 0 if t is None else t.numel() * t.element_size()


def storage_bytes(mp: MixedPrecisionDP) -> int:
    """Bytes of every distinct storage the model and the wrapper hold (parameters, their
    ``.grad``, the wrapper's objects and gathered buffer): a second copy anywhere shows up."""
    seen: dict[int, int] = {}
    ts = [*mp.module.parameters(), *(p.grad for p in mp.module.parameters())]
    ts += [*mp.state_objects().values(), mp.gathered, mp._full_grads]
    for t in ts:
        if t is not None:
            s = t.untyped_storage()
            seen[s.data_ptr() if s.nbytes() else id(s)] = s.nbytes()
    return sum(seen.values())


def measure_state(mp: MixedPrecisionDP) -> dict:
    objs = mp.state_objects()
    per = {k: _nbytes(t) for k, t in objs.items()}
    return {
        "per_object": per,
        "total": sum(per.values()),
        "storages": storage_bytes(mp),
        "dtypes": {k: None if t is None else str(t.dtype) for k, t in objs.items()},
    }


def train(layout: str, recipe: str, kind: str, steps: int, group, microbatches: int = 1) -> dict:
    """``steps`` AdamW steps; per step the global mean loss (fp32, all-reduced); model state
    measured after the gradients are reduced (before the step) and after the step. With
    ``microbatches`` > 1 each rank's batch is cut into that many pieces whose gradients of
    ``loss / microbatches`` accumulate in the recipe's gradient dtype before the reduction."""
    model = tiny_gpt(kind, seed=dist.get_rank())  # different seeds: the broadcast must fix it
    mp = MixedPrecisionDP(model, group, MixedPrecisionConfig(layout, recipe))
    D = group.size()
    losses, states = [], {}
    for s in range(steps):
        loss = torch.zeros((), device=next(model.parameters()).device)
        for xy in split_microbatches(rank_slice(step_batch(model.config, s), group=group),
                                     microbatches):
            part = lm_loss(mp, *xy) / microbatches
            part.backward()
            loss += part.detach()
        mp.finish_gradient_synchronization()
        if s == steps - 1:
            states["after_backward"] = measure_state(mp)
        mp.step()
        mp.zero_grad()
        g = loss.detach().clone()
        dist.all_reduce(g, group=group)  # fp32: the mean over ranks of the local means
        losses.append((g / D).item())
    states["after_step"] = measure_state(mp)
    return {
        "losses": losses,
        "weights": mp.full_weights(),
        "n_params": mp.numel,
        "padded_numel": mp.padded,
        **states,
    }


def torch_reference(kind: str, steps: int) -> dict:
    """The 16-byte recipe written with plain PyTorch, one process, whole batch: bf16 model,
    fp32 master copies stepped by ``torch.optim.AdamW`` (single-tensor), bf16 copies back."""
    model = tiny_gpt(kind)
    cfg = MixedPrecisionConfig()
    ps = [p for p in model.parameters() if p.requires_grad]
    masters = [p.detach().clone().requires_grad_() for p in ps]  # fp32 initial values
    model.to(torch.bfloat16)  # the compute copy: weights rounded to bf16
    opt = torch.optim.AdamW(
        masters, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, weight_decay=cfg.weight_decay,
        foreach=False,
    )
    losses = []
    for s in range(steps):
        loss = lm_loss(model, *step_batch(model.config, s))
        loss.backward()
        for p, m in zip(ps, masters):
            m.grad = p.grad.float()
            p.grad = None
        opt.step()
        with torch.no_grad():
            for p, m in zip(ps, masters):
                p.copy_(m)
        losses.append(loss.item())
    return {
        "losses": losses,
        "weights": torch.cat([p.detach().reshape(-1) for p in ps]),
    }


def suite(kind: str = "plain", steps: int = STEPS, layouts=LAYOUTS, recipes=RECIPES) -> dict:
    """Every layout x recipe on all ranks; rank 0 adds the single-process runs of each recipe
    (the same class on a 1-rank group: the whole batch in one backward, and in D microbatches)
    and the plain-PyTorch 16-byte run."""
    torch.set_num_threads(1)
    world = dist.group.WORLD
    solo = dist.new_group([0])  # every rank takes part in creating it; only rank 0 uses it
    out: dict = {"runs": {}, "single": {}, "single_accum": {}, "torch": None}
    # stub_or_raise: a stub (NotImplementedError) is reported per case, any other error ends
    # the run with this rank's traceback
    for recipe in recipes:
        for layout in layouts:
            out["runs"][f"{layout}/{recipe}"] = stub_or_raise(
                train, layout, recipe, kind, steps, world
            )
        if dist.get_rank() == 0:  # whole batch in one backward, and in D microbatches
            out["single"][recipe] = stub_or_raise(train, "ddp", recipe, kind, steps, solo)
            out["single_accum"][recipe] = stub_or_raise(
                train, "ddp", recipe, kind, steps, solo, dist.get_world_size()
            )
    if dist.get_rank() == 0:
        out["torch"] = stub_or_raise(torch_reference, kind, steps)
    return out
