"""CommTrace with a mesh axis on every record (given, not graded).

On a 2x2 mesh the data-parallel and the tensor-parallel groups both have 2 ranks, so the
group size cannot say which axis an operation ran on. :class:`AxisTrace` reads the process
group every ``c10d`` operator receives, turns it into its sorted list of global ranks and
looks that list up in ``{ranks: axis}`` built from ``accounting.mesh.Mesh.groups``; the
record gets ``rec.axis`` (``"tp"``, ``"pp"``, ``"dp"``, or ``"world"`` / ``"?"`` for a group
that is not an axis). The bytes are still CommTrace's: ``accounting.comm.ring_sent_bytes``
for collectives, the tensor's bytes for a send.
"""

from __future__ import annotations

import torch.distributed as dist
from shardlab.accounting.mesh import AXES, Mesh
from shardlab.runtime import CommTrace


def axis_of_ranks(mesh: Mesh) -> dict[tuple[int, ...], str]:
    """``{sorted ranks of a group: its axis}`` for every axis of degree > 1."""
    table = {tuple(range(mesh.G)): "world"}
    for axis in AXES:
        if mesh.sizes[axis] > 1:
            for ranks in mesh.groups(axis):
                table[tuple(ranks)] = axis
    return table


def _ranks(pg) -> tuple[int, ...] | None:
    try:
        if pg is None:
            pg = dist.group.WORLD
        if not isinstance(pg, dist.ProcessGroup):
            pg = dist.ProcessGroup.unbox(pg)
        return tuple(sorted(dist.get_process_group_ranks(pg)))
    except Exception:
        return None


class AxisTrace(CommTrace):
    """``CommTrace`` whose records carry ``axis``; :meth:`sent_by_axis` sums them."""

    def __init__(self, mesh: Mesh):
        super().__init__()
        self.mesh = mesh
        self.table = axis_of_ranks(mesh)

    def _record(self, ns, name, op, full_arg, bound, out):
        rec = super()._record(ns, name, op, full_arg, bound, out)
        if ns == "c10d":
            ranks = _ranks(bound.get("process_group"))
        else:  # functional collectives name their group
            from torch.distributed.distributed_c10d import _resolve_process_group

            ranks = _ranks(_resolve_process_group(bound.get("group_name")))
        rec.axis = self.table.get(ranks, "?") if ranks is not None else "?"
        return rec

    def sent_by_axis(self, phase=None) -> dict[str, float]:
        """Per-rank sent bytes of the selected records, summed per axis."""
        out: dict[str, float] = {}
        for r in self.select(phase):
            if r.sent_bytes is not None:
                out[r.axis] = out.get(r.axis, 0.0) + r.sent_bytes
        return out

    def count_by_axis(self, phase=None) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.select(phase):
            out[r.axis] = out.get(r.axis, 0) + 1
        return out

    def __setstate__(self, state):
        super().__setstate__(state)
        self.mesh, self.table = None, {}
