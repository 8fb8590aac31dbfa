"""Context parallelism: bytes sent per layer and per-rank attention memory.

A context group of ``c`` ranks holds ``s/c`` tokens of every sequence. Attention needs every
key and value, so ``K`` and ``V`` travel:

* ``"ring"`` (ring attention): ``c-1`` hops of one ``K`` and one ``V`` block per pass; in the
  backward pass ``K``/``V`` travel again and the accumulated ``dK``/``dV`` of every block
  travel ``c-1`` hops back to their owner;
* ``"all_gather"``: one all-gather of ``K`` and ``V`` in the forward pass; the backward pass
  gathers them again (nothing but the local shard is kept between the passes) and
  reduce-scatters ``dK``/``dV``.

Both move the same bytes per rank. In units of one ring all-gather of the *local head slice*
of ``K`` and ``V`` over the whole sequence, ``U = 2 q b s h_kv (c-1)/c`` with
``h_kv = kv_heads_per_rank(kv_heads, t) * head_dim``: forward ``U``, backward ``2U``, step
``3U``. The causal mask and the zig-zag layout change the work, not the bytes (every block
still travels, masked or not).

Grouped-query attention enters through ``kv_heads``: ``K`` and ``V`` have ``kv_heads`` heads
however many query heads there are. With tensor parallelism of degree ``t`` each rank holds
``kv_heads / t`` of them (one head, replicated, when ``t`` is a multiple of ``kv_heads``), so
Llama 3 405B (8 K/V heads, ``t = 8``) sends one head's worth per rank.
"""

from __future__ import annotations

from . import _validate as v
from .comm import ring_sent_bytes

VARIANTS = ("ring", "all_gather")
PHASES = ("forward", "backward", "step")
# number of K/V-sized ring all-gathers (or reduce-scatters) per phase
_UNITS = {"forward": 1, "backward": 2, "step": 3}


def kv_heads_per_rank(kv_heads: int, t: int = 1) -> int:
    """K/V heads one tensor-parallel rank holds: ``kv_heads / t``, or 1 if ``t`` is a multiple."""
    kv = v.positive_int("kv_heads", kv_heads)
    tt = v.positive_int("t", t)
    if kv % tt == 0:
        return kv // tt
    if tt % kv == 0:  # more TP ranks than K/V heads: each rank keeps a replica of one head
        return 1
    raise ValueError(f"t={tt} and kv_heads={kv}: one must divide the other")


def check_sequence(s: int, c: int, zigzag: bool = False) -> tuple[int, int]:
    """Validate that ``c`` (``2c`` with zig-zag) divides ``s``; return ``(s, c)``."""
    ss = v.positive_int("s", s)
    cc = v.positive_int("c", c)
    if v.flag("zigzag", zigzag) and ss % (2 * cc):
        raise ValueError(f"zig-zag needs 2c = {2 * cc} (c={cc}) to divide the sequence s={ss}")
    if ss % cc:
        raise ValueError(f"c={cc} does not divide the sequence s={ss}")
    return ss, cc


def kv_bytes(b: int, s: int, kv_heads: int, head_dim: int, q: float = 2, t: int = 1) -> float:
    """Bytes of ``K`` and ``V`` of ``s`` tokens on one TP rank: ``2 q b s h_kv``."""
    bb = v.positive_int("b", b)
    ss = v.positive_int("s", s)
    d = v.positive_int("head_dim", head_dim)
    qq = v.number("q", q)
    return 2 * qq * bb * ss * kv_heads_per_rank(kv_heads, t) * d


def cp_volume(
    b: int,
    s: int,
    kv_heads: int,
    head_dim: int,
    c: int,
    q: float = 2,
    t: int = 1,
    variant: str = "ring",
    phase: str = "step",
    layers: int = 1,
    microbatches: int = 1,
) -> float:
    """Per-rank bytes sent by context parallelism: ``units * 2 q b s h_kv (c-1)/c``.

    ``phase``: ``"forward"`` (1 unit: K/V all-gathered or passed around the ring),
    ``"backward"`` (2 units: K/V again, and dK/dV reduce-scattered or sent home along the
    ring) or ``"step"`` (3 units). ``variant`` is ``"ring"`` or ``"all_gather"``; they send the
    same bytes (see the module docstring). ``h_kv = kv_heads_per_rank(kv_heads, t) * head_dim``.
    """
    v.choice("variant", variant, VARIANTS)
    ph = v.choice("phase", phase, PHASES)
    ss, cc = check_sequence(s, c)
    L = v.positive_int("layers", layers)
    m = v.positive_int("microbatches", microbatches)
    unit = ring_sent_bytes("all_gather", kv_bytes(b, ss, kv_heads, head_dim, q, t), cc)
    return _UNITS[ph] * unit * L * m


def attention_memory(
    b: int,
    s: int,
    heads: int,
    kv_heads: int,
    head_dim: int,
    c: int,
    variant: str = "ring",
    q: float = 4,
) -> dict[str, float]:
    """Peak bytes one rank allocates inside a (non-causal) CP attention forward, by term.

    Counts the tensors of the lab's implementation (``labs/07_context/ring_attention.py``);
    the rank's own ``q, k, v`` shards are inputs and not counted. ``n = s/c`` local tokens,
    ``h = heads``, ``h_kv = kv_heads``, ``d = head_dim``, ``q`` bytes per element:

    * ``kv_buffers``: received K/V. Ring: the block being computed on and the block arriving,
      ``min(2, c-1)`` blocks of ``2 q b n h_kv d``. All-gather: the whole sequence's K and V,
      ``2 q b s h_kv d``.
    * ``scores``: one block's score matrix, ``q b h n n_k`` with ``n_k = n`` (ring) or ``s``
      (all-gather): the only term that grows with ``s^2``.
    * ``rows``: tensors with one entry per query row and head. Ring: the running output and
      log-sum-exp, the block's output and log-sum-exp, and the merge's temporaries (one
      output-sized product, four row vectors): ``(3d + 6) q b h n``. All-gather: the block's
      output and four row vectors (max, sum, its log, log-sum-exp): ``(d + 4) q b h n``.
    * ``positions``: int64 token positions of the queries and of the keys in use:
      ``8 (n + n_k)``.

    A causal mask only removes work (and adds a boolean mask on diagonal blocks); the
    prediction is for the non-causal case.
    """
    var = v.choice("variant", variant, VARIANTS)
    ss, cc = check_sequence(s, c)
    bb, hh, kv, d = (v.positive_int(k, x) for k, x in (
        ("b", b), ("heads", heads), ("kv_heads", kv_heads), ("head_dim", head_dim)))
    qq = v.number("q", q)
    if hh % kv:
        raise ValueError(f"kv_heads={kv} does not divide heads={hh}")
    n = ss // cc
    if var == "ring":
        nk, kv_buf, rows = n, min(2, cc - 1) * 2 * qq * bb * n * kv * d, (3 * d + 6)
    else:
        nk, kv_buf, rows = ss, 2 * qq * bb * ss * kv * d, (d + 4)
    terms = {
        "kv_buffers": kv_buf,
        "scores": qq * bb * hh * n * nk,
        "rows": rows * qq * bb * hh * n,
        "positions": 8 * (n + nk),
    }
    terms["total"] = sum(terms.values())
    return terms
