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
    * ``finish_gradient_synchronization()``: wait for the handles. With buckets,
      ``param.grad`` is a view into its bucket (*gradient as bucket view*), so the averaged
      result is already in place: no copy back, and no second copy of the gradients.

Bytes per rank per step (ring all-reduce of every gradient once):
``2 q N (D-1) / D`` = :func:`shardlab.accounting.comm.step_volume` ``("ddp", N, D, q)``.
With ``m`` microbatches inside :meth:`DDP.no_sync` all but the last, the volume per update
stays ``2 q N (D-1)/D`` instead of ``m`` times that
(:func:`shardlab.accounting.comm.grad_accum_volume`). Persistent model state per rank is
:func:`shardlab.accounting.memory.model_state` ``(N, D, "ddp", recipe)``: nothing divided
by ``D``. The bucket buffers *are* the gradients (``param.grad`` views them), allocated once.

Peak memory per rank (fp32 AdamW, see :func:`shardlab.accounting.peak.predict_peak`): the
model state ``16 N`` plus, during backward, the saved activations and backward's transient
tensors, or, during ``optimizer.step()``, foreach AdamW's one temporary of ``4 N`` bytes.

Averaging: the objective is the mean loss over the *global* batch. With equal local batch
sizes, the global mean's gradient is the average of the local means' gradients, hence
``/ D``. If ranks hold different numbers of tokens, dividing by ``D`` weights every rank
equally, not every token; to get the token mean, scale each local loss by
``local_tokens * D / global_tokens`` before backward (or sum losses and divide by the
all-reduced token count).

Production: ``torch.nn.parallel.DistributedDataParallel`` (a C++ reducer with 25 MB buckets,
``gradient_as_bucket_view=True`` does what the buckets here do; the default ``False`` keeps
the buckets *and* separate ``.grad`` tensors; unused-parameter detection, comm hooks).
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
    # BEGIN SOLUTION hint: walk params in reverse; start a new bucket when the next one would exceed bucket_bytes
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


class _Bucket:
    """A flat gradient buffer for a group of parameters, allocated once at construction.

    *Gradient as bucket view*: after a parameter's first gradient of a step has been copied
    in, ``param.grad`` **is** a view into ``buffer``, so the bucket is the only copy of the
    gradients (later microbatches accumulate into it in place) and the all-reduce result
    needs no copy back. The buffer is the ``grads`` entry of the model state, not an extra.
    """

    def __init__(self, params: list[nn.Parameter]) -> None:
        self.params = params
        self.offsets = []
        off = 0
        for p in params:
            self.offsets.append(off)
            off += p.numel()
        self.numel = off
        self.index = {id(p): i for i, p in enumerate(params)}
        p0 = params[0]
        self.buffer = torch.zeros(self.numel, dtype=p0.dtype, device=p0.device)  # (numel,)
        self.views = [
            self.buffer[o : o + p.numel()].view_as(p) for p, o in zip(params, self.offsets)
        ]
        self.reset()

    def reset(self) -> None:
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
        if not self._buckets:
            if not self.require_sync:
                return
            # BEGIN SOLUTION hint: pre-divide p.grad by D, start an async all_reduce, keep the handle
            p.grad.div_(self.world_size)
            work = dist.all_reduce(p.grad, op=dist.ReduceOp.SUM, group=self.group, async_op=True)
            self._handles.append((p, work))
            # END SOLUTION
            return
        b = self._bucket_of[id(p)]
        # BEGIN SOLUTION hint: make p.grad a view of its bucket slot (copy once); all_reduce the bucket async when full
        i = b.index[id(p)]
        view = b.views[i]
        if p.grad.data_ptr() != view.data_ptr():  # first gradient of this step: move it in
            view.copy_(p.grad)
            p.grad = view  # the autograd-made tensor is freed here
        if not self.require_sync:
            return  # later microbatches accumulate into the bucket in place
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
        # BEGIN SOLUTION hint: wait on the handles; launch incomplete buckets (zeros in unused slots) and wait
        for _, work in self._handles:
            work.wait()
        self._handles.clear()
        for b in self._buckets:
            if not b.ready:  # no parameter of this bucket was used on this step
                continue
            if b.handle is None:  # some parameters were unused: send zeros in their slots
                for i, view in enumerate(b.views):
                    if i not in b.ready:
                        view.zero_()
                self._launch(b)
            b.handle.wait()  # param.grad views now hold the average: nothing to copy
            b.reset()
        # END SOLUTION
