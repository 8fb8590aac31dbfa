"""Ranks' functions for ddp_mixed.py: the 16- and 12-byte recipes on the lab's bucketed DDP
(bf16 parameters and buckets, :class:`ddp_mixed.MasterAdamW`), importable by name."""

from __future__ import annotations

import torch
import torch.distributed as dist
from ddp import DDP
from ddp_mixed import MasterAdamW
from shardlab.models import lm_loss, rank_slice, split_microbatches, step_batch, tiny_gpt
from shardlab.runtime.cases import stub_or_raise

STEPS = 8
# recipe name (accounting.memory.RECIPES) -> dtype of AdamW's moments
RECIPES = {"mixed-adam-16": torch.float32, "low-precision-12": torch.bfloat16}
BUCKET_MB = 0.002  # several buckets for the tiny GPT
# Loss tolerance against one process taking the whole batch in one backward: the same as lab
# 03's mixed_precision tests (4 fp32 ulps at step 0, then 2**-11 relative; see test_ddp_mixed).
STEP0_RTOL = 4 * torch.finfo(torch.float32).eps
LOSS_RTOL = 2.0**-11


def _bytes(ts) -> int:
    return sum(t.numel() * t.element_size() for t in ts if t is not None)


def measure(model: torch.nn.Module, opt: MasterAdamW) -> dict:
    """Bytes per object, and of every distinct storage the model, grads and optimizer hold."""
    ps = [p for p in model.parameters() if p.requires_grad]
    sts = [opt.state[p] for p in ps]
    per = {
        "weights": _bytes(ps),
        "grads": _bytes(p.grad for p in ps),
        "master": _bytes(st["master"] for st in sts),
        "moment1": _bytes(st["exp_avg"] for st in sts),
        "moment2": _bytes(st["exp_avg_sq"] for st in sts),
    }
    seen = {}
    for t in [*ps, *(p.grad for p in ps), *(x for st in sts for x in st.values())]:
        if torch.is_tensor(t):
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    return {"per_object": per, "total": sum(per.values()), "storages": sum(seen.values())}


def train(recipe: str, kind: str, steps: int, group, microbatches: int = 1, ddp: bool = True):
    """bf16 model (fp32 masters from the fp32 init), the lab's DDP with buckets, MasterAdamW;
    the loss per step is the fp32 mean over ranks. Model state is measured after the
    gradients are synchronized on the last step."""
    model = tiny_gpt(kind)  # same seed on every rank: the fp32 masters agree everywhere
    masters = [p.detach().clone() for p in model.parameters() if p.requires_grad]
    model.to(torch.bfloat16)
    fwd = DDP(model, bucket_size_mb=BUCKET_MB, group=group) if ddp else model
    ps = [p for p in model.parameters() if p.requires_grad]
    opt = MasterAdamW(ps, moment_dtype=RECIPES[recipe], masters=masters)
    D = dist.get_world_size(group) if ddp else 1
    losses, state = [], None
    for s in range(steps):
        opt.zero_grad()
        xy = (
            rank_slice(step_batch(model.config, s), group=group)
            if ddp
            else step_batch(model.config, s)
        )
        chunks = split_microbatches(xy, microbatches)
        loss = torch.zeros((), device=ps[0].device)
        for i, c in enumerate(chunks):
            last = i == len(chunks) - 1
            with fwd.no_sync() if ddp and not last else _nothing():
                part = lm_loss(fwd, *c) / len(chunks)
                part.backward()
            loss += part.detach()
        if ddp:
            fwd.finish_gradient_synchronization()
        if s == steps - 1:
            state = measure(model, opt)
        opt.step()
        if ddp:
            dist.all_reduce(loss, group=group)
        losses.append((loss / D).item())
    weights = torch.cat([p.detach().reshape(-1) for p in ps])
    return {"losses": losses, "weights": weights, "n_params": weights.numel(), "state": state}


class _nothing:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def torch_reference(steps: int, kind: str = "plain") -> dict:
    """The 16-byte recipe in plain PyTorch, one process: bf16 model, fp32 masters stepped by
    ``torch.optim.AdamW`` (single-tensor), rounded back into the bf16 parameters."""
    model = tiny_gpt(kind)
    ps = [p for p in model.parameters() if p.requires_grad]
    masters = [p.detach().clone().requires_grad_() for p in ps]
    model.to(torch.bfloat16)
    opt = torch.optim.AdamW(masters, lr=1e-2, weight_decay=0.1, foreach=False)
    losses = []
    for s in range(steps):
        loss = lm_loss(model, *step_batch(model.config, s))
        loss.backward()
        for p, m in zip(ps, masters):
            m.grad, p.grad = p.grad.float(), None
        opt.step()
        with torch.no_grad():
            for p, m in zip(ps, masters):
                p.copy_(m)
        losses.append(loss.item())
    return {"losses": losses, "weights": torch.cat([p.detach().reshape(-1) for p in ps])}


def suite(kind: str = "plain", steps: int = STEPS) -> dict:
    """Both recipes on every rank; rank 0 adds one process (whole batch, and D microbatches
    accumulated in bf16) per recipe and the plain-PyTorch 16-byte run."""
    torch.set_num_threads(1)
    D = dist.get_world_size()
    out: dict = {"ddp": {}, "single": {}, "single_accum": {}, "torch": None}
    for recipe in RECIPES:
        out["ddp"][recipe] = stub_or_raise(train, recipe, kind, steps, None)
        if dist.get_rank() == 0:
            out["single"][recipe] = stub_or_raise(train, recipe, kind, steps, None, ddp=False)
            out["single_accum"][recipe] = stub_or_raise(
                train, recipe, kind, steps, None, D, ddp=False
            )
    if dist.get_rank() == 0:
        out["torch"] = stub_or_raise(torch_reference, steps, kind)
    return out
