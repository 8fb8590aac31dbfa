"""``shardlab train --layout fsdp+tp``: lab 09's ``fsdp_tp_model`` as a
:class:`shardlab.train.runner.Runner`.

Declared in this lab's ``train.toml`` (``[train."fsdp+tp"]``) and loaded by path by the rank
after the modules of labs 04-06 it composes (``[needs]``), lab 06's ``layout_tp.py``,
``mesh_trace.py``, ``combined.py`` (the reference, or the student's file), ``_cases_combined``
and ``_memory_combined``.

On a ``dp x tp`` mesh (``accounting.mesh.Mesh``, tp innermost): lab 06's tensor parallelism
inside each tp group, lab 04's FSDP of the tp slices over each dp group. Bytes: the tp bytes
of ``layout_tp.tp_bytes`` with the dp rank's share of the batch, plus
``comm.step_volume("zero3", N_tp_pad, D, q)`` on the dp axis; lab 09's ``AxisTrace`` sorts
the measured bytes by axis. Peak: lab 09's ``_memory_combined.fsdp_tp_predicted_peak``
(``accounting.fsdp_peak.fsdp_step_peak`` with the blocks' activations from
``activation_bytes_per_layer(..., "tp")`` and the head's measured). Production: FSDP2 +
DTensor on a 2-D ``init_device_mesh``.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from _memory_combined import fsdp_tp_predicted_peak
from combined import build_axis_groups, fsdp_tp_backward, fsdp_tp_model
from layout_tp import tp_bytes
from mesh_trace import AxisTrace
from shardlab.accounting import comm
from shardlab.accounting.mesh import Mesh
from shardlab.models import make_optimizer
from shardlab.train.runner import Q, Runner, phase
from tensor_reference import ModelConfig, SerialGPT, make_batch


def fsdp_tp_bytes(b: int, mc: ModelConfig, mesh: Mesh, padded_numel: int) -> dict[str, float]:
    """Per-rank bytes of one FSDP x TP step, per axis: lab 06's ``layout_tp.tp_bytes`` of the
    dp rank's ``b`` sequences on tp, ``comm.step_volume("zero3", N_tp_pad, D, q)`` on dp (lab
    09's tests and notebook compare their runs with the same numbers)."""
    return {
        "dp": comm.step_volume("zero3", padded_numel, mesh.dp, Q),
        "tp": tp_bytes(b, mc.to_shape(), mesh.tp),
    }


def _one_rank_groups(ag) -> None:
    """Give every size-1 axis its one-rank groups: lab 09's ``build_axis_groups`` leaves them
    out (nothing to talk to), but lab 04's FSDP and lab 06's TPGroups ask their group for its
    size and rank (``--ranks 2`` with tp = 2 leaves dp = 1). Every rank creates every group,
    in the same order, as ``dist.new_group`` requires; they carry no traffic."""
    for axis in ("dp", "tp"):
        if ag.mesh.sizes[axis] == 1 and ag.groups.get(axis) is None:
            for ranks in ag.mesh.groups(axis):
                pg = dist.new_group(ranks)
                if ag.rank in ranks:
                    ag.groups[axis] = pg


class FSDPTPRunner(Runner):
    axes = ("dp", "tp")
    tag_batch = True

    def build(self) -> None:
        g, t = dist.get_world_size(), self.spec.tp
        self.mesh = Mesh(G=g, dp=g // t, tp=t, pp=1)
        self.ag = build_axis_groups(self.mesh)
        _one_rank_groups(self.ag)
        self.mc = ModelConfig.from_shape(self.m)
        self.forward = fsdp_tp_model(SerialGPT(self.mc).to(self.dev), self.ag)
        self.module = self.forward.module
        self.opt = make_optimizer("adamw", self.forward.parameters())
        self.last_block = self.module.blocks[-1]

    def batch(self, i: int):
        d, dp = self.ag.coords.dp, self.mesh.dp
        return tuple(z.chunk(dp)[d].contiguous().to(self.dev)
                     for z in make_batch(self.mc, self.spec.batch, seed=i))

    def step(self, i: int, batch=None) -> torch.Tensor:
        idx, tgt = self.batch(i) if batch is None else batch  # (B/D, s) each
        self.opt.zero_grad()
        with phase("forward+backward"):
            loss = fsdp_tp_backward(self.forward, idx, tgt)
        with phase("optimizer"):
            self.opt.step()
        return loss

    def comm_trace(self):
        return AxisTrace(self.mesh)

    def sent(self, tr) -> dict[str, float]:
        """Bytes per mesh axis. A size-1 axis's one-rank group is no axis to the trace (its
        key is "?", or "world" on one rank) and sends nothing; other leftovers are kept."""
        by_axis = tr.sent_by_axis()
        out = {axis: by_axis.pop(axis, 0.0) for axis in self.axes}
        out.update({k: v for k, v in by_axis.items() if v})
        return out

    def params(self):
        return list(self.forward.parameters())

    def watch(self, mt) -> None:
        mt.watch(self.forward, self.opt)
        mt.tag([f.buffer for u in self.forward.units for f in u.flats], "parameters")

    def predicted_bytes(self) -> dict[str, float]:
        b = self.spec.batch // self.mesh.dp
        return fsdp_tp_bytes(b, self.mc, self.mesh, self.forward.padded_numel)

    def predicted_peak(self, tl, extra):
        """Lab 09's ``fsdp_tp_predicted_peak`` for this model (the blocks' activations from
        ``activation_bytes_per_layer(..., "tp")``, the head's measured as the trace saw it)."""
        b = self.spec.batch // self.mesh.dp
        head = max(tl.bytes["activations"]) - extra.get("units", 0)
        return fsdp_tp_predicted_peak(self.forward, self.mesh, b, head, cfg=self.mc)
