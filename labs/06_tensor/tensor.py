"""Lab 06, part 1 — tensor-parallel operators: f, g, the sequence-parallel pair, linears, vocab.

What is sharded. ``t`` ranks of one tensor-parallel group (:class:`TPGroups`) each hold
``1/t`` of every weight matrix: :class:`ColumnParallelLinear` the rows of ``W`` (output
features, so its output is split along the last dimension), :class:`RowParallelLinear` the
matching input columns (its output is a full-size *partial sum*), :class:`VocabParallelEmbedding`
and the output head ``V/t`` vocabulary rows. Biases of row-parallel layers, norms and
position embeddings are replicated.

Which collectives run, when (autograd functions named for their communication):

==========  =======================================  ======================  ======================
operator    class                                    forward                 backward
==========  =======================================  ======================  ======================
``f``       :class:`IdentityFwdAllReduceBwd`         identity                all-reduce
``g``       :class:`AllReduceFwdIdentityBwd`         all-reduce              identity
SP entry    :class:`AllGatherFwdReduceScatterBwd`    all-gather along s      reduce-scatter along s
SP exit     :class:`ReduceScatterFwdAllGatherBwd`    reduce-scatter along s  all-gather along s
==========  =======================================  ======================  ======================

A transformer layer uses ``f`` before and ``g`` after each of its two blocks: 4 all-reduces
of ``b s h`` elements, ``8 q b s h (t-1)/t`` bytes sent per rank per layer per microbatch,
``shardlab.accounting.comm.tp_volume``. With sequence parallelism every all-reduce becomes an
all-gather + reduce-scatter pair of the same tensor: the same bytes (``tp_volume(sp=True)``).
If the column-parallel layer keeps only its input's sequence shard for backward
(``regather=True``, what Korthikanti et al. count), its backward all-gathers that input again:
two more all-gathers per layer, ``2 * comm.ring_sent_bytes("all_gather", q b s h, t)``.

The vocabulary-parallel cross-entropy never gathers the ``(b, s, V)`` logits: it all-reduces
the per-token maximum, the sum of exponentials and the target logit (``3 b s`` elements).

In production: Megatron-Core's ``tensor_parallel`` package (the same operators, fused with
overlapped communication), and PyTorch's DTensor ``parallelize_module`` with
``ColwiseParallel`` / ``RowwiseParallel`` / ``SequenceParallel`` (see ``benchmark_tensor.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

# torch 2.13 renamed all_gather_into_tensor / reduce_scatter_tensor (same arguments, same ops)
all_gather_into_tensor = getattr(dist, "all_gather_single", dist.all_gather_into_tensor)
reduce_scatter_tensor = getattr(dist, "reduce_scatter_single", dist.reduce_scatter_tensor)


@dataclass(frozen=True)
class TPGroups:
    """Process groups and degrees of a (dp x tp) layout, tp innermost: global rank
    ``r = dp_rank * tp + tp_rank``. ``tp == 1`` (``tp_group=None``) means no communication."""

    tp: int = 1
    tp_rank: int = 0
    tp_group: dist.ProcessGroup | None = None
    dp: int = 1
    dp_rank: int = 0
    dp_group: dist.ProcessGroup | None = None

    def __post_init__(self) -> None:
        for name, deg, rank in (("tp", self.tp, self.tp_rank), ("dp", self.dp, self.dp_rank)):
            if not isinstance(deg, int) or isinstance(deg, bool) or deg < 1:
                raise ValueError(f"{name}={deg!r} must be a positive integer")
            if not (isinstance(rank, int) and 0 <= rank < deg):
                raise ValueError(f"{name}_rank={rank!r} must be in [0, {name}={deg})")
        if self.tp > 1 and self.tp_group is None:
            raise ValueError(f"tp={self.tp} needs a tp_group")
        if self.tp_group is not None and self.tp_group.size() != self.tp:
            raise ValueError(f"tp={self.tp} but tp_group has {self.tp_group.size()} ranks")

    @classmethod
    def from_world(cls, tp: int) -> TPGroups:
        """Split the default group into ``world/tp`` tp groups of consecutive ranks (every
        rank must call this, in the same order: ``new_group`` is collective)."""
        world, rank = dist.get_world_size(), dist.get_rank()
        if world % tp:
            raise ValueError(f"tp={tp} does not divide the world size {world}")
        dp = world // tp
        tp_groups = [dist.new_group(list(range(d * tp, (d + 1) * tp))) for d in range(dp)]
        dp_groups = [dist.new_group(list(range(r, world, tp))) for r in range(tp)]
        return cls(
            tp=tp, tp_rank=rank % tp, tp_group=tp_groups[rank // tp] if tp > 1 else None,
            dp=dp, dp_rank=rank // tp, dp_group=dp_groups[rank % tp] if dp > 1 else None,
        )

    def shard(self, n: int, what: str) -> int:
        """``n / tp``, or a ValueError naming both numbers."""
        if n % self.tp:
            raise ValueError(
                f"{what}={n} is not divisible by the tensor-parallel degree t={self.tp}"
            )
        return n // self.tp


# ----------------------------------------------------------------- collectives on (b, s, h)
def all_reduce(x: torch.Tensor, groups: TPGroups) -> torch.Tensor:
    """Sum of ``x`` over the tp group (a new tensor; ``x`` is left untouched)."""
    out = x.contiguous().clone()
    if groups.tp > 1:
        dist.all_reduce(out, group=groups.tp_group)
    return out


def all_gather_seq(x: torch.Tensor, groups: TPGroups) -> torch.Tensor:
    """(b, s/t, h) shards -> (b, s, h): rank r's shard becomes positions r*s/t ... ."""
    if groups.tp == 1:
        return x
    t, (b, s_loc, h) = groups.tp, x.shape
    # BEGIN SOLUTION hint: all_gather_into_tensor into a (t, b, s/t, h) buffer (dim 0 = rank), then move the rank dim next to s and reshape to (b, s, h)
    buf = torch.empty(
        t, b, s_loc, h, dtype=x.dtype, device=x.device
    )  # (t, b, s/t, h): dim 0 is the rank
    all_gather_into_tensor(buf.view(-1), x.contiguous().view(-1), group=groups.tp_group)
    return buf.transpose(0, 1).reshape(b, t * s_loc, h)  # (b, s, h)
    # END SOLUTION


def reduce_scatter_seq(x: torch.Tensor, groups: TPGroups) -> torch.Tensor:
    """(b, s, h) partial sums -> (b, s/t, h): the sum over ranks of this rank's positions."""
    if groups.tp == 1:
        return x.clone()
    t, (b, s, h) = groups.tp, x.shape
    # BEGIN SOLUTION hint: lay x out as (t, b, s/t, h) contiguous (chunk r = rank r's positions), reduce_scatter_tensor into a (b, s/t, h) tensor
    chunks = x.reshape(b, t, s // t, h).transpose(0, 1).contiguous()  # (t, b, s/t, h)
    out = torch.empty(b, s // t, h, dtype=x.dtype, device=x.device)
    reduce_scatter_tensor(out.view(-1), chunks.view(-1), group=groups.tp_group)
    return out
    # END SOLUTION


# ----------------------------------------------------------------- the four operators
class IdentityFwdAllReduceBwd(torch.autograd.Function):
    """``f``: enters a tensor-parallel block. Every rank already has the whole input; each
    rank's slice of the block produces a partial input gradient, so backward sums them."""

    @staticmethod
    def forward(ctx, x, groups):
        ctx.groups = groups
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        # BEGIN SOLUTION hint: the input gradient is the sum of every rank's partial gradient
        return all_reduce(grad, ctx.groups), None
        # END SOLUTION


class AllReduceFwdIdentityBwd(torch.autograd.Function):
    """``g``: leaves a tensor-parallel block. Forward sums the ranks' partial outputs; the
    output gradient is already whole on every rank, so backward passes it through."""

    @staticmethod
    def forward(ctx, x, groups):
        ctx.groups = groups
        # BEGIN SOLUTION hint: sum the partial outputs over the tp group
        return all_reduce(x, groups)
        # END SOLUTION

    @staticmethod
    def backward(ctx, grad):
        # BEGIN SOLUTION hint: every rank already holds the full output gradient
        return grad, None
        # END SOLUTION


class AllGatherFwdReduceScatterBwd(torch.autograd.Function):
    """SP entry (replaces ``f``): sequence shards -> full sequence; backward sums the ranks'
    partial input gradients and hands each rank its own positions."""

    @staticmethod
    def forward(ctx, x, groups):
        ctx.groups = groups
        # BEGIN SOLUTION hint: gather the sequence shards (all_gather_seq)
        return all_gather_seq(x, groups)
        # END SOLUTION

    @staticmethod
    def backward(ctx, grad):
        # BEGIN SOLUTION hint: reduce-scatter the partial gradients back to sequence shards
        return reduce_scatter_seq(grad, ctx.groups), None
        # END SOLUTION


class ReduceScatterFwdAllGatherBwd(torch.autograd.Function):
    """SP exit (replaces ``g``): partial full-sequence outputs -> summed sequence shards;
    backward gathers the shards' gradients into the full sequence."""

    @staticmethod
    def forward(ctx, x, groups):
        ctx.groups = groups
        # BEGIN SOLUTION hint: reduce_scatter_seq
        return reduce_scatter_seq(x, groups)
        # END SOLUTION

    @staticmethod
    def backward(ctx, grad):
        # BEGIN SOLUTION hint: all_gather_seq of the gradient shards
        return all_gather_seq(grad, ctx.groups), None
        # END SOLUTION


class AllGatherLinearRegatherBwd(torch.autograd.Function):
    """SP entry fused with a column-parallel linear that saves only its input's sequence
    shard: forward all-gathers; backward all-gathers the saved shard *again* (for the weight
    gradient) and reduce-scatters the input gradient (Megatron's sequence-parallel linear)."""

    @staticmethod
    def forward(ctx, x, weight, bias, groups):
        ctx.groups, ctx.has_bias = groups, bias is not None
        ctx.save_for_backward(x, weight)  # the (b, s/t, h) shard, not the gathered input
        return F.linear(all_gather_seq(x, groups), weight, bias)  # (b, s, out/t)

    @staticmethod
    def backward(ctx, grad):  # grad: (b, s, out/t)
        x, weight = ctx.saved_tensors
        # BEGIN SOLUTION hint: re-gather x, weight grad = grad^T x_full over (b, s); input grad = grad @ W, reduce-scattered; bias grad = sum of grad over (b, s)
        full = all_gather_seq(x, ctx.groups)  # (b, s, h) rebuilt for the weight gradient
        gw = grad.flatten(0, 1).t() @ full.flatten(0, 1)  # (out/t, h)
        gx = reduce_scatter_seq(grad @ weight, ctx.groups)  # (b, s/t, h)
        gb = grad.sum((0, 1)) if ctx.has_bias else None
        return gx, gw, gb, None
        # END SOLUTION


f = IdentityFwdAllReduceBwd.apply
g = AllReduceFwdIdentityBwd.apply
gather_seq = AllGatherFwdReduceScatterBwd.apply
scatter_seq = ReduceScatterFwdAllGatherBwd.apply


# ----------------------------------------------------------------- layers
def _rows(full: torch.Tensor, groups: TPGroups, what: str) -> torch.Tensor:
    """This rank's 1/t of ``full`` along dim 0 (a copy), checking divisibility."""
    n = groups.shard(full.shape[0], what)
    return full[groups.tp_rank * n : (groups.tp_rank + 1) * n].detach().clone()


class ColumnParallelLinear(nn.Module):
    """``y = x W^T + b`` with ``W`` (out, in) split by output rows: this rank computes
    ``out/t`` output features. Input: the whole ``x`` (``f`` in front), or with sequence
    parallelism its (b, s/t, in) shard (all-gathered in front, optionally re-gathered in
    backward). Output: (b, s, out/t), split along the last dimension."""

    def __init__(self, weight, bias, groups: TPGroups, sequence_parallel=False, regather=True):
        super().__init__()
        self.groups, self.sp, self.regather = groups, sequence_parallel, regather
        self.weight = nn.Parameter(_rows(weight, groups, "output features"))  # (out/t, in)
        self.bias = None if bias is None else nn.Parameter(_rows(bias, groups, "output features"))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # BEGIN SOLUTION hint: SP: regather ? AllGatherLinearRegatherBwd : linear(gather_seq(x)); else linear(f(x))
        if self.sp and self.regather and self.groups.tp > 1:
            return AllGatherLinearRegatherBwd.apply(x, self.weight, self.bias, self.groups)
        x = gather_seq(x, self.groups) if self.sp else f(x, self.groups)  # (b, s, in)
        return F.linear(x, self.weight, self.bias)  # (b, s, out/t)
        # END SOLUTION


class RowParallelLinear(nn.Module):
    """``y = x W^T + b`` with ``W`` (out, in) split by input columns: input (b, s, in/t)
    split along the last dimension (a column-parallel output), output the sum over ranks
    (``g``), or with sequence parallelism its (b, s/t, out) shard (reduce-scatter); the
    replicated bias is added once, after the sum."""

    def __init__(self, weight, bias, groups: TPGroups, sequence_parallel=False):
        super().__init__()
        self.groups, self.sp = groups, sequence_parallel
        self.weight = nn.Parameter(_rows(weight.t(), groups, "input features").t().contiguous())
        self.bias = None if bias is None else nn.Parameter(bias.detach().clone())
        if self.bias is not None:  # replicated, but each rank sees only its tokens under SP
            self.bias.sequence_parallel = sequence_parallel

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # BEGIN SOLUTION hint: partial = x @ W_r^T; sum it with g (or scatter_seq under SP); add the bias after the sum
        partial = F.linear(x, self.weight)  # (b, s, out): this rank's share of the sum
        y = scatter_seq(partial, self.groups) if self.sp else g(partial, self.groups)
        return y if self.bias is None else y + self.bias
        # END SOLUTION


class VocabParallelEmbedding(nn.Module):
    """Token embedding with rows ``[r V/t, (r+1) V/t)`` on rank r. Each rank looks up the
    tokens it owns (zeros elsewhere) and the partial results are summed: ``g``, or under
    sequence parallelism a reduce-scatter that leaves each rank its (b, s/t, h) shard."""

    def __init__(self, weight: torch.Tensor, groups: TPGroups, sequence_parallel=False):
        super().__init__()
        self.groups, self.sp = groups, sequence_parallel
        self.weight = nn.Parameter(_rows(weight, groups, "vocabulary"))  # (V/t, h)
        self.lo = groups.tp_rank * self.weight.shape[0]

    def forward(self, idx: torch.Tensor) -> torch.Tensor:  # idx: (b, s)
        # BEGIN SOLUTION hint: mask tokens outside [lo, lo + V/t), look up idx - lo (0 where masked), zero the masked rows, then g / scatter_seq
        local = idx - self.lo
        outside = (local < 0) | (local >= self.weight.shape[0])
        out = F.embedding(local.masked_fill(outside, 0), self.weight)  # (b, s, h)
        out = out.masked_fill(outside.unsqueeze(-1), 0.0)
        return scatter_seq(out, self.groups) if self.sp else g(out, self.groups)
        # END SOLUTION


class VocabParallelCrossEntropy(torch.autograd.Function):
    """Mean cross-entropy of logits split over the vocabulary, (b, s, V/t) per rank, without
    gathering them: all-reduce the max (MAX), the sum of exponentials and the target logit
    (SUM). Backward is local: ``(softmax - onehot) / (b s)`` on this rank's columns."""

    @staticmethod
    def forward(ctx, logits, target, groups):  # logits (b, s, V/t), target (b, s)
        v_loc = logits.shape[-1]
        lo = groups.tp_rank * v_loc
        # BEGIN SOLUTION hint: subtract the all-reduced (MAX) max, exp, all-reduce the sum and the (masked) target logit, loss = log(sum) - target logit; save softmax and the local target
        z = logits.float()
        zmax = z.amax(-1)  # (b, s)
        if groups.tp > 1:
            dist.all_reduce(zmax, op=dist.ReduceOp.MAX, group=groups.tp_group)
        z = z - zmax.unsqueeze(-1)
        e = z.exp()
        sum_exp = all_reduce(e.sum(-1), groups)  # (b, s)
        local = target - lo
        outside = (local < 0) | (local >= v_loc)
        local = local.masked_fill(outside, 0)
        picked = z.gather(-1, local.unsqueeze(-1)).squeeze(-1).masked_fill(outside, 0.0)
        picked = all_reduce(picked, groups)  # (b, s): the target's logit, from its owner
        loss = (sum_exp.log() - picked).mean()
        ctx.save_for_backward(e / sum_exp.unsqueeze(-1), local, outside)
        return loss
        # END SOLUTION

    @staticmethod
    def backward(ctx, grad):
        softmax, local, outside = ctx.saved_tensors
        # BEGIN SOLUTION hint: softmax minus one-hot of the target on its owner, times grad / (b s)
        gz = softmax.clone()  # (b, s, V/t)
        gz.scatter_add_(-1, local.unsqueeze(-1), (~outside).unsqueeze(-1).to(gz.dtype).neg())
        return gz * (grad / local.numel()), None, None
        # END SOLUTION


def vocab_parallel_cross_entropy(logits, target, groups: TPGroups) -> torch.Tensor:
    """Mean next-token loss over (b, s) from vocab-split logits (b, s, V/t)."""
    return VocabParallelCrossEntropy.apply(logits, target, groups)
