"""Communication volume and alpha-beta time of collectives and of whole training steps.

Conventions (lecture 8, "The network is part of the computation" and "FSDP trades storage
lifetime for communication"; Rajbhandari et al., *ZeRO*, Sec. 7; Narayanan et al.,
*Megatron-LM*, 2021; Korthikanti et al., 2022, Sec. 4.2.2):

* ``nbytes`` (written V) is the size of the **full** tensor: the all-gather output, the
  reduce-scatter input, the all-reduce tensor, one rank's all-to-all input, the broadcast
  tensor. ``D`` is the group size. Volumes are **bytes sent per rank**; received bytes are
  comparable and are not added a second time.

Ring model, per-rank sent bytes (:func:`ring_sent_bytes`)::

    all_gather, reduce_scatter   V (D-1)/D      (D-1 steps, one V/D chunk each)
    all_reduce                   2 V (D-1)/D    (reduce-scatter then all-gather)
    all_to_all                   V (D-1)/D      (keep own 1/D, send the rest)
    broadcast                    V              (pipelined ring: the root sends V and every
                                                 rank but the last forwards V; the value is
                                                 the per-rank maximum, the root's)

With ``D = 1`` nothing is sent. Rounds (:func:`rounds`), i.e. sequential latency steps:
``ring``: all_gather/reduce_scatter/all_to_all/broadcast ``D-1``, all_reduce ``2(D-1)``;
``tree`` with ``k = ceil(log2 D)``: all_gather (recursive doubling), reduce_scatter
(recursive halving), broadcast (binomial tree), all_to_all (Bruck) ``k``; all_reduce
(halving then doubling, Rabenseifner) ``2k``. Time (:func:`alpha_beta_time`)::

    T = rounds * alpha + V_sent / beta

where ``V_sent`` is the ring volume above for ring; for tree it is the bytes on the critical
path: the same as ring for all_gather/reduce_scatter/all_reduce, ``k V`` for the binomial
broadcast (the root sends the whole tensor every round) and ``k V / 2`` for Bruck
all-to-all. For D not a power of two the tree counts are the usual ceiling approximation.
``alpha`` is seconds per round, ``beta`` bytes per second. :func:`collectives_time` is the
time of ``count`` such collectives in sequence (``count`` times the above), and
:func:`p2p_time` the same model for point-to-point messages: ``messages * alpha + V / beta``.

Step volumes, per rank per optimizer step, ``q`` bytes per element for both parameters and
communicated gradients, ``c = (D-1)/D`` (:func:`step_volume`)::

    ddp          2 q N c    (gradient all-reduce)
    zero1/zero2  2 q N c    (gradient reduce-scatter + parameter all-gather)
    zero3        3 q N c    (all-gather for forward, again for backward, reduce-scatter)
    zero3, keep  2 q N c    (reshard_after_forward=False: no backward all-gather)

Tensor parallelism (:func:`tp_volume`): 2 all-reduces forward + 2 backward on ``b s h``
elements per layer per microbatch: ``8 q b s h (t-1)/t``. With sequence parallelism each
all-reduce becomes an all-gather + reduce-scatter pair, so the volume is the same.
"""

from __future__ import annotations

import math

from . import _validate as v

COLLECTIVES = ("all_gather", "reduce_scatter", "all_reduce", "all_to_all", "broadcast")
ALGOS = ("ring", "tree")
STEP_LAYOUTS = ("ddp", "zero1", "zero2", "zero3")


def _frac(d: int) -> float:
    return (d - 1) / d


def ring_sent_bytes(op: str, nbytes: float, group_size: int) -> float:
    """Per-rank sent bytes of ``op`` on a ring of ``group_size`` ranks (V = full tensor)."""
    op = v.choice("op", op, COLLECTIVES)
    nb = v.nonneg_number("nbytes", nbytes)
    d = v.positive_int("group_size", group_size)
    return _ring_sent(op, nb, d)


def _ring_sent(op: str, nb: float, d: int) -> float:
    # ring_sent_bytes without its checks, for callers that checked the inputs once (the
    # planner's search); _ring_collectives below is collectives_time + sent_bytes the same way
    if d == 1:
        return 0.0
    if op == "all_reduce":
        return 2 * nb * _frac(d)
    if op == "broadcast":
        return float(nb)
    return nb * _frac(d)


def _ring_collectives(op: str, nb: float, d: int, count: int, alpha: float,
                      beta: float) -> tuple[float, float]:
    """``(collectives_time(op, nb, d, count, alpha, beta), count * sent_bytes(op, nb, d))``
    on the ring, without the checks: the same arithmetic, so the same floats."""
    sent = _ring_sent(op, nb, d)
    return count * _alpha_beta(_rounds(op, d, "ring"), sent, alpha, beta), count * sent


def _log2_ceil(d: int) -> int:
    return (d - 1).bit_length()


def rounds(op: str, group_size: int, algo: str = "ring") -> int:
    """Sequential communication rounds (latency terms) of ``op`` on ``group_size`` ranks."""
    op = v.choice("op", op, COLLECTIVES)
    d = v.positive_int("group_size", group_size)
    algo = v.choice("algo", algo, ALGOS)
    return _rounds(op, d, algo)


def _rounds(op: str, d: int, algo: str) -> int:
    # rounds without its checks (see _ring_sent)
    steps = d - 1 if algo == "ring" else _log2_ceil(d)
    return 2 * steps if op == "all_reduce" else steps


def sent_bytes(op: str, nbytes: float, group_size: int, algo: str = "ring") -> float:
    """Bytes on the critical path of ``op`` under ``algo`` (ring: per-rank sent bytes)."""
    algo = v.choice("algo", algo, ALGOS)
    ring = ring_sent_bytes(op, nbytes, group_size)
    if algo == "ring" or op in ("all_gather", "reduce_scatter", "all_reduce"):
        return ring
    k = _log2_ceil(int(group_size))
    if op == "broadcast":
        return k * float(nbytes)
    return k * float(nbytes) / 2  # Bruck all-to-all: half the buffer moves each round


def alpha_beta_time(
    op: str, nbytes: float, group_size: int, alpha: float, beta: float, algo: str = "ring"
) -> float:
    """``rounds * alpha + sent_bytes / beta`` in seconds (alpha s/round, beta bytes/s)."""
    a = v.nonneg_number("alpha", alpha)
    b = v.number("beta", beta)
    t = _alpha_beta(rounds(op, group_size, algo), sent_bytes(op, nbytes, group_size, algo), a, b)
    if t == math.inf:  # each input is bounded, not their quotient: 1e30 bytes at 1e-291 B/s
        raise ValueError(f"nbytes={nbytes!r} at beta={beta!r} bytes/s (alpha={alpha!r} s, "
                         f"group_size={group_size!r}) takes more time than a float holds")
    return t


def _alpha_beta(rounds_: int, sent: float, alpha: float, beta: float) -> float:
    # the alpha-beta formula itself, shared by alpha_beta_time and _ring_collectives
    return rounds_ * alpha + sent / beta


def collectives_time(
    op: str,
    nbytes_each: float,
    group_size: int,
    count: int,
    alpha: float,
    beta: float,
    algo: str = "ring",
) -> float:
    """Seconds for ``count`` sequential collectives ``op`` of ``nbytes_each`` bytes each.

    ``count * alpha_beta_time(op, nbytes_each, ...)``: splitting a volume ``V`` into ``n``
    collectives of ``V/n`` keeps the bandwidth term and multiplies the latency term by ``n``.
    ``count = 0`` gives 0. With ``nbytes_each = 0`` the result is the latency part alone.
    """
    n = v.nonneg_int("count", count)
    return n * alpha_beta_time(op, nbytes_each, group_size, alpha, beta, algo)


def p2p_time(nbytes: float, alpha: float, beta: float, messages: int = 1) -> float:
    """Seconds to send ``nbytes`` in total as ``messages`` point-to-point messages.

    ``T = messages * alpha + nbytes / beta`` (alpha s per message, beta bytes/s), e.g. the
    boundary activations and activation gradients a pipeline stage exchanges with its
    neighbours (:func:`pipeline_p2p_volume`, ``2 m`` messages per step for ``v = 1``).
    Bytes without a message to carry them (``messages = 0``, ``nbytes > 0``) raise.
    """
    nb = v.nonneg_number("nbytes", nbytes)
    a = v.nonneg_number("alpha", alpha)
    b = v.number("beta", beta)
    k = v.nonneg_int("messages", messages)
    if k == 0 and nb > 0:
        raise ValueError(f"messages=0 cannot carry nbytes={nbytes!r}")
    return k * a + nb / b


def step_volume(
    layout: str, n_params: int, dp: int, q: float = 2, reshard_after_forward: bool = True
) -> float:
    """Per-rank sent bytes for one forward/backward/update step of a data-parallel layout."""
    return grad_accum_volume(layout, n_params, dp, q, 1, True, reshard_after_forward)


def grad_accum_volume(
    layout: str,
    n_params: int,
    dp: int,
    q: float,
    microbatches: int,
    sync_every_microbatch: bool,
    reshard_after_forward: bool = True,
    *,
    keep_weights: bool = False,
) -> float:
    """Per-rank sent bytes per optimizer update with ``m`` accumulated microbatches.

    In units of ``U = q N (D-1)/D`` (one all-gather or reduce-scatter of all parameters):

    * ddp: all-reduce (2U) every microbatch if syncing, else once: ``2mU`` or ``2U``.
    * zero1/zero2: gradient reduce-scatter every microbatch or once, plus one parameter
      all-gather after the update: ``(m+1)U`` or ``2U``. (ZeRO-2 without per-microbatch sync
      must keep a full unsharded local gradient buffer, which gives up its memory saving.)
    * zero3: ``g`` parameter all-gathers per microbatch (``g = 2`` with reshard-after-forward,
      1 without) plus a gradient reduce-scatter every microbatch or once:
      ``(g m + m)U`` or ``(g m + 1)U``. The optimizer updates its own shard, so no
      all-gather follows the update. (FSDP ``no_sync`` keeps unsharded gradients to do this.)
      ``reshard_after_forward=False`` keeps a unit's weights from its forward to its own
      backward *within* one microbatch (``g = 1``).
    * zero3 with ``keep_weights=True``: the gathered weights are kept *across* the
      microbatches (resharded neither after forward nor after backward until the update),
      so one all-gather per update: ``(1 + m)U`` or ``2U`` -- DDP's volume, at the memory
      of a full replica of the weights. Requires ``reshard_after_forward=False``; zero3 only.

    With ``m = 1`` this is :func:`step_volume`.
    """
    layout = v.choice("layout", layout, STEP_LAYOUTS)
    n = v.positive_int("n_params", n_params)
    d = v.positive_int("dp", dp)
    qq = v.number("q", q)
    m = v.positive_int("microbatches", microbatches)
    sync = v.flag("sync_every_microbatch", sync_every_microbatch)
    reshard = v.flag("reshard_after_forward", reshard_after_forward)
    if v.flag("keep_weights", keep_weights) and (layout != "zero3" or reshard):
        raise ValueError(
            f"keep_weights=True needs layout='zero3' and reshard_after_forward=False "
            f"(got layout={layout!r}, reshard_after_forward={reshard})"
        )
    unit = qq * n * _frac(d)
    reductions = m if sync else 1
    if layout == "ddp":
        return 2 * reductions * unit
    if layout in ("zero1", "zero2"):
        return (reductions + 1) * unit
    gathers = 1 if keep_weights else m * (2 if reshard else 1)
    return (gathers + reductions) * unit


def tp_volume(
    b: int,
    s: int,
    h: int,
    t: int,
    q: float = 2,
    layers: int = 1,
    sp: bool = False,
    microbatches: int = 1,
) -> float:
    """Per-rank sent bytes of tensor parallelism: ``8 q b s h (t-1)/t`` per layer per microbatch.

    ``sp=True`` (sequence parallelism) replaces each all-reduce by all-gather + reduce-scatter
    on the same ``b s h`` tensor; the ring volume is identical, so the result is too.
    """
    bb, ss, hh = (v.positive_int(k, x) for k, x in (("b", b), ("s", s), ("h", h)))
    tt = v.positive_int("t", t)
    qq = v.number("q", q)
    L = v.positive_int("layers", layers)
    m = v.positive_int("microbatches", microbatches)
    v.flag("sp", sp)
    return 8 * qq * bb * ss * hh * _frac(tt) * L * m


def pipeline_p2p_volume(
    b: int, s: int, h: int, q: float = 2, microbatches: int = 1, chunks: int = 1
) -> float:
    """Bytes sent per step by an interior pipeline stage: ``2 v m q b s h``.

    Each microbatch sends its ``b s h`` boundary activation forward and receives it back as
    an activation gradient, which the stage forwards upstream. First and last stages send
    half of this (only forward or only backward). With ``chunks = v`` interleaved model
    chunks per rank, every microbatch crosses ``v`` times as many rank boundaries.
    """
    bb, ss, hh = (v.positive_int(k, x) for k, x in (("b", b), ("s", s), ("h", h)))
    qq = v.number("q", q)
    m = v.positive_int("microbatches", microbatches)
    c = v.positive_int("chunks", chunks)
    return 2 * c * m * qq * bb * ss * hh
