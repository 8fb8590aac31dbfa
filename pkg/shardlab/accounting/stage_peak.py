"""Predicted peak of one pipeline stage's step, moment by moment, with autograd's temporaries.

:func:`.peak.predict_peak` walks FSDP units; a pipeline stage instead runs a schedule of
forwards and backwards of microbatches (:func:`.pipeline.schedule`), so what coexists depends
on the action: how many microbatches are in flight, whether an earlier backward has already
accumulated the stage's gradients, which boundary tensors are still on their way. This module
walks one rank's actions (``F``/``B`` of ``v = 1`` schedules: GPipe, 1F1B) and takes the
largest moment.

**Autograd temporaries of a block's backward** (:func:`block_backward_temporaries`). Measured
with ``MemoryTrace`` in lab 09 (labelled ``other``; lab 05's stages are the same blocks): the
largest moment inside a pre-LN block's backward is the backward of the MLP's output projection
``y = x W^T + c`` (``x`` is ``(b, s, f)``), while every saved activation of the block still
exists. Alive then, besides the saved tensors: the gradient arriving at the block's output
``(b, s, h)`` (a received buffer on an inner stage, the head's input gradient on the last),
the projection's input gradient ``(b, s, f)``, its weight gradient ``(h, f)`` and bias
gradient ``(h,)``, before autograd accumulates them into ``.grad`` (the first microbatch's
become ``.grad``; later ones are added and freed)::

    temporaries = q (b s h + b s f + f h + h)          bytes (h if the projection has a bias)

Later moments of the same backward are smaller: the GeLU's backward holds two ``(b, s, f)``
tensors but its saved output is already freed, and the first projection's gradients are
``h``-wide. (For ``f >= h``; attention's temporaries are ``h``-wide too.)

**Moments** (every term in bytes, per rank):

``forward`` of a microbatch      persistent + gradients so far + saved activations in flight
                                 + buffers
``backward`` start (last stage)  the same + ``backward_workspace`` (:func:`.peak.
                                 logits_workspace`: the loss's two ``(b, s, V)`` gradients)
``backward`` of the block        persistent + gradients so far + activations in flight less
                                 this microbatch's head (``head_bytes``: the final norm, the
                                 logits and the loss run their backward first and free their
                                 saved tensors) + buffers + temporaries
``dp all-reduce``                persistent + gradients + the flat bucket (``bucket_bytes``)
``optimizer``                    persistent + gradients + ``optimizer_workspace``

*Gradients so far*: ``grad_bytes`` (all of the stage's) once a backward has finished on this
rank; during the first backward, the head's (``head_grad_bytes``), whose backward came first.
*Buffers*: one ``message_bytes`` boundary tensor for every send already issued (lab 05's
executor keeps them until the step ends) and one for the receive posted ahead for the next
action; the receive the current backward consumes is the gradient counted in the
temporaries. ``F`` sends unless the stage is the last, ``B`` unless it is the first; ``F``
receives unless the stage is the first, ``B`` unless it is the last.

**One fp32 AdamW step of a GPT stage** (:func:`gpt_stage_step_peak`): the sizes above, read
off a stage's shape, composed once for lab 09 (DP x PP) and lab 05 (one pipeline, ``dp = 1``
and no all-reduce): ``persistent`` is ``model_state(N_stage, D, "ddp", "fp32")`` without its
gradients (``zero_grad`` frees them), ``message_bytes`` one ``q b s h`` boundary tensor, the
head's gradients those of the final norm and the head, the last stage's
``logits_workspace(b, s, V)``, the dp all-reduce's flat bucket of every gradient (``q
N_stage``, when the stage is data-parallel) and ``adam_workspace`` of the stage's tensors.
"""

from __future__ import annotations

from collections.abc import Sequence

from . import _validate as v
from . import memory, peak
from .peak import PeakBreakdown, PeakPoint
from .pipeline import Action

STAGE_TERMS = ("persistent", "grads", "activations", "buffers", "backward_temporaries",
               "backward_workspace", "dp_bucket", "optimizer_workspace")


def block_backward_temporaries(
    b: int, s: int, h: int, ffn: int, q: float = 4, bias: bool = True
) -> float:
    """Autograd temporaries at the largest moment of a transformer block's backward:
    ``q (b s h + b s f + f h [+ h])`` (module docstring: which tensors and why)."""
    b, s, h, f = (v.positive_int(k, x) for k, x in (("b", b), ("s", s), ("h", h), ("ffn", ffn)))
    qq = v.number("q", q)
    return qq * (b * s * h + b * s * f + f * h + (h if v.flag("bias", bias) else 0))


def stage_peak(
    actions: Sequence[Action],
    chunk_bytes: float,
    persistent_bytes: float,
    grad_bytes: float,
    message_bytes: float,
    temporaries_bytes: float,
    first: bool,
    last: bool,
    head_bytes: float = 0,
    head_grad_bytes: float = 0,
    backward_workspace_bytes: float = 0,
    bucket_bytes: float = 0,
    optimizer_workspace_bytes: float = 0,
) -> PeakBreakdown:
    """Largest moment of one rank's pipeline step (module docstring). ``actions``: this rank's
    list from :func:`.pipeline.schedule` (``F``/``B``, one chunk); ``chunk_bytes``: saved
    activations of one microbatch on this stage (:func:`.pipeline.inflight_bytes`'s unit)."""
    acts = list(actions)
    for a in acts:
        if not isinstance(a, Action) or a.kind not in ("F", "B") or a.chunk:
            raise ValueError(f"stage_peak walks F/B actions of one chunk (v=1); got {a!r}")
    names = ("chunk_bytes", "persistent_bytes", "grad_bytes", "message_bytes",
             "temporaries_bytes", "head_bytes", "head_grad_bytes", "backward_workspace_bytes",
             "bucket_bytes", "optimizer_workspace_bytes")
    vals = (chunk_bytes, persistent_bytes, grad_bytes, message_bytes, temporaries_bytes,
            head_bytes, head_grad_bytes, backward_workspace_bytes, bucket_bytes,
            optimizer_workspace_bytes)
    (chunk, pers, grads, msg, temps, head, head_grads, ws, bucket, opt_ws) = (
        v.nonneg_number(n, x) for n, x in zip(names, vals)
    )
    first, last = v.flag("first", first), v.flag("last", last)
    if head > chunk:
        raise ValueError(f"head_bytes={head} exceed chunk_bytes={chunk}")

    def sends(a: Action) -> bool:
        return not last if a.kind == "F" else not first

    def receives(a: Action) -> bool:
        return not first if a.kind == "F" else not last

    timeline: list[PeakPoint] = []
    inflight = sent = 0
    done_backward = False

    def point(phase: str, i: int, **extra: float) -> None:
        ahead = 1 if i + 1 < len(acts) and receives(acts[i + 1]) else 0
        terms = dict.fromkeys(STAGE_TERMS, 0.0)
        terms.update(persistent=pers, grads=grads if done_backward else 0.0,
                     activations=inflight * chunk, buffers=(sent + ahead) * msg)
        terms.update(extra)
        timeline.append(PeakPoint(phase, i, terms, ()))

    for i, a in enumerate(acts):
        if a.kind == "F":
            inflight += 1
            point("forward", i)
        else:
            if last:
                point("backward", i, backward_workspace=ws)
            point("backward", i, backward_temporaries=temps,
                  activations=inflight * chunk - (head if last else 0.0),
                  grads=grads if done_backward else (head_grads if last else 0.0))
            inflight -= 1
            done_backward = True
        if sends(a):
            sent += 1
    end = dict.fromkeys(STAGE_TERMS, 0.0)
    end.update(persistent=pers, grads=grads)
    timeline.append(PeakPoint("dp all-reduce", None, {**end, "dp_bucket": bucket}, ()))
    timeline.append(PeakPoint("optimizer", None, {**end, "optimizer_workspace": opt_ws}, ()))
    best = max(timeline, key=lambda pt: pt.total)  # earliest on ties
    return PeakBreakdown(dict(best.terms), best.total, best.phase, best.unit, tuple(timeline))


def gpt_stage_step_peak(
    actions: Sequence[Action],
    chunk_bytes: float,
    stage_numels: Sequence[int],
    head_numel: int,
    dp: int,
    b: int,
    s: int,
    h: int,
    ffn: int,
    vocab: int,
    first: bool,
    last: bool,
    head_bytes: float = 0,
    dp_all_reduce: bool = True,
    q: float = 4,
) -> PeakBreakdown:
    """:func:`stage_peak` of one fp32 AdamW step of a GPT pipeline stage (module docstring):
    ``stage_numels`` the numels of the stage's parameters, ``head_numel`` those of its final
    norm and head (0 but on the last stage), replicated over ``dp`` ranks (``dp_all_reduce``:
    whether their gradients are all-reduced in one flat bucket), microbatches of ``b``
    sequences of ``s`` tokens, hidden ``h``, MLP ``ffn``, vocabulary ``vocab``."""
    numels = [int(n) for n in stage_numels]
    n_stage = sum(numels)
    state = memory.model_state(n_stage, dp, "ddp", "fp32")
    return stage_peak(
        actions,
        chunk_bytes,
        persistent_bytes=state.total - state.per_object["grads"],
        grad_bytes=state.per_object["grads"],
        message_bytes=q * b * s * h,
        temporaries_bytes=block_backward_temporaries(b, s, h, ffn, q),
        first=first,
        last=last,
        head_bytes=head_bytes,
        head_grad_bytes=q * head_numel,
        backward_workspace_bytes=peak.logits_workspace(b, s, vocab, q),
        bucket_bytes=q * n_stage if dp_all_reduce else 0,
        optimizer_workspace_bytes=peak.adam_workspace(numels),
    )
