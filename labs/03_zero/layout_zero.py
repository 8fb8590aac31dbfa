"""``shardlab train --layout zero1|zero2``: lab 03's ``ShardedOptimizer`` and ``ZeRO2`` as
:class:`shardlab.train.runner.Runner`\\ s.

Declared in this lab's ``train.toml`` (``[train.zero1]``, ``[train.zero2]``) and loaded by
path by the rank after the layout's module (``zero1.py`` or ``zero2.py``: the reference or the
student's), which is why each class imports it when it builds.

Sharded: AdamW moments (zero1), and gradients (zero2), ``1/D`` per rank over flat padded
buffers. Communication per step: reduce-scatter of the gradients and all-gather of the updated
weights, ``accounting.comm.step_volume("zero1"|"zero2", N_pad, D, q)`` = ``2 q N_pad (D-1)/D``.
Production: ``torch.distributed.optim.ZeroRedundancyOptimizer`` (stage 1), FSDP's
``SHARD_GRAD_OP`` (stage 2).
"""

from __future__ import annotations

from shardlab.accounting import peak
from shardlab.models import OPTIMIZERS
from shardlab.train.runner import DataParallelRunner, Q


class Zero1Runner(DataParallelRunner):
    """Lab 03's ``ShardedOptimizer`` (flat weights and gradients, owner segments)."""

    layout = "zero1"

    def wrap(self) -> None:
        from zero1 import ShardedOptimizer

        cls, kw = OPTIMIZERS["adamw"]
        params = list(self.module.parameters())
        self.opt = ShardedOptimizer(params, cls, bucket_size_mb=self.spec.bucket_mb, **kw)
        self.forward, self.finish = self.module, None
        self.n_state = self.opt.padded_numel

    @property
    def inner_optimizer(self):
        return self.opt.optim

    def watch(self, mt) -> None:
        mt.watch(self.module, self.opt.optim)
        mt.tag(self.opt.flat_weights, "parameters")
        mt.tag(self.opt.flat_grads, "gradients")


class Zero2Runner(DataParallelRunner):
    """Lab 03's ``ZeRO2`` (bucketed reduce-scatter in backward, sharded AdamW)."""

    layout = "zero2"

    def wrap(self) -> None:
        from zero2 import ZeRO2

        cls, kw = OPTIMIZERS["adamw"]
        z = ZeRO2(self.module, cls, bucket_size_mb=self.spec.bucket_mb, **kw)
        self.forward = self.opt = z
        self.finish = z.finish_gradient_synchronization
        self.n_state = z.padded_numel

    @property
    def inner_optimizer(self):
        return self.opt.optimizer

    def watch(self, mt) -> None:
        mt.watch(self.module, self.opt.optimizer)
        mt.tag([b.weights for b in self.opt.buckets], "parameters")
        mt.tag([b.grad_shard for b in self.opt.buckets], "gradients")

    def predicted_peak(self, tl, extra):
        """As ddp/zero1, plus ZeRO-2's transient full-size bucket buffers (``buffer_bytes`` of
        ``predict_layout_peak``): up to ``max_in_flight`` buckets being reduce-scattered and the
        one backward is filling, so the ``max_in_flight + 1`` largest (with a bucket larger than
        the model: one flat copy of every gradient). Counting only the largest one under-
        predicted by two buckets once the model had several (measured 1.18 on 2 ranks and
        1.32 on 4 at 12.9 M parameters, four buckets, ``tools/sweep_scaling.py``)."""
        b = self.spec.batch // self.D
        alive = sorted((bk.padded * Q for bk in self.opt.buckets), reverse=True)
        return peak.predict_layout_peak(
            self.n_state, self.D, "zero2", "fp32",
            activation_bytes=max(tl.bytes["activations"]),
            buffer_bytes=sum(alive[: self.opt.config.max_in_flight + 1]),
            backward_workspace_bytes=peak.logits_workspace(b, self.cfg.seq_len,
                                                           self.cfg.vocab_size, Q),
            optimizer_workspace_bytes=peak.adam_workspace([p.numel() for p in self.params()]),
        )
