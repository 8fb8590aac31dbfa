"""Distributed data parallelism (DDP) from scratch.

What is sharded: nothing. Every rank keeps the whole model, its gradients and the optimizer
state; only the *data* is split (each rank sees ``B / D`` of the global batch).

What runs, and when
    * construction: one ``broadcast`` per parameter and buffer from rank 0, so every replica
      starts from the same weights (a one-off cost, not part of a training step);
    * backward: as soon as a parameter's gradient is final (its post-accumulate-grad hook),
      it is divided by ``D`` and an **asynchronous** ``all_reduce(SUM)`` is started, either
      per parameter or per flat *bucket* of parameters (``bucket_size_mb``), so communication
      overlaps with the rest of backward;
    * ``finish_gradient_synchronization()``: wait for the handles, copy bucket results back
      into ``param.grad``.

Bytes per rank per step (ring all-reduce of every gradient once):
``2 q N (D-1) / D`` = :func:`shardlab.accounting.comm.step_volume` ``("ddp", N, D, q)``.
With ``m`` microbatches inside :meth:`DDP.no_sync` all but the last, the volume per update
stays ``2 q N (D-1)/D`` instead of ``m`` times that
(:func:`shardlab.accounting.comm.grad_accum_volume`). Persistent model state per rank is
:func:`shardlab.accounting.memory.model_state` ``(N, D, "ddp", recipe)``: nothing divided
by ``D``. Bucket buffers live only from the first gradient of a bucket until the copy-back.

Averaging: the objective is the mean loss over the *global* batch. With equal local batch
sizes, the global mean's gradient is the average of the local means' gradients, hence
``/ D``. If ranks hold different numbers of tokens, dividing by ``D`` weights every rank
equally, not every token; to get the token mean, scale each local loss by
``local_tokens * D / global_tokens`` before backward (or sum losses and divide by the
all-reduced token count).

Production: ``torch.nn.parallel.DistributedDataParallel`` (a C++ reducer with 25 MB buckets,
``gradient_as_bucket_view`` to avoid the copy, unused-parameter detection, comm hooks).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn


@dataclass(frozen=True)
class DDPConfig:
    """``bucket_size_mb=None`` all-reduces every parameter on its own."""

    bucket_size_mb: float | None = None
    broadcast_from: int = 0

    def __post_init__(self) -> None:
        if self.bucket_size_mb is not None and not self.bucket_size_mb > 0:
            raise ValueError(f"bucket_size_mb={self.bucket_size_mb!r} must be > 0 or None")
        if not isinstance(self.broadcast_from, int) or self.broadcast_from < 0:
            raise ValueError(f"broadcast_from={self.broadcast_from!r} must be a rank >= 0")


def unique_trainable_params(module: nn.Module) -> list[nn.Parameter]:
    """Parameters that need a gradient, each tied (shared) tensor once, in module order."""
    seen: set[int] = set()
    out = []
    for p in module.parameters():  # already de-duplicates shared Parameters
        if p.requires_grad and id(p) not in seen:
            seen.add(id(p))
            out.append(p)
    return out


def make_buckets(params: list[nn.Parameter], bucket_bytes: float) -> list[list[nn.Parameter]]:
    """Group ``params`` in *reverse* order (roughly the order backward produces gradients)
    into buckets of at most ``bucket_bytes`` (a parameter larger than that gets its own)."""
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


class _Bucket:
    """A flat buffer for a group of parameters, filled as their gradients become final."""

    def __init__(self, params: list[nn.Parameter]) -> None:
        self.params = params
        self.offsets = []
        off = 0
        for p in params:
            self.offsets.append(off)
            off += p.numel()
        self.numel = off
        self.index = {id(p): i for i, p in enumerate(params)}
        self.reset()

    def reset(self) -> None:
        self.buffer: torch.Tensor | None = None  # (numel,) allocated on first gradient
        self.ready: set[int] = set()
        self.handle = None


class DDP(nn.Module):
    """Wrap ``module``; call :meth:`finish_gradient_synchronization` after ``backward``."""

    def __init__(
        self,
        module: nn.Module,
        bucket_size_mb: float | None = None,
        group: dist.ProcessGroup | None = None,
        broadcast_from: int = 0,
    ) -> None:
        super().__init__()
        self.config = DDPConfig(bucket_size_mb, broadcast_from)
        self.module = module
        self.group = group
        self.world_size = dist.get_world_size(group)
        self.params = unique_trainable_params(module)
        self.require_sync = True
        self._handles: list[tuple[nn.Parameter, object]] = []
        self._buckets: list[_Bucket] = []
        self._bucket_of: dict[int, _Bucket] = {}
        # BEGIN SOLUTION hint: broadcast parameters and buffers from rank broadcast_from
        src = dist.get_global_rank(group, broadcast_from) if group is not None else broadcast_from
        with torch.no_grad():
            for t in list(module.parameters()) + list(module.buffers()):
                dist.broadcast(t.data, src=src, group=group)
        # END SOLUTION
        if bucket_size_mb is not None:
            for ps in make_buckets(self.params, bucket_size_mb * 2**20):
                b = _Bucket(ps)
                self._buckets.append(b)
                for p in ps:
                    self._bucket_of[id(p)] = b
        for p in self.params:
            p.register_post_accumulate_grad_hook(self._hook)

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Backward passes inside only accumulate local gradients (no communication)."""
        previous, self.require_sync = self.require_sync, False
        try:
            yield
        finally:
            self.require_sync = previous

    def _hook(self, p: nn.Parameter) -> None:
        """Called by autograd once ``p.grad`` holds this backward's full (accumulated) value."""
        if not self.require_sync:
            return
        if not self._buckets:
            # BEGIN SOLUTION hint: pre-divide p.grad by D, start an async all_reduce, keep the handle
            p.grad.div_(self.world_size)
            work = dist.all_reduce(p.grad, op=dist.ReduceOp.SUM, group=self.group, async_op=True)
            self._handles.append((p, work))
            # END SOLUTION
            return
        b = self._bucket_of[id(p)]
        # BEGIN SOLUTION hint: copy grad/D into the bucket's flat buffer; all_reduce it async when full
        if b.buffer is None:
            b.buffer = torch.zeros(b.numel, dtype=p.grad.dtype, device=p.grad.device)
        i = b.index[id(p)]
        b.buffer[b.offsets[i] : b.offsets[i] + p.numel()].copy_(p.grad.view(-1))
        b.ready.add(i)
        if len(b.ready) == len(b.params):
            self._launch(b)
        # END SOLUTION

    def _launch(self, b: _Bucket) -> None:
        # BEGIN SOLUTION hint: divide the flat buffer by D and start an async all_reduce
        b.buffer.div_(self.world_size)
        b.handle = dist.all_reduce(b.buffer, op=dist.ReduceOp.SUM, group=self.group, async_op=True)
        # END SOLUTION

    def finish_gradient_synchronization(self) -> None:
        """Wait for every outstanding all-reduce; afterwards ``param.grad`` is the average."""
        if not self.require_sync:
            return
        # BEGIN SOLUTION hint: wait on the handles; for buckets also launch incomplete ones and copy back
        for _, work in self._handles:
            work.wait()
        self._handles.clear()
        for b in self._buckets:
            if b.buffer is None:  # no parameter of this bucket was used on this step
                continue
            if b.handle is None:  # some parameters were unused: their slots stay zero
                self._launch(b)
            b.handle.wait()
            for i, p in enumerate(b.params):
                if i in b.ready:
                    p.grad.view(-1).copy_(b.buffer[b.offsets[i] : b.offsets[i] + p.numel()])
            b.reset()  # frees the flat buffer
        # END SOLUTION
