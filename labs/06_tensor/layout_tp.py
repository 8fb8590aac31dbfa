"""``shardlab train --layout tp``: lab 06's ``ParallelGPT`` as a
:class:`shardlab.train.runner.Runner`, plus ``tp_bytes``, which lab 09's fsdp+tp layout shares.

Declared in this lab's ``train.toml`` (``[train.tp]``) and loaded by path by the rank after
``tensor.py``, ``tensor_reference.py`` and ``tensor_block.py`` (the references, or the
student's files), so the imports below find the run's choice.

Built from ``SerialGPT`` over all ranks (``t = G``): heads, MLP columns and vocabulary rows
split ``1/t``; every rank sees the whole batch. Bytes per rank: four ``(b, s, h)``
all-reduces per layer, ``accounting.comm.tp_volume(b, s, h, t, q, L)``, plus the embedding's
forward and the head's backward all-reduce of ``(b, s, h)`` and the vocabulary-parallel
loss's three ``(b, s)`` all-reduces (``comm.ring_sent_bytes``). Production: DTensor
``parallelize_module`` with ``ColwiseParallel`` / ``RowwiseParallel``.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from shardlab.accounting import comm
from shardlab.accounting.compute import ModelShape
from shardlab.models import make_optimizer
from shardlab.train.runner import Q, Runner, phase
from tensor import TPGroups
from tensor_block import ParallelGPT, TPConfig, sync_sequence_parallel_grads
from tensor_reference import ModelConfig, SerialGPT, make_batch


def tp_bytes(b: int, m: ModelShape, t: int) -> float:
    """Per-rank bytes of one step of ``ParallelGPT`` on ``b`` sequences (module docstring)."""
    s, h = m.seq_len, m.hidden
    act = comm.ring_sent_bytes("all_reduce", Q * b * s * h, t)  # one (b, s, h)
    loss = comm.ring_sent_bytes("all_reduce", 4 * b * s, t)  # one (b, s) fp32
    return comm.tp_volume(b, s, h, t, Q, layers=m.layers) + 2 * act + 3 * loss


class TPRunner(Runner):
    axes = ("tp",)

    def build(self) -> None:
        self.mc, self.t = ModelConfig.from_shape(self.m), dist.get_world_size()
        self.groups = TPGroups.from_world(self.t)
        serial = SerialGPT(self.mc)
        self.module = ParallelGPT(serial, self.groups, TPConfig(self.mc, self.t)).to(self.dev)
        self.opt = make_optimizer("adamw", self.module.parameters())

    def batch(self, i: int):
        return tuple(z.to(self.dev) for z in make_batch(self.mc, self.spec.batch, seed=i))

    def step(self, i: int, batch=None) -> torch.Tensor:
        idx, tgt = self.batch(i) if batch is None else batch  # (B, s) each, on every rank
        self.opt.zero_grad()
        with phase("forward"):
            loss = self.module(idx, tgt, i)
        with phase("backward"):
            loss.backward()
            sync_sequence_parallel_grads(self.module, self.groups)  # no-op without SP
        with phase("optimizer"):
            self.opt.step()
        return loss.detach()

    def params(self):
        return list(self.module.parameters())

    def predicted_bytes(self) -> dict[str, float]:
        return {"tp": tp_bytes(self.spec.batch, self.m, self.t)}

    def predicted_peak(self, tl, extra):
        """As labs 02/03 (``predicted_step_peak``, one replica of this rank's ``1/t`` slice)
        with the vocabulary-parallel logits ``(b, s, V/t)`` in the backward workspace."""
        from shardlab.models import predicted_step_peak

        n = sum(p.numel() for p in self.params())
        prof = {
            "timeline": tl,
            "n_state": n,
            "stepped": [p.numel() for p in self.params()],
            "logits_shape": (self.spec.batch, self.m.seq_len, self.m.vocab // self.t),
        }
        return predicted_step_peak(prof, "ddp", 1)
