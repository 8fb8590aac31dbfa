"""Storage layer of the FSDP lab: flat, padded, sharded parameters (the schedule is in fsdp.py).

A :class:`FlatParam` takes the parameters of one FSDP unit that share ``requires_grad``,
concatenates them into one 1-D vector of ``numel`` elements in the parameters' dtype (fp32,
or bf16 for a model cast before wrapping: the lecture's 16-byte recipe, whose fp32 master then
lives in the optimizer), pads it with zeros to
``padded = ceil(numel / D) * D`` and keeps only this rank's ``padded / D`` slice as an
``nn.Parameter`` (``.shard``): that is all the weight state a rank stores. While the unit
computes, ``.buffer`` (``padded`` elements in the compute dtype) holds the all-gathered copy
and the module's parameter attributes are views into it; when the unit is resharded the
buffer's storage is resized to 0 bytes, so the views keep their shapes but hold no memory.

Collectives issued here (``D`` ranks, ``q`` bytes per element of the dtype sent):
``all_gather_into_tensor`` of the shard (sends ``q * padded * (D-1)/D`` per rank) and
``reduce_scatter_tensor`` of the padded gradient (same count); see
``shardlab.accounting.comm.ring_sent_bytes``.

HSDP (a ``replicate`` group of ``R`` ranks holding the same shard): the shard group above is
one replica's ``D`` ranks; after the step's last reduce-scatter :meth:`FlatParam.reduce_replicas`
all-reduces the averaged gradient shard across the replicas (``2 q (padded/D) (R-1)/R`` bytes,
``shardlab.accounting.hierarchical.hsdp_step_volume``) and divides it by ``R``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

# torch 2.13 renamed all_gather_into_tensor / reduce_scatter_tensor (same arguments, same ops)
all_gather_into_tensor = getattr(dist, "all_gather_single", dist.all_gather_into_tensor)
reduce_scatter_tensor = getattr(dist, "reduce_scatter_single", dist.reduce_scatter_tensor)


@dataclass
class Slot:
    """One distinct parameter inside a flat vector: where it lives and every name it has."""

    aliases: list[tuple[nn.Module, str, str]]  # (owning module, attribute, full name)
    shape: torch.Size
    numel: int
    offset: int


def padded_numel(numel: int, world: int) -> int:
    """Smallest multiple of ``world`` that is >= ``numel`` (equal shards on every rank)."""
    return -(-numel // world) * world


class FlatParam:
    """The same-``requires_grad`` parameters of one unit as one sharded flat vector."""

    def __init__(
        self,
        params: list[tuple[nn.Parameter, list[tuple[nn.Module, str, str]]]],
        group: dist.ProcessGroup,
        compute_dtype: torch.dtype,
        reduce_dtype: torch.dtype,
        replicate: dist.ProcessGroup | None = None,
    ) -> None:
        self.group, self.world, self.rank = group, group.size(), group.rank()
        self.replicate = replicate  # HSDP: the ranks that hold this same shard (None: FSDP)
        self.replicas = replicate.size() if replicate is not None else 1
        self._replica_pending = False  # a reduced shard.grad not yet all-reduced across replicas
        self.compute_dtype, self.reduce_dtype = compute_dtype, reduce_dtype
        self.requires_grad = params[0][0].requires_grad
        self.slots, offset = [], 0
        for p, aliases in params:
            self.slots.append(Slot(aliases, p.shape, p.numel(), offset))
            offset += p.numel()
        self.numel = offset
        self.padded = padded_numel(offset, self.world)
        self.shard_numel = self.padded // self.world
        self.param_dtype = params[0][0].dtype  # dtype of the stored shard (fp32 unless cast)
        # BEGIN SOLUTION hint: flatten the params into one vector of self.param_dtype padded to self.padded, copy rank 0's values everywhere (HSDP: replica 0's too), keep this rank's slice as nn.Parameter self.shard
        flat = torch.zeros(
            self.padded, dtype=self.param_dtype, device=params[0][0].device
        )  # (padded,)
        flat[: self.numel] = torch.cat([p.detach().reshape(-1) for p, _ in params])
        # every rank must start from the same weights: take rank 0's
        dist.broadcast(flat, group=group, group_src=0)
        if replicate is not None:  # HSDP: and every replica from replica 0
            dist.broadcast(flat, group=replicate, group_src=0)
        lo = self.rank * self.shard_numel
        self.shard = nn.Parameter(flat[lo : lo + self.shard_numel].clone(), self.requires_grad)
        # END SOLUTION
        self.buffer = torch.empty(  # (padded,) gathered copy
            self.padded, dtype=compute_dtype, device=params[0][0].device
        )
        self.gathered = False  # True when buffer holds the full parameters
        self._gather_work = None  # pending async all-gather
        self._rs = None  # pending async reduce-scatter: (work, out, inp)
        self.unsharded_grad: torch.Tensor | None = None  # (padded,) reduce dtype, under no_sync
        for slot, view in zip(self.slots, self.buffer[: self.numel].split(self.sizes())):
            for mod, attr, _ in slot.aliases:
                mod._parameters.pop(attr, None)
                setattr(mod, attr, view.view(slot.shape))  # placeholder until gathered
        self.free()

    def sizes(self) -> list[int]:
        return [s.numel for s in self.slots]

    def free(self) -> None:
        """Reshard: drop the gathered copy (the storage shrinks to 0 bytes; views stay valid)."""
        # BEGIN SOLUTION hint: resize the buffer's untyped storage to 0 bytes and mark the flat param as not gathered
        self.buffer.untyped_storage().resize_(0)
        self.gathered = False
        # END SOLUTION

    def start_gather(self) -> None:
        """Issue the async all-gather of the shards into ``buffer`` (no-op if gathered/pending)."""
        if self.gathered or self._gather_work is not None:
            return
        # BEGIN SOLUTION hint: give the buffer its storage back, then all_gather_into_tensor(buffer, shard in compute dtype, async_op=True)
        self.buffer.untyped_storage().resize_(self.padded * self.buffer.element_size())
        src = self.shard.detach().to(self.compute_dtype)  # (padded/D,) cast before sending
        self._gather_work = all_gather_into_tensor(
            self.buffer, src, group=self.group, async_op=True
        )
        # END SOLUTION

    def wait_gather(self) -> None:
        """Block until ``buffer`` holds the full parameters."""
        self.start_gather()
        if self._gather_work is not None:
            self._gather_work.wait()
            self._gather_work = None
        self.gathered = True

    def make_views(self, on_grad: Callable[[torch.Tensor], None]) -> None:
        """Point the module attributes at fresh autograd views of the gathered buffer.

        ``full`` aliases ``buffer[:numel]`` but has its own version counter (``.data``), so
        refilling ``buffer`` before backward does not trip autograd's saved-tensor check.
        Its gradient arrives once, summed over all views; ``on_grad(full)`` then runs.
        """
        # BEGIN SOLUTION hint: leaf = buffer.data[:numel] (requires_grad like the shard), split it into one view per slot, setattr each alias, hook on_grad with register_post_accumulate_grad_hook
        full = self.buffer.data[: self.numel]  # (numel,)
        full.requires_grad_(self.requires_grad)
        for slot, view in zip(self.slots, full.split(self.sizes())):
            for mod, attr, _ in slot.aliases:
                setattr(mod, attr, view.view(slot.shape))
        if self.requires_grad:
            full.register_post_accumulate_grad_hook(on_grad)
        # END SOLUTION

    def reduce_grad(self, grad: torch.Tensor, sync: bool) -> None:
        """Pad ``grad`` (numel,) in the reduce dtype; reduce-scatter it now or keep it (no_sync)."""
        # BEGIN SOLUTION hint: pad grad (cast to reduce_dtype) to self.padded, add any no_sync accumulation; if sync, async reduce_scatter_tensor (SUM) into a (shard_numel,) tensor, else keep it in self.unsharded_grad
        if self.padded == self.numel and grad.dtype == self.reduce_dtype:
            padded = grad  # nothing to pad or cast: reduce autograd's gradient in place
        else:
            padded = torch.zeros(
                self.padded, dtype=self.reduce_dtype, device=grad.device
            )  # (padded,)
            padded[: self.numel] = grad
        if self.unsharded_grad is not None:
            padded += self.unsharded_grad
            self.unsharded_grad = None
        if not sync:
            self.unsharded_grad = padded
            return
        self.drain()  # at most one reduce-scatter in flight per flat param
        out = torch.empty(
            self.shard_numel, dtype=self.reduce_dtype, device=padded.device
        )  # (padded/D,)
        work = reduce_scatter_tensor(out, padded, group=self.group, async_op=True)
        self._rs = (work, out, padded)
        # END SOLUTION

    def drain(self) -> None:
        """Wait for the pending reduce-scatter; average by D into ``shard.grad`` (shard dtype)."""
        if self._rs is None:
            return
        self._replica_pending = self.replicate is not None
        # BEGIN SOLUTION hint: wait, divide the summed shard by D, cast to the shard's dtype and add it to shard.grad (or set it)
        work, out, _ = self._rs
        work.wait()
        self._rs = None
        out = out.div_(self.world).to(self.shard.dtype)  # sum over ranks -> mean
        if self.shard.grad is None:
            self.shard.grad = out
        else:
            self.shard.grad += out
        # END SOLUTION

    def reduce_replicas(self) -> None:
        """HSDP, once per step after :meth:`drain`: average ``shard.grad`` across the replicas."""
        if not self._replica_pending:
            return
        self._replica_pending = False
        # BEGIN SOLUTION hint: all_reduce (SUM) shard.grad across self.replicate (one call: the whole shard), then divide it by self.replicas
        # the shard is already the mean over this replica's D ranks: sum the R means, / R
        dist.all_reduce(self.shard.grad, group=self.replicate)
        self.shard.grad.div_(self.replicas)
        # END SOLUTION

    def full_params(self) -> dict[str, torch.Tensor]:
        """All-gather the shards (their dtype) and return ``{name: tensor}`` per alias (a copy)."""
        full = torch.empty(
            self.padded, dtype=self.shard.dtype, device=self.shard.device
        )  # (padded,)
        all_gather_into_tensor(full, self.shard.detach(), group=self.group)
        out = {}
        for slot, view in zip(self.slots, full[: self.numel].split(self.sizes())):
            for _, _, name in slot.aliases:
                out[name] = view.view(slot.shape).clone()
        return out
