"""The model-parallel layouts of ``shardlab train``: tp (lab 06), pp (lab 05) and fsdp+tp
(lab 09), fp32 AdamW.

* **tp**: lab 06's ``ParallelGPT`` built from ``SerialGPT`` over all ranks (``t = G``): heads,
  MLP columns and vocabulary rows split ``1/t``; every rank sees the whole batch. Bytes per
  rank: four ``(b, s, h)`` all-reduces per layer, ``accounting.comm.tp_volume(b, s, h, t, q,
  L)``, plus the embedding's forward and the head's backward all-reduce of ``(b, s, h)`` and
  the vocabulary-parallel loss's three ``(b, s)`` all-reduces (``comm.ring_sent_bytes``).
* **pp**: lab 05's ``split_stages`` + ``PipelineExecutor`` (``--schedule``, ``--microbatches``)
  on all ranks, one stage each. Bytes: ``accounting.pipeline.p2p_sent_bytes``.
* **fsdp+tp**: lab 09's ``fsdp_tp_model`` on a ``dp x tp`` mesh (``accounting.mesh.Mesh``):
  the tp bytes above with the dp rank's share of the batch, plus ``comm.step_volume("zero3",
  N_tp_pad, D, q)`` on the dp axis; lab 09's ``AxisTrace`` sorts the measured bytes by axis.

Peaks are ``accounting.peak`` predictions composed as labs 05, 06 and 09 do. Production:
DTensor ``parallelize_module``, ``torch.distributed.pipelining``, FSDP2 + DTensor on a 2-D
``init_device_mesh``.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from shardlab.accounting import comm, memory, peak
from shardlab.accounting import pipeline as pacc
from shardlab.models import GPT, make_optimizer
from shardlab.runtime import MemoryTrace, phase
from shardlab.train._runner import Q, Runner
from shardlab.train.layouts_dp import gpt_config


def model_config(m: dict[str, int]):
    """The run's model shape as lab 06's ``ModelConfig`` (no dropout)."""
    from tensor_reference import ModelConfig

    return ModelConfig(vocab=m["vocab"], seq=m["seq"], h=m["h"], a=m["heads"], ffn=m["ffn"],
                       layers=m["layers"], dropout=0.0, attn_dropout=0.0)  # fmt: skip


def tp_bytes(b: int, m: dict[str, int], t: int) -> float:
    """Per-rank bytes of one step of lab 06's ``ParallelGPT`` on ``b`` sequences (see above)."""
    act = comm.ring_sent_bytes("all_reduce", Q * b * m["seq"] * m["h"], t)  # one (b, s, h)
    loss = comm.ring_sent_bytes("all_reduce", 4 * b * m["seq"], t)  # one (b, s) fp32
    return comm.tp_volume(b, m["seq"], m["h"], t, Q, layers=m["layers"]) + 2 * act + 3 * loss


class TPRunner(Runner):
    axes = ("tp",)

    def build(self) -> None:
        from tensor import TPGroups
        from tensor_block import ParallelGPT, TPConfig
        from tensor_reference import SerialGPT

        self.mc, self.t = model_config(self.m), dist.get_world_size()
        self.groups = TPGroups.from_world(self.t)
        serial = SerialGPT(self.mc)
        self.module = ParallelGPT(serial, self.groups, TPConfig(self.mc, self.t)).to(self.dev)
        self.opt = make_optimizer("adamw", self.module.parameters())

    def batch(self, i: int):
        from tensor_reference import make_batch

        return tuple(z.to(self.dev) for z in make_batch(self.mc, self.spec.batch, seed=i))

    def step(self, i: int, batch=None) -> torch.Tensor:
        from tensor_block import sync_sequence_parallel_grads

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
            "logits_shape": (self.spec.batch, self.m["seq"], self.m["vocab"] // self.t),
        }
        return predicted_step_peak(prof, "ddp", 1)  # fmt: skip


class PPRunner(Runner):
    axes = ("pp",)

    def build(self) -> None:
        from pipeline import PipeConfig, PipelineExecutor, split_stages

        self.cfg, self.p = gpt_config(self.m), dist.get_world_size()
        self.rank, self.mb = dist.get_rank(), self.spec.microbatches
        stage = split_stages(GPT(self.cfg, seed=0), self.p)[self.rank]
        self.module = stage.to(self.dev)
        cfg = PipeConfig(self.spec.schedule, self.p, self.mb)
        self.executor = PipelineExecutor([stage], cfg, dist.group.WORLD)
        self.opt = make_optimizer("adamw", stage.parameters())

    def batch(self, i: int):
        from _workers_pipeline import microbatches

        xs, ys = microbatches(self.cfg, i, self.spec.batch, self.mb)  # m x (B/m, s)
        return [x.to(self.dev) for x in xs], [y.to(self.dev) for y in ys]

    def step(self, i: int, batch=None) -> torch.Tensor | None:
        xs, ys = self.batch(i) if batch is None else batch
        self.opt.zero_grad()
        with phase("pipeline"):
            loss = self.executor.step(xs, ys)
        with phase("optimizer"):
            self.opt.step()
        return None if loss is None else loss.detach()

    def params(self):
        return list(self.module.parameters())

    def predicted_bytes(self) -> dict[str, float]:
        b = self.spec.batch // self.mb
        return {"pp": pacc.p2p_sent_bytes(self.rank, self.p, b, self.m["seq"], self.m["h"], Q,
                                          self.mb)}  # fmt: skip

    def chunk_bytes(self, b: int) -> tuple[int, int]:
        """Saved-activation bytes one microbatch leaves on this stage (lab 05/09's measure),
        and the part of them the head saves (final norm, logits, loss; 0 but on the last
        stage), read when the stage's last block has run (lab 09's ``pp_chunk_bytes``)."""
        from pipeline import microbatch_loss

        xs, ys = self.batch(0)
        seen = {}

        def mark(*_):  # the blocks' saved bytes end here
            seen["blocks"] = mt.live_bytes("activations")

        hook = self.module.blocks[-1].register_forward_hook(mark)
        with MemoryTrace() as mt:
            mt.watch(self.params())  # weights saved by matmuls are parameters
            first = self.module.first
            inp = (
                xs[0]
                if first
                else torch.zeros(b, self.m["seq"], self.m["h"], requires_grad=True, device=self.dev)
            )
            mt.tag([inp], "activations")
            y = self.module(inp)
            if self.module.last:
                y = microbatch_loss(y, ys[0], self.mb)
            got = mt.live_bytes("activations")
        hook.remove()
        del y
        return got, (got - seen["blocks"] if self.module.last else 0)

    def predicted_peak(self, tl, extra):
        """Lab 09's ``dp_pp_predicted_peak`` with one pipeline (``accounting.stage_peak``,
        moment by moment over this rank's actions): weights + moments, the microbatches in
        flight at each action, the gradients an earlier backward accumulated, the boundary
        tensors sent and the receive posted ahead, autograd's temporaries of a block's
        backward (``block_backward_temporaries``), the last stage's logits workspace,
        AdamW's temporaries."""
        from shardlab.accounting.stage_peak import block_backward_temporaries, stage_peak

        b, ex, st, m = self.spec.batch // self.mb, self.executor, self.module, self.m
        chunk, head = self.chunk_bytes(b)
        n_stage = sum(p.numel() for p in self.params())
        state = memory.model_state(n_stage, 1, "ddp", "fp32")
        head_params = [p for mod in ("ln_f", "lm_head") if hasattr(st, mod)
                       for p in getattr(st, mod).parameters()]  # fmt: skip
        return stage_peak(
            ex.actions,
            chunk,
            persistent_bytes=state.total - state.per_object["grads"],
            grad_bytes=state.per_object["grads"],
            message_bytes=Q * b * m["seq"] * m["h"],
            temporaries_bytes=block_backward_temporaries(b, m["seq"], m["h"], m["ffn"], Q),
            first=st.first,
            last=st.last,
            head_bytes=head,
            head_grad_bytes=Q * sum(p.numel() for p in head_params),
            backward_workspace_bytes=peak.logits_workspace(b, m["seq"], m["vocab"], Q),
            optimizer_workspace_bytes=peak.adam_workspace([p.numel() for p in self.params()]),
        )


class FSDPTPRunner(Runner):
    axes = ("dp", "tp")
    tag_batch = True

    def build(self) -> None:
        import _labs_path  # noqa: F401  (labs 04, 05, 06 on sys.path, as lab 09 does)
        from combined import build_axis_groups, fsdp_tp_model
        from tensor_reference import SerialGPT

        from shardlab.accounting.mesh import Mesh

        g, t = dist.get_world_size(), self.spec.tp
        self.mesh = Mesh(G=g, dp=g // t, tp=t, pp=1)
        self.ag = build_axis_groups(self.mesh)
        self.mc = model_config(self.m)
        self.forward = fsdp_tp_model(SerialGPT(self.mc).to(self.dev), self.ag)
        self.module = self.forward.module
        self.opt = make_optimizer("adamw", self.forward.parameters())
        self.last_block = self.module.blocks[-1]

    def batch(self, i: int):
        from tensor_reference import make_batch

        d, dp = self.ag.coords.dp, self.mesh.dp
        return tuple(z.chunk(dp)[d].contiguous().to(self.dev)
                     for z in make_batch(self.mc, self.spec.batch, seed=i))  # fmt: skip

    def step(self, i: int, batch=None) -> torch.Tensor:
        from combined import fsdp_tp_backward

        idx, tgt = self.batch(i) if batch is None else batch  # (B/D, s) each
        self.opt.zero_grad()
        with phase("forward+backward"):
            loss = fsdp_tp_backward(self.forward, idx, tgt)
        with phase("optimizer"):
            self.opt.step()
        return loss

    def comm_trace(self):
        from mesh_trace import AxisTrace

        return AxisTrace(self.mesh)

    def sent(self, tr) -> dict[str, float]:
        return tr.sent_by_axis()

    def params(self):
        return list(self.forward.parameters())

    def watch(self, mt) -> None:
        mt.watch(self.forward, self.opt)
        mt.tag([f.buffer for u in self.forward.units for f in u.flats], "parameters")

    def predicted_bytes(self) -> dict[str, float]:
        b = self.spec.batch // self.mesh.dp
        dp = comm.step_volume("zero3", self.forward.padded_numel, self.mesh.dp, Q)
        return {"dp": dp, "tp": tp_bytes(b, self.m, self.mesh.tp)}

    def predicted_peak(self, tl, extra):
        """Lab 09's ``fsdp_tp_predicted_peak`` for this model (the blocks' activations from
        ``activation_bytes_per_layer(..., "tp")``, the head's measured)."""
        from tensor_block import activation_kwargs

        from shardlab.accounting import activations

        model, t, m = self.forward, self.mesh.tp, self.mc
        b = self.spec.batch // self.mesh.dp
        blocks = [f.padded * Q for u in model.units[1:] for f in u.flats]
        shards = [f.shard_numel * Q for u in model.units[1:] for f in u.flats]
        shards[0] += sum(f.shard_numel * Q for f in model.units[0].flats)  # root: after block 0
        state = memory.model_state(model.padded_numel, self.mesh.dp, "zero3", "fp32")
        per_layer = activations.activation_bytes_per_layer(
            m.seq, b, m.h, m.a, t, "tp", **activation_kwargs(m, Q)
        )
        acts = m.layers * per_layer + 2 * 8 * b * m.seq  # + the int64 tokens and targets
        head = max(tl.bytes["activations"]) - extra.get("units", 0)
        return peak.predict_peak(
            persistent_bytes=state.total - state.per_object["grads"],
            unit_bytes=blocks,
            activation_bytes=acts,
            buffer_bytes=sum(f.padded * Q for f in model.units[0].flats),
            prefetch=model.config.prefetch,
            reshard_after_forward=model.config.reshard_after_forward,
            grad_unit_bytes=blocks,
            grad_shard_bytes=shards,
            backward_workspace_bytes=peak.logits_workspace(b, m.seq, m.vocab // t, Q),
            backward_workspace_at="before_units",
            head_activation_bytes=head,
            optimizer_workspace_bytes=peak.adam_workspace([p.numel() for p in self.params()]),
        )
