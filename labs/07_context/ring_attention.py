"""Lab 07 — context parallelism: ring attention (forward and backward) and zig-zag shards.

What is sharded. The sequence: each of the ``c`` ranks of a context group holds ``n = s/c``
tokens of ``Q``, ``K`` and ``V`` (shapes ``(b, h, n, d)`` for ``Q`` and ``(b, h_kv, n, d)``
for ``K``/``V``; ``h_kv`` divides ``h``: grouped-query attention, query head ``i`` uses K/V
head ``i // (h / h_kv)``). Contiguous layout: rank ``r`` holds positions
``[r n, (r+1) n)``. Zig-zag layout: the sequence is cut into ``2c`` chunks and rank ``r``
holds chunks ``r`` and ``2c-1-r``, so under a causal mask every rank has the same work.
Replicated: nothing (there are no weights here).

Which messages run, when (``RingAttention``, ``c`` ranks in a ring ``r -> r+1``):

* forward: in each of the ``c`` steps a rank computes its queries against the K/V block it
  holds while (``isend``/``irecv``, posted *before* the computation) passing that block to
  the right and receiving the next from the left; ``c-1`` hops. Partial results are folded
  into a running output and log-sum-exp (online softmax, :func:`merge_partials`);
* backward (its own ring pass, not autograd through the forward's messages): K/V travel the
  ring again; each rank adds its ``dK``/``dV`` contribution for the block it holds into an
  accumulator that travels with the block one step behind, ``c-1`` hops, and arrives at the
  block's owner after the last step.

``AllGatherAttention`` instead all-gathers K/V (forward), gathers them again in backward and
reduce-scatters ``dK``/``dV``. Per rank both send ``shardlab.accounting.context.cp_volume``
bytes: forward ``2 q b s h_kv d (c-1)/c``, backward twice that. The all-gather variant holds
the whole sequence's K/V at once (``accounting.context.attention_memory``), the ring two
blocks.

In production: Megatron-LM / Transformer Engine context parallelism (``cp_comm_type`` "p2p"
is this ring, "all_gather" the variant) and PyTorch's
``torch.distributed.tensor.experimental.context_parallel`` (ring over SDPA; it has no CPU
kernel registered, so this lab compares against full attention on one process instead).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist
from attention_blocks import _box, block_attention, block_grads  # noqa: F401 (given helpers)
from shardlab.accounting.context import check_sequence

__all__ = [
    "CPConfig",
    "shard_positions",
    "shard",
    "unshard",
    "block_attention",
    "block_grads",
    "merge_partials",
    "RingAttention",
    "AllGatherAttention",
    "ring_attention",
    "allgather_attention",
]

TAG_K, TAG_V, TAG_DK, TAG_DV = 0, 1, 2, 3  # distinct tags: K/V and dK/dV hops may interleave


@dataclass(frozen=True)
class CPConfig:
    """Shapes of one context-parallel attention run; validated before any rank starts."""

    s: int
    c: int
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 16
    batch: int = 1
    causal: bool = True
    zigzag: bool = False

    def __post_init__(self) -> None:
        for name in ("s", "c", "heads", "kv_heads", "head_dim", "batch"):
            val = getattr(self, name)
            if isinstance(val, bool) or not isinstance(val, int) or val < 1:
                raise ValueError(f"{name}={val!r} must be a positive integer")
        for name in ("causal", "zigzag"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name}={getattr(self, name)!r} must be True or False")
        check_sequence(self.s, self.c, self.zigzag)
        if self.heads % self.kv_heads:
            raise ValueError(f"kv_heads={self.kv_heads} does not divide heads={self.heads}")


def shard_positions(rank: int, c: int, s: int, zigzag: bool) -> torch.Tensor:
    """Sequence positions rank ``rank`` holds, increasing: ``(s/c,)`` int64."""
    # BEGIN SOLUTION hint: contiguous: [rank*n, (rank+1)*n); zig-zag: chunks rank and 2c-1-rank of 2c chunks of s/(2c)
    if not zigzag:
        n = s // c
        return torch.arange(rank * n, (rank + 1) * n)
    m = s // (2 * c)
    late = 2 * c - 1 - rank
    return torch.cat(
        [torch.arange(rank * m, (rank + 1) * m), torch.arange(late * m, (late + 1) * m)]
    )
    # END SOLUTION


def shard(x: torch.Tensor, rank: int, c: int, zigzag: bool, dim: int = 2) -> torch.Tensor:
    """Rank ``rank``'s tokens of a full-sequence tensor (sequence along ``dim``)."""
    pos = shard_positions(rank, c, x.shape[dim], zigzag).to(x.device)
    return x.index_select(dim, pos).contiguous()


def unshard(pieces: list[torch.Tensor], zigzag: bool, dim: int = 2) -> torch.Tensor:
    """Inverse of :func:`shard`: put every rank's tokens back in sequence order."""
    c = len(pieces)
    s = sum(p.shape[dim] for p in pieces)
    pos = torch.cat([shard_positions(r, c, s, zigzag) for r in range(c)])
    out = torch.empty_like(torch.cat(pieces, dim))
    out.index_copy_(dim, pos.to(out.device), torch.cat(pieces, dim))
    return out


def merge_partials(out, lse, r0: int, blk_out, blk_lse) -> None:
    """Fold a block's ``(blk_out, blk_lse)`` into rows ``r0:`` of the running ``(out, lse)``,
    in place. A row that has seen nothing yet has ``lse = -inf``."""
    # BEGIN SOLUTION hint: new_lse = m + log(exp(lse - m) + exp(blk_lse - m)) with m the elementwise max; out = exp(lse - new) * out + exp(blk_lse - new) * blk_out
    o, old = out[:, :, r0:], lse[:, :, r0:]
    m = torch.maximum(old, blk_lse)  # running max: finite, since the block saw something
    w_old, w_blk = torch.exp(old - m), torch.exp(blk_lse - m)
    new = m + torch.log(w_old + w_blk)
    o.mul_(torch.exp(old - new).unsqueeze(-1)).add_(
        blk_out * torch.exp(blk_lse - new).unsqueeze(-1)
    )
    old.copy_(new)
    # END SOLUTION


def _neighbours(group) -> tuple[int, int, int, int]:
    c, r = dist.get_world_size(group), dist.get_rank(group)
    right = dist.get_global_rank(group, (r + 1) % c)
    left = dist.get_global_rank(group, (r - 1) % c)
    return c, r, right, left


class RingAttention(torch.autograd.Function):
    """Forward: K/V blocks around the ring, online softmax. Backward: K/V around the ring
    again, dK/dV accumulators one hop behind, home after ``c-1`` hops (see module docstring)."""

    @staticmethod
    def forward(ctx, q, k, v, group, causal: bool, zigzag: bool):
        c, r, right, left = _neighbours(group)
        s, scale = q.shape[2] * c, 1.0 / math.sqrt(q.shape[-1])
        q_pos = shard_positions(r, c, s, zigzag)
        # BEGIN SOLUTION hint: out zeros and lse -inf; c steps: post isend(K,V)->right and irecv(next K,V)<-left before block_attention on the block of owner (r-step)%c, merge_partials, wait, rotate
        out = q.new_zeros(q.shape, dtype=torch.float32)  # (b, h, n, d)
        lse = q.new_full(q.shape[:3], float("-inf"), dtype=torch.float32)  # (b, h, n)
        cur_k, cur_v = k, v
        for step in range(c):
            reqs = []
            if step < c - 1:  # pass the block on while computing on it (overlap)
                nxt_k, nxt_v = torch.empty_like(k), torch.empty_like(v)
                reqs = [
                    dist.isend(cur_k, right, group=group, tag=TAG_K),
                    dist.isend(cur_v, right, group=group, tag=TAG_V),
                    dist.irecv(nxt_k, left, group=group, tag=TAG_K),
                    dist.irecv(nxt_v, left, group=group, tag=TAG_V),
                ]
            k_pos = shard_positions((r - step) % c, c, s, zigzag)
            res = block_attention(q, cur_k, cur_v, q_pos, k_pos, causal, scale)
            if res is not None:
                merge_partials(out, lse, *res)
            for req in reqs:
                req.wait()
            if reqs:
                cur_k, cur_v = nxt_k, nxt_v
        # END SOLUTION
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.group, ctx.causal, ctx.zigzag = group, causal, zigzag
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        group, causal, zigzag = ctx.group, ctx.causal, ctx.zigzag
        c, r, right, left = _neighbours(group)
        s, scale = q.shape[2] * c, 1.0 / math.sqrt(q.shape[-1])
        q_pos = shard_positions(r, c, s, zigzag)
        dout = dout.contiguous()
        delta = (dout * out).sum(-1)  # (b, h, n): rowsum(dO * O), the softmax backward term
        # BEGIN SOLUTION hint: ring K/V as in forward; block_grads per step; keep step 0's dK/dV; from step 1 add the accumulator received from the left (step >= 2) and isend it right; after the loop irecv your own block's accumulator
        dq = torch.zeros_like(q)
        own_dk, own_dv = torch.zeros_like(k), torch.zeros_like(v)
        cur_k, cur_v = k, v
        pending = []  # dK/dV sends in flight, with their buffers (kept alive until waited for)
        for step in range(c):
            reqs = []
            if step < c - 1:
                nxt_k, nxt_v = torch.empty_like(k), torch.empty_like(v)
                reqs = [
                    dist.isend(cur_k, right, group=group, tag=TAG_K),
                    dist.isend(cur_v, right, group=group, tag=TAG_V),
                    dist.irecv(nxt_k, left, group=group, tag=TAG_K),
                    dist.irecv(nxt_v, left, group=group, tag=TAG_V),
                ]
            acc_k, acc_v = (
                (own_dk, own_dv) if step == 0 else (torch.zeros_like(k), torch.zeros_like(v))
            )
            acc_reqs = []
            if step >= 2:  # the accumulator of this block, from the rank that held it before
                acc_reqs = [
                    dist.irecv(acc_k, left, group=group, tag=TAG_DK),
                    dist.irecv(acc_v, left, group=group, tag=TAG_DV),
                ]
            k_pos = shard_positions((r - step) % c, c, s, zigzag)
            res = block_grads(q, cur_k, cur_v, dout, lse, delta, q_pos, k_pos, causal, scale)
            for req in acc_reqs:
                req.wait()
            if res is not None:
                r0, dq_blk, k1, dk_blk, dv_blk = res
                dq[:, :, r0:] += dq_blk
                acc_k[:, :, :k1] += dk_blk
                acc_v[:, :, :k1] += dv_blk
            if step >= 1:  # on to the next holder; after the last step that is the owner
                pending += [
                    (dist.isend(acc_k, right, group=group, tag=TAG_DK), acc_k),
                    (dist.isend(acc_v, right, group=group, tag=TAG_DV), acc_v),
                ]
            for req in reqs:
                req.wait()
            if reqs:
                cur_k, cur_v = nxt_k, nxt_v
        if c > 1:  # my block's dK/dV, summed over the other c-1 ranks, comes home
            home_k, home_v = torch.empty_like(k), torch.empty_like(v)
            for req in (dist.irecv(home_k, left, group=group, tag=TAG_DK),
                        dist.irecv(home_v, left, group=group, tag=TAG_DV)):
                req.wait()
            own_dk += home_k
            own_dv += home_v
        for work, _buf in pending:
            work.wait()
        # END SOLUTION
        return dq, own_dk, own_dv, None, None, None


def _gather_kv(x: torch.Tensor, group) -> torch.Tensor:
    # all_gather_into_tensor stacks the c shards along a new leading dim: (c, b, h_kv, n, d);
    # attention wants them along the sequence: (b, h_kv, c*n, d) in rank order
    c = dist.get_world_size(group)
    b, hk, n, d = x.shape
    buf = x.new_empty((c * b, hk, n, d))  # gloo wants the shards along dim 0
    dist.all_gather_into_tensor(buf, x.contiguous(), group=group)
    return buf.view(c, b, hk, n, d).movedim(0, 2).reshape(b, hk, c * n, d)


class AllGatherAttention(torch.autograd.Function):
    """Forward: all-gather K/V, attend. Backward: all-gather K/V again (only the local shard
    is kept between the passes), reduce-scatter dK/dV."""

    @staticmethod
    def forward(ctx, q, k, v, group, causal: bool, zigzag: bool):
        c, r = dist.get_world_size(group), dist.get_rank(group)
        s, scale = q.shape[2] * c, 1.0 / math.sqrt(q.shape[-1])
        # BEGIN SOLUTION hint: gather K and V (_gather_kv); key positions = every rank's shard_positions in rank order; one block_attention
        k_all, v_all = _gather_kv(k, group), _gather_kv(v, group)
        k_pos = torch.cat([shard_positions(j, c, s, zigzag) for j in range(c)])
        r0, blk_out, blk_lse = block_attention(
            q, k_all, v_all, shard_positions(r, c, s, zigzag), k_pos, causal, scale
        )
        out = q.new_zeros(q.shape, dtype=torch.float32)
        lse = q.new_full(q.shape[:3], float("-inf"), dtype=torch.float32)
        out[:, :, r0:], lse[:, :, r0:] = blk_out, blk_lse
        # END SOLUTION
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.group, ctx.causal, ctx.zigzag = group, causal, zigzag
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        group, causal, zigzag = ctx.group, ctx.causal, ctx.zigzag
        c, r = dist.get_world_size(group), dist.get_rank(group)
        s, scale = q.shape[2] * c, 1.0 / math.sqrt(q.shape[-1])
        dout = dout.contiguous()
        delta = (dout * out).sum(-1)  # (b, h, n)
        # BEGIN SOLUTION hint: gather K/V again; block_grads against all keys; reshape dK/dV to (c, b, h_kv, n, d) and reduce_scatter_tensor (sum) to get your shard
        k_all, v_all = _gather_kv(k, group), _gather_kv(v, group)
        k_pos = torch.cat([shard_positions(j, c, s, zigzag) for j in range(c)])
        r0, dq_blk, k1, dk_blk, dv_blk = block_grads(
            q,
            k_all,
            v_all,
            dout,
            lse,
            delta,
            shard_positions(r, c, s, zigzag),
            k_pos,
            causal,
            scale,
        )
        dq = torch.zeros_like(q)
        dq[:, :, r0:] = dq_blk
        b, hk, n, d = k.shape
        grads = []
        for full in (dk_blk, dv_blk):
            padded = k.new_zeros(b, hk, c * n, d)
            padded[:, :, :k1] = full
            # (c*b, h_kv, n, d): rank j's keys first-dim block j, as reduce_scatter_tensor cuts it
            stacked = padded.view(b, hk, c, n, d).movedim(2, 0).reshape(c * b, hk, n, d)
            mine = torch.empty_like(k)
            dist.reduce_scatter_tensor(mine, stacked, group=group)  # sum over the c ranks
            grads.append(mine)
        # END SOLUTION
        return dq, grads[0], grads[1], None, None, None


def ring_attention(q, k, v, group=None, causal: bool = True, zigzag: bool = False):
    """Ring attention of the local queries over the whole sequence (autograd-aware)."""
    return RingAttention.apply(q, k, v, group or dist.group.WORLD, causal, zigzag)


def allgather_attention(q, k, v, group=None, causal: bool = True, zigzag: bool = False):
    """All-gather-K/V attention of the local queries over the whole sequence."""
    return AllGatherAttention.apply(q, k, v, group or dist.group.WORLD, causal, zigzag)
