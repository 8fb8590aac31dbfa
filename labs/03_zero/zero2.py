"""ZeRO stage 2 from scratch: :class:`ZeRO2`, optimizer state and gradients sharded over D ranks.

Sharded: the optimizer state and the gradients. Replicated: the weights. Trainable
parameters (:func:`unique_trainable_params`, a tied tensor once) are grouped into flat
buckets (:func:`make_buckets`: reverse order, at most ``bucket_size_mb`` each), each padded
to a multiple of ``D``; the parameters become views into those flat buffers, and rank ``r``
owns the ``r``-th contiguous ``1/D`` of every bucket as an fp32 shard the optimizer updates
in place.

Collectives:

1. at construction, a ``broadcast`` of every parameter and buffer from rank 0 (all ranks
   start equal);
2. during backward, as soon as all gradients of a bucket are final they are copied into a
   flat buffer, ``param.grad`` is released (``None``), and an asynchronous
   ``reduce_scatter`` sends each rank its shard of the average (on gloo a bucket of at least
   ``gloo_form_min_mb`` as an in-place ``all_reduce`` of the buffer whose own piece the rank
   keeps: gloo's reduce-scatter is an all-reduce of a copy, the same wire bytes, so this
   spares the copy; ``shardlab.runtime.collective_forms``), overlapping the rest of
   backward (as DDP overlaps its all-reduce). A bucket whose reduce-scatter has finished is
   completed (its full-size buffer freed) at the next launch; only when more than
   ``max_in_flight`` buckets are in flight does a launch wait for the oldest, which bounds
   the full-size buffers alive at once. Under ``no_sync()`` nothing is sent and full local
   gradients accumulate instead;
3. ``step()`` runs the optimizer on the shards and starts an asynchronous, in-place
   ``all_gather`` per bucket (in forward order; on gloo from ``gloo_form_min_mb`` as ``D``
   in-place broadcasts, each shard from its owner: the same bytes per rank); a forward pre-hook on each module waits for
   its parameters' bucket just before their first use, so the all-gathers overlap the next
   forward. ``state_dict()`` and the next ``step()`` wait too; anything else that reads the
   weights between ``step()`` and the next forward calls :meth:`ZeRO2.wait_for_weights`.

Bytes. Sent per rank per step: :func:`shardlab.accounting.comm.step_volume`
``("zero2", N_pad, D, q)`` with ``N_pad`` the padded element count (:attr:`ZeRO2.padded_numel`);
per accumulated update :func:`~shardlab.accounting.comm.grad_accum_volume`. Model state per
rank: :func:`shardlab.accounting.memory.model_state` ``(N_pad, D, "zero2", recipe)`` exactly.

Production: DeepSpeed ZeRO stage 2; in PyTorch, FSDP with ``SHARD_GRAD_OP``. Stage 1
(sharded optimizer state only) is :mod:`zero1`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist
from shardlab.runtime.collective_forms import (
    GLOO_FORM_MIN_MB,
    all_reduce_pieces,
    broadcast_pieces,
    gloo_form,
)
from torch import nn


def unique_trainable_params(module: nn.Module) -> list[nn.Parameter]:
    """Parameters that need a gradient, each tied (shared) tensor once, in module order."""
    return [p for p in module.parameters() if p.requires_grad]  # parameters() de-duplicates


def make_buckets(params: list[nn.Parameter], bucket_bytes: float) -> list[list[nn.Parameter]]:
    """Reverse order (about when backward produces them), at most ``bucket_bytes`` each
    (a larger parameter gets a bucket of its own)."""
    # BEGIN SOLUTION hint: the same bucketing as make_buckets in lab 02's ddp.py (reverse order, cap bucket_bytes)
    buckets: list[list[nn.Parameter]] = []
    current: list[nn.Parameter] = []
    size = 0
    for p in reversed(params):
        nbytes = p.numel() * p.element_size()
        if current and size + nbytes > bucket_bytes:
            buckets.append(current)
            current, size = [], 0
        current.append(p)
        size += nbytes
    if current:
        buckets.append(current)
    return buckets
    # END SOLUTION


@dataclass(frozen=True)
class ZeRO2Config:
    bucket_size_mb: float = 25.0
    max_in_flight: int = 2  # reduce-scatters (full-size bucket buffers) before a launch waits
    gloo_form_min_mb: float = GLOO_FORM_MIN_MB  # on gloo, buckets from this size: gloo forms

    def __post_init__(self) -> None:
        if not self.bucket_size_mb > 0:
            raise ValueError(f"bucket_size_mb={self.bucket_size_mb!r} must be > 0")
        if not self.gloo_form_min_mb >= 0:
            raise ValueError(f"gloo_form_min_mb={self.gloo_form_min_mb!r} must be >= 0")
        if self.max_in_flight < 1:
            raise ValueError(f"max_in_flight={self.max_in_flight!r} must be >= 1")


class _FlatBucket:
    """Params viewed into one flat (padded) weight buffer; this rank owns one 1/D shard."""

    def __init__(self, params: list[nn.Parameter], world_size: int, rank: int) -> None:
        self.params = params
        self.numel = sum(p.numel() for p in params)
        self.padded = -(-self.numel // world_size) * world_size  # ceil to a multiple of D
        self.shard_numel = self.padded // world_size
        p0 = params[0]
        self.weights = torch.zeros(self.padded, dtype=p0.dtype, device=p0.device)
        self.offsets = []
        off = 0
        for p in params:
            self.offsets.append(off)
            self.weights[off : off + p.numel()].copy_(p.detach().view(-1))
            p.data = self.weights[off : off + p.numel()].view_as(p)  # share storage
            off += p.numel()
        lo = rank * self.shard_numel
        # The optimizer's parameter: a view of this rank's slice, updated in place.
        self.shard = nn.Parameter(self.weights[lo : lo + self.shard_numel])
        # This rank's reduced gradient lives here, allocated once (the ZeRO-2 "grads" state):
        # the first reduce-scatter of a step writes straight into it.
        self.grad_shard = torch.zeros(self.shard_numel, dtype=p0.dtype, device=p0.device)
        self.index = {id(p): i for i, p in enumerate(params)}
        self.gather = None  # the async all-gather of the weights started by step()
        self.reset()

    def wait_gather(self) -> None:
        if self.gather is not None:
            self.gather.wait()
            self.gather = None

    def reset(self) -> None:
        self.grad_buffer: torch.Tensor | None = None  # (padded,) only while reducing
        self.ready: set[int] = set()
        self.handle = None
        self.out: torch.Tensor | None = None  # (shard_numel,)


class ZeRO2(nn.Module):
    """Wrap ``module``; backward reduce-scatters gradients into shards; :meth:`step` updates."""

    def __init__(
        self,
        module: nn.Module,
        optimizer_cls: type[torch.optim.Optimizer],
        bucket_size_mb: float = 25.0,
        group: dist.ProcessGroup | None = None,
        max_in_flight: int = 2,
        gloo_form_min_mb: float = GLOO_FORM_MIN_MB,
        **kwargs,
    ) -> None:
        super().__init__()
        self.config = ZeRO2Config(bucket_size_mb, max_in_flight, gloo_form_min_mb)
        self.module = module
        self.group = group
        self.world_size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self.require_sync = True
        src = dist.get_global_rank(group, 0) if group is not None else 0
        with torch.no_grad():
            for t in list(module.parameters()) + list(module.buffers()):
                dist.broadcast(t.data, src=src, group=group)
        params = unique_trainable_params(module)
        self.buckets = [
            _FlatBucket(ps, self.world_size, self.rank)
            for ps in make_buckets(params, bucket_size_mb * 2**20)
        ]
        self._bucket_of = {id(p): b for b in self.buckets for p in b.params}
        self.optimizer = optimizer_cls([b.shard for b in self.buckets], **kwargs)
        self._inflight: list[_FlatBucket] = []  # launched, not yet waited for
        for p in params:
            p.register_post_accumulate_grad_hook(self._hook)
        # Wait for a module's all-gathered weights just before its forward first uses them.
        for m in module.modules():
            mine = [
                self._bucket_of[id(p)]
                for p in m.parameters(recurse=False)
                if id(p) in self._bucket_of
            ]
            if mine:
                m.register_forward_pre_hook(lambda *_, bs=tuple(set(mine)): self._wait(bs))
        module.register_state_dict_pre_hook(lambda *_: self.wait_for_weights())

    def _wait(self, buckets) -> None:
        for b in buckets:
            b.wait_gather()

    def wait_for_weights(self) -> None:
        """Finish every all-gather that :meth:`step` started (weights final on every rank)."""
        self._wait(self.buckets)

    @property
    def padded_numel(self) -> int:
        """``N_pad``: trainable elements plus the padding of every bucket."""
        return sum(b.padded for b in self.buckets)

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Accumulate full local gradients (gives up the gradient-memory saving meanwhile)."""
        previous, self.require_sync = self.require_sync, False
        try:
            yield
        finally:
            self.require_sync = previous

    def _hook(self, p: nn.Parameter) -> None:
        if not self.require_sync:
            return
        b = self._bucket_of[id(p)]
        # BEGIN SOLUTION hint: copy grad into the flat buffer, set p.grad=None, reduce_scatter async when full
        if b.grad_buffer is None:
            # empty, not zeros: every slot is written (a copy here, or zeros in
            # finish_gradient_synchronization for a parameter with no gradient); a memset of
            # the whole bucket per step measured as a visible share of ZeRO-2's extra CPU time
            b.grad_buffer = torch.empty(b.padded, dtype=p.grad.dtype, device=p.grad.device)
            b.grad_buffer[b.numel :].zero_()  # the padding
        i = b.index[id(p)]
        b.grad_buffer[b.offsets[i] : b.offsets[i] + p.numel()].copy_(p.grad.view(-1))
        p.grad = None  # the full-size gradient is gone; only the bucket buffer holds it
        b.ready.add(i)
        if len(b.ready) == len(b.params):
            self._launch(b)
        # END SOLUTION

    def _launch(self, b: _FlatBucket) -> None:
        # BEGIN SOLUTION hint: divide by D, async reduce_scatter_single into a (shard_numel,) tensor; complete the previous bucket
        b.grad_buffer.div_(self.world_size)
        if self._gloo_form(b):  # the whole buffer summed in place; _complete reads our piece
            b.out = None
            b.handle = all_reduce_pieces([b.grad_buffer], self.group)
        else:
            first = b.shard.grad is None  # write into the persistent shard, else add later
            b.out = b.grad_shard if first else torch.empty_like(b.grad_shard)
            b.handle = dist.reduce_scatter_single(
                b.out, b.grad_buffer, op=dist.ReduceOp.SUM, group=self.group, async_op=True
            )
        self._inflight.append(b)
        # Free the buffers of finished reduce-scatters; wait only when too many are in flight.
        while self._inflight and (
            len(self._inflight) > self.config.max_in_flight
            or self._inflight[0].handle.is_completed()
        ):
            self._complete(self._inflight.pop(0))
        # END SOLUTION

    def _complete(self, b: _FlatBucket) -> None:
        """Wait for ``b``'s reduce-scatter, add its shard into ``shard.grad``, free buffers."""
        # BEGIN SOLUTION hint: wait; shard.grad = grad_shard (or += out); reset the bucket
        b.handle.wait()
        if b.out is None:  # the gloo form: this rank's piece of the all-reduced buffer
            lo = self.rank * b.shard_numel
            b.out = b.grad_buffer[lo : lo + b.shard_numel]
            if b.shard.grad is None:
                b.grad_shard.copy_(b.out)
        if b.shard.grad is None:
            b.shard.grad = b.grad_shard  # b.out is grad_shard (or copied into it)
        else:
            b.shard.grad.add_(b.out)
        b.reset()
        # END SOLUTION

    def finish_gradient_synchronization(self) -> None:
        """Wait for the reduce-scatters; accumulate each bucket's result into ``shard.grad``."""
        if not self.require_sync:
            return
        # BEGIN SOLUTION hint: launch incomplete buckets, then complete every launched one
        for b in self.buckets:
            if b.grad_buffer is not None and b.handle is None:
                for i, p in enumerate(b.params):  # no gradient this step: send zeros
                    if i not in b.ready:
                        b.grad_buffer[b.offsets[i] : b.offsets[i] + p.numel()].zero_()
                self._launch(b)
        while self._inflight:
            self._complete(self._inflight.pop(0))
        # END SOLUTION

    @torch.no_grad()
    def step(self) -> None:
        """Optimizer step on the shards, then start every bucket's all-gather (async)."""
        self.wait_for_weights()  # the previous step's gathers read the shards we update
        # BEGIN SOLUTION hint: optimizer.step(); per bucket, last first: b.gather = async all_gather_single(b.weights, b.shard)
        self.optimizer.step()
        for b in reversed(self.buckets):  # forward order: the last bucket holds the first layers
            if self._gloo_form(b):  # each shard broadcast in place from its owner
                b.gather = broadcast_pieces(b.weights.chunk(self.world_size), self.group)
                continue
            # In place: the input is this rank's slice of the output (as FSDP's flat params).
            b.gather = dist.all_gather_single(
                b.weights, b.shard.detach(), group=self.group, async_op=True
            )
        # END SOLUTION

    def _gloo_form(self, b: _FlatBucket) -> bool:
        nbytes = b.padded * b.weights.element_size()
        return gloo_form(nbytes, self.group, self.config.gloo_form_min_mb)

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)
        self.module.zero_grad(set_to_none=set_to_none)
