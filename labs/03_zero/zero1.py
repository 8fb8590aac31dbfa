"""ZeRO stage 1 from scratch: :class:`ShardedOptimizer`, optimizer state sharded over D ranks.

Sharded: the optimizer state (Adam's m and v). Replicated: weights and full gradients.
Every trainable parameter gets one *owner* rank (:func:`assign_owners`, greedy by size:
largest tensor first, to the least-loaded rank), and each rank builds ``optimizer_cls``
over its owned tensors only; param groups keep their hyperparameters, a tied tensor is
owned once.

Layout. The weights and the gradients each live in one flat buffer laid out owner by owner,
each owner's segment padded to the largest segment ``S``: parameters are views of the
weight buffer, and a post-accumulate-grad hook makes ``param.grad`` a view of the gradient
buffer (copied in once per step; later microbatches accumulate in place, so gradient
accumulation communicates once per update).

Collectives, all in ``step()``, chunk by chunk (``bucket_size_mb``), so the temporaries are
bucket-sized, never ``D S``. For each piece ``[lo, hi)`` of the segments:

1. ``reduce_scatter`` of the ``(D, c)`` gradient pieces (sum, then ``/ D``) into the
   owner's own segment: each owner gets the average gradient of what it steps;
2. the owner steps its local optimizer;
3. ``all_gather`` of the owners' ``(c,)`` weight pieces, copied into every segment: every
   rank holds the same model again.

Bytes. Sent per rank per step: ``2 q (D S) (D-1)/D``, i.e.
:func:`shardlab.accounting.comm.step_volume` ``("zero1", D*S, D, q)``; ``D S - N`` is the
padding (0 when the owners are perfectly balanced); per accumulated update
:func:`~shardlab.accounting.comm.grad_accum_volume`. Model state per rank:
:func:`shardlab.accounting.memory.model_state` ``(N, D, "zero1", recipe)``; the moments are
exact summed over ranks, each rank holding its owned numel (imbalance is reported, not
hidden).

Production: ``torch.distributed.optim.ZeroRedundancyOptimizer`` (all-reduce by DDP, then a
broadcast from each owner: more bytes than reduce-scatter + all-gather). Stage 2 (sharded
gradients too) is :mod:`zero2`.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


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
