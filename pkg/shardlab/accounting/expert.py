"""Expert parallelism: expert capacity, and the bytes of the dispatch and return all-to-alls.

Lecture 8, "Expert parallelism"; Lepikhin et al., *GShard* (2021); Fedus et al., *Switch
Transformers* (2022). Chapter 9 of the book and ``labs/08_expert`` use these functions.

Layout. ``E`` experts are split over an expert-parallel (EP) group of ``ep`` ranks in
contiguous blocks: rank ``r`` owns experts ``r*E/ep .. (r+1)*E/ep - 1`` (``expert_owner``).
Every rank holds ``T`` tokens of width ``h``; the router sends each token to ``k`` experts.

Capacity. Each expert accepts at most ``C = ceil(cf * k * T_total / E)`` token copies per
step, ``T_total`` being the tokens of the whole EP group (``capacity``). Copies beyond ``C``
are dropped *before* the dispatch, so they are never sent.

Bytes. The dispatch all-to-all sends every kept copy (one row of ``h`` elements of ``q``
bytes) from its home rank to the expert's owner; the return all-to-all sends the expert's
output row back. Rows whose expert lives on their own rank stay there. So, with
``n[s][d]`` = kept copies travelling from rank ``s`` to rank ``d`` (``rank_matrix``):

* dispatch, rank ``r`` sends ``sum_{d != r} n[r][d] * h * q``;
* return, rank ``r`` sends ``sum_{s != r} n[s][r] * h * q``;

and backward runs both again in the opposite direction, doubling each rank's total
(``a2a_sent_bytes``). Under uniform routing and no drops, each copy lands on a given rank
with probability ``1/ep``, so the expected per-rank bytes of one all-to-all are
``k*T*h*q*(ep-1)/ep`` = ``comm.ring_sent_bytes("all_to_all", k*T*h*q, ep)``
(``expected_a2a_sent_bytes``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from fractions import Fraction

from . import _validate as v
from .comm import ring_sent_bytes

__all__ = [
    "check_moe",
    "capacity",
    "expert_owner",
    "rank_matrix",
    "a2a_sent_bytes",
    "expected_a2a_sent_bytes",
]


def check_moe(num_experts: int, ep: int, top_k: int, capacity_factor: float) -> None:
    """Raise ``ValueError`` naming the values if this MoE layout is impossible."""
    e = v.positive_int("num_experts", num_experts)
    p = v.positive_int("ep", ep)
    k = v.positive_int("top_k", top_k)
    v.number("capacity_factor", capacity_factor)  # must be > 0
    if e % p:
        raise ValueError(f"num_experts={e} is not divisible by the expert-parallel degree ep={p}")
    if k > e:
        raise ValueError(f"top_k={k} exceeds num_experts={e}: a token cannot pick more experts")


def capacity(tokens_total: int, num_experts: int, top_k: int, capacity_factor: float) -> int:
    """Token copies one expert accepts per step: ``ceil(cf * k * T_total / E)``.

    ``capacity_factor`` is read as the decimal the caller wrote (``Fraction(str(cf))``), so
    ``cf=1.1`` gives exactly ``1.1 * k * T / E`` before rounding up, not a float's neighbour.
    """
    t = v.positive_int("tokens_total", tokens_total)
    e = v.positive_int("num_experts", num_experts)
    k = v.positive_int("top_k", top_k)
    cf = v.number("capacity_factor", capacity_factor)
    if k > e:
        raise ValueError(f"top_k={k} exceeds num_experts={e}")
    return math.ceil(Fraction(str(cf)) * k * t / e)


def expert_owner(expert: int, num_experts: int, ep: int) -> int:
    """The EP rank that owns ``expert`` (contiguous blocks of ``E/ep`` experts)."""
    e = v.positive_int("num_experts", num_experts)
    p = v.positive_int("ep", ep)
    x = v.nonneg_int("expert", expert)
    if e % p:
        raise ValueError(f"num_experts={e} is not divisible by the expert-parallel degree ep={p}")
    if x >= e:
        raise ValueError(f"expert={x} is outside 0..{e - 1}")
    return x // (e // p)


def _counts(kept: Sequence[Sequence[int]]) -> tuple[list[list[int]], int, int]:
    rows = [list(r) for r in kept]
    if not rows or not rows[0]:
        raise ValueError("kept must be a non-empty ep x E matrix of token-copy counts")
    n_exp = len(rows[0])
    if any(len(r) != n_exp for r in rows):
        raise ValueError(f"kept rows have different lengths {[len(r) for r in rows]}")
    for s, r in enumerate(rows):
        for x, c in enumerate(r):
            v.nonneg_int(f"kept[{s}][{x}]", c)
    return rows, len(rows), n_exp


def rank_matrix(kept: Sequence[Sequence[int]]) -> list[list[int]]:
    """``n[s][d]``: token copies rank ``s`` sends to rank ``d`` in the dispatch.

    ``kept[s][x]`` = copies of rank ``s``'s tokens that expert ``x`` accepted (after
    capacity); its rows are the ``ep`` ranks, its columns the ``E`` experts.
    """
    rows, ep, n_exp = _counts(kept)
    if n_exp % ep:
        raise ValueError(
            f"num_experts={n_exp} (columns of kept) is not divisible by ep={ep} (rows of kept)"
        )
    per = n_exp // ep
    return [[sum(r[d * per : (d + 1) * per]) for d in range(ep)] for r in rows]


def a2a_sent_bytes(
    kept: Sequence[Sequence[int]], hidden: int, bytes_per_elem: int, backward: bool = False
) -> list[int]:
    """Per-rank bytes sent by the dispatch and the return all-to-all of one MoE layer.

    Forward only by default; ``backward=True`` adds the two all-to-alls of the backward pass
    (the same rows again, in the opposite direction), doubling every rank's total.
    """
    h = v.positive_int("hidden", hidden)
    q = v.positive_int("bytes_per_elem", bytes_per_elem)
    v.flag("backward", backward)
    n = rank_matrix(kept)
    ep = len(n)
    row = h * q
    out = []
    for r in range(ep):
        dispatch = sum(n[r][d] for d in range(ep) if d != r)  # my tokens to other owners
        ret = sum(n[s][r] for s in range(ep) if s != r)  # outputs of my experts sent home
        out.append((dispatch + ret) * row * (2 if backward else 1))
    return out


def expected_a2a_sent_bytes(
    tokens_per_rank: int,
    top_k: int,
    hidden: int,
    bytes_per_elem: int,
    ep: int,
    backward: bool = False,
) -> float:
    """Expected per-rank bytes of dispatch + return under uniform routing and no drops.

    Each all-to-all: ``comm.ring_sent_bytes("all_to_all", k*T*h*q, ep)`` = ``k*T*h*q*(ep-1)/ep``.
    """
    t = v.positive_int("tokens_per_rank", tokens_per_rank)
    k = v.positive_int("top_k", top_k)
    h = v.positive_int("hidden", hidden)
    q = v.positive_int("bytes_per_elem", bytes_per_elem)
    p = v.positive_int("ep", ep)
    v.flag("backward", backward)
    one = ring_sent_bytes("all_to_all", k * t * h * q, p)
    return 2 * one * (2 if backward else 1)
