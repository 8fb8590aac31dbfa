"""Functions every rank runs for the combined-layout tests, notebook and benchmark.

References run in one process on rank 0: the whole global batch through
:class:`tensor_reference.SerialGPT` (FSDP x TP) or :class:`shardlab.models.GPT` (DP x PP),
with the same optimizer. The distributed weights are gathered back to full tensors under the
one-process model's names for the comparison (tests only).
"""

from __future__ import annotations

import _labs_path  # noqa: F401  (labs 04, 05 and 06 on sys.path)
import torch
import torch.distributed as dist
from _workers_tensor import full_grads
from combined import (
    build_axis_groups,
    dp_pp_pipeline,
    dp_pp_step,
    fsdp_tp_backward,
    fsdp_tp_model,
    tp_groups,
)
from mesh_trace import AxisTrace
from shardlab.accounting import comm
from shardlab.accounting import pipeline as pacc
from shardlab.accounting.mesh import Mesh
from shardlab.models import GPT, GPTConfig, lm_loss, step_batch
from tensor_block import ParallelGPT, TPConfig
from tensor_reference import ModelConfig, SerialGPT, make_batch

Q = 4  # fp32 everywhere: weights, activations, communication
STEPS, LR = 3, 0.1
# FSDP x TP: lab 06's GPT without dropout (each dp rank sees other sequences than one
# process would put at the same batch position, so seeded masks would not line up)
TP_MODEL = ModelConfig(vocab=64, seq=16, h=32, a=4, ffn=96, layers=2, dropout=0.0,
                       attn_dropout=0.0)  # fmt: skip
TP_BATCH = 4  # global: 2 sequences per dp rank
FSDP_TP_MESH = dict(G=4, dp=2, tp=2, pp=1)
# DP x PP: two pipelines of two stages, m microbatches each
PP_MODEL = GPTConfig(vocab_size=64, seq_len=16, n_layer=2, n_head=2, d_model=32)
PP_BATCH, PP_M = 8, 2  # global batch; each pipeline gets 4 = 2 microbatches of 2
DP_PP_MESH = dict(G=4, dp=2, tp=1, pp=2)


def _dp_slice(t: torch.Tensor, dp_rank: int, dp: int) -> torch.Tensor:
    return t.chunk(dp)[dp_rank].contiguous()


# ----------------------------------------------------------------- FSDP x TP
def tp_batch(step: int):
    return make_batch(TP_MODEL, TP_BATCH, seed=step)


def fsdp_tp_full_params(model, ag) -> dict[str, torch.Tensor]:
    """Every weight as one full tensor under SerialGPT's names: FSDP's all-gather over dp,
    then lab 06's gather over tp (``full_grads`` reads ``.grad``, so we lend it the weights)."""
    sd = model.full_state_dict()  # tp-local full tensors, ParallelGPT's names
    shell = ParallelGPT(SerialGPT(TP_MODEL), tp_groups(ag), TPConfig(TP_MODEL, ag.mesh.tp))
    for name, p in shell.named_parameters():
        p.grad = sd[name]
    return {k: v.clone() for k, v in full_grads(shell, tp_groups(ag)).items()}


def tp_predicted_bytes(b: int, mesh: Mesh, n_padded: int) -> dict[str, float]:
    """Per-rank bytes of one FSDP x TP step, per axis, from ``shardlab.accounting``."""
    m, t = TP_MODEL, mesh.tp
    act = comm.ring_sent_bytes("all_reduce", Q * b * m.seq * m.h, t)  # one (b, s, h) all-reduce
    loss = comm.ring_sent_bytes("all_reduce", 4 * b * m.seq, t)  # one (b, s) fp32 all-reduce
    return {
        "dp": comm.step_volume("zero3", n_padded, mesh.dp, Q, reshard_after_forward=True),
        "tp": comm.tp_volume(b, m.seq, m.h, t, Q, layers=m.layers) + 2 * act + 3 * loss,
    }


def fsdp_tp_reference(steps: int = STEPS) -> tuple[dict, list[float]]:
    model = SerialGPT(TP_MODEL)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    losses = []
    for step in range(steps):
        idx, tgt = tp_batch(step)
        logits = model(idx)
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tgt.flatten())
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return {n: p.detach().clone() for n, p in model.named_parameters()}, losses


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
            pred = tp_predicted_bytes(idx.shape[0], mesh, model.padded_numel)
            got = tr.sent_by_axis()
            bytes_row = {
                "rank": ag.rank, "measured": got, "predicted": pred,
                "ratio": {a: got.get(a, 0.0) / pred[a] for a in pred},
                "other_axes": sorted(set(got) - set(pred)), "calls": tr.count_by_axis(),
            }  # fmt: skip
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
    from _memory_combined import fsdp_tp_memory

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
    }  # fmt: skip


# ----------------------------------------------------------------- DP x PP
def pp_microbatches(step: int, dp_rank: int, dp: int):
    idx, tgt = (_dp_slice(z, dp_rank, dp) for z in step_batch(PP_MODEL, step, PP_BATCH))
    return [t.clone() for t in idx.chunk(PP_M)], [t.clone() for t in tgt.chunk(PP_M)]


def dp_pp_reference(steps: int = STEPS) -> dict[str, torch.Tensor]:
    model = GPT(PP_MODEL, seed=0)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    for step in range(steps):
        lm_loss(model, *step_batch(PP_MODEL, step, PP_BATCH)).backward()
        opt.step()
        opt.zero_grad()
    return {n: p.detach().clone() for n, p in model.named_parameters()}


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
            }  # fmt: skip
            got = tr.sent_by_axis()
            bytes_row = {
                "rank": ag.rank, "coords": ag.coords.as_dict(), "n_stage": n_stage,
                "measured": got, "predicted": pred,
                "ratio": {a: got.get(a, 0.0) / pred[a] for a in pred},
                "other_axes": sorted(set(got) - set(pred)), "calls": tr.count_by_axis(),
            }  # fmt: skip
        else:
            dp_pp_step(stage, executor, ag, xs, ys)
        opt.step()
        opt.zero_grad()
    params = {n: p.detach().clone() for n, p in named.items()}
    parts = [None] * mesh.G
    dist.all_gather_object(parts, (ag.coords.dp, params, bytes_row))
    from _memory_combined import dp_pp_memory

    mem = [None] * mesh.G
    dist.all_gather_object(mem, dp_pp_memory(kind, ag))
    if ag.rank != 0:
        return None
    ref = dp_pp_reference(steps)
    # each pipeline holds the whole model: compare both, and the twins with each other
    out = {"mesh": DP_PP_MESH, "kind": kind, "bytes": [p[2] for p in parts], "pipelines": {},
           "memory": mem}  # fmt: skip
    for d in range(mesh.dp):
        full = {n: t for dd, ps, _ in parts if dd == d for n, t in ps.items()}
        diff = {n: (full[n] - ref[n]).abs().max().item() for n in ref}
        out["pipelines"][d] = {
            "names_match": set(full) == set(ref), "max_abs_param": max(diff.values()),
            "worst_param": max(diff, key=diff.get),
        }  # fmt: skip
    twins = [ps for _, ps, _ in parts]
    out["twins_bitwise"] = all(
        torch.equal(twins[r][n], twins[r + mesh.pp][n])
        for r in range(mesh.pp) for n in twins[r]
    )  # fmt: skip
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
        }  # fmt: skip
    return out


def extra_checks() -> dict | None:
    """Hidden-test launch: the groups, PyTorch's FSDP2 + DTensor on the same mesh, and DP x PP
    with the GPipe schedule (equality and bytes)."""
    from _pytorch_combined import pytorch_check

    rows = [None] * dist.get_world_size()
    dist.all_gather_object(rows, group_rows())
    rep = {"groups": rows, "pytorch": pytorch_check(), "gpipe": dp_pp_check(kind="gpipe")}
    return rep if dist.get_rank() == 0 else None


def lab_report() -> dict | None:
    """Everything the notebook shows, from one 4-rank launch (rank 0 returns it)."""
    rep = {"fsdp_tp": fsdp_tp_check(), "dp_pp": dp_pp_check()}
    return rep if dist.get_rank() == 0 else None
