"""ZeRO stage 1 (sharded optimizer state) and stage 2 (+ sharded gradients) from scratch.

ZeRO-1, :class:`ShardedOptimizer`
    Sharded: optimizer state (Adam's m and v). Replicated: weights and full gradients.
    Every trainable parameter gets one *owner* rank (greedy by size: largest tensor first,
    to the least-loaded rank), and each rank builds ``optimizer_cls`` over its owned tensors
    only. The weights and the gradients each live in one flat buffer laid out owner by
    owner, each owner's segment padded to the largest segment ``S``: parameters are views
    of the weight buffer, and a post-accumulate-grad hook makes ``param.grad`` a view of the
    gradient buffer (copied in once per step). ``step()`` then works chunk by chunk
    (``bucket_size_mb``), so its temporaries are bucket-sized, never ``D S``: for each piece
    ``[lo, hi)`` of the segments, a ``reduce_scatter`` of the ``(D, c)`` gradient pieces
    (sum, then ``/ D``) into the owner's own segment; the owner steps; an ``all_gather`` of
    the owners' ``(c,)`` weight pieces, copied into every segment.
    Sent bytes per rank per step: ``2 q (D S) (D-1)/D``, i.e.
    :func:`shardlab.accounting.comm.step_volume` ``("zero1", D*S, D, q)``; ``D S - N`` is
    the padding (0 when the owners are perfectly balanced).
    Model state: :func:`shardlab.accounting.memory.model_state` ``(N, D, "zero1", recipe)``;
    the moments are exact summed over ranks, each rank holds its owned numel (imbalance is
    reported, not hidden).
    Production: ``torch.distributed.optim.ZeroRedundancyOptimizer`` (all-reduce by DDP, then
    a broadcast from each owner: more bytes than reduce-scatter + all-gather).

ZeRO-2, :class:`ZeRO2`
    Sharded: optimizer state and gradients. Replicated: weights. Trainable parameters are
    grouped into flat buckets (reverse order, ``bucket_size_mb``), each padded to a multiple
    of ``D``; the parameters become views into those flat buffers, and rank ``r`` owns the
    ``r``-th contiguous ``1/D`` of every bucket as an fp32 shard the optimizer updates in
    place. During backward, as soon as all gradients of a bucket are final they are copied
    into a flat buffer, ``param.grad`` is released (``None``), and an asynchronous
    ``reduce_scatter`` sends each rank its shard of the sum; when a bucket is launched, the
    one before it is waited for and its full-size buffer freed, so at most two bucket
    buffers exist at once. ``step()`` runs the optimizer on the shards and ``all_gather``s
    the buckets one after another (one shard-size temporary at a time). Sent bytes per rank per step:
    ``step_volume("zero2", N_pad, D, q)`` with ``N_pad`` the padded element count; model
    state per rank: ``model_state(N_pad, D, "zero2", recipe)`` exactly.
    Production: DeepSpeed ZeRO stage 2; in PyTorch, FSDP with ``SHARD_GRAD_OP``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn


def assign_owners(numels: list[int], world_size: int) -> list[int]:
    """Owner rank per tensor: largest first, each to the least-loaded rank (ties: lower
    index / lower rank), so every rank computes the same answer."""
    if world_size < 1:
        raise ValueError(f"world_size={world_size} must be >= 1")
    owners = [0] * len(numels)
    # BEGIN SOLUTION hint: sort indices by numel descending; give each to argmin of the loads
    load = [0] * world_size
    for i in sorted(range(len(numels)), key=lambda i: (-numels[i], i)):
        r = min(range(world_size), key=lambda r: (load[r], r))
        owners[i] = r
        load[r] += numels[i]
    # END SOLUTION
    return owners


class ShardedOptimizer(torch.optim.Optimizer):
    """ZeRO-1: ``optimizer_cls(**kwargs)`` over this rank's owned parameters only."""

    def __init__(
        self,
        params,
        optimizer_cls: type[torch.optim.Optimizer],
        group=None,
        bucket_size_mb: float = 25.0,
        **kwargs,
    ):
        if not bucket_size_mb > 0:
            raise ValueError(f"bucket_size_mb={bucket_size_mb!r} must be > 0")
        super().__init__(params, defaults=kwargs)
        self.bucket_size_mb = bucket_size_mb
        self.group = group
        self.world_size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        # Each tensor once (tied weights appear once), trainable only, in group order.
        seen: set[int] = set()
        self.params: list[torch.Tensor] = []
        for g in self.param_groups:
            for p in g["params"]:
                if p.requires_grad and id(p) not in seen:
                    seen.add(id(p))
                    self.params.append(p)
        self.owners = assign_owners([p.numel() for p in self.params], self.world_size)
        # Flat layout: rank r's owned tensors in order, at r * S + offset.
        loads = [0] * self.world_size
        self.offsets: list[int] = []
        for p, r in zip(self.params, self.owners):
            self.offsets.append(loads[r])
            loads[r] += p.numel()
        self.loads = loads
        self.segment = max(loads) if loads else 0  # S
        owned = {id(p) for p, r in zip(self.params, self.owners) if r == self.rank}
        # BEGIN SOLUTION hint: build optimizer_cls over owned params, one group per outer group
        local_groups = []
        for g in self.param_groups:
            hyper = {k: v for k, v in g.items() if k != "params"}
            local_groups.append({**hyper, "params": [p for p in g["params"] if id(p) in owned]})
        has_any = any(group["params"] for group in local_groups)
        self.optim = optimizer_cls(local_groups, **kwargs) if has_any else None
        # END SOLUTION
        if self.optim is not None:
            self.state = self.optim.state  # per-rank shard of the optimizer state
        # Flat owner-major storage: weights (params become views) and gradients (hooked).
        p0 = self.params[0] if self.params else None
        self.flat_weights = self.flat_grads = None
        self._grad_views: dict[int, torch.Tensor] = {}
        if p0 is not None:
            self.flat_weights = self._flat(p0.dtype, p0.device)  # (D*S,)
            self.flat_grads = self._flat(p0.dtype, p0.device)  # (D*S,)
            for p, sl in zip(self.params, self._slices()):
                self.flat_weights[sl].copy_(p.detach().view(-1))
                p.data = self.flat_weights[sl].view_as(p)  # share storage
                self._grad_views[id(p)] = self.flat_grads[sl].view_as(p)
                p.register_post_accumulate_grad_hook(self._to_flat)

    def _chunks(self) -> list[tuple[int, int]]:
        """``[lo, hi)`` pieces of a segment, each ``D * (hi - lo)`` elements <= the bucket
        (at least one element), so a collective's temporaries stay bucket-sized."""
        p0 = self.params[0]
        per = self.bucket_size_mb * 2**20 / (p0.element_size() * self.world_size)
        c = max(1, int(per))
        return [(lo, min(lo + c, self.segment)) for lo in range(0, self.segment, c)]

    def _slices(self) -> list[slice]:
        S = self.segment
        return [
            slice(o * S + off, o * S + off + p.numel())
            for p, o, off in zip(self.params, self.owners, self.offsets)
        ]

    @torch.no_grad()
    def _to_flat(self, p: torch.Tensor) -> None:
        """Gradient as bucket view: move ``p.grad`` into the flat buffer once per step."""
        view = self._grad_views[id(p)]
        if p.grad.data_ptr() != view.data_ptr():
            view.copy_(p.grad)
            p.grad = view  # later backward passes accumulate in place

    @property
    def padded_numel(self) -> int:
        """``D * S``: elements each collective moves (``N`` plus padding)."""
        return self.world_size * self.segment

    def _flat(self, dtype, device) -> torch.Tensor:
        return torch.zeros(self.padded_numel, dtype=dtype, device=device)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if not self.params:
            return loss
        D, S, r = self.world_size, self.segment, self.rank
        # BEGIN SOLUTION hint: per chunk of the segment: reduce_scatter (D, c) grads -> (c,), /D, into own segment
        for p, sl in zip(self.params, self._slices()):
            if p.grad is None:  # unused this step: send zeros, not last step's values
                self.flat_grads[sl].zero_()
        grads = self.flat_grads.view(D, S)  # row o = owner o's segment
        for lo, hi in self._chunks():
            send = grads[:, lo:hi].reshape(-1)  # (D*c,) temporary, <= one bucket
            mine = torch.empty(hi - lo, dtype=send.dtype, device=send.device)
            dist.reduce_scatter_single(mine, send, op=dist.ReduceOp.SUM, group=self.group)
            grads[r, lo:hi].copy_(mine.div_(D))  # owned p.grad views see the average
            del send, mine
        # END SOLUTION
        # BEGIN SOLUTION hint: copy hyperparameters from self.param_groups, then step the local optimizer
        if self.optim is not None:
            for outer, local in zip(self.param_groups, self.optim.param_groups):
                for k, v in outer.items():
                    if k != "params":
                        local[k] = v
            self.optim.step()
        # END SOLUTION
        # BEGIN SOLUTION hint: per chunk: all_gather the owners' (c,) weight pieces, copy into the segments
        weights = self.flat_weights.view(D, S)
        for lo, hi in self._chunks():
            recv = torch.empty(D * (hi - lo), dtype=weights.dtype, device=weights.device)
            dist.all_gather_single(recv, weights[r, lo:hi].contiguous(), group=self.group)
            weights[:, lo:hi].copy_(recv.view(D, -1))
            del recv
        # END SOLUTION
        return loss

    def state_dict(self):
        """This rank's shard of the optimizer state (``optimizer_cls`` format)."""
        return self.optim.state_dict() if self.optim is not None else {}

    def load_state_dict(self, state_dict) -> None:
        if self.optim is not None:
            self.optim.load_state_dict(state_dict)


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

    def __post_init__(self) -> None:
        if not self.bucket_size_mb > 0:
            raise ValueError(f"bucket_size_mb={self.bucket_size_mb!r} must be > 0")


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
        self.reset()

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
        **kwargs,
    ) -> None:
        super().__init__()
        self.config = ZeRO2Config(bucket_size_mb)
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
            b.grad_buffer = torch.zeros(b.padded, dtype=p.grad.dtype, device=p.grad.device)
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
        first = b.shard.grad is None  # write into the persistent shard, else add later
        b.out = b.grad_shard if first else torch.empty_like(b.grad_shard)
        b.handle = dist.reduce_scatter_single(
            b.out, b.grad_buffer, op=dist.ReduceOp.SUM, group=self.group, async_op=True
        )
        self._inflight.append(b)
        while len(self._inflight) > 1:  # overlap one bucket, free the older buffer
            self._complete(self._inflight.pop(0))
        # END SOLUTION

    def _complete(self, b: _FlatBucket) -> None:
        """Wait for ``b``'s reduce-scatter, add its shard into ``shard.grad``, free buffers."""
        # BEGIN SOLUTION hint: wait; shard.grad = grad_shard (or += out); reset the bucket
        b.handle.wait()
        if b.shard.grad is None:
            b.shard.grad = b.grad_shard  # b.out is grad_shard
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
                self._launch(b)
        while self._inflight:
            self._complete(self._inflight.pop(0))
        # END SOLUTION

    @torch.no_grad()
    def step(self) -> None:
        """Optimizer step on the shards, then all-gather every bucket's weights."""
        # BEGIN SOLUTION hint: optimizer.step(); per bucket all_gather_single(b.weights, b.shard copy)
        self.optimizer.step()
        for b in self.buckets:  # one at a time: one shard-size copy alive, not all of them
            dist.all_gather_single(b.weights, b.shard.detach().clone(), group=self.group)
        # END SOLUTION

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)
        self.module.zero_grad(set_to_none=set_to_none)
