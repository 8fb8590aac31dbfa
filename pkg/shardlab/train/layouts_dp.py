"""The data-parallel layouts of ``shardlab train``: ddp (lab 02), zero1 and zero2 (lab 03),
fsdp (lab 04), each on :class:`shardlab.models.GPT` with fp32 AdamW.

Every step is :func:`shardlab.models.train_step` (the step the labs' workers and benchmarks
run): ``zero_grad``, forward with ``lm_loss`` on this rank's ``1/D`` of the global batch
(``step_batch`` + ``rank_slice``), backward, the wrapper's gradient synchronisation, AdamW.

Sent bytes per rank and step (``accounting.comm.step_volume``, ``q = 4``): ddp
``2 q N (D-1)/D`` (all-reduce); zero1 and zero2 ``2 q N_pad (D-1)/D`` (reduce-scatter of the
gradients, all-gather of the updated weights); fsdp ``3 q N_pad (D-1)/D`` (all-gather in
forward and again in backward, reduce-scatter). Peak: ddp/zero via
``shardlab.models.predicted_step_peak`` (as labs 02/03), fsdp via
``accounting.peak.predict_peak`` term by term (as lab 04); saved activations are the one
measured term. PyTorch's production counterparts: ``DistributedDataParallel``,
``ZeroRedundancyOptimizer``, FSDP2 ``fully_shard``.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from shardlab.accounting import comm, memory, peak
from shardlab.models import GPT, GPTConfig, make_optimizer, rank_slice, step_batch, train_step
from shardlab.train._runner import Q, Runner


def gpt_config(m: dict[str, int]) -> GPTConfig:
    """The run's model shape as a :class:`GPTConfig` (untied, no dropout)."""
    return GPTConfig(vocab_size=m["vocab"], seq_len=m["seq"], n_layer=m["layers"],
                     n_head=m["heads"], d_model=m["h"], d_ff=m["ffn"])  # fmt: skip


class _DataParallel(Runner):
    """Shared by the four: model, this rank's batch, the step, the peak of ddp/zero."""

    layout = "ddp"

    def build(self) -> None:
        self.cfg = gpt_config(self.m)
        self.module = GPT(self.cfg, seed=0).to(self.dev)
        self.n = sum(p.numel() for p in self.module.parameters())
        self.D = dist.get_world_size()
        self.wrap()

    def batch(self, i: int):
        xy = rank_slice(step_batch(self.cfg, i, self.spec.batch))  # (B/D, s) each
        return tuple(t.to(self.dev) for t in xy)

    def step(self, i: int, batch=None) -> torch.Tensor:
        batch = self.batch(i) if batch is None else batch
        return train_step(self.forward, self.opt, batch, self.finish).detach()

    def predicted_bytes(self) -> dict[str, float]:
        return {"dp": comm.step_volume(self.layout, self.n_state, self.D, Q)}

    def params(self):
        return [p for g in self.inner_optimizer.param_groups for p in g["params"]]

    def predicted_peak(self, tl, extra):
        from shardlab.models import predicted_step_peak

        b = self.spec.batch // self.D
        prof = {"timeline": tl, "n_state": self.n_state, "logits_shape": (b, self.cfg.seq_len,
                self.cfg.vocab_size), "stepped": [p.numel() for p in self.params()]}  # fmt: skip
        return predicted_step_peak(prof, self.layout, self.D)


class DDPRunner(_DataParallel):
    """Lab 02's ``DDP`` (bucketed asynchronous all-reduce, buckets are ``param.grad``)."""

    layout = "ddp"

    def wrap(self) -> None:
        from ddp import DDP

        self.forward = DDP(self.module, bucket_size_mb=self.spec.bucket_mb)
        self.finish = self.forward.finish_gradient_synchronization
        self.opt = make_optimizer("adamw", self.forward.parameters())
        self.n_state = self.n

    def watch(self, mt) -> None:
        mt.watch(self.module, self.opt)
        mt.tag([b.buffer for b in self.forward._buckets], "gradients")


class Zero1Runner(_DataParallel):
    """Lab 03's ``ShardedOptimizer`` (flat weights and gradients, owner segments)."""

    layout = "zero1"

    def wrap(self) -> None:
        from zero1 import ShardedOptimizer

        from shardlab.models import OPTIMIZERS

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


class Zero2Runner(_DataParallel):
    """Lab 03's ``ZeRO2`` (bucketed reduce-scatter in backward, sharded AdamW)."""

    layout = "zero2"

    def wrap(self) -> None:
        from zero2 import ZeRO2

        from shardlab.models import OPTIMIZERS

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
        """As ddp/zero1, plus the full-size flat buffer of the bucket being reduce-scattered
        (``buffer_bytes`` of ``predict_layout_peak``: ZeRO-2's transient gradient bucket; with
        a bucket larger than the model it is one flat copy of every gradient)."""
        b = self.spec.batch // self.D
        return peak.predict_layout_peak(
            self.n_state, self.D, "zero2", "fp32",
            activation_bytes=max(tl.bytes["activations"]),
            buffer_bytes=max(bk.padded * Q for bk in self.opt.buckets),
            backward_workspace_bytes=peak.logits_workspace(b, self.cfg.seq_len,
                                                           self.cfg.vocab_size, Q),
            optimizer_workspace_bytes=peak.adam_workspace([p.numel() for p in self.params()]),
        )  # fmt: skip


class FSDPRunner(_DataParallel):
    """Lab 04's ``FSDP`` (a flat unit per block plus the root; reshard after forward,
    prefetch)."""

    layout = "zero3"

    def wrap(self) -> None:
        from fsdp import FSDP, FSDPConfig

        self.forward = FSDP(self.module, dist.group.WORLD, FSDPConfig())
        self.finish = self.forward.finish_gradient_synchronization
        self.opt = make_optimizer("adamw", self.forward.parameters())
        self.n_state = self.forward.padded_numel
        self.last_block = self.module.blocks[-1]
        self.tag_batch = True

    def params(self):
        return list(self.forward.parameters())

    def watch(self, mt) -> None:
        mt.watch(self.forward, self.opt)
        mt.tag([f.buffer for u in self.forward.units for f in u.flats], "parameters")

    def predicted_peak(self, tl, extra):
        """Lab 04's ``predicted_peak`` for this model: weight shards + moments, gathered
        blocks by the reshard/prefetch schedule, the root gathered all step, gradient shards
        from their unit's backward on, logits workspace, AdamW's temporaries."""
        model, cfg = self.forward, self.forward.config
        units = extra.get("units", 0)
        head = max(tl.bytes["activations"]) - units
        blocks = [f.padded * Q for u in model.units[1:] for f in u.flats]
        shards = [f.shard_numel * Q for u in model.units[1:] for f in u.flats]
        shards[0] += sum(f.shard_numel * Q for f in model.units[0].flats)  # root: after block 0
        state = memory.model_state(model.padded_numel, self.D, "zero3", "fp32")
        b = self.spec.batch // self.D
        return peak.predict_peak(
            persistent_bytes=state.total - state.per_object["grads"],
            unit_bytes=blocks,
            activation_bytes=units,
            buffer_bytes=sum(f.padded * Q for f in model.units[0].flats),
            prefetch=cfg.prefetch,
            reshard_after_forward=cfg.reshard_after_forward,
            grad_unit_bytes=blocks,
            grad_shard_bytes=shards,
            backward_workspace_bytes=peak.logits_workspace(b, self.cfg.seq_len,
                                                           self.cfg.vocab_size, Q),
            backward_workspace_at="before_units",
            head_activation_bytes=head,
            optimizer_workspace_bytes=peak.adam_workspace([p.numel() for p in self.params()]),
        )  # fmt: skip
