"""Ranks' functions for the lecture's 16-byte recipe on this lab's FSDP (importable by name).

Two ways to hold the 16 bytes per parameter at ZeRO-3, both measured against
``accounting.memory.model_state(N_pad, D, "zero3", "mixed-adam-16")``:

* ``lecture``: the model is cast to bf16 *before* wrapping, so every ``FlatParam`` shard is bf16
  (weights 2/D), gathered and computed in bf16, its gradient reduce-scattered in bf16 into a
  bf16 ``shard.grad`` (grads 2/D); fp32 master shards (4/D) with fp32 AdamW moments (8/D) live
  in the optimizer, and the updated master is rounded into the bf16 shard after each step.
* ``fsdp2``: PyTorch FSDP2's split (``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)``):
  the shard itself is the fp32 master (4/D), cast to bf16 at every all-gather (no bf16 copy
  is stored: 0), gradients reduced and kept in fp32 (4/D), fp32 moments (8/D). Same total,
  2 bytes moved from the weights to the gradients.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from _workers_fsdp import make_batches, make_model
from fsdp import FSDP, FSDPConfig
from shardlab.models import lm_loss, rank_slice, split_microbatches
from shardlab.testing import stub_or_raise

STEPS = 8
BF16 = torch.bfloat16
ADAMW = {"lr": 1e-2, "weight_decay": 0.1, "foreach": False}  # the labs' AdamW, single-tensor
# Loss tolerance against one process with the whole batch in one backward (derivation in
# labs/03_zero/test_mixed_precision.py): 4 fp32 ulps at step 0, then 2**-11 relative.
STEP0_RTOL = 4 * torch.finfo(torch.float32).eps
LOSS_RTOL = 2.0**-11


def _nb(ts) -> int:
    return sum(t.numel() * t.element_size() for t in ts if t is not None)


def _measure(model: FSDP, opt: torch.optim.Optimizer, masters: list[torch.Tensor]) -> dict:
    """Bytes per object, and of every distinct storage held (shards, grads, masters, moments,
    gathered buffers, no_sync accumulators): an extra copy anywhere would show."""
    shards = list(model.parameters())
    moments = [opt.state[m] for m in masters]
    per = {
        "weights": _nb(s for s in shards if s.dtype == BF16),  # a stored bf16 copy
        "grads": _nb(s.grad for s in shards),
        "master": _nb(masters),
        "moment1": _nb(st["exp_avg"] for st in moments),
        "moment2": _nb(st["exp_avg_sq"] for st in moments),
    }
    flats = [f for u in model.units for f in u.flats]
    seen = {}
    ts = [*shards, *(s.grad for s in shards), *masters, *(f.buffer for f in flats)]
    ts += [f.unsharded_grad for f in flats] + [st[k] for st in moments for k in st]
    for t in ts:
        if torch.is_tensor(t) and t.dim() > 0:  # AdamW's 0-d step counters aside
            s = t.untyped_storage()
            seen[s.data_ptr() if s.nbytes() else id(s)] = s.nbytes()
    return {"per_object": per, "total": sum(per.values()), "storages": sum(seen.values())}


def train(split: str, kind: str, steps: int, group, microbatches: int = 1) -> dict:
    """AdamW steps of the 16-byte recipe in ``split`` ("lecture" or "fsdp2") on ``group``."""
    D = group.size()
    if split == "lecture":
        # the fp32 master shards: the same flat layout, built from the fp32 model
        masters = [p.detach().clone() for p in FSDP(make_model(kind), group).parameters()]
        cfg = FSDPConfig(compute_dtype=BF16, reduce_dtype=BF16)
        model = FSDP(make_model(kind).to(BF16), group, cfg)
    else:
        cfg = FSDPConfig(compute_dtype=BF16, reduce_dtype=torch.float32)
        model = FSDP(make_model(kind), group, cfg)
        masters = list(model.parameters())  # the fp32 shards are the master
    shards = list(model.parameters())
    opt = torch.optim.AdamW([m.requires_grad_() for m in masters], **ADAMW)
    losses, state = [], None
    for s, (x, y) in enumerate(make_batches(steps)):
        loss = torch.zeros((), device=shards[0].device)
        xy = (rank_slice(x, group=group), rank_slice(y, group=group))
        for piece in split_microbatches(xy, microbatches):
            part = lm_loss(model, *piece) / microbatches
            part.backward()
            loss += part.detach()
        model.finish_gradient_synchronization()
        if s == steps - 1:
            state = _measure(model, opt, masters)
        if split == "lecture":
            for sh, m in zip(shards, masters):
                m.grad, sh.grad = sh.grad.float(), None  # fp32 working copy of the bf16 grad
        opt.step()
        opt.zero_grad()
        with torch.no_grad():
            for sh, m in zip(shards, masters):
                sh.grad = None
                if sh is not m:
                    sh.copy_(m)  # round the master into the bf16 shard
        dist.all_reduce(loss, group=group)
        losses.append((loss / D).item())
    full = model.full_state_dict()
    return {"losses": losses, "weights": full, "padded_numel": model.padded_numel, "state": state}


def torch_reference(kind: str, steps: int, microbatches: int = 1) -> dict:
    """One process, plain PyTorch: bf16 model, fp32 masters stepped by ``torch.optim.AdamW``."""
    model = make_model(kind)
    ps = [p for p in model.parameters() if p.requires_grad]
    masters = [p.detach().clone().requires_grad_() for p in ps]
    model.to(BF16)
    opt = torch.optim.AdamW(masters, **ADAMW)
    losses = []
    for x, y in make_batches(steps):
        loss = torch.zeros((), device=masters[0].device)
        for piece in split_microbatches((x, y), microbatches):
            part = lm_loss(model, *piece) / microbatches
            part.backward()  # accumulates p.grad in bf16
            loss += part.detach()
        for p, m in zip(ps, masters):
            m.grad, p.grad = p.grad.float(), None
        opt.step()
        with torch.no_grad():
            for p, m in zip(ps, masters):
                p.copy_(m)
        losses.append(loss.item())
    names = {n: p.detach().clone() for n, p in model.named_parameters(remove_duplicate=False)}
    return {"losses": losses, "weights": names}


def suite(kind: str = "plain", steps: int = STEPS) -> dict:
    """Both splits on every rank; rank 0 adds the plain-PyTorch run, whole batch and D
    microbatches accumulated in bf16."""
    torch.set_num_threads(1)
    world, D = dist.group.WORLD, dist.get_world_size()
    # a stub (NotImplementedError) is reported per case so it does not hide the others; any
    # other error ends the run with this rank's traceback
    out = {split: stub_or_raise(train, split, kind, steps, world)
           for split in ("lecture", "fsdp2")}
    if dist.get_rank() == 0:
        out["single"] = stub_or_raise(torch_reference, kind, steps)
        out["single_accum"] = stub_or_raise(torch_reference, kind, steps, D)
    return out
