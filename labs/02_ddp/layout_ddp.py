"""``shardlab train --layout ddp``: lab 02's ``DDP`` as a :class:`shardlab.train.runner.Runner`.

Declared in this lab's ``train.toml`` (``[train.ddp]``) and loaded by path by the rank,
after ``ddp.py`` (the reference, or the student's file chosen with ``--module`` /
``--from-cwd``), so ``from ddp import DDP`` below finds the run's choice.

Replicated: weights, gradients, AdamW moments. Communication: one bucketed asynchronous
all-reduce of the gradients per step, ``accounting.comm.step_volume("ddp", N, D, q)`` =
``2 q N (D-1)/D`` bytes per rank. Peak: ``shardlab.models.predicted_step_peak`` (as the lab's
workers). Production: ``torch.nn.parallel.DistributedDataParallel``.
"""

from __future__ import annotations

from ddp import DDP
from shardlab.models import make_optimizer
from shardlab.train.runner import DataParallelRunner


class DDPRunner(DataParallelRunner):
    """Lab 02's ``DDP`` (bucketed asynchronous all-reduce, buckets are ``param.grad``)."""

    layout = "ddp"

    def wrap(self) -> None:
        self.forward = DDP(self.module, bucket_size_mb=self.spec.bucket_mb)
        self.finish = self.forward.finish_gradient_synchronization
        self.opt = make_optimizer("adamw", self.forward.parameters())
        self.n_state = self.n

    def watch(self, mt) -> None:
        mt.watch(self.module, self.opt)
        mt.tag([b.buffer for b in self.forward._buckets], "gradients")
