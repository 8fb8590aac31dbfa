"""Bytes of a pipeline schedule: point-to-point traffic per rank, saved activations in flight.

Nothing is sharded here beyond the layers themselves (:mod:`.pipeline` cuts them into stages);
these are the two byte counts of a schedule, re-exported by :mod:`.pipeline`.
:func:`p2p_sent_bytes`: the ``q b s h`` activation each virtual stage sends forward and the
gradient it sends backward per microbatch, point to point (``send``/``recv``), when the
neighbouring stage lives on another rank. :func:`inflight_bytes`: the peak of saved
activations of one rank's action list (F holds a chunk's bytes until its B, or its BW when
the backward is split). A leaf over :mod:`.pipeline_actions`, so :mod:`.pipeline` can import
it without a circle.
"""

from __future__ import annotations

from . import _validate as chk
from .pipeline_actions import PLACEMENTS, Action, _pmv


def p2p_sent_bytes(
    rank: int,
    p: int,
    b: int,
    s: int,
    h: int,
    q: float = 2,
    m: int = 1,
    v: int = 1,
    placement: str = "loop",
) -> float:
    """Bytes rank ``rank`` of ``p`` sends per step: one ``q b s h`` message forward per
    microbatch and virtual stage that is not the last, one backward per virtual stage that is
    not the first, each only when the neighbouring stage is on another rank (``placement``
    as in :func:`virtual_stage`). Interior ranks send ``comm.pipeline_p2p_volume(b, s, h, q,
    m, v)``; rank 0 and rank p-1 send one message per microbatch fewer each in a loop (no
    stage before 0, none after the last), two fewer in a V (rank 0 holds both ends, rank p-1
    keeps the p-1 -> p boundary in both directions)."""
    from .comm import pipeline_p2p_volume

    p, m, vv = _pmv(p, m, v)
    r = chk.nonneg_int("rank", rank)
    place = chk.choice("placement", placement, PLACEMENTS)
    if r >= p:
        raise ValueError(f"rank={r} must be below p={p}")
    if place == "v" and vv != 2:
        raise ValueError(f"placement='v' holds 2 chunks per rank, got v={vv}")
    if p == 1:
        return 0.0
    per_message = pipeline_p2p_volume(b, s, h, q, microbatches=m) / (2 * m)  # q b s h
    # the messages that stay on the rank: none before stage 0, none after the last stage, and
    # in a V the two directions of the p-1 -> p boundary on rank p-1
    edges = ((r == 0) + (r == p - 1)) * (2 if place == "v" else 1)
    return pipeline_p2p_volume(b, s, h, q, microbatches=m, chunks=vv) - edges * m * per_message


def inflight_bytes(
    actions: list[Action], chunk_bytes: list[float], kept_bytes: list[float] | None = None
) -> float:
    """Peak saved-activation bytes of one rank running ``actions``: a ``(microbatch, chunk)``
    holds ``chunk_bytes[chunk]`` from the start of its F to the end of its B (or BW, when
    the list splits the backward). With ``kept_bytes``, a split backward releases all but
    ``kept_bytes[chunk]`` at the end of its BI (what the weight gradients read: lab 05's BI
    keeps each weight-owning layer's input) and those at the end of its BW. For ``v = 1`` and
    no ``kept_bytes`` this is ``chunk_bytes[0]`` times ``simulate(...).peak_inflight``."""
    sizes = [chk.nonneg_number(f"chunk_bytes[{i}]", x) for i, x in enumerate(chunk_bytes)]
    kept = (
        sizes
        if kept_bytes is None
        else [chk.nonneg_number(f"kept_bytes[{i}]", x) for i, x in enumerate(kept_bytes)]
    )
    if len(kept) != len(sizes):
        raise ValueError(f"kept_bytes has {len(kept)} entries, chunk_bytes {len(sizes)}")
    if any(k > c for k, c in zip(kept, sizes)):
        raise ValueError(f"kept_bytes={kept} must not exceed chunk_bytes={sizes}")
    split = {(a.microbatch, a.chunk) for a in actions if a.kind == "BW"}
    now = peak = 0.0
    for a in actions:
        if not isinstance(a, Action):
            raise ValueError(f"actions holds {a!r}, not an Action")
        if a.chunk >= len(sizes):
            raise ValueError(f"{a} runs chunk {a.chunk} but chunk_bytes has {len(sizes)} entries")
        if a.kind == "F":
            now += sizes[a.chunk]
            peak = max(peak, now)
        elif a.kind == "BW":
            now -= kept[a.chunk]
        elif (a.microbatch, a.chunk) in split:  # BI of a split backward: keep the layer inputs
            now -= sizes[a.chunk] - kept[a.chunk]
        else:  # B (or a BI without BW, which frees everything)
            now -= sizes[a.chunk]
    return peak
