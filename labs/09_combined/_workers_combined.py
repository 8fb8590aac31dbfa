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
from shardlab.accounting import comm, memory
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


def fsdp_tp_check(steps: int = STEPS) -> dict | None:
    """Train ``steps`` SGD steps on the 2x2 mesh; trace step 0 per axis; compare with one
    process. Rank 0 returns the report, with every rank's bytes."""
    mesh = Mesh(**FSDP_TP_MESH)
    ag = build_axis_groups(mesh)
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


def dp_pp_check(steps: int = STEPS, kind: str = "1f1b") -> dict | None:
    mesh = Mesh(**DP_PP_MESH)
    ag = build_axis_groups(mesh)
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


def state_expected(n: int, dp: int, layout: str):
    return memory.model_state(n, dp, layout, "fp32")


# ----------------------------------------------------------------- memory
def _nbytes(ts) -> int:
    return sum(t.numel() * t.element_size() for t in ts)


def _moments(opt, params) -> list[torch.Tensor]:
    keep = ("exp_avg", "exp_avg_sq")
    return [t for p in params for k, t in opt.state.get(p, {}).items() if k in keep]


def _traced_step(params, opt, run, tag=()) -> object:
    """One step (``run()`` does forward and backward, then ``opt.step()``) under MemoryTrace;
    returns the timeline and the activations saved when ``mark`` fired."""
    from shardlab.dist import MemoryTrace, phase

    with MemoryTrace() as mt:
        mt.watch(params, opt)
        for tensors, cat in tag:
            mt.tag(tensors, cat)
        with phase("forward+backward"):
            run()
        with phase("optimizer"):
            opt.step()
        opt.zero_grad()
    return mt.timeline()


def fsdp_tp_memory(ag=None) -> dict:
    """Persistent state (after backward: shards, gradients, AdamW moments) and the peak of
    one AdamW step; every rank returns its row."""
    from shardlab.dist import MemoryTrace, phase

    mesh = Mesh(**FSDP_TP_MESH)
    ag = ag or build_axis_groups(mesh)
    model = fsdp_tp_model(SerialGPT(TP_MODEL), ag)
    params = list(model.parameters())
    opt = torch.optim.AdamW(params, lr=1e-3)
    idx, tgt = (_dp_slice(z, ag.coords.dp, mesh.dp) for z in tp_batch(0))
    fsdp_tp_backward(model, idx, tgt)  # warm-up step: the moments exist from now on
    opt.step()
    opt.zero_grad()
    seen = {}

    def mark(*_):  # activations alive when the last block's forward ends (None: keep output)
        seen.setdefault("units", mt.live_bytes("activations"))

    hook = model.module.blocks[-1].register_forward_hook(mark)
    with MemoryTrace() as mt:
        mt.watch(model, opt)
        mt.tag([f.buffer for u in model.units for f in u.flats], "parameters")
        mt.tag([idx, tgt], "activations")
        with phase("forward+backward"):
            fsdp_tp_backward(model, idx, tgt)
        held = {"weights": _nbytes(params), "grads": _nbytes([p.grad for p in params]),
                "moments": _nbytes(_moments(opt, params))}  # fmt: skip
        with phase("optimizer"):
            opt.step()
        opt.zero_grad()
    hook.remove()
    tl = mt.timeline()
    state = memory.model_state(model.padded_numel, mesh.dp, "zero3", "fp32")
    head = max(tl.bytes["activations"]) - seen["units"]
    pred = fsdp_tp_predicted_peak(model, mesh, idx.shape[0], head)
    return {
        "peak_predicted": pred.total, "peak_ratio": tl.peak / pred.total,
        "predicted_terms": pred.terms, "predicted_phase": pred.phase_of_peak,
        "predicted_unit": pred.unit_of_peak,
        "rank": ag.rank, "held": held, "state_measured": sum(held.values()),
        "state_predicted": state.total, "peak": tl.peak,
        "peak_breakdown": {k: v for k, v in tl.peak_breakdown.items() if v},
        "peak_phase": tl.phases[tl.peak_index], "act_units": seen.get("units"),
        "act_max": max(tl.bytes["activations"]),
        "units": [[f.padded for f in u.flats] for u in model.units],
    }  # fmt: skip


def fsdp_tp_predicted_peak(model, mesh: Mesh, b: int, head_bytes: float):
    """``accounting.peak.predict_peak`` of one AdamW step of the FSDP x TP model on this rank.

    As lab 04's prediction, with the tensor-parallel sizes: ``persistent`` = weight shards +
    AdamW moments (``model_state(N_tp_padded, D, "zero3", "fp32")`` without its gradients,
    which ``zero_grad`` frees); one gathered fp32 buffer per block unit (its *tp slice*,
    ``padded`` elements) alive by the reshard/prefetch schedule, the root's for the whole
    step (``buffers``); the block's full gradient during its backward; the gradient shards
    from the end of each unit's backward. Saved activations: ``L`` times
    ``accounting.activations.activation_bytes_per_layer(s, b, h, a, t, "tp")`` with lab 06's
    layer constants, plus the int64 batch (tokens and targets). ``backward_workspace``: the
    vocabulary-parallel loss's two ``(b, s, V/t)`` gradients, ``logits_workspace(b, s, V/t)``.
    ``head_bytes``: what the final norm, the head and the loss save (measured, as in lab 04).
    """
    from shardlab.accounting import activations, peak
    from tensor_block import activation_kwargs

    m, t = TP_MODEL, mesh.tp
    blocks = [f.padded * Q for u in model.units[1:] for f in u.flats]
    shards = [f.shard_numel * Q for u in model.units[1:] for f in u.flats]
    shards[0] += sum(f.shard_numel * Q for f in model.units[0].flats)  # root: after block 0
    state = memory.model_state(model.padded_numel, mesh.dp, "zero3", "fp32")
    per_layer = activations.activation_bytes_per_layer(
        m.seq, b, m.h, m.a, t, "tp", **activation_kwargs(m, Q)
    )
    acts = m.layers * per_layer + 2 * 8 * b * m.seq  # + the int64 tokens and targets
    cfg = model.config
    return peak.predict_peak(
        persistent_bytes=state.total - state.per_object["grads"],
        unit_bytes=blocks,
        activation_bytes=acts,
        buffer_bytes=sum(f.padded * Q for f in model.units[0].flats),
        prefetch=cfg.prefetch,
        reshard_after_forward=cfg.reshard_after_forward,
        grad_unit_bytes=blocks,
        grad_shard_bytes=shards,
        backward_workspace_bytes=peak.logits_workspace(b, m.seq, m.vocab // t, Q),
        backward_workspace_at="before_units",
        head_activation_bytes=head_bytes,
        optimizer_workspace_bytes=peak.adam_workspace([p.numel() for p in model.parameters()]),
    )


def dp_pp_memory(kind: str = "1f1b", ag=None) -> dict:
    """Persistent state and the peak of one AdamW step of this rank's stage; every rank
    returns its row (with the per-microbatch activation bytes of its stage).

    ``act_ratio``: the peak of saved activations against ``accounting.pipeline.
    inflight_bytes`` of the schedule (lab 05's check). ``peak_ratio``: the whole peak against
    :func:`dp_pp_predicted_peak`, which leaves out autograd's backward temporaries and the
    gradients accumulated by an earlier microbatch's backward (reported, not asserted)."""
    from shardlab.dist import MemoryTrace, phase

    mesh = Mesh(**DP_PP_MESH)
    ag = ag or build_axis_groups(mesh)
    model = GPT(PP_MODEL, seed=0)
    stage, executor = dp_pp_pipeline(model, ag, kind, PP_M)
    params = list(stage.parameters())
    opt = torch.optim.AdamW(params, lr=1e-3)
    xs, ys = pp_microbatches(0, ag.coords.dp, mesh.dp)
    chunk = pp_chunk_bytes(stage, xs, ys, params)
    dp_pp_step(stage, executor, ag, xs, ys)  # warm-up: moments exist
    opt.step()
    opt.zero_grad()
    with MemoryTrace() as mt:
        mt.watch(stage, opt)
        mt.tag(xs + ys, "activations")
        with phase("pipeline"):
            executor.step(xs, ys)
        held = {"weights": _nbytes(params), "grads": _nbytes([p.grad for p in params]),
                "moments": _nbytes(_moments(opt, params))}  # fmt: skip
        with phase("dp all-reduce"):
            from combined import all_reduce_mean

            all_reduce_mean(params, ag.group("dp"))
        with phase("optimizer"):
            opt.step()
        opt.zero_grad()
    tl = mt.timeline()
    n_stage = sum(p.numel() for p in params)
    state = memory.model_state(n_stage, mesh.dp, "ddp", "fp32")
    pred = dp_pp_predicted_peak(stage, executor, mesh, xs[0].shape[0], chunk)
    return {
        "peak_predicted": pred.total, "peak_ratio": tl.peak / pred.total,
        "predicted_terms": pred.terms, "predicted_phase": pred.phase_of_peak,
        "chunk_bytes": chunk, "rank": ag.rank,
        "act_predicted": pacc.inflight_bytes(executor.actions, [chunk]),
        "act_ratio": max(tl.bytes["activations"]) / pacc.inflight_bytes(executor.actions, [chunk]), "coords": ag.coords.as_dict(), "held": held,
        "state_measured": sum(held.values()), "state_predicted": state.total, "peak": tl.peak,
        "peak_breakdown": {k: v for k, v in tl.peak_breakdown.items() if v},
        "peak_phase": tl.phases[tl.peak_index], "act_max": max(tl.bytes["activations"]),
        "actions": [str(a) for a in executor.actions],
    }  # fmt: skip


def pp_chunk_bytes(stage, xs, ys, params) -> int:
    """Saved-activation bytes one microbatch leaves on this stage (forward only, as lab 05
    measures them; the loss on the last stage; the input counts on later stages)."""
    from pipeline import microbatch_loss
    from shardlab.dist import MemoryTrace

    b, s = xs[0].shape
    with MemoryTrace() as mt:
        mt.watch(params)  # weights saved by matmuls are parameters, not activations
        inp = xs[0] if stage.first else torch.zeros(b, s, PP_MODEL.d_model, requires_grad=True)
        mt.tag([inp], "activations")
        y = stage(inp)
        if stage.last:
            y = microbatch_loss(y, ys[0], PP_M)
        got = mt.live_bytes("activations")
    del y
    return got


def dp_pp_predicted_peak(stage, executor, mesh: Mesh, b: int, chunk_bytes: int):
    """``accounting.peak.predict_peak`` of one AdamW step of this rank's stage.

    ``persistent``: weights + AdamW moments (``model_state(N_stage, D, "ddp", "fp32")``
    without the gradients, freed by ``zero_grad``); ``activations``: the schedule's in-flight
    microbatches, ``accounting.pipeline.inflight_bytes(actions, [chunk_bytes])``;
    ``buffers``: the boundary tensors this rank sends (kept until the step ends) and the
    receive buffer posted ahead, ``q b s h`` each; the last stage's ``backward_workspace``:
    ``logits_workspace(b, s, V)``; the gradients join at the optimizer step
    (``grad_shard_bytes``) with ``adam_workspace``.
    """
    from shardlab.accounting import peak

    n_stage = sum(p.numel() for p in stage.parameters())
    state = memory.model_state(n_stage, mesh.dp, "ddp", "fp32")
    msg = Q * b * PP_MODEL.seq_len * PP_MODEL.d_model
    sends = sum(1 for a in executor.actions if a.kind == "F") if not stage.last else 0
    sends += sum(1 for a in executor.actions if a.kind == "B") if not stage.first else 0
    return peak.predict_peak(
        persistent_bytes=state.total - state.per_object["grads"],
        unit_bytes=[],
        activation_bytes=pacc.inflight_bytes(executor.actions, [chunk_bytes]),
        buffer_bytes=(sends + 1) * msg,
        backward_workspace_bytes=(
            peak.logits_workspace(b, PP_MODEL.seq_len, PP_MODEL.vocab_size, Q)
            if stage.last
            else None
        ),
        grad_shard_bytes=state.per_object["grads"],
        optimizer_workspace_bytes=peak.adam_workspace([p.numel() for p in stage.parameters()]),
    )


# ----------------------------------------------------------------- PyTorch: FSDP2 + DTensor
def pytorch_fsdp_tp_model(cfg: ModelConfig = TP_MODEL):
    """The same layout with PyTorch's own tools on ``init_device_mesh("cpu", (2, 2))``:
    ``parallelize_module`` on the "tp" sub-mesh (vocabulary-split embedding, column/row
    parallel attention and MLP, column-parallel head gathered to full logits), then
    ``fully_shard`` of every block and of the root on the "dp" sub-mesh."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    m = Mesh(**FSDP_TP_MESH)
    mesh = init_device_mesh("cpu", (m.dp, m.tp), mesh_dim_names=("dp", "tp"))
    model = SerialGPT(cfg)
    plan = {
        **{p: ColwiseParallel() for p in ("q_proj", "k_proj", "v_proj", "fc")},
        **{p: RowwiseParallel() for p in ("o_proj", "proj")},
    }
    for blk in model.blocks:
        parallelize_module(blk, mesh["tp"], plan)
    parallelize_module(model, mesh["tp"], {
        "tok": RowwiseParallel(input_layouts=Replicate()),
        "head": ColwiseParallel(output_layouts=Replicate()),
    })  # fmt: skip
    for blk in model.blocks:
        fully_shard(blk, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    return model


def pytorch_backward(model, idx, tgt) -> torch.Tensor:
    logits = model(idx)  # (b, s, V), replicated over tp
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tgt.flatten())
    loss.backward()
    return loss.detach()


def pytorch_check(steps: int = STEPS) -> dict | None:
    """FSDP2 + DTensor, ``steps`` SGD steps on the same batches: weights vs one process."""
    mesh = Mesh(**FSDP_TP_MESH)
    model = pytorch_fsdp_tp_model()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    dp_rank = mesh.rank_to_coords(dist.get_rank()).dp
    for step in range(steps):
        idx, tgt = (_dp_slice(z, dp_rank, mesh.dp) for z in tp_batch(step))
        pytorch_backward(model, idx, tgt)
        opt.step()
        opt.zero_grad()
    full = {n: p.full_tensor().detach().clone() for n, p in model.named_parameters()}
    ag = build_axis_groups(mesh)  # ours on the same batches
    mine = fsdp_tp_model(SerialGPT(TP_MODEL), ag)
    opt = torch.optim.SGD(mine.parameters(), lr=LR)
    for step in range(steps):
        fsdp_tp_backward(mine, *(_dp_slice(z, dp_rank, mesh.dp) for z in tp_batch(step)))
        opt.step()
        opt.zero_grad()
    ours = fsdp_tp_full_params(mine, ag)
    if dist.get_rank() != 0:
        return None
    ref, _ = fsdp_tp_reference(steps)
    diff = {n: (full[n] - ref[n]).abs().max().item() for n in ref}
    vs_ours = {n: (full[n] - ours[n]).abs().max().item() for n in ref}
    return {"names_match": set(full) == set(ref) == set(ours),
            "max_abs_param": max(diff.values()), "worst_param": max(diff, key=diff.get),
            "max_abs_vs_ours": max(vs_ours.values())}  # fmt: skip


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
    rows = [None] * dist.get_world_size()
    dist.all_gather_object(rows, group_rows())
    rep = {"groups": rows, "pytorch": pytorch_check(), "gpipe": dp_pp_check(kind="gpipe")}
    return rep if dist.get_rank() == 0 else None


def benchmark(steps: int = 10, batch: int = 8, **model_kw) -> dict | None:
    """Median step time (forward, backward, gradient synchronisation, AdamW) and the peak of
    live tensor bytes of one step (MemoryTrace): ours vs FSDP2 + DTensor on the same 2x2 mesh,
    model and data. ``batch`` is global (``batch / dp`` per dp rank)."""
    import time

    from shardlab.dist import MemoryTrace

    cfg = ModelConfig(**{**TP_MODEL.__dict__, **model_kw})
    mesh = Mesh(**FSDP_TP_MESH)
    ag = build_axis_groups(mesh)
    idx, tgt = (_dp_slice(z, ag.coords.dp, mesh.dp) for z in make_batch(cfg, batch, seed=11))
    res: dict = {"model": model_kw, "batch": batch, "mesh": FSDP_TP_MESH}
    runs = {}
    for name in ("ours", "pytorch"):
        if name == "ours":
            model = fsdp_tp_model(SerialGPT(cfg), ag)
            fn = fsdp_tp_backward
        else:
            model = pytorch_fsdp_tp_model(cfg)
            fn = pytorch_backward
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

        def step(model=model, opt=opt, fn=fn):
            fn(model, idx, tgt)
            opt.step()
            opt.zero_grad()

        step()
        step()  # warm-up: AdamW state exists
        with MemoryTrace() as mt:
            mt.watch(model, opt)
            step()
        res[name] = {"peak_bytes": mt.peak}
        runs[name] = step
    times = {name: [] for name in runs}
    for _ in range(steps):  # interleaved: load from other processes hits both alike
        for name, step in runs.items():
            dist.barrier()
            t0 = time.perf_counter()
            step()
            times[name].append(time.perf_counter() - t0)
    for name, ts in times.items():
        res[name]["step_s"] = sorted(ts)[len(ts) // 2]
    res["ratio_time"] = res["ours"]["step_s"] / res["pytorch"]["step_s"]
    res["ratio_peak"] = res["ours"]["peak_bytes"] / res["pytorch"]["peak_bytes"]
    return res if dist.get_rank() == 0 else None


def lab_report() -> dict | None:
    """Everything the notebook shows, from one 4-rank launch (rank 0 returns it)."""
    rep = {"fsdp_tp": fsdp_tp_check(), "dp_pp": dp_pp_check()}
    return rep if dist.get_rank() == 0 else None
