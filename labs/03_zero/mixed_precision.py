"""The lecture's mixed-precision recipes on all four data-parallel layouts: :class:`MixedPrecisionDP`.

A *recipe* (:data:`shardlab.accounting.memory.RECIPES`) says how many bytes each stored object
takes per parameter; this module turns those byte counts into dtypes (2 -> bf16, 4 -> fp32,
0 -> not stored) and keeps exactly those objects:

=====================  =======  =====  ======  =======  ====================================
recipe                 weights  grads  master  moments  gradient path
=====================  =======  =====  ======  =======  ====================================
``mixed-adam-16``      bf16     bf16   fp32    fp32     bf16 grads reduced in bf16
``low-precision-12``   bf16     bf16   fp32    bf16     bf16 grads reduced in bf16
``bf16-no-master-10``  bf16     fp32   --      bf16     fp32 grads (``main_grad``), fp32 reduce
=====================  =======  =====  ======  =======  ====================================

What is sharded is the layout's :data:`~shardlab.accounting.memory.SHARDED_OBJECTS`: DDP
nothing; ZeRO-1 master and moments; ZeRO-2 also the gradients; ZeRO-3 also the bf16 weights.
All trainable parameters form one flat vector of ``N`` elements padded to ``N_pad``, a multiple
of ``D``; a sharded object holds rank ``r``'s contiguous ``N_pad / D`` slice, a replicated one
all ``N_pad``. Per rank that is exactly ``model_state(N_pad, D, layout, recipe)`` bytes.

The gradient path. Forward and backward run on the bf16 weights (the module's parameters are
views of the bf16 buffer), so autograd produces bf16 gradients; a post-accumulate-grad hook
adds each into the flat gradient buffer of the recipe's dtype and frees ``param.grad``.
The 16- and 12-byte recipes store 2-byte gradients, so they are reduced in bf16 (q = 2 bytes
sent per element, half of fp32); on ``D`` ranks the ring rounds each partial sum to bf16 (D-1
roundings of relative size 2**-9; for D = 2 one), and the sum is divided by D afterwards, which
is exact for a power of two. The 10-byte recipe keeps 4-byte gradients (Megatron's
``main_grad``) precisely so that accumulation and reduction happen in fp32 (q = 4).

Collectives per step (one flat bucket, no overlap: bucketing is labs 02/03's topic, not
precision's), volumes from :func:`shardlab.accounting.comm.step_volume` with ``N_pad`` and
``q`` the gradient dtype's size: DDP ``all_reduce`` of the gradients; ZeRO-1 and ZeRO-2
``reduce_scatter`` of the gradients then ``all_gather`` of the updated bf16 weights; ZeRO-3
``all_gather`` of the bf16 weight shards before forward (kept through backward: the whole model
is one unit) and ``reduce_scatter`` of the gradients. The optimizer is AdamW computed in fp32 on
this rank's range (the update formula of ``torch.optim.AdamW``); the result goes to the fp32
master and is rounded to bf16 into the weights, or, without a master, straight into the bf16
weights (round to nearest).

Production: DeepSpeed's bf16 optimizer / ZeRO stages; PyTorch FSDP2's ``MixedPrecisionPolicy``
(fp32 sharded parameters as the master, bf16 ``param_dtype``, ``reduce_dtype`` of your choice);
Megatron's distributed optimizer (``main_grad`` in fp32).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist
from shardlab.accounting import memory
from torch import nn

# torch 2.13 renamed all_gather_into_tensor / reduce_scatter_tensor (same arguments, same ops)
all_gather_into_tensor = getattr(dist, "all_gather_single", dist.all_gather_into_tensor)
reduce_scatter_tensor = getattr(dist, "reduce_scatter_single", dist.reduce_scatter_tensor)

RECIPES = ("mixed-adam-16", "low-precision-12", "bf16-no-master-10")
_DTYPE_OF_BYTES = {2: torch.bfloat16, 4: torch.float32}


def recipe_dtypes(recipe: str) -> dict[str, torch.dtype | None]:
    """Dtype of each stored object of ``recipe`` (``None``: not stored), from its byte counts."""
    rec = memory.get_recipe(recipe)
    out: dict[str, torch.dtype | None] = {}
    for obj in ("weights", "grads", "master", "moment1", "moment2"):
        b = rec.bytes_of(obj)
        if b and b not in _DTYPE_OF_BYTES:
            raise ValueError(f"recipe {recipe!r} stores {obj} in {b} bytes: no dtype of that size")
        out[obj] = _DTYPE_OF_BYTES.get(int(b)) if b else None
    if out["weights"] is None or out["grads"] is None:
        raise ValueError(f"recipe {recipe!r} must store weights and gradients")
    return out


@dataclass(frozen=True)
class MixedPrecisionConfig:
    """Layout (``accounting.memory.LAYOUTS``), recipe (:data:`RECIPES`), AdamW hyperparameters."""

    layout: str = "ddp"
    recipe: str = "mixed-adam-16"
    lr: float = 1e-2
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.1

    def __post_init__(self) -> None:
        if self.layout not in memory.LAYOUTS:
            raise ValueError(f"layout={self.layout!r} is not one of {', '.join(memory.LAYOUTS)}")
        if self.recipe not in RECIPES:
            raise ValueError(f"recipe={self.recipe!r} is not one of {', '.join(RECIPES)}")
        if not self.lr > 0 or not self.eps > 0 or not self.weight_decay >= 0:
            raise ValueError(
                f"lr={self.lr!r} and eps={self.eps!r} must be > 0, "
                f"weight_decay={self.weight_decay!r} >= 0"
            )
        if not all(0 <= b < 1 for b in self.betas) or len(self.betas) != 2:
            raise ValueError(f"betas={self.betas!r} must be two numbers in [0, 1)")


class MixedPrecisionDP(nn.Module):
    """Data-parallel training of ``module`` in ``config.recipe`` with ``config.layout``.

    Use: ``loss = lm_loss(mp, x, y); loss.backward(); mp.finish_gradient_synchronization();
    mp.step(); mp.zero_grad()``. Ranks start from rank 0's weights (broadcast).
    """

    def __init__(
        self, module: nn.Module, group: dist.ProcessGroup, config: MixedPrecisionConfig
    ) -> None:
        super().__init__()
        self.config, self.group = config, group
        self.world, self.rank = group.size(), group.rank()
        self.dtypes = recipe_dtypes(config.recipe)
        self.sharded = memory.SHARDED_OBJECTS[config.layout]
        self.module = module
        self.params = [p for p in module.parameters() if p.requires_grad]  # de-duplicated
        self.numel = sum(p.numel() for p in self.params)  # N
        self.padded = -(-self.numel // self.world) * self.world  # N_pad
        self.shard_numel = self.padded // self.world  # N_pad / D
        lo = self.rank * self.shard_numel
        self.own = slice(lo, lo + self.shard_numel)  # this rank's range of the flat vector
        self.offsets = [0]
        for p in self.params:
            self.offsets.append(self.offsets[-1] + p.numel())
        dev = self.params[0].device if self.params else None  # every buffer lives here
        flat = torch.zeros(self.padded, dtype=torch.float32, device=dev)  # (N_pad,) fp32 initial
        if self.params:
            flat[: self.numel] = torch.cat([p.detach().reshape(-1).float() for p in self.params])
        dist.broadcast(flat, group=group, group_src=0)  # every rank starts from rank 0's model
        self.step_count = 0

        # BEGIN SOLUTION hint: allocate weights/grads/master/moment1/moment2 in self.dtypes; an object in self.sharded holds only flat[self.own], the others all N_pad; no master when its dtype is None
        def alloc(obj: str, init: torch.Tensor | None) -> torch.Tensor | None:
            dtype = self.dtypes[obj]
            if dtype is None:
                return None
            n = self.shard_numel if obj in self.sharded else self.padded
            if init is None:
                return torch.zeros(n, dtype=dtype, device=dev)
            src = init[self.own] if obj in self.sharded else init
            return src.to(dtype, copy=True)

        self.weights = alloc("weights", flat)  # (N_pad,) or (N_pad/D,) bf16
        self.grads = alloc("grads", None)  # (N_pad,) or (N_pad/D,) grad dtype
        self.master = alloc("master", flat)  # fp32, or None for the 10-byte recipe
        self.moment1 = alloc("moment1", None)
        self.moment2 = alloc("moment2", None)
        # END SOLUTION
        del flat
        # ZeRO-3 keeps the full bf16 weights only while computing: a buffer whose storage is
        # resized to 0 bytes between steps (the parameter views stay valid, hold nothing).
        self.gathered = self.weights
        if "weights" in self.sharded:
            self.gathered = self.weights.new_empty(self.padded)  # weights' dtype and device
        module.to(self.dtypes["weights"])  # frozen parameters and float buffers compute in bf16
        for p, a, b in zip(self.params, self.offsets, self.offsets[1:]):
            p.data = self.gathered[a:b].view_as(p)  # parameters are views of the bf16 weights
            p.register_post_accumulate_grad_hook(self._hook)
        if "weights" in self.sharded:
            self._free_gathered()
        self._full_grads: torch.Tensor | None = None  # (N_pad,) transient, sharded grads only
        self._index = {id(p): i for i, p in enumerate(self.params)}

    def _free_gathered(self) -> None:
        self.gathered.untyped_storage().resize_(0)

    def forward(self, *args, **kwargs):
        if "weights" in self.sharded:
            self.gather_weights()
        return self.module(*args, **kwargs)

    def gather_weights(self) -> None:
        """ZeRO-3: all-gather the bf16 weight shards into the full buffer (no-op if there)."""
        if self.gathered.untyped_storage().nbytes() > 0:
            return
        # BEGIN SOLUTION hint: give the gathered buffer its storage back (padded * element_size bytes) and all_gather_into_tensor the bf16 shards into it
        self.gathered.untyped_storage().resize_(self.padded * self.gathered.element_size())
        all_gather_into_tensor(self.gathered, self.weights, group=self.group)
        # END SOLUTION

    @torch.no_grad()
    def _hook(self, p: nn.Parameter) -> None:
        """Autograd's bf16 ``p.grad`` is final: add it into the flat gradient, free it."""
        i = self._index[id(p)]
        a, b = self.offsets[i], self.offsets[i + 1]
        # BEGIN SOLUTION hint: replicated grads: add p.grad into self.grads[a:b] (cast to its dtype); sharded grads: into a zeroed transient (N_pad,) buffer self._full_grads; then p.grad = None
        if "grads" in self.sharded:
            if self._full_grads is None:
                self._full_grads = self.grads.new_zeros(self.padded)
            target = self._full_grads
        else:
            target = self.grads
        target[a:b].add_(p.grad.reshape(-1))  # bf16 -> grad dtype (fp32 for main_grad)
        p.grad = None
        # END SOLUTION

    @torch.no_grad()
    def finish_gradient_synchronization(self) -> None:
        """Reduce the gradients in their dtype; afterwards this rank's range holds the mean."""
        D = self.world
        # BEGIN SOLUTION hint: ddp: all_reduce(grads) /D; zero1: reduce_scatter the full grads into grads[own] /D; zero2/zero3: reduce_scatter _full_grads into the grad shard /D and drop _full_grads; zero3: free the gathered weights
        layout = self.config.layout
        if layout == "ddp":
            dist.all_reduce(self.grads, group=self.group)
            self.grads.div_(D)  # sum, then / D: exact for a power of two
        elif layout == "zero1":
            mine = self.grads.new_empty(self.shard_numel)  # (N_pad/D,)
            reduce_scatter_tensor(mine, self.grads, group=self.group)
            self.grads[self.own].copy_(mine.div_(D))
        else:
            full = self._full_grads
            if full is None:  # no parameter got a gradient: reduce zeros
                full = self.grads.new_zeros(self.padded)
            out = torch.empty_like(self.grads)  # (N_pad/D,)
            reduce_scatter_tensor(out, full, group=self.group)
            self.grads.add_(out.div_(D))
            self._full_grads = None
        if "weights" in self.sharded:
            self._free_gathered()
        # END SOLUTION

    def _mine(self, obj: str) -> torch.Tensor | None:
        """The part of object ``obj`` this rank updates: all of it under DDP (every rank
        steps every element), else this rank's range (the whole tensor if it is a shard)."""
        t = getattr(self, obj)
        if t is None or self.config.layout == "ddp" or obj in self.sharded:
            return t
        return t[self.own]

    @torch.no_grad()
    def step(self) -> None:
        """AdamW in fp32 on this rank's range, master -> bf16 weights, then re-replicate."""
        cfg = self.config
        self.step_count += 1
        t = self.step_count
        b1, b2 = cfg.betas
        # DDP updates everything on every rank (replicated optimizer state); the ZeRO layouts
        # update only their range and all-gather the bf16 result.
        # BEGIN SOLUTION hint: g = self._mine("grads") in fp32; m, v: update in fp32 (lerp; mul + addcmul) and store back in their dtype; p = master (or the bf16 weights in fp32): decay by lr*wd, addcdiv m/(sqrt(v)/sqrt(bc2)+eps) with -lr/bc1; round into the bf16 weights; zero1/zero2 all-gather the weights
        g = self._mine("grads").float()  # fp32 working copy
        m_store, v_store = self._mine("moment1"), self._mine("moment2")
        m, v = m_store.float(), v_store.float()  # the same tensors when stored in fp32
        m.lerp_(g, 1 - b1)
        v.mul_(b2).addcmul_(g, g, value=1 - b2)
        m_store.copy_(m)  # no-op in fp32, rounds to bf16 for the 12- and 10-byte recipes
        v_store.copy_(v)
        w = self._mine("weights")  # bf16
        p = self.master if self.master is not None else w.float()
        p.mul_(1 - cfg.lr * cfg.weight_decay)
        denom = (v.sqrt() / math.sqrt(1 - b2**t)).add_(cfg.eps)
        p.addcdiv_(m, denom, value=-cfg.lr / (1 - b1**t))
        w.copy_(p)  # round to nearest bf16
        if cfg.layout in ("zero1", "zero2"):
            all_gather_into_tensor(self.weights, w.clone(), group=self.group)
        # END SOLUTION

    def zero_grad(self) -> None:
        self.grads.zero_()
        for p in self.params:
            p.grad = None

    def state_objects(self) -> dict[str, torch.Tensor | None]:
        """The persistent objects by accounting name (moments under both names)."""
        return {
            "weights": self.weights,
            "grads": self.grads,
            "master": self.master,
            "moment1": self.moment1,
            "moment2": self.moment2,
        }

    def full_weights(self) -> torch.Tensor:
        """The full bf16 weight vector ``(N,)`` (a copy; ZeRO-3 all-gathers it)."""
        if "weights" in self.sharded:
            full = self.weights.new_empty(self.padded)
            all_gather_into_tensor(full, self.weights, group=self.group)
            return full[: self.numel]
        return self.weights[: self.numel].clone()
