"""The interface every layout of ``shardlab train`` implements on a rank (:class:`Runner`).

The runners live in the labs, not here: each lab that ``shardlab train`` runs ships a
``layout_<topic>.py`` whose class subclasses :class:`Runner`, and declares it in its
``train.toml`` (``[train.<layout>]``, read by :mod:`shardlab.train.spec`). The rank loads that
file and the lab modules it calls *by path* (:func:`shardlab.modload.load_file`), so the
package never imports a lab by name and never edits ``sys.path``. :class:`DataParallelRunner`
is the part the data-parallel layouts share (the package's GPT, this rank's slice of the
batch, ``train_step``, ``predicted_step_peak``); it names no lab.

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
        # the run's accounting.compute.ModelShape (layers, hidden, heads, ffn, vocab, seq_len)
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



class DataParallelRunner(Runner):
    """What ddp, zero1, zero2 and fsdp share: :class:`shardlab.models.GPT` with fp32 AdamW,
    this rank's ``1/D`` of the global batch (``step_batch`` + ``rank_slice``), every step
    :func:`shardlab.models.train_step` (the step the labs' workers and benchmarks run), the
    bytes ``accounting.comm.step_volume(layout, n_state, D, q)`` and the peak
    ``predicted_step_peak``. A subclass's ``wrap`` sets ``forward``, ``finish``, ``opt`` and
    ``n_state`` from its lab's module."""

    layout = "ddp"

    def build(self) -> None:
        import torch.distributed as dist

        from shardlab.models import GPT, GPTConfig

        self.cfg = GPTConfig.from_shape(self.m)
        self.module = GPT(self.cfg, seed=0).to(self.dev)
        self.n = sum(p.numel() for p in self.module.parameters())
        self.D = dist.get_world_size()
        self.wrap()

    def wrap(self) -> None:
        raise NotImplementedError

    def batch(self, i: int):
        from shardlab.models import rank_slice, step_batch

        xy = rank_slice(step_batch(self.cfg, i, self.spec.batch))  # (B/D, s) each
        return tuple(t.to(self.dev) for t in xy)

    def step(self, i: int, batch=None) -> torch.Tensor:
        from shardlab.models import train_step

        batch = self.batch(i) if batch is None else batch
        return train_step(self.forward, self.opt, batch, self.finish).detach()

    def predicted_bytes(self) -> dict[str, float]:
        from shardlab.accounting import comm

        return {"dp": comm.step_volume(self.layout, self.n_state, self.D, Q)}

    def params(self):
        return [p for g in self.inner_optimizer.param_groups for p in g["params"]]

    def predicted_peak(self, tl, extra):
        from shardlab.models import predicted_step_peak

        b = self.spec.batch // self.D
        prof = {"timeline": tl, "n_state": self.n_state, "logits_shape": (b, self.cfg.seq_len,
                self.cfg.vocab_size), "stepped": [p.numel() for p in self.params()]}
        return predicted_step_peak(prof, self.layout, self.D)


__all__ = ["DataParallelRunner", "Q", "Runner", "phase"]
