"""Memory checks of the combined-layouts lab: per-rank model state and the peak of one AdamW
step (``MemoryTrace``) against ``shardlab.accounting`` (imported by ``_workers_combined``)."""

from __future__ import annotations

import _earlier  # noqa: F401  (labs 04, 05 and 06 by file)
import torch
from _cases_combined import (
    DP_PP_MESH,
    FSDP_TP_MESH,
    PP_M,
    PP_MODEL,
    TP_MODEL,
    Q,
    _dp_slice,
    pp_microbatches,
    tp_batch,
)
from combined import (
    all_reduce_mean,
    build_axis_groups,
    dp_pp_pipeline,
    dp_pp_step,
    fsdp_tp_backward,
    fsdp_tp_model,
)
from layout_pp import pp_chunk_bytes
from shardlab.accounting import memory
from shardlab.accounting import pipeline as pacc
from shardlab.accounting.mesh import Mesh
from shardlab.models import GPT
from tensor_reference import SerialGPT


# ----------------------------------------------------------------- memory
def _nbytes(ts) -> int:
    return sum(t.numel() * t.element_size() for t in ts)


def _moments(opt, params) -> list[torch.Tensor]:
    keep = ("exp_avg", "exp_avg_sq")
    return [t for p in params for k, t in opt.state.get(p, {}).items() if k in keep]


def fsdp_tp_memory(ag=None) -> dict:
    """Persistent state (after backward: shards, gradients, AdamW moments) and the peak of
    one AdamW step; every rank returns its row."""
    from shardlab.runtime import MemoryTrace, phase

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
                "moments": _nbytes(_moments(opt, params))}
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
    }


def fsdp_tp_predicted_peak(model, mesh: Mesh, b: int, head_bytes: float, cfg=TP_MODEL):
    """``accounting.fsdp_peak.fsdp_step_peak`` of one AdamW step of the FSDP x TP model here.

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
    ``cfg``: the model's lab 06 ``ModelConfig`` (``shardlab train --layout fsdp+tp`` passes its
    own model's).
    """
    from shardlab.accounting import activations, peak
    from shardlab.accounting.fsdp_peak import flat_unit_sizes, fsdp_step_peak
    from tensor_block import activation_kwargs

    m, t = cfg, mesh.tp
    per_layer = activations.activation_bytes_per_layer(
        m.seq, b, m.h, m.a, t, "tp", **activation_kwargs(m, Q)
    )
    acts = m.layers * per_layer + 2 * 8 * b * m.seq  # + the int64 tokens and targets
    return fsdp_step_peak(
        world=mesh.dp,
        activation_bytes=acts,
        head_activation_bytes=head_bytes,
        backward_workspace_bytes=peak.logits_workspace(b, m.seq, m.vocab // t, Q),
        **flat_unit_sizes(model, Q),
    )


def dp_pp_memory(kind: str = "1f1b", ag=None) -> dict:
    """Persistent state and the peak of one AdamW step of this rank's stage; every rank
    returns its row (with the per-microbatch activation bytes of its stage).

    ``act_ratio``: the peak of saved activations against ``accounting.pipeline.
    inflight_bytes`` of the schedule (lab 05's check). ``peak_ratio``: the whole peak against
    :func:`dp_pp_predicted_peak` (``accounting.stage_peak``: moment by moment, with autograd's
    temporaries of a block's backward and the gradients an earlier microbatch accumulated)."""
    from shardlab.runtime import MemoryTrace, phase

    mesh = Mesh(**DP_PP_MESH)
    ag = ag or build_axis_groups(mesh)
    model = GPT(PP_MODEL, seed=0)
    stage, executor = dp_pp_pipeline(model, ag, kind, PP_M)
    params = list(stage.parameters())
    opt = torch.optim.AdamW(params, lr=1e-3)
    xs, ys = pp_microbatches(0, ag.coords.dp, mesh.dp)
    chunk, head = pp_chunk_bytes(stage, xs, ys, params, PP_M, PP_MODEL.d_model)  # lab 05's
    dp_pp_step(stage, executor, ag, xs, ys)  # warm-up: moments exist
    opt.step()
    opt.zero_grad()
    with MemoryTrace() as mt:
        mt.watch(stage, opt)
        mt.tag(xs + ys, "activations")
        with phase("pipeline"):
            executor.step(xs, ys)
        held = {"weights": _nbytes(params), "grads": _nbytes([p.grad for p in params]),
                "moments": _nbytes(_moments(opt, params))}
        with phase("dp all-reduce"):
            all_reduce_mean(params, ag.group("dp"))
        with phase("optimizer"):
            opt.step()
        opt.zero_grad()
    tl = mt.timeline()
    n_stage = sum(p.numel() for p in params)
    state = memory.model_state(n_stage, mesh.dp, "ddp", "fp32")
    pred = dp_pp_predicted_peak(stage, executor, mesh, xs[0].shape[0], chunk, head)
    return {
        "peak_predicted": pred.total, "peak_ratio": tl.peak / pred.total,
        "predicted_terms": pred.terms, "predicted_phase": pred.phase_of_peak,
        "predicted_action": (str(executor.actions[pred.unit_of_peak])
                             if pred.unit_of_peak is not None else None),
        "chunk_bytes": chunk, "head_bytes": head, "rank": ag.rank,
        "act_predicted": pacc.inflight_bytes(executor.actions, [chunk]),
        "act_ratio": max(tl.bytes["activations"]) / pacc.inflight_bytes(executor.actions, [chunk]), "coords": ag.coords.as_dict(), "held": held,
        "state_measured": sum(held.values()), "state_predicted": state.total, "peak": tl.peak,
        "peak_breakdown": {k: v for k, v in tl.peak_breakdown.items() if v},
        "peak_phase": tl.phases[tl.peak_index], "act_max": max(tl.bytes["activations"]),
        "actions": [str(a) for a in executor.actions],
    }


def dp_pp_predicted_peak(
    stage, executor, mesh: Mesh, b: int, chunk_bytes: int, head_bytes: int = 0
):
    """``accounting.stage_peak.gpt_stage_step_peak`` of one AdamW step of this rank's stage.

    ``persistent``: weights + AdamW moments (``model_state(N_stage, D, "ddp", "fp32")``
    without the gradients, freed by ``zero_grad``); ``grads``: the stage's gradients (the
    head's alone during the last stage's first backward); ``activations``: ``chunk_bytes`` per
    microbatch in flight at that action (``head_bytes`` of it freed during the block's
    backward); ``buffers``: boundary tensors sent so far and the receive posted ahead, ``q b s
    h`` each; ``backward_temporaries``: ``block_backward_temporaries(b, s, h, f)`` (the output
    gradient, the MLP output projection's input, weight and bias gradients); the last stage's
    ``backward_workspace``: ``logits_workspace(b, s, V)``; the dp all-reduce's flat bucket of
    every gradient; ``adam_workspace`` at the optimizer step.
    """
    from shardlab.accounting.stage_peak import gpt_stage_step_peak

    m = PP_MODEL
    head_params = [p for mod in ("ln_f", "lm_head") if hasattr(stage, mod)
                   for p in getattr(stage, mod).parameters()]
    return gpt_stage_step_peak(
        executor.actions,
        chunk_bytes,
        stage_numels=[p.numel() for p in stage.parameters()],
        head_numel=sum(p.numel() for p in head_params),
        dp=mesh.dp,
        b=b,
        s=m.seq_len,
        h=m.d_model,
        ffn=m.d_ff or 4 * m.d_model,
        vocab=m.vocab_size,
        first=stage.first,
        last=stage.last,
        head_bytes=head_bytes,
        q=Q,
    )
