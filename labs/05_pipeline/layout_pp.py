"""``shardlab train --layout pp``: lab 05's ``split_stages`` + ``PipelineExecutor`` as a
:class:`shardlab.train.runner.Runner`.

Declared in this lab's ``train.toml`` (``[train.pp]``) and loaded by path by the rank after
``pipeline.py`` (the reference, or the student's file) and ``_workers_pipeline.py``, so the
imports below find the run's choice.

One stage per rank (``--schedule``, ``--microbatches``). Sent: the boundary activations
forward and their gradients backward, ``accounting.pipeline.p2p_sent_bytes``. Peak:
``accounting.stage_peak.gpt_stage_step_peak`` with ``dp=1``, moment by moment over this
rank's actions (lab 09's ``dp_pp_predicted_peak`` with its dp degree), from the saved bytes
:func:`pp_chunk_bytes` measures for one microbatch (lab 09 loads this file for it).
Production: ``torch.distributed.pipelining``.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from _workers_pipeline import microbatches
from pipeline import PipeConfig, PipelineExecutor, microbatch_loss, split_stages
from shardlab.accounting import pipeline as pacc
from shardlab.accounting.stage_peak import gpt_stage_step_peak
from shardlab.models import GPT, GPTConfig, make_optimizer
from shardlab.runtime import MemoryTrace
from shardlab.train.runner import Q, Runner, phase


def pp_chunk_bytes(stage, xs, ys, params, m: int, h: int) -> tuple[int, int]:
    """Saved-activation bytes one microbatch leaves on ``stage`` (forward only, as this lab
    measures them; the loss of ``m`` microbatches on the last stage; the ``(b, s, h)`` input
    counts on later stages), and the part of them the head saves (final norm, logits, loss: 0
    but on the last stage), read when the stage's last block has run. ``xs``, ``ys``: the
    step's microbatches (the first is run); ``params``: the stage's, watched so weights saved
    by matmuls count as parameters. Lab 09's pipeline stages use the same measure."""
    b, s = xs[0].shape
    seen = {}

    def mark(*_):  # the blocks' saved bytes end here (None: keep the block's output)
        seen["blocks"] = mt.live_bytes("activations")

    hook = stage.blocks[-1].register_forward_hook(mark)
    with MemoryTrace() as mt:
        mt.watch(params)  # weights saved by matmuls are parameters, not activations
        inp = (
            xs[0] if stage.first else torch.zeros(b, s, h, requires_grad=True, device=xs[0].device)
        )
        mt.tag([inp], "activations")
        y = stage(inp)
        if stage.last:
            y = microbatch_loss(y, ys[0], m)
        got = mt.live_bytes("activations")
    hook.remove()
    del y
    return got, (got - seen["blocks"] if stage.last else 0)


class PPRunner(Runner):
    axes = ("pp",)

    def build(self) -> None:
        self.cfg, self.p = GPTConfig.from_shape(self.m), dist.get_world_size()
        self.rank, self.mb = dist.get_rank(), self.spec.microbatches
        stage = split_stages(GPT(self.cfg, seed=0), self.p)[self.rank]
        self.module = stage.to(self.dev)
        cfg = PipeConfig(self.spec.schedule, self.p, self.mb)
        self.executor = PipelineExecutor([stage], cfg, dist.group.WORLD)
        self.opt = make_optimizer("adamw", stage.parameters())

    def batch(self, i: int):
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
        m = self.m
        return {"pp": pacc.p2p_sent_bytes(self.rank, self.p, b, m.seq_len, m.hidden, Q, self.mb)}

    def chunk_bytes(self) -> tuple[int, int]:
        """:func:`pp_chunk_bytes` of this rank's stage on step 0's first microbatch."""
        xs, ys = self.batch(0)
        return pp_chunk_bytes(self.module, xs, ys, self.params(), self.mb, self.m.hidden)

    def predicted_peak(self, tl, extra):
        """``accounting.stage_peak.gpt_stage_step_peak`` of this rank's stage with one pipeline
        (``dp=1``, no all-reduce bucket), as lab 09's ``dp_pp_predicted_peak``: moment by
        moment over this rank's actions, weights + moments, the microbatches in flight at each
        action, the gradients an earlier backward accumulated, the boundary tensors sent and
        the receive posted ahead, autograd's temporaries of a block's backward, the last
        stage's logits workspace, AdamW's temporaries."""
        st, m = self.module, self.m
        chunk, head = self.chunk_bytes()
        head_params = [
            p
            for mod in ("ln_f", "lm_head")
            if hasattr(st, mod)
            for p in getattr(st, mod).parameters()
        ]
        return gpt_stage_step_peak(
            self.executor.actions,
            chunk,
            stage_numels=[p.numel() for p in self.params()],
            head_numel=sum(p.numel() for p in head_params),
            dp=1,
            b=self.spec.batch // self.mb,
            s=m.seq_len,
            h=m.hidden,
            ffn=m.ffn,
            vocab=m.vocab,
            first=st.first,
            last=st.last,
            head_bytes=head,
            dp_all_reduce=False,
            q=Q,
        )
