"""Functions every rank runs for the HSDP tests, notebook and benchmark (importable by name).

HSDP on a ``(replicate, shard)`` mesh of ``R x S`` ranks (4 CPU ranks: 2 x 2), built with
``init_device_mesh(..., mesh_dim_names=("replicate", "shard"))`` so that our wrapper and FSDP2
use the very same process groups: rank ``r S + s`` shards with the ranks of its row and holds
the same shard as the ranks of its column. Every rank trains on its own ``1 / (R S)`` of the
global batch (data parallel degree ``R S``).

The reference (``reference_hsdp``, one process) does HSDP's arithmetic: per replica, the ``S``
per-rank gradients added and divided by ``S`` (the reduce-scatter and ``drain``); those ``R``
means added and divided by ``R`` (``reduce_replicas``). With ``S = R = 2`` every sum has two
terms (``a + b == b + a`` exactly, whatever order gloo adds in) and the divisions are by 2
(exact), so the run must equal it bit for bit. Bytes per axis: the shard axis is every
all-gather and reduce-scatter, the replicate axis every all-reduce (``CommTrace`` records each
with its group size), against ``accounting.hierarchical.hsdp_step_volume``.
"""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist
from _workers_fsdp import (
    RECIPE,
    accumulate,
    compare,
    make_batches,
    make_model,
    named,
    reference_full,
    state_bytes,
    traced_step,
    train_fsdp2,
)
from fsdp import FSDP, FSDPConfig
from shardlab.accounting import hierarchical, memory
from shardlab.models import lm_loss, make_optimizer, rank_slice, split_microbatches

STEPS = 2
AXES = {"shard": ("all_gather", "reduce_scatter"), "replicate": ("all_reduce",)}


def hsdp_mesh(replicate: int = 2):
    """The 2-D mesh ``(replicate, shard)`` over every rank (FSDP2's HSDP convention)."""
    from torch.distributed.device_mesh import init_device_mesh

    world = dist.get_world_size()
    return init_device_mesh("cpu", (replicate, world // replicate),
                            mesh_dim_names=("replicate", "shard"))


def train_hsdp(kind="plain", opt="adamw", steps=STEPS, microbatches=1, sync_each=True, mesh=None,
               cfg=None, **model_cfg):
    """Our FSDP sharded on the mesh's ``shard`` axis, replicated on ``replicate``."""
    mesh = mesh or hsdp_mesh()
    model = FSDP(make_model(kind, **model_cfg), mesh.get_group("shard"), cfg or FSDPConfig(),
                 replicate_group=mesh.get_group("replicate"))
    o = make_optimizer(opt, model.parameters())
    for x, y in make_batches(steps):
        accumulate(model, rank_slice(x), rank_slice(y), microbatches, sync_each)
        o.step()
        o.zero_grad()
    return model, o


def reference_hsdp(kind, opt, shard, replicate, steps=STEPS, microbatches=1):
    """One process: per-rank gradients (``loss / m`` accumulated over microbatches, as
    ``accumulate`` with ``no_sync``), meaned inside each replica, then across replicas."""
    model = make_model(kind)
    o = make_optimizer(opt, model.parameters())
    params = [p for p in model.parameters() if p.requires_grad]
    world = shard * replicate
    for x, y in make_batches(steps):
        means = []
        for r in range(replicate):
            total = None
            for s in range(shard):
                xr, yr = rank_slice((x, y), r * shard + s, world)
                local = copy.deepcopy(model)
                pieces = split_microbatches((xr, yr), microbatches)
                for xm, ym in pieces:
                    (lm_loss(local, xm, ym) / len(pieces)).backward()
                g = [p.grad for p in local.parameters() if p.requires_grad]
                total = g if total is None else [a + b for a, b in zip(total, g)]
            means.append([t / shard for t in total])
        mean = means[0]
        for m in means[1:]:
            mean = [a + b for a, b in zip(mean, m)]
        for p, g in zip(params, mean):
            p.grad = g / replicate
        o.step()
        o.zero_grad()
    return named(model)


def axis_bytes(tr) -> dict:
    """Measured ring-model bytes, counts and group sizes per mesh axis of one ``CommTrace``."""
    out = {}
    for axis, ops in AXES.items():
        recs = [r for r in tr.records if r.op in ops]
        out[axis] = {"bytes": sum(r.sent_bytes for r in recs), "count": len(recs),
                     "group_sizes": sorted({r.group_size for r in recs})}
    out["other"] = sorted({r.op for r in tr.records} - {o for ops in AXES.values() for o in ops})
    return out


def comm_rows(mesh, microbatches=1, sync_each=True, reshard=True, q=4) -> dict:
    """One traced step (fresh model, AdamW): bytes per axis next to ``hsdp_step_volume``."""
    R, S = mesh.size(0), mesh.size(1)
    cfg = FSDPConfig(reshard_after_forward=reshard)
    model, opt = train_hsdp("plain", "adamw", 0, mesh=mesh, cfg=cfg)
    x, y = make_batches(1, batch=R * S * microbatches, seed=7)[0]
    tr = traced_step(model, opt, rank_slice(x), rank_slice(y), microbatches, sync_each)
    n_pad = model.padded_numel
    pred = hierarchical.hsdp_step_volume(n_pad, S, R, q, reshard, microbatches, sync_each)
    return {"run": f"m={microbatches} sync_every_microbatch={sync_each} reshard={reshard}",
            "N_padded": n_pad, "measured": axis_bytes(tr), "predicted": pred}


def state_row(mesh) -> dict:
    """Bytes held per rank after backward (before the step) vs ZeRO-3 over the shard axis."""
    S = mesh.size(1)
    model, opt = train_hsdp("plain", "adamw", 1, mesh=mesh)
    x, y = make_batches(1, seed=9)[0]
    accumulate(model, rank_slice(x), rank_slice(y))
    got = state_bytes(model, opt)
    pred = memory.model_state(model.padded_numel, S, "zero3", RECIPE).total
    measured = got["weights"] + got["grads"] + got["moments"]
    return {"N_padded": model.padded_numel, "shard": S, "measured_bytes": measured,
            "predicted_bytes": pred, "gathered_left": got["gathered_left"]}


def replicas_agree(model: FSDP, mesh) -> bool:
    """Every rank of this rank's replicate group holds bitwise the same shards."""
    ok = True
    grp = mesh.get_group("replicate")
    for p in model.parameters():
        got = [torch.empty_like(p) for _ in range(grp.size())]
        dist.all_gather(got, p.detach().contiguous(), group=grp)
        ok = ok and all(torch.equal(g, got[0]) for g in got)
    return ok


def _check(kind, opt, mesh, microbatches=1, sync_each=True) -> dict | None:
    R, S = mesh.size(0), mesh.size(1)
    model, _ = train_hsdp(kind, opt, STEPS, microbatches, sync_each, mesh)
    sd, agree = model.full_state_dict(), replicas_agree(model, mesh)
    if dist.get_rank() != 0:
        return None
    return {"split": compare(sd, reference_hsdp(kind, opt, S, R, STEPS, microbatches)),
            "full": compare(sd, reference_full(kind, opt, STEPS)), "replicas_agree": agree}


def check_hsdp() -> dict | None:
    """Public-test launch (4 ranks, 2 x 2): correctness, state and bytes per axis."""
    mesh = hsdp_mesh()
    rep = {"mesh": tuple(mesh.shape), "plain": _check("plain", "adamw", mesh)}
    rep["comm"] = [comm_rows(mesh), comm_rows(mesh, reshard=False)]
    rep["state"] = state_row(mesh)
    return rep if dist.get_rank() == 0 else None


def extra_hsdp() -> dict | None:
    """Hidden-test launch (4 ranks, 2 x 2): accumulation, tied/frozen models, FSDP2."""
    mesh = hsdp_mesh()
    rep = {"accum": {"no_sync": _check("plain", "sgd", mesh, 2, False),
                     "tied": _check("tied", "adamw", mesh), "frozen": _check("frozen", "sgd", mesh)},
           "comm": [comm_rows(mesh, 2, False), comm_rows(mesh, 2, True)]}
    ours = train_hsdp("plain", "adamw", mesh=mesh)[0].full_state_dict()
    theirs = train_fsdp2_hsdp("plain", "adamw", mesh=mesh)[0]
    sd = {n: p.full_tensor().detach().clone() for n, p in theirs.named_parameters()}
    rep["fsdp2"] = compare(ours, sd)
    return rep if dist.get_rank() == 0 else None


def train_fsdp2_hsdp(kind="plain", opt="adamw", steps=STEPS, mesh=None, **model_cfg):
    """PyTorch FSDP2 on the same 2-D mesh: ``fully_shard`` per block and the root (HSDP)."""
    return train_fsdp2(kind, opt, steps, mesh=mesh or hsdp_mesh(), **model_cfg)
