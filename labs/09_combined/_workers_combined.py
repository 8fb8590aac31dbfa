"""Functions every rank runs for the combined-layout tests, notebook and benchmark.

References run in one process on rank 0: the whole global batch through
:class:`tensor_reference.SerialGPT` (FSDP x TP) or :class:`shardlab.models.GPT` (DP x PP),
with the same optimizer. The distributed weights are gathered back to full tensors under the
one-process model's names for the comparison (tests only).
"""

from __future__ import annotations

import _earlier  # noqa: F401  (labs 04, 05 and 06 by file)
import torch
import torch.distributed as dist
from _cases_combined import (
    DP_PP_MESH,
    FSDP_TP_MESH,
    LR,
    PP_M,
    PP_MODEL,
    STEPS,
    TP_MODEL,
    Q,
    _dp_slice,
    dp_pp_reference,
    fsdp_tp_full_params,
    fsdp_tp_reference,
    pp_microbatches,
    tp_batch,
)
from _memory_combined import dp_pp_memory, fsdp_tp_memory
from _pytorch_combined import pytorch_check
from combined import (
    build_axis_groups,
    dp_pp_pipeline,
    dp_pp_step,
    fsdp_tp_backward,
    fsdp_tp_model,
)
from layout_fsdp_tp import fsdp_tp_bytes
from mesh_trace import AxisTrace
from shardlab.accounting import comm
from shardlab.accounting import pipeline as pacc
from shardlab.accounting.mesh import Mesh
from shardlab.models import GPT
from tensor_reference import SerialGPT


def fsdp_tp_check(steps: int = STEPS, ag=None) -> dict | None:
    """Train ``steps`` SGD steps on the 2x2 mesh; trace step 0 per axis; compare with one
    process. Rank 0 returns the report, with every rank's bytes. ``ag``: the mesh's groups,
    when the caller has built them already."""
    mesh = Mesh(**FSDP_TP_MESH)
    ag = ag or build_axis_groups(mesh)
    model = fsdp_tp_model(SerialGPT(TP_MODEL), ag)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    losses, bytes_row = [], None
    for step in range(steps):
        idx, tgt = (_dp_slice(z, ag.coords.dp, mesh.dp) for z in tp_batch(step))
        if step == 0:
            with AxisTrace(mesh) as tr:
                loss = fsdp_tp_backward(model, idx, tgt)
                opt.step()
            pred = fsdp_tp_bytes(idx.shape[0], TP_MODEL, mesh, model.padded_numel)
            got = tr.sent_by_axis()
            bytes_row = {
                "rank": ag.rank, "measured": got, "predicted": pred,
                "ratio": {a: got.get(a, 0.0) / pred[a] for a in pred},
                "other_axes": sorted(set(got) - set(pred)), "calls": tr.count_by_axis(),
            }
        else:
            loss = fsdp_tp_backward(model, idx, tgt)
            opt.step()
        opt.zero_grad()
        losses.append(loss)
    # the global mean loss: the mean over dp of the dp ranks' losses (equal batch shares)
    losses = torch.stack(losses)
    dist.all_reduce(losses, group=ag.group("dp"))
    full = fsdp_tp_full_params(model, ag)
    rows = [None] * mesh.G
    dist.all_gather_object(rows, bytes_row)
    mem = [None] * mesh.G
    dist.all_gather_object(mem, fsdp_tp_memory(ag))
    if ag.rank != 0:
        return None
    ref, ref_losses = fsdp_tp_reference(steps)
    diff = {n: (full[n] - ref[n]).abs().max().item() for n in ref}
    return {
        "mesh": FSDP_TP_MESH, "n_padded": model.padded_numel,
        "units": [u.name for u in model.units],
        "max_abs_param": max(diff.values()), "worst_param": max(diff, key=diff.get),
        "names_match": set(full) == set(ref),
        "loss_diff": max(abs(a - b) for a, b in zip((losses / mesh.dp).tolist(), ref_losses)),
        "bytes": rows, "memory": mem,
    }


# ----------------------------------------------------------------- DP x PP
def dp_pp_check(steps: int = STEPS, kind: str = "1f1b", ag=None) -> dict | None:
    mesh = Mesh(**DP_PP_MESH)
    ag = ag or build_axis_groups(mesh)
    model = GPT(PP_MODEL, seed=0)
    stage, executor = dp_pp_pipeline(model, ag, kind, PP_M)
    mine = {id(p) for p in stage.parameters()}
    named = {n: p for n, p in model.named_parameters() if id(p) in mine}
    opt = torch.optim.SGD(stage.parameters(), lr=LR)
    bytes_row = None
    for step in range(steps):
        xs, ys = pp_microbatches(step, ag.coords.dp, mesh.dp)
        if step == 0:
            with AxisTrace(mesh) as tr:
                dp_pp_step(stage, executor, ag, xs, ys)
            b = xs[0].shape[0]
            n_stage = sum(p.numel() for p in stage.parameters())
            pred = {
                "pp": pacc.p2p_sent_bytes(ag.coords.pp, mesh.pp, b, PP_MODEL.seq_len,
                                          PP_MODEL.d_model, Q, PP_M),
                "dp": comm.step_volume("ddp", n_stage, mesh.dp, Q),
            }
            got = tr.sent_by_axis()
            bytes_row = {
                "rank": ag.rank, "coords": ag.coords.as_dict(), "n_stage": n_stage,
                "measured": got, "predicted": pred,
                "ratio": {a: got.get(a, 0.0) / pred[a] for a in pred},
                "other_axes": sorted(set(got) - set(pred)), "calls": tr.count_by_axis(),
            }
        else:
            dp_pp_step(stage, executor, ag, xs, ys)
        opt.step()
        opt.zero_grad()
    params = {n: p.detach().clone() for n, p in named.items()}
    parts = [None] * mesh.G
    dist.all_gather_object(parts, (ag.coords.dp, params, bytes_row))
    mem = [None] * mesh.G
    dist.all_gather_object(mem, dp_pp_memory(kind, ag))
    if ag.rank != 0:
        return None
    ref = dp_pp_reference(steps)
    # each pipeline holds the whole model: compare both, and the twins with each other
    out = {"mesh": DP_PP_MESH, "kind": kind, "bytes": [p[2] for p in parts], "pipelines": {},
           "memory": mem}
    for d in range(mesh.dp):
        full = {n: t for dd, ps, _ in parts if dd == d for n, t in ps.items()}
        diff = {n: (full[n] - ref[n]).abs().max().item() for n in ref}
        out["pipelines"][d] = {
            "names_match": set(full) == set(ref), "max_abs_param": max(diff.values()),
            "worst_param": max(diff, key=diff.get),
        }
    twins = [ps for _, ps, _ in parts]
    out["twins_bitwise"] = all(
        torch.equal(twins[r][n], twins[r + mesh.pp][n])
        for r in range(mesh.pp) for n in twins[r]
    )
    return out


def group_rows() -> dict:
    """Every axis' group of this rank (global ranks) next to ``Mesh.group_of``, both meshes."""
    out = {}
    for name, spec in (("fsdp_tp", FSDP_TP_MESH), ("dp_pp", DP_PP_MESH)):
        mesh = Mesh(**spec)
        ag = build_axis_groups(mesh)
        out[name] = {
            axis: (
                None if ag.group(axis) is None
                else sorted(dist.get_process_group_ranks(ag.group(axis))),
                mesh.group_of(ag.rank, axis) if mesh.sizes[axis] > 1 else None,
            )
            for axis in ("tp", "pp", "dp", "cp")
        }
    return out


def extra_checks() -> dict | None:
    """Hidden-test launch: the groups, PyTorch's FSDP2 + DTensor on the same mesh, and DP x PP
    with the GPipe schedule (equality and bytes)."""
    rows = [None] * dist.get_world_size()
    dist.all_gather_object(rows, group_rows())
    rep = {"groups": rows, "pytorch": pytorch_check(), "gpipe": dp_pp_check(kind="gpipe")}
    return rep if dist.get_rank() == 0 else None


def lab_report() -> dict | None:
    """Everything the notebook shows, from one 4-rank launch (rank 0 returns it)."""
    rep = {"fsdp_tp": fsdp_tp_check(), "dp_pp": dp_pp_check()}
    return rep if dist.get_rank() == 0 else None
