"""``shardlab train --layout fsdp``: lab 04's ``FSDP`` as a
:class:`shardlab.train.runner.Runner`.

Declared in this lab's ``train.toml`` (``[train.fsdp]``) and loaded by path by the rank after
``fsdp_units.py`` and ``fsdp.py`` (the references, or the student's files), so the imports
below find the run's choice.

Sharded: weights, gradients and AdamW moments, ``1/D`` of each flat unit per rank (a unit
per block plus the root). Communication per step: all-gather of each unit in forward and
again in backward, reduce-scatter of its gradient, ``accounting.comm.step_volume("zero3",
N_pad, D, q)`` = ``3 q N_pad (D-1)/D``. Peak: ``accounting.fsdp_peak.fsdp_step_peak``, the
prediction the lab's workers make, with the saved activations measured. Production: FSDP2
``fully_shard``.
"""

from __future__ import annotations

import torch.distributed as dist
from fsdp import FSDP, FSDPConfig
from shardlab.accounting import peak
from shardlab.accounting.fsdp_peak import flat_unit_sizes, fsdp_step_peak
from shardlab.models import make_optimizer
from shardlab.train.runner import DataParallelRunner, Q


class FSDPRunner(DataParallelRunner):
    """Lab 04's ``FSDP`` (a flat unit per block plus the root; reshard after forward,
    prefetch)."""

    layout = "zero3"

    def wrap(self) -> None:
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
        """``fsdp_step_peak`` of this model, the saved activations split as the trace saw
        them: the blocks' (alive when the last block's forward ends) and the head's."""
        units = extra.get("units", 0)
        b = self.spec.batch // self.D
        return fsdp_step_peak(
            world=self.D,
            activation_bytes=units,
            head_activation_bytes=max(tl.bytes["activations"]) - units,
            backward_workspace_bytes=peak.logits_workspace(b, self.cfg.seq_len,
                                                           self.cfg.vocab_size, Q),
            **flat_unit_sizes(self.forward, Q),
        )
