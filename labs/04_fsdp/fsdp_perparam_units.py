"""Storage layer of per-parameter FSDP: dim-0 shards, packed collectives (schedule: fsdp_perparam.py).

A :class:`ShardedUnit` holds one unit's parameters, each as a :class:`Slot`: an fp32
``nn.Parameter`` shard of ``c = ceil(d0 / D)`` rows (the parameter zero-padded to ``D c``
rows; ``accounting.memory.fsdp_padded_numel(shapes, D, "per_param")`` elements over all
ranks), registered on the parameter's module under its own name while the unit is idle, and
``full``, a ``(D c, *rest)`` buffer in the compute dtype that holds the gathered parameter
while the unit computes (its storage is resized to 0 bytes when freed; the module sees the
unpadded view ``full[:d0]``).

Collectives issued here, on all of the unit's shards packed into one ``(S,)`` vector
(``S = sum c * prod(rest)``): one ``all_gather_into_tensor`` into a rank-major ``(D, S)``
buffer, whose columns are then copied out into each ``full``, and one
``reduce_scatter_tensor`` of a ``(D, S)`` input packed the same way, each sending
``q * D * S * (D-1)/D`` bytes per rank (``accounting.comm.ring_sent_bytes``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch
import torch.distributed as dist
from fsdp_units import all_gather_into_tensor, reduce_scatter_tensor
from torch import nn


@dataclass
class Slot:
    """One distinct parameter of a unit: its shard, where it sits in the packed vector."""

    aliases: list[tuple[nn.Module, str, str]]  # (owning module, attribute, full name)
    shape: torch.Size  # unsharded shape (d0, *rest)
    rows: int  # c = ceil(d0 / D): rows per rank
    offset: int  # start of this shard in the unit's packed (S,) vector
    shard: nn.Parameter  # (c, *rest) fp32, registered on the module while idle
    full: torch.Tensor  # (D c, *rest) gathered copy in param_dtype; storage 0 bytes when freed

    @property
    def numel(self) -> int:  # shard elements
        return self.shard.numel()

    def register(self, tensor: torch.Tensor) -> None:
        for mod, attr, _ in self.aliases:
            mod._parameters[attr] = tensor  # no type check: a plain tensor while gathered


def _storage(t: torch.Tensor) -> torch.Tensor:
    """Give ``t`` its storage back (after ``resize_(0)``); returns ``t``."""
    t.untyped_storage().resize_(t.numel() * t.element_size())
    return t


class ShardedUnit:
    """The parameters of one unit, each sharded on dim 0; one all-gather, one reduce-scatter."""

    def __init__(self, name, module, params, group, param_dtype, reduce_dtype) -> None:
        self.name, self.module, self.group = name, module, group
        self.param_dtype, self.reduce_dtype = param_dtype, reduce_dtype
        self.world, self.rank = group.size(), group.rank()
        self.slots: list[Slot] = []
        offset = 0
        for p, aliases in params:
            shape = p.shape if p.dim() else torch.Size([1])
            rows = -(-shape[0] // self.world)  # ceil(d0 / D)
            # BEGIN SOLUTION hint: zero-pad p to (D*rows, *rest) in fp32, broadcast rank 0's copy, keep rows [rank*rows, (rank+1)*rows) as an nn.Parameter (requires_grad like p)
            padded = torch.zeros(self.world * rows, *shape[1:], device=p.device)  # (D c, *rest)
            padded[: shape[0]] = p.detach().reshape(shape).float()
            dist.broadcast(padded, group=group, group_src=0)  # same start on every rank
            lo = self.rank * rows
            shard = nn.Parameter(padded[lo : lo + rows].clone(), p.requires_grad)
            # END SOLUTION
            full = torch.empty(self.world * rows, *shape[1:], dtype=param_dtype, device=p.device)
            slot = Slot(aliases, shape, rows, offset, shard, full)
            offset += slot.numel
            self.slots.append(slot)
        self.packed = offset  # S
        self.trainable = [s for s in self.slots if s.shard.requires_grad]
        self.gathered, self._ag, self._rs = False, None, None
        # collective buffers, (D S,) each: their storage exists only while a collective uses
        # it (resize_ frees it at once, even while gloo's work object still refers to it)
        dev = params[0][0].device if params else None  # the parameters' device (CUDA/CPU)
        self._ag_out = torch.empty(self.world * offset, dtype=param_dtype, device=dev)
        self._rs_in = torch.empty(self.world * offset, dtype=reduce_dtype, device=dev)
        for t in (self._ag_out, self._rs_in):
            t.untyped_storage().resize_(0)
        self._grads: dict[int, torch.Tensor] = {}  # id(slot) -> finished unsharded gradient
        self.free()

    def free(self) -> None:
        """Reshard: drop every gathered buffer and register the shards again."""
        # BEGIN SOLUTION hint: resize each slot's full storage to 0 bytes, register its shard on the module(s), mark not gathered
        for s in self.slots:
            s.full.untyped_storage().resize_(0)
            s.register(s.shard)
        self.gathered = False
        # END SOLUTION

    def start_gather(self) -> None:
        """Issue the unit's one async all-gather (no-op if gathered or pending)."""
        if self.gathered or self._ag is not None or not self.slots:
            return
        # BEGIN SOLUTION hint: out = empty (D*S,) in param_dtype; this rank's input is out's own slice [rank*S, (rank+1)*S) (no extra buffer): copy each shard there (cast), then async all_gather_into_tensor(out, that slice); keep (work, out)
        out = _storage(self._ag_out)  # (D S,)
        inp = out[self.rank * self.packed : (self.rank + 1) * self.packed]  # (S,) in place
        for s in self.slots:
            inp[s.offset : s.offset + s.numel].copy_(s.shard.detach().reshape(-1))
        work = all_gather_into_tensor(out, inp, group=self.group, async_op=True)
        self._ag = (work, out)
        # END SOLUTION

    def wait_gather(self) -> None:
        """Finish the all-gather and copy each parameter out of the rank-major buffer."""
        self.start_gather()
        if self._ag is not None:
            # BEGIN SOLUTION hint: wait; view out as (D, S); per slot give full its storage back and copy columns [offset, offset+numel) into full viewed as (D, numel)
            work, out = self._ag
            work.wait()
            out = out.view(self.world, self.packed)  # (D, S): row r = rank r's shards
            for s in self.slots:
                _storage(s.full)
                s.full.view(self.world, s.numel).copy_(out[:, s.offset : s.offset + s.numel])
            # END SOLUTION
            out.untyped_storage().resize_(0)  # freed now, whoever still holds the tensor
            self._ag = None
        self.gathered = True

    def make_views(self, on_grad: Callable) -> None:
        """Register a fresh leaf ``full.data[:d0]`` per parameter (own version counter, so
        refilling ``full`` before backward does not trip autograd's saved-tensor check)."""
        for s in self.slots:
            leaf = s.full.data[: s.shape[0]].view(s.shape)  # (d0, *rest)
            leaf.requires_grad_(s.shard.requires_grad)
            s.register(leaf)
            if leaf.requires_grad:
                leaf.register_post_accumulate_grad_hook(partial(on_grad, s))

    def keep_grad(self, s: Slot, grad: torch.Tensor) -> bool:
        """Hold one finished gradient and free the slot's gathered copy (its last use in
        backward is over); True when every trainable parameter's gradient is in."""
        s.full.untyped_storage().resize_(0)
        self._grads[id(s)] = grad
        return len(self._grads) == len(self.trainable)

    def reduce(self) -> None:
        """Pack the held gradients rank-major and issue the unit's one async reduce-scatter."""
        if not self._grads:
            return
        # BEGIN SOLUTION hint: (D*S,) reduce_dtype input viewed (D, S); per slot copy grad rows [r*rows, (r+1)*rows) into row r, columns [offset, offset+numel), zeros for padding rows and for slots without a grad, and drop each grad at once; async reduce_scatter_tensor (SUM) into (S,); keep (work, out, input)
        inp = _storage(self._rs_in)  # (D S,), uninitialised: every element is written below
        dst = inp.view(self.world, self.packed)  # (D, S): row r goes to rank r
        for s in self.slots:
            grad = self._grads.pop(id(s), None)
            cols = dst[:, s.offset : s.offset + s.numel]  # (D, numel)
            if grad is None:  # frozen, or no gradient reached it: zeros
                cols.zero_()
                continue
            per_row = grad.reshape(s.shape[0], -1)  # (d0, prod(rest))
            for r in range(self.world):
                rows = per_row[r * s.rows : (r + 1) * s.rows].reshape(-1)  # <= c rows
                cols[r, : rows.numel()].copy_(rows)
                cols[r, rows.numel() :].zero_()  # padding rows
            del grad, per_row, rows  # freed as soon as packed: never all grads + the input
        out = torch.empty(self.packed, dtype=self.reduce_dtype, device=inp.device)  # (S,)
        work = reduce_scatter_tensor(out, inp, group=self.group, async_op=True)
        self._rs = (work, out, inp)
        # END SOLUTION
        self._grads = {}

    def drain(self) -> None:
        """Wait for the reduce-scatter; average by D into each shard's fp32 ``.grad``."""
        if self._rs is None:
            return
        # BEGIN SOLUTION hint: wait; out / D in fp32; each trainable shard's grad is its slice viewed (rows, *rest) (add if a grad exists)
        work, out, inp = self._rs
        work.wait()
        inp.untyped_storage().resize_(0)
        self._rs = None
        out = out.div_(self.world).to(torch.float32)  # sum over ranks -> mean
        for s in self.trainable:
            g = out[s.offset : s.offset + s.numel].view(s.shard.shape)
            s.shard.grad = g if s.shard.grad is None else s.shard.grad.add_(g)
        # END SOLUTION

    def full_params(self) -> dict[str, torch.Tensor]:
        """All-gather the fp32 shards (one collective) and return unpadded copies by name."""
        inp = torch.cat([s.shard.detach().reshape(-1) for s in self.slots])  # (S,)
        out = torch.empty(self.world * self.packed, device=inp.device)  # (D S,)
        out = out.view(self.world, self.packed)  # (D, S)
        all_gather_into_tensor(out.view(-1), inp, group=self.group)
        res = {}
        for s in self.slots:
            full = out[:, s.offset : s.offset + s.numel].reshape(-1, *s.shape[1:])  # (D c, ..)
            for _, _, name in s.aliases:
                res[name] = full[: s.shape[0]].reshape(s.shape).clone()
        return res
