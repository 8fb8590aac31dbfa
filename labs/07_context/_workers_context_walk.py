"""The one launch behind lab 07's notebook: every exercise check and measured section.

:func:`walkthrough` runs on 4 ranks. Ring size ``c = 4`` uses the whole world; ``c = 2``
uses ranks 0 and 1 as a group of their own (ranks 2 and 3 skip it), so one launch serves
both ring sizes. Each rank runs every equivalence case of
:func:`_workers_context.equivalence_cases` (forward, then backward, under ``CommTrace``),
the forward memory of both variants (``MemoryTrace``) and, on the 4-rank ring, the causal
compute per rank with and without zig-zag (:func:`_workers_context.balance`).

Why one launch: the exercises and the measured sections read the same runs, so a save of
``ring_attention.py`` costs one launch of 4 rank processes, not three launches of 2 + 4 + 4
(ring sizes 2 and 4, then the balance): each launch pays its start-up and its process-group
set-up again, so one launch is the shorter wait on any machine.

A part of ``ring_attention.py`` that still holds its ``NotImplementedError`` stub does not end
the launch: that case records the stub's message under ``"missing"`` and the launch goes on,
so a student with the ring's forward written sees it checked before writing the backward.
Only ``NotImplementedError`` is caught: a stub raises it on every rank of the group before any
message is posted, so the ranks stay in step. Any other error ends the launch with that
rank's error, as usual.
"""

from __future__ import annotations

import _workers_context as W
import ring_attention as ra
import torch.distributed as dist
from ring_attention import CPConfig
from shardlab.runtime import CommTrace

SIZES = (2, 4)  # ring sizes: ranks [0, 1] and the whole 4-rank world
PHASES = ("forward", "backward")


def run_case(cfg: CPConfig, variant: str, group, seed: int = 0) -> dict:
    """Forward, then backward, of ``variant`` on this rank's shard in ``group``.

    The same fields as :func:`_workers_context.run_case` (shards, bytes and messages per
    phase, ops), with ``None`` for what a stub kept from running and its message in
    ``"missing"``.
    """
    c, r = dist.get_world_size(group), dist.get_rank(group)
    row = {"out": None, "dq": None, "dk": None, "dv": None, "missing": None,
           "sent": {}, "messages": {}, "ops": []}
    try:
        x = W.make_inputs(cfg, seed)
        mine = {n: ra.shard(t, r, c, cfg.zigzag) for n, t in x.items()}
    except NotImplementedError as exc:  # shard_positions still a stub
        row["missing"] = str(exc)
        return row
    q, k, v = (mine[n].requires_grad_(True) for n in "qkv")
    dist.barrier(group)
    with CommTrace() as tr:
        try:
            with tr.phase("forward"):
                out = W.VARIANTS[variant](q, k, v, group, cfg.causal, cfg.zigzag)
            row["out"] = out.detach()
            with tr.phase("backward"):
                out.backward(mine["dout"])
            row.update(dq=q.grad, dk=k.grad, dv=v.grad)
        except NotImplementedError as exc:
            row["missing"] = str(exc)
    done = [ph for ph in PHASES if row["out" if ph == "forward" else "dq"] is not None]
    row["sent"] = {ph: tr.sent_bytes(phase=ph) for ph in done}
    row["messages"] = {ph: len(tr.select(phase=ph)) for ph in done}
    row["ops"] = sorted({rec.op for rec in tr.records})
    return row


def memory(cfg: CPConfig, variant: str, group, seed: int = 0) -> dict:
    """:func:`_workers_context.memory` in ``group`` (``None`` and the stub's message if the
    forward is missing)."""
    try:
        return {**W.memory(cfg, variant, seed, group), "missing": None}
    except NotImplementedError as exc:
        return {"rank": dist.get_rank(group), "s": cfg.s, "variant": variant,
                "measured": None, "missing": str(exc)}


def walkthrough(seqs: tuple[int, ...] = W.MEMORY_SEQS, balance_s: int = 1024, repeats: int = 2):
    """Everything the notebook shows, per rank: ``{2: report, 4: report, "balance": ...}``.

    A report is ``{"cases", "runs", "memory"}`` as :func:`_workers_context.report` returns
    it (ranks 2 and 3 have no ``2`` entry). ``"balance"`` is
    :func:`_workers_context.balance` at ``s = balance_s``, or the stub's message when the
    ring's forward or backward is missing.
    """
    if dist.get_world_size() != max(SIZES):
        raise ValueError(f"walkthrough runs on {max(SIZES)} ranks, not {dist.get_world_size()}")
    pair = dist.new_group([0, 1])  # every rank takes part in creating a group
    me = dist.get_rank()
    res: dict = {"rank": me}
    for c, group in ((2, pair), (4, dist.group.WORLD)):
        if me >= c:
            continue
        cases = W.equivalence_cases(c)
        runs = [run_case(*case, group) for case in cases]
        mem = [
            memory(CPConfig(s=s, c=c, causal=False), variant, group)
            for variant in ("ring", "all_gather")
            for s in seqs
        ]
        res[c] = {"cases": cases, "runs": runs, "memory": mem}
    try:  # the causal work per rank of the 4-rank ring, contiguous and zig-zag
        res["balance"] = W.balance(balance_s, repeats)
    except NotImplementedError as exc:
        res["balance"] = str(exc)
    return res
