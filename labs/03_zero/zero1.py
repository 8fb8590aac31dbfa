"""ZeRO stage 1 from scratch: :class:`ShardedOptimizer`, optimizer state sharded over D ranks.

Sharded: the optimizer state (Adam's m and v). Replicated: weights and full gradients.
Every trainable parameter gets one *owner* rank (:func:`assign_owners`, greedy by size:
largest tensor first, to the least-loaded rank), and each rank builds ``optimizer_cls``
over its owned tensors only; param groups keep their hyperparameters, a tied tensor is
owned once.

Layout. The weights and the gradients each live in one flat buffer laid out owner by owner,
each owner's segment padded to the largest segment ``S``: parameters are views of the
weight buffer, and a post-accumulate-grad hook makes ``param.grad`` a view of the gradient
buffer (copied in once per step; later microbatches accumulate in place).

Collectives, chunk by chunk (``bucket_size_mb``), so the temporaries are bucket-sized, never
``D S``. For each piece ``[lo, hi)`` of the segments:

1. ``reduce_scatter`` of the ``D`` rows' ``(c,)`` gradient pieces (sum) into the owner's own
   piece, started asynchronously by the gradient hooks as soon as every gradient in the piece
   is final, so it overlaps the rest of backward (as DDP overlaps its all-reduce; pieces go
   out last first, in the same order on every rank, at most ``max_in_flight`` at once). Once
   a piece is sent, the other owners' parts are zeroed, so a later backward accumulates only
   what is new; the end of backward waits for the last ones. Under ``no_sync()`` nothing is
   sent and the gradients accumulate locally: gradient accumulation communicates once per
   update, on the last microbatch (or in ``step()`` if every backward ran under
   ``no_sync()``);
2. ``step()`` divides the own segment by ``D`` (the average) and steps the local optimizer;
3. ``all_gather`` (the list form) of the owners' ``(c,)`` weight pieces straight into every
   row (the input is a copy of the own piece, ``1/D`` of a bucket): every rank holds the same
   model again. With ``overlap_gather=True`` the gathers run on after ``step()`` returns (at
   most ``max_in_flight`` at once, first chunk first: each segment holds its tensors in model
   order, so low chunks hold the first layers) and each chunk is waited for just before the
   first forward of a module that holds one of its tensors (a process-wide module forward
   pre-hook: the optimizer is given tensors, not a module);
   :meth:`ShardedOptimizer.wait_for_weights` finishes them all. Off by default: a caller that
   reads the weights straight after ``step()`` (without a forward) must call
   :meth:`~ShardedOptimizer.wait_for_weights` first.

Which form of each collective (``benchmark_gloo_forms.py`` measured them on gloo). The
``(D, S)`` rows put a chunk's ``D`` pieces ``S`` apart, so the single-tensor
``reduce_scatter_single`` needs a packed send copy (the exercise's form); the list
``all_gather`` over the ``D`` rows' views writes the pieces where they are (measured within
noise of the single form with its copy-back, or faster), so small chunks take those two. On
gloo a chunk of at least ``gloo_form_min_mb`` takes the gloo forms
(``shardlab.runtime.collective_forms``): the reduce-scatter as ``D`` in-place all-reduces of
the rows' pieces (gloo's own reduce-scatter is an all-reduce of a copy: the same wire bytes,
less local work) and the all-gather as ``D`` in-place broadcasts, each piece from its owner
(the same bytes per rank). Below that size latency dominates and the ``D`` all-reduces lost
(1.3-2.4x a single reduce-scatter at 0.25-1 MB on 4 ranks); on NCCL the standard forms always.

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

import contextlib
from collections.abc import Iterator

import torch
import torch.distributed as dist
from shardlab.runtime.collective_forms import (
    GLOO_FORM_MIN_MB,
    all_reduce_pieces,
    broadcast_pieces,
    gloo_form,
)


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
        max_in_flight: int = 2,
        overlap_gather: bool = False,
        gloo_form_min_mb: float = GLOO_FORM_MIN_MB,
        **kwargs,
    ):
        if not bucket_size_mb > 0:
            raise ValueError(f"bucket_size_mb={bucket_size_mb!r} must be > 0")
        if not gloo_form_min_mb >= 0:
            raise ValueError(f"gloo_form_min_mb={gloo_form_min_mb!r} must be >= 0")
        if max_in_flight < 1:
            raise ValueError(f"max_in_flight={max_in_flight!r} must be >= 1")
        super().__init__(params, defaults=kwargs)
        self.bucket_size_mb = bucket_size_mb
        self.max_in_flight = max_in_flight
        self.overlap_gather = overlap_gather
        self.gloo_form_min_mb = gloo_form_min_mb
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
        self.require_sync = True
        self._inflight: list = []  # (work, lo, hi, send) of reduce-scatters, oldest first
        self._reduced = self._dirty = self._queued = False
        self._to_gather: list[int] = []  # chunks whose weight all-gather has not started
        self._gathers: list = []  # (chunk, work, own) of started all-gathers, oldest first
        self._pre_hook = None  # the forward pre-hook that waits for them (while any remain)
        if p0 is not None:
            # Which chunks each tensor touches; a chunk goes out once all of its tensors are final.
            chunks = self._chunks()
            self._chunks_of = [
                [k for k, (lo, hi) in enumerate(chunks) if lo < off + p.numel() and off < hi]
                for p, off in zip(self.params, self.offsets)
            ]
            self._count = [sum(k in ks for ks in self._chunks_of) for k in range(len(chunks))]
            self._index = {id(p): i for i, p in enumerate(self.params)}
            self._new_round()
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

    def _gloo_form(self, lo: int, hi: int) -> bool:
        """Whether chunk ``[lo, hi)`` (``D`` pieces) moves in the gloo forms (in-place
        all-reduces and broadcasts of the rows' pieces: ``shardlab.runtime.collective_forms``)."""
        nbytes = self.world_size * (hi - lo) * self.flat_grads.element_size()
        return gloo_form(nbytes, self.group, self.gloo_form_min_mb)

    def _slices(self) -> list[slice]:
        S = self.segment
        return [
            slice(o * S + off, o * S + off + p.numel())
            for p, o, off in zip(self.params, self.owners, self.offsets)
        ]

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Backward passes inside accumulate locally and send nothing (as DDP's ``no_sync``)."""
        previous, self.require_sync = self.require_sync, False
        try:
            yield
        finally:
            self.require_sync = previous

    def _new_round(self) -> None:
        self._remaining = list(self._count)  # tensors of each chunk not yet final
        self._next = len(self._count) - 1  # chunks go out last first, like backward

    @torch.no_grad()
    def _to_flat(self, p: torch.Tensor) -> None:
        """Gradient as bucket view (moved into the flat buffer once per step); when syncing,
        start every chunk whose gradients are now all final."""
        view = self._grad_views[id(p)]
        if p.grad.data_ptr() != view.data_ptr():
            view.copy_(p.grad)
            p.grad = view  # later backward passes accumulate in place
        if not self.require_sync:
            self._dirty = True
            return
        if not self._queued:  # once per backward: finish the round when backward ends
            self._queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._end_backward)
        for k in self._chunks_of[self._index[id(p)]]:
            self._remaining[k] -= 1
        while self._next >= 0 and self._remaining[self._next] == 0:
            self._launch(self._next)
            self._next -= 1

    def _launch(self, k: int) -> None:
        """Start chunk ``k``'s reduce-scatter of the rows' ``(c,)`` pieces into the own piece."""
        D, S, r = self.world_size, self.segment, self.rank
        lo, hi = self._chunks()[k]
        grads = self.flat_grads.view(D, S)  # row o = owner o's segment
        if self._gloo_form(lo, hi):  # a large chunk on gloo: the rows' pieces, nothing packed
            # every row's (c,) piece summed in place (the own row gets its sum; the others'
            # sums are zeroed by _retire, as after a reduce-scatter): gloo's reduce-scatter
            # is an all-reduce of a copy anyway, so the same wire bytes, no copy
            work = all_reduce_pieces([grads[o, lo:hi] for o in range(D)], self.group)
            self._inflight.append((work, lo, hi, None))
        else:
            # BEGIN SOLUTION hint: pack the (D, c) pieces into a (D*c,) copy; async reduce_scatter_single into the own row's piece
            send = torch.empty(D * (hi - lo), dtype=grads.dtype, device=grads.device)  # (D*c,)
            send.view(D, -1).copy_(grads[:, lo:hi])  # a copy (<= one bucket), never a view
            work = dist.reduce_scatter_single(
                grads[r, lo:hi], send, op=dist.ReduceOp.SUM, group=self.group, async_op=True
            )  # the own row gets the sum (its old value is in send)
            self._inflight.append((work, lo, hi, send))
            # END SOLUTION
        # BEGIN SOLUTION hint: retire finished reduce-scatters; wait for the oldest only when more than max_in_flight are in flight
        # Retire finished ones; wait for the oldest only when too many are in flight.
        while self._inflight and (
            len(self._inflight) > self.max_in_flight or self._inflight[0][0].is_completed()
        ):
            self._retire()
        # END SOLUTION

    def _retire(self) -> None:
        """Wait for the oldest reduce-scatter (freeing its send copy), then zero the other
        owners' pieces it read (a later backward accumulates only what is new)."""
        work, lo, hi, _send = self._inflight.pop(0)
        work.wait()
        grads = self.flat_grads.view(self.world_size, self.segment)
        for o in range(self.world_size):
            if o != self.rank:
                grads[o, lo:hi].zero_()

    @torch.no_grad()
    def _end_backward(self) -> None:
        """Send the chunks still waiting (some tensor got no gradient), then wait for all."""
        for p, sl in zip(self.params, self._slices()):
            if p.grad is None:  # unused this step: send zeros, not last step's values
                self.flat_grads[sl].zero_()
        while self._next >= 0:
            self._launch(self._next)
            self._next -= 1
        while self._inflight:  # before the next backward accumulates into the own rows
            self._retire()
        self._new_round()
        self._queued, self._reduced, self._dirty = False, True, False  # all sent

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
        self.wait_for_weights()  # the previous step's gathers read the rows we update
        D, S, r = self.world_size, self.segment, self.rank
        if self._dirty or not self._reduced:  # every backward ran under no_sync(): reduce now
            self._end_backward()
        self.flat_grads.view(D, S)[r].div_(D)  # owned p.grad views see the average
        # BEGIN SOLUTION hint: copy hyperparameters from self.param_groups, then step the local optimizer
        if self.optim is not None:
            for outer, local in zip(self.param_groups, self.optim.param_groups):
                for k, v in outer.items():
                    if k != "params":
                        local[k] = v
            self.optim.step()
        # END SOLUTION
        self._reduced = self._dirty = False
        self._to_gather = list(range(len(self._chunks())))
        if not self.overlap_gather:
            self.wait_for_weights()  # every chunk gathered and copied in before returning
            return loss
        while self._to_gather and len(self._gathers) < self.max_in_flight:
            self._start_gather(self._to_gather.pop(0))
        if self._pre_hook is None:
            self._pre_hook = torch.nn.modules.module.register_module_forward_pre_hook(
                self._before_forward
            )
        return loss

    def _start_gather(self, k: int) -> None:
        """Start chunk ``k``'s all-gather of the owners' ``(c,)`` weight pieces."""
        D, S, r = self.world_size, self.segment, self.rank
        lo, hi = self._chunks()[k]
        weights = self.flat_weights.view(D, S)  # row o = owner o's segment
        if self._gloo_form(lo, hi):  # a large chunk on gloo: each owner broadcasts its piece
            pieces = [weights[o, lo:hi] for o in range(D)]  # (c,) each, written in place
            self._gathers.append((k, broadcast_pieces(pieces, self.group), None))
            return
        # BEGIN SOLUTION hint: async all_gather into the D rows' (c,) pieces (views) from a copy of the own piece
        own = weights[r, lo:hi].clone()  # (c,): the input must not alias an output
        pieces = [weights[o, lo:hi] for o in range(D)]  # written in place: no copy-in
        work = dist.all_gather(pieces, own, group=self.group, async_op=True)
        # END SOLUTION
        self._gathers.append((k, work, own))

    @torch.no_grad()
    def _finish_gather(self) -> None:
        """Wait for the oldest all-gather (it wrote every row's piece), start the next."""
        k, work, own = self._gathers.pop(0)
        # BEGIN SOLUTION hint: wait (the pieces land in the rows themselves)
        work.wait()
        # END SOLUTION
        del own  # 1/D of a bucket: at most max_in_flight of them are alive
        if self._to_gather:
            self._start_gather(self._to_gather.pop(0))

    def _before_forward(self, module, _args) -> None:
        """Before a module's forward: finish the gathers up to the last chunk it reads."""
        ks = [
            k
            for p in module.parameters(recurse=False)
            if id(p) in self._index
            for k in self._chunks_of[self._index[id(p)]]
        ]
        if ks:
            self.wait_for_weights(upto=max(ks))

    def wait_for_weights(self, upto: int | None = None) -> None:
        """Finish the all-gathers :meth:`step` started, in chunk order, through chunk ``upto``
        (default: all of them); the forward pre-hook goes once none is left."""
        if not self.params:
            return
        last = len(self._chunks()) - 1 if upto is None else upto
        while True:
            if not self._gathers and self._to_gather:  # the synchronous path starts here
                self._start_gather(self._to_gather.pop(0))
            if not self._gathers or self._gathers[0][0] > last:
                break
            self._finish_gather()
        if not self._gathers and not self._to_gather and self._pre_hook is not None:
            self._pre_hook.remove()
            self._pre_hook = None

    def state_dict(self):
        """This rank's shard of the optimizer state (``optimizer_cls`` format)."""
        self.wait_for_weights()
        return self.optim.state_dict() if self.optim is not None else {}

    def load_state_dict(self, state_dict) -> None:
        if self.optim is not None:
            self.optim.load_state_dict(state_dict)
