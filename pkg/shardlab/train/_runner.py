"""The interface every layout of ``shardlab train`` implements on a rank (:class:`Runner`).

A runner builds the lab's implementation of its layout around the run's model, then the rank
loop (:mod:`shardlab.train.rank`) calls, once per step: :meth:`Runner.step` (forward,
backward, gradient communication, optimizer, ``zero_grad``), inside a ``CommTrace`` for the
first step (:meth:`Runner.comm_trace` makes it; :meth:`Runner.sent` reads it per mesh axis)
and inside a ``MemoryTrace`` for the second (:meth:`Runner.memory_step`), then asks
:meth:`Runner.predicted_peak` and :meth:`Runner.predicted_bytes`: the layout's
``shardlab.accounting`` formulas per axis, composed as the lab does (no formula lives here).
"""

from __future__ import annotations

import torch

from shardlab.runtime import CommTrace, MemoryTrace, phase

Q = 4  # fp32 weights, gradients, activations and communication: bytes per element


class Runner:
    """Base class; subclasses set ``axes`` and implement the abstract methods."""

    axes: tuple[str, ...] = ("dp",)

    def __init__(self, spec, dev: torch.device) -> None:
        self.spec, self.dev, self.m = spec, dev, spec.shape
        self.build()

    # -- what a subclass provides
    def build(self) -> None:
        raise NotImplementedError

    def batch(self, i: int):
        """This rank's inputs of step ``i`` (a function of ``i`` only: every run sees the same)."""
        raise NotImplementedError

    def step(self, i: int, batch=None) -> torch.Tensor | None:
        """Training step ``i`` on ``batch`` (default ``self.batch(i)``); returns this rank's
        loss (``None`` on a rank that computes none)."""
        raise NotImplementedError

    def predicted_bytes(self) -> dict[str, float]:
        raise NotImplementedError

    def params(self) -> list[torch.nn.Parameter]:
        """The parameters (or shards) this rank holds and steps."""
        raise NotImplementedError

    def watch(self, mt: MemoryTrace) -> None:
        """Tag what the trace must count from the start (flat buffers made before it)."""
        mt.watch(self.module, self.inner_optimizer)

    def predicted_peak(self, tl, extra: dict):
        raise NotImplementedError

    # -- shared
    @property
    def inner_optimizer(self) -> torch.optim.Optimizer:
        return self.opt

    def comm_trace(self) -> CommTrace:
        return CommTrace()

    def sent(self, tr: CommTrace) -> dict[str, float]:
        return {self.axes[0]: tr.sent_bytes()}

    def memory_step(self, i: int):
        """Step ``i`` under a ``MemoryTrace``: ``(loss, timeline, extra)``; ``extra`` holds
        what :meth:`predicted_peak` needs besides the timeline."""
        extra: dict = {}
        batch = self.batch(i)
        self.opt.zero_grad()  # last step's gradients are freed before the trace, as in the labs
        with MemoryTrace() as mt:
            self.watch(mt)
            if self.tag_batch:  # the tokens are saved for backward: count them from the start
                mt.tag([t for t in batch if torch.is_tensor(t)], "activations")
            self._hook_last_block(mt, extra)
            loss = self.step(i, batch)
        self._unhook()
        return loss, mt.timeline(), extra

    tag_batch = False
    # saved activations alive when the last block's forward ends (FSDP-style predictions split
    # them into the blocks' and the head's, as labs 04 and 09 do)
    last_block: torch.nn.Module | None = None

    def _hook_last_block(self, mt, extra) -> None:
        self._handle = None
        if self.last_block is not None:

            def mark(*_):
                extra.setdefault("units", mt.live_bytes("activations"))

            self._handle = self.last_block.register_forward_hook(mark)

    def _unhook(self) -> None:
        if self._handle is not None:
            self._handle.remove()


__all__ = ["Runner", "Q", "phase"]
