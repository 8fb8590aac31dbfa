"""Given helpers of lab 07: attention of queries over one K/V block, forward and backward.

Both work on the *visible box* of a block: under a causal mask, the rows (queries) that see at
least one key and the keys that at least one of them sees. Positions increase within a shard
(contiguous and zig-zag alike), so the visible rows are a suffix and the visible keys a
prefix; only that box is computed, which is what makes a zig-zag off-diagonal block half a
block of work. Grouped-query attention: the ``g = h / h_kv`` query heads of one K/V head are
stacked as rows, so one matmul serves them all and K/V are never copied ``g`` times.
Everything is plain PyTorch (two matmuls and a softmax per block); on GPUs a fused kernel
(FlashAttention, which also returns the log-sum-exp) plays this part.
"""

from __future__ import annotations

import torch

__all__ = ["block_attention", "block_grads"]


def _box(q_pos: torch.Tensor, k_pos: torch.Tensor, causal: bool):
    """Rows ``[r0, n_q)`` x keys ``[0, k1)`` that contain every visible pair, and the mask
    inside that box (None when all of it is visible); None when nothing is visible.
    Positions are increasing within a shard, so visible rows are a suffix, keys a prefix."""
    if not causal:
        return 0, len(k_pos), None
    rows = q_pos >= k_pos.min()  # a row sees something iff it is not before every key
    cols = k_pos <= q_pos.max()
    if not rows.any():
        return None
    r0, k1 = int(rows.numel() - rows.sum()), int(cols.sum())
    if not (rows[r0:].all() and cols[:k1].all()):  # not sorted (gathered zig-zag keys)
        r0, k1 = 0, len(k_pos)
    mask = k_pos[None, :k1] <= q_pos[r0:, None]  # (m, k1)
    return r0, k1, (None if bool(mask.all()) else mask)


def _grouped(x: torch.Tensor, kv_heads: int) -> torch.Tensor:
    # (b, h, m, d) -> (b, h_kv, g*m, d): the g query heads of one K/V head stacked as rows,
    # so one matmul with (b, h_kv, d, n_k) serves them all without copying K or V g times
    b, h, m, d = x.shape
    return x.reshape(b, kv_heads, (h // kv_heads) * m, d)


def block_attention(q, k, v, q_pos, k_pos, causal: bool, scale: float):
    """Attention of queries ``q`` over one K/V block, normalised within the block.

    Returns ``(r0, out, lse)``: rows ``r0:`` of ``q`` see at least one key, ``out``
    ``(b, h, n_q - r0, d)``, ``lse`` ``(b, h, n_q - r0)`` (log-sum-exp of the scores); or
    None if no query sees any key. Only the visible box is computed (this is what makes
    zig-zag balanced: an off-diagonal zig-zag block is half a block of work).
    """
    box = _box(q_pos, k_pos, causal)
    if box is None:
        return None
    r0, k1, mask = box
    b, h, _, d = q.shape
    hk = k.shape[1]
    qg = _grouped(q[:, :, r0:], hk)  # (b, h_kv, g*m, d)
    scores = torch.matmul(qg, k[:, :, :k1].transpose(-1, -2)).mul_(scale)  # (b, h_kv, g*m, k1)
    if mask is not None:
        scores.view(b, hk, h // hk, -1, k1).masked_fill_(~mask.to(scores.device), float("-inf"))
    mx = scores.amax(-1, keepdim=True)  # the block's running max: exponents stay <= 0
    p = scores.sub_(mx).exp_()
    denom = p.sum(-1, keepdim=True)
    out = torch.matmul(p, v[:, :, :k1]).div_(denom)  # (b, h_kv, g*m, d)
    lse = (mx + denom.log()).squeeze(-1)
    m = q.shape[2] - r0
    return r0, out.view(b, h, m, d), lse.view(b, h, m)


def block_grads(q, k, v, dout, lse, delta, q_pos, k_pos, causal: bool, scale: float):
    """Gradient contributions of one K/V block, given the *final* ``lse`` and
    ``delta = rowsum(dout * out)`` of the whole attention (the softmax of the block is then
    ``exp(scores - lse)``, exactly its share of the full softmax).

    Returns ``(r0, dq, k1, dk, dv)``: ``dq`` for rows ``r0:`` and ``dk``/``dv`` for keys
    ``:k1`` of the block, or None if nothing is visible.
    """
    box = _box(q_pos, k_pos, causal)
    if box is None:
        return None
    r0, k1, mask = box
    b, h, _, d = q.shape
    hk = k.shape[1]
    qg, dog = _grouped(q[:, :, r0:], hk), _grouped(dout[:, :, r0:], hk)  # (b, h_kv, g*m, d)
    kb, vb = k[:, :, :k1], v[:, :, :k1]
    scores = torch.matmul(qg, kb.transpose(-1, -2)).mul_(scale)  # (b, h_kv, g*m, k1)
    if mask is not None:
        scores.view(b, hk, h // hk, -1, k1).masked_fill_(~mask.to(scores.device), float("-inf"))
    p = scores.sub_(_grouped(lse[:, :, r0:, None], hk)).exp_()  # share of the full softmax
    dv = torch.matmul(p.transpose(-1, -2), dog)  # (b, h_kv, k1, d), summed over the g heads
    ds = torch.matmul(dog, vb.transpose(-1, -2))  # dP
    ds.sub_(_grouped(delta[:, :, r0:, None], hk)).mul_(p).mul_(scale)  # dS = P (dP - delta)
    dq = torch.matmul(ds, kb)  # (b, h_kv, g*m, d)
    dk = torch.matmul(ds.transpose(-1, -2), qg)  # (b, h_kv, k1, d)
    m = q.shape[2] - r0
    return r0, dq.view(b, h, m, d), k1, dk, dv
