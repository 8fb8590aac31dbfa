"""Lab 09 — two sharding axes at once on a 2-D mesh: FSDP x TP and DP x PP.

The mesh is ``shardlab.accounting.mesh.Mesh`` (``G = dp * tp * pp * cp``, tp innermost:
``rank = (dp_i * pp + pp_i) * tp + tp_i`` with ``cp = 1``). Every axis of degree > 1 gets
one process group per line of the mesh (:func:`build_axis_groups`); a rank then talks on
exactly two groups, and every collective names the one it means.

**FSDP x TP** (``Mesh(G=4, dp=2, tp=2, pp=1)``: tp groups ``[0, 1], [2, 3]``, dp groups
``[0, 2], [1, 3]``). Lab 06's :class:`tensor_block.ParallelGPT` cuts every weight matrix
over the tp group (``1/t`` of the heads, MLP columns and vocabulary rows per rank); lab 04's
:class:`fsdp.FSDP` then shards *that rank's slice* over the dp group, one unit per block plus
the root. Per rank: ``1/(t D)`` of the model state, ``accounting.memory.model_state(
N_tp_padded, D, "zero3", recipe)`` with ``N_tp_padded`` the padded size of the tp slice.
Bytes per step and rank, per axis (fp32, ``q = 4``):

* dp: all-gathers (forward and backward) and reduce-scatters of the tp slice,
  ``accounting.comm.step_volume("zero3", N_tp_padded, D, q)``;
* tp: the four all-reduces of every layer, ``accounting.comm.tp_volume(b, s, h, t, q, L)``,
  plus the embedding's forward and the head's backward all-reduce of ``(b, s, h)`` and the
  vocabulary-parallel loss's three ``(b, s)`` all-reduces (``comm.ring_sent_bytes``), with
  ``b`` the dp rank's share of the batch.

**DP x PP** (``Mesh(G=4, dp=2, tp=1, pp=2)``: pp groups ``[0, 1], [2, 3]``, dp groups
``[0, 2], [1, 3]``). Two pipelines of two stages (lab 05's :class:`pipeline.PipelineExecutor`
on the pp group), each fed half of the global batch; after the schedule ends every stage
all-reduces its gradients with its twin in the other pipeline (the dp group) and divides by
``D``. Bytes: pp ``accounting.pipeline.p2p_sent_bytes(pp_rank, p, b, s, h, q, m)``; dp one
all-reduce of the stage's ``N_stage`` gradients, ``accounting.comm.step_volume("ddp",
N_stage, D, q)``. State per rank: ``model_state(N_stage, D, "ddp", recipe)``.

In production: PyTorch's ``init_device_mesh(..., mesh_dim_names=("dp", "tp"))`` with
``parallelize_module`` on ``mesh["tp"]`` and ``fully_shard`` on ``mesh["dp"]`` (see
``benchmark_combined.py``), ``torch.distributed.pipelining`` stages on ``mesh["pp"]``;
Megatron-Core's ``parallel_state`` builds the same groups from the same rank formula.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import _earlier  # noqa: F401  (labs 04, 05 and 06 by file)
import torch
import torch.distributed as dist
from fsdp import FSDP, FSDPConfig
from pipeline import PipeConfig, PipelineExecutor, Stage, split_stages
from shardlab.accounting.mesh import AXES, Coords, Mesh
from shardlab.models import GPT
from tensor import TPGroups
from tensor_block import ParallelGPT, TPConfig
from tensor_reference import SerialGPT
from torch import nn


@dataclass
class AxisGroups:
    """This rank's place in ``mesh``: its coordinates and its process group on every axis
    (``None`` on an axis of degree 1: nothing to communicate)."""

    mesh: Mesh
    rank: int
    coords: Coords
    groups: dict[str, dist.ProcessGroup | None] = field(default_factory=dict)

    def group(self, axis: str) -> dist.ProcessGroup | None:
        if axis not in AXES:
            raise ValueError(f"axis={axis!r} is not one of {AXES}")
        return self.groups.get(axis)


def build_axis_groups(mesh: Mesh) -> AxisGroups:
    """Create the process groups of every axis of ``mesh`` (collective: every rank calls it).

    ``dist.new_group`` must be called by *all* ranks for *every* group, in the same order,
    even for the groups a rank is not in; each rank keeps the group that contains it.
    """
    if dist.get_world_size() != mesh.G:
        raise ValueError(f"mesh G={mesh.G} but the job has {dist.get_world_size()} ranks")
    rank = dist.get_rank()
    out = AxisGroups(mesh, rank, mesh.rank_to_coords(rank))
    # BEGIN SOLUTION hint: for each axis in AXES with mesh.sizes[axis] > 1, call dist.new_group(ranks) for every ranks list of mesh.groups(axis) and keep (in out.groups[axis]) the one whose ranks contain this rank
    for axis in AXES:
        if mesh.sizes[axis] == 1:
            continue
        for ranks in mesh.groups(axis):
            pg = dist.new_group(ranks)  # every rank, every group, same order
            if rank in ranks:
                out.groups[axis] = pg
    # END SOLUTION
    return out


# ----------------------------------------------------------------- FSDP x TP
def tp_groups(ag: AxisGroups) -> TPGroups:
    """Lab 06's :class:`TPGroups` for this rank, taken from the mesh's tp and dp axes."""
    # BEGIN SOLUTION hint: TPGroups(tp=mesh.tp, tp_rank=coords.tp, tp_group=ag.group("tp"), dp=mesh.dp, dp_rank=coords.dp, dp_group=ag.group("dp"))
    m, c = ag.mesh, ag.coords
    return TPGroups(
        tp=m.tp, tp_rank=c.tp, tp_group=ag.group("tp"),
        dp=m.dp, dp_rank=c.dp, dp_group=ag.group("dp"),
    )
    # END SOLUTION


def fsdp_tp_model(serial: SerialGPT, ag: AxisGroups, config: FSDPConfig | None = None) -> FSDP:
    """Tensor-parallel GPT (lab 06) over the tp axis, fully sharded (lab 04) over the dp axis.

    ``serial`` must be the same model on every rank (it is built from a seed). The FSDP
    units are the tensor-parallel blocks plus the root (embedding, final norm, head).
    """
    if ag.mesh.pp != 1 or ag.mesh.cp != 1:
        raise ValueError(f"FSDP x TP needs pp=cp=1, got pp={ag.mesh.pp} cp={ag.mesh.cp}")
    # BEGIN SOLUTION hint: ParallelGPT(serial, tp_groups(ag), TPConfig(serial.c, t=mesh.tp)); wrap it in FSDP on the *dp* group (the tp ranks hold different slices: never shard across them)
    tp_model = ParallelGPT(serial, tp_groups(ag), TPConfig(serial.c, t=ag.mesh.tp))
    dp_group = ag.group("dp")
    return FSDP(tp_model, dp_group, config)
    # END SOLUTION


def fsdp_tp_backward(model: FSDP, idx: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Forward and backward of this dp rank's batch ``(b, s)``; afterwards every shard's
    ``.grad`` holds the gradient of the global mean loss. Returns the local loss."""
    # BEGIN SOLUTION hint: loss = model(idx, target) (the vocab-parallel loss), backward, then finish FSDP's reduce-scatters
    loss = model(idx, target)  # ParallelGPT.forward -> mean loss of this dp rank's tokens
    loss.backward()
    model.finish_gradient_synchronization()  # reduce-scatter over dp, / D: the global mean
    return loss.detach()
    # END SOLUTION


# ----------------------------------------------------------------- DP x PP
def dp_pp_pipeline(model: GPT, ag: AxisGroups, kind: str = "1f1b", m: int = 2):
    """This rank's stage of ``model`` (stage ``coords.pp`` of ``mesh.pp``) and lab 05's
    executor on the pp group. Returns ``(stage, executor)``."""
    if ag.mesh.tp != 1 or ag.mesh.cp != 1:
        raise ValueError(f"DP x PP needs tp=cp=1, got tp={ag.mesh.tp} cp={ag.mesh.cp}")
    # BEGIN SOLUTION hint: split_stages(model, mesh.pp)[coords.pp]; PipelineExecutor([stage], PipeConfig(kind, mesh.pp, m), ag.group("pp"))
    stage = split_stages(model, ag.mesh.pp)[ag.coords.pp]
    executor = PipelineExecutor([stage], PipeConfig(kind, ag.mesh.pp, m), ag.group("pp"))
    return stage, executor
    # END SOLUTION


def all_reduce_mean(params: list[nn.Parameter], group: dist.ProcessGroup | None) -> None:
    """Replace every ``p.grad`` by its mean over ``group`` with ONE all-reduce of a flat
    fp32 bucket (``2 q N (D-1)/D`` bytes per rank: ``comm.step_volume("ddp", N, D, q)``)."""
    if group is None:
        return
    # BEGIN SOLUTION hint: concatenate the flattened grads, dist.all_reduce(bucket, group=group), divide by group.size(), copy each slice back into p.grad
    grads = [p.grad for p in params]
    bucket = torch.cat([g.reshape(-1) for g in grads])  # (N_stage,)
    dist.all_reduce(bucket, group=group)
    bucket /= group.size()
    for g, piece in zip(grads, bucket.split([g.numel() for g in grads])):
        g.copy_(piece.view_as(g))
    # END SOLUTION


def dp_pp_step(stage: Stage, executor: PipelineExecutor, ag: AxisGroups, inputs, targets):
    """One step of this rank's pipeline on its ``m`` microbatches, then the gradients of its
    stage averaged with the same stage of the other pipelines. Returns the pipeline's loss
    on the last stage, ``None`` elsewhere."""
    # BEGIN SOLUTION hint: loss = executor.step(inputs, targets); all_reduce_mean over the *dp* group (the twin stage in the other pipeline, not the next stage of this one)
    loss = executor.step(inputs, targets)
    all_reduce_mean([p for p in stage.parameters() if p.grad is not None], ag.group("dp"))
    return loss
    # END SOLUTION
