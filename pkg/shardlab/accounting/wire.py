"""What a backend's own collective algorithms send per rank, beside the ring model.

:func:`shardlab.accounting.comm.ring_sent_bytes` is the textbook ring: the bytes an
algorithm *should* need. Libraries choose their own algorithms, and on the wire the
difference can be a factor of two. This module holds the per-rank payload of the algorithms
that the backends really run, so that measured wire bytes (``shardlab.runtime.wire``) can be
compared with a formula instead of with a guess. ``V`` is the full tensor as in
``accounting.comm`` (all-gather output, reduce-scatter input, all-reduce tensor, one rank's
all-to-all input, broadcast tensor), ``D`` the group size, ``c = (D-1)/D``.

gloo (torch 2.x ``ProcessGroupGloo``, TCP transport; measured with ``shardlab.runtime.wire``)::

    all_reduce       2 V c      ring: reduce-scatter pass + all-gather pass
    reduce_scatter   2 V c      implemented as an all-reduce of the whole input, after which
                                each rank keeps its slice: twice the ring model V c
    all_gather       V c        ring
    all_to_all       V c        every rank sends its D-1 foreign chunks directly
    broadcast        k V        binomial tree: a rank sends the whole tensor to each of its
                                k children; the root has ceil(log2 D) children at most,
                                leaves have none (:func:`binomial_children`)

Control overhead (:data:`GLOO_PREAMBLE_BYTES`): gloo's TCP pairs put a 48-byte preamble in
front of every message and exchange 48-byte notifications: a receive always tells the sender
"ready to receive"; a send tells the receiver "ready to send" only if the receiver's
notification has not arrived yet, which depends on timing. So the wire carries the payload
above plus a multiple of 48 bytes that can change by a few notifications from run to run
(:func:`gloo_p2p_control_bytes` gives the band for point-to-point messages). Collectives split
large tensors into more messages, so their control bytes grow slowly with size (about 0.02 %
of the payload at 1-100 MB; tests/test_wire_collectives.py bounds it).

nccl (its ring algorithms, from NCCL's documentation; *not* measured here, because NVLink
and InfiniBand traffic never passes through the process's sockets)::

    all_reduce 2 V c, reduce_scatter V c, all_gather V c, all_to_all V c (ring model);
    broadcast  V      pipelined chain from the root: every rank sends V except the last
                      one in ring order, rank (root - 1) mod D, which sends nothing.

NCCL may pick a tree for all-reduce; a double binary tree also sends about 2 V per rank.
"""

from __future__ import annotations

from . import _validate as v
from .comm import COLLECTIVES, ring_sent_bytes

BACKENDS = ("gloo", "nccl")
GLOO_PREAMBLE_BYTES = 48  # gloo::transport::tcp Op preamble: six 8-byte fields


def _rank_root(rank, root, d) -> tuple[int, int]:
    r = v.nonneg_int("rank", rank)
    s = v.nonneg_int("root", root)
    if r >= d or s >= d:
        raise ValueError(f"rank={r} and root={s} must both be < group_size={d}")
    return r, s


def binomial_children(rank: int, root: int, group_size: int) -> int:
    """Children of ``rank`` in a binomial broadcast tree rooted at ``root`` on ``D`` ranks.

    With relative rank ``u = (rank - root) mod D``, rank ``u`` sends to ``u + 2^j`` for every
    ``2^j > u`` with ``u + 2^j < D``. The root (``u = 0``) has ``ceil(log2 D)`` children.
    """
    d = v.positive_int("group_size", group_size)
    r, s = _rank_root(rank, root, d)
    u = (r - s) % d
    step = 1 if u == 0 else 1 << u.bit_length()
    n = 0
    while u + step < d:
        n, step = n + 1, step * 2
    return n


def gloo_sent_bytes(op: str, nbytes: float, group_size: int, rank: int = 0, root: int = 0) -> float:
    """Payload bytes ``rank`` sends in gloo's algorithm for ``op`` (``V = nbytes``).

    ``root`` matters only for ``broadcast``. Exact when ``D`` divides the element count; with
    uneven chunks gloo's per-rank bytes differ from this by a few elements.
    """
    op = v.choice("op", op, COLLECTIVES)
    nb = v.nonneg_number("nbytes", nbytes)
    d = v.positive_int("group_size", group_size)
    r, s = _rank_root(rank, root, d)
    if d == 1:
        return 0.0
    if op == "reduce_scatter":  # all-reduce of the whole input
        return ring_sent_bytes("all_reduce", nb, d)
    if op == "broadcast":
        return float(nb) * binomial_children(r, s, d)
    return ring_sent_bytes(op, nb, d)


def nccl_sent_bytes(op: str, nbytes: float, group_size: int, rank: int = 0, root: int = 0) -> float:
    """Payload bytes ``rank`` sends in NCCL's ring algorithm for ``op`` (not measured here)."""
    op = v.choice("op", op, COLLECTIVES)
    nb = v.nonneg_number("nbytes", nbytes)
    d = v.positive_int("group_size", group_size)
    r, s = _rank_root(rank, root, d)
    if op == "broadcast":
        return 0.0 if d == 1 or r == (s - 1) % d else float(nb)
    return ring_sent_bytes(op, nb, d)


def backend_sent_bytes(
    backend: str, op: str, nbytes: float, group_size: int, rank: int = 0, root: int = 0
) -> float:
    """:func:`gloo_sent_bytes` or :func:`nccl_sent_bytes` by ``backend`` name."""
    b = v.choice("backend", backend, BACKENDS)
    fn = gloo_sent_bytes if b == "gloo" else nccl_sent_bytes
    return fn(op, nbytes, group_size, rank, root)


def gloo_p2p_control_bytes(sends: int, recvs: int = 0) -> tuple[int, int]:
    """Least and most control bytes gloo writes for ``sends`` messages and ``recvs`` receives.

    Each send writes a 48-byte preamble, plus a 48-byte "ready to send" notification when the
    peer has not posted its receive yet; each receive writes one 48-byte notification.
    """
    s = v.nonneg_int("sends", sends)
    r = v.nonneg_int("recvs", recvs)
    return GLOO_PREAMBLE_BYTES * (s + r), GLOO_PREAMBLE_BYTES * (2 * s + r)
