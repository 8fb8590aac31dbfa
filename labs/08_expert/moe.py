"""Lab 08 — a mixture-of-experts layer with expert parallelism (EP) on real ranks.

What is sharded: the ``E`` experts. Rank ``r`` of the EP group (``ep`` ranks) owns experts
``r*E/ep .. (r+1)*E/ep - 1`` (``shardlab.accounting.expert.expert_owner``) and holds only
their weights. Replicated: the router matrix ``W_r (h, E)``. Every rank holds its own ``T``
tokens ``x (T, h)``.

One forward pass (``moe_forward``), one communication step each:

1. **route** — logits ``x W_r``; each token keeps its ``k`` largest, gate weights = softmax
   over those ``k`` logits (chapter 9).
2. **count exchange** — ``all_gather`` of every rank's per-expert counts ``(E,)`` (int64), so
   that every rank knows the whole ``(ep, E)`` count matrix. From it each rank computes,
   without further messages, which of its copies fit in the capacity and how many rows it
   will send to and receive from every peer (the split sizes of the all-to-alls).
3. **capacity** — expert ``e`` accepts ``C = ceil(cf * k * T_total / E)`` copies
   (``accounting.expert.capacity``), first come first served in the order of the tokens of
   the whole EP group (rank 0's tokens first, then rank 1's, ...; within a rank by token
   index). Dropped copies are never sent; they contribute nothing to the token's output, so a
   token whose copies are all dropped leaves the layer with output 0 and passes the block on
   its residual connection only. The gates of kept copies are not renormalised (Switch).
4. **dispatch** — ``all_to_all_single`` with uneven split sizes: the kept copies, sorted by
   expert (hence by owner rank), go to the experts' owners.
5. **experts** — each local expert runs its MLP ``gelu(x W1) W2`` on the rows it received.
6. **return** — the inverse ``all_to_all_single`` sends every output row back home.
7. **combine** — ``y[token] += gate * expert_output`` for each kept copy.

Backward runs the two all-to-alls again with the split sizes swapped (``AllToAllRows``).

Load-balancing loss (Switch Transformers): ``aux = coef * E * sum_i f_i P_i`` with ``f_i`` the
share of routed copies that chose expert ``i`` (before drops) and ``P_i`` the mean router
probability of expert ``i``, both over the whole EP group. ``f`` needs only the exchanged
counts; ``P`` is a sum over tokens, so each rank returns its own tokens' share of ``aux`` and
the shares add up to the group's loss (and their gradients to its gradient).

Bytes per rank (rows of ``h`` elements): dispatch sends the kept copies whose expert lives on
another rank, return sends back the rows its experts processed for other ranks —
``accounting.expert.a2a_sent_bytes(kept, h, q)``; the expectation under uniform routing is
``accounting.expert.expected_a2a_sent_bytes``. Backward doubles both.

In production: Megatron Core's ``MoEAlltoAllTokenDispatcher`` and DeepSpeed-MoE do the same two
``all_to_all_single`` calls (on NCCL), with grouped GEMMs for the experts and often
dropless routing; DeepEP replaces the all-to-all with fused NVLink/RDMA kernels.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from shardlab.accounting import expert as acc

__all__ = [
    "MoEConfig",
    "init_params",
    "local_experts",
    "route",
    "kept_counts",
    "keep_mask",
    "load_balancing_loss",
    "AllToAllRows",
    "moe_forward",
]


@dataclass(frozen=True)
class MoEConfig:
    """An MoE layer laid out over an EP group of ``ep`` ranks."""

    hidden: int
    ffn: int
    num_experts: int
    top_k: int
    capacity_factor: float
    ep: int
    aux_loss_coef: float = 0.01

    def __post_init__(self) -> None:
        for name in ("hidden", "ffn"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}={value!r} must be a positive integer")
        acc.check_moe(self.num_experts, self.ep, self.top_k, self.capacity_factor)
        if not isinstance(self.aux_loss_coef, (int, float)) or self.aux_loss_coef < 0:
            raise ValueError(f"aux_loss_coef={self.aux_loss_coef!r} must be a number >= 0")

    @property
    def experts_per_rank(self) -> int:
        return self.num_experts // self.ep


def init_params(cfg: MoEConfig, seed: int = 0, dtype=torch.float32) -> dict[str, torch.Tensor]:
    """All weights of the layer (every expert), the same on every process for one seed."""
    g = torch.Generator().manual_seed(seed)
    h, f, e = cfg.hidden, cfg.ffn, cfg.num_experts

    def rand(*shape, fan_in):
        return (torch.randn(*shape, generator=g, dtype=torch.float64) / math.sqrt(fan_in)).to(dtype)

    return {
        "router": rand(h, e, fan_in=h),  # (h, E), replicated on every rank
        "w1": rand(e, h, f, fan_in=h),  # (E, h, f)
        "w2": rand(e, f, h, fan_in=f),  # (E, f, h)
    }


def local_experts(params: dict[str, torch.Tensor], cfg: MoEConfig, rank: int) -> dict:
    """This rank's share: the router and the weights of experts it owns (leaf tensors)."""
    lo = rank * cfg.experts_per_rank
    hi = lo + cfg.experts_per_rank
    return {
        "router": params["router"].clone().requires_grad_(),
        "w1": params["w1"][lo:hi].clone().requires_grad_(),  # (E/ep, h, f)
        "w2": params["w2"][lo:hi].clone().requires_grad_(),  # (E/ep, f, h)
    }


def route(x: torch.Tensor, router: torch.Tensor, top_k: int):
    """``(probs (T, E), chosen (T, k), gates (T, k))`` for tokens ``x (T, h)``.

    ``probs`` = softmax over all ``E`` logits (for the load-balancing loss); ``chosen`` = the
    ``k`` largest logits' experts, largest first; ``gates`` = softmax over those ``k`` logits.
    """
    # BEGIN SOLUTION hint: logits = x @ router; probs = softmax(logits); topk of the logits; gates = softmax of the top-k logits
    logits = x @ router  # (T, E)
    probs = logits.softmax(dim=-1)
    top_logits, chosen = logits.topk(top_k, dim=-1)  # (T, k)
    gates = top_logits.softmax(dim=-1)
    return probs, chosen, gates
    # END SOLUTION


def kept_counts(counts: torch.Tensor, cap: int) -> torch.Tensor:
    """``kept[s, e]``: copies of rank ``s``'s tokens that expert ``e`` accepts.

    ``counts (ep, E)`` = copies routed by each rank to each expert. Expert ``e`` fills its
    ``cap`` slots with rank 0's copies first, then rank 1's, and so on.
    """
    # BEGIN SOLUTION hint: slots already taken by lower ranks = exclusive cumsum over dim 0; kept = clamp(cap - taken, 0, counts)
    taken = counts.cumsum(0) - counts  # (ep, E) copies of lower ranks
    free = (cap - taken).clamp(min=0)
    return torch.minimum(counts, free)
    # END SOLUTION


def keep_mask(chosen: torch.Tensor, counts: torch.Tensor, rank: int, cap: int) -> torch.Tensor:
    """``(T, k)`` bool: which of this rank's copies fit in their expert's capacity.

    A copy's place in its expert's queue is the copies of lower ranks to that expert plus
    this rank's earlier copies to it (tokens in index order).
    """
    # BEGIN SOLUTION hint: one_hot(chosen) cumsum over tokens gives each copy's position among this rank's copies; add the lower ranks' counts; keep if < cap
    n_exp = counts.shape[1]
    onehot = F.one_hot(chosen.reshape(-1), n_exp)  # (T*k, E), token-major
    pos = (onehot.cumsum(0) - 1).gather(1, chosen.reshape(-1, 1)).view_as(chosen)  # (T, k)
    before = counts[:rank].sum(0)  # (E,) slots used by lower ranks
    return (before[chosen] + pos) < cap
    # END SOLUTION


def load_balancing_loss(
    probs: torch.Tensor, counts: torch.Tensor, tokens_total: int, top_k: int, coef: float
) -> torch.Tensor:
    """This rank's share of ``coef * E * sum_i f_i P_i`` (see the module docstring).

    ``probs (T, E)`` this rank's router probabilities; ``counts (ep, E)`` routed copies of
    every rank (no gradient); ``tokens_total`` = tokens of the whole EP group.
    """
    # BEGIN SOLUTION hint: f = counts.sum(0) / (k * T_total); P-share = probs.sum(0) / T_total; coef * E * (f * P-share).sum()
    n_exp = probs.shape[1]
    f = counts.sum(0).to(probs.dtype) / (top_k * tokens_total)  # (E,) share of copies
    p_share = probs.sum(0) / tokens_total  # (E,) this rank's part of the mean probability
    return coef * n_exp * (f * p_share).sum()
    # END SOLUTION


class AllToAllRows(torch.autograd.Function):
    """Forward: all-to-all of rows with uneven split sizes. Backward: the inverse all-to-all.

    ``x (sum(in_splits), h)``: rows ``in_splits[0]`` go to group rank 0, the next
    ``in_splits[1]`` to group rank 1, ...; the result has ``sum(out_splits)`` rows in source
    order. The gradient of a received row belongs to the rank that sent it, so backward
    sends the gradients back with the two split lists swapped.
    """

    @staticmethod
    def forward(ctx, x, in_splits: list[int], out_splits: list[int], group=None):
        # BEGIN SOLUTION hint: save the splits and group on ctx; out = x.new_empty(sum(out_splits), h); dist.all_to_all_single(out, x.contiguous(), out_splits, in_splits, group=group)
        ctx.splits = (list(in_splits), list(out_splits))
        ctx.group = group
        out = x.new_empty((sum(out_splits), *x.shape[1:]))  # (rows received, h)
        # one message per peer; the rows for this rank itself are copied locally by the backend
        dist.all_to_all_single(out, x.contiguous(), list(out_splits), list(in_splits), group=group)
        return out
        # END SOLUTION

    @staticmethod
    def backward(ctx, grad_out):
        # BEGIN SOLUTION hint: the same call with in/out splits swapped sends every row's gradient back to its sender; return (grad, None, None, None)
        in_splits, out_splits = ctx.splits
        grad_in = grad_out.new_empty((sum(in_splits), *grad_out.shape[1:]))
        # gradients travel home: what we received from s goes back to s
        dist.all_to_all_single(
            grad_in, grad_out.contiguous(), in_splits, out_splits, group=ctx.group
        )
        return grad_in, None, None, None
        # END SOLUTION


def _expert_mlp(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    return F.gelu(x @ w1) @ w2  # (n, h) -> (n, f) -> (n, h)


def moe_forward(x: torch.Tensor, params: dict, cfg: MoEConfig, group=None):
    """Expert-parallel MoE layer on this rank's tokens ``x (T, h)``.

    ``params``: this rank's share from :func:`local_experts`. Every rank of ``group`` (the EP
    group, ``cfg.ep`` ranks) calls it; ``T`` may differ between ranks. Returns ``(y (T, h), aux,
    stats)``; ``stats`` holds ``counts`` and ``kept`` (``(ep, E)`` int64, no gradient),
    ``capacity`` and ``dropped`` (copies of the whole group that did not fit).
    """
    ep, rank = dist.get_world_size(group), dist.get_rank(group)
    if ep != cfg.ep:
        raise ValueError(f"the EP group has {ep} ranks but cfg.ep={cfg.ep}")
    n_exp, k, per = cfg.num_experts, cfg.top_k, cfg.experts_per_rank
    tokens, h = x.shape
    # BEGIN SOLUTION hint: route; all_gather the per-expert counts; capacity + keep_mask + kept_counts; sort kept copies by expert; dispatch with AllToAllRows; run each local expert on its rows; return with AllToAllRows (splits swapped); index_add gate * output into y
    probs, chosen, gates = route(x, params["router"], k)  # (T, E), (T, k), (T, k)
    # count exchange: every rank learns the (ep, E) routing counts (int64, no gradient)
    mine = torch.bincount(chosen.reshape(-1), minlength=n_exp)  # (E,)
    counts = mine.new_empty(ep * n_exp)  # gloo wants a flat output
    dist.all_gather_into_tensor(counts, mine, group=group)
    counts = counts.view(ep, n_exp)
    tokens_total = int(counts.sum()) // k  # every token routes exactly k copies
    cap = acc.capacity(tokens_total, n_exp, k, cfg.capacity_factor)
    keep = keep_mask(chosen, counts, rank, cap)  # (T, k)
    kept = kept_counts(counts, cap)  # (ep, E)

    # kept copies sorted by expert: experts of rank d are contiguous, so rows group by owner
    tok = torch.arange(tokens, device=x.device).repeat_interleave(k)[keep.reshape(-1)]  # (n,)
    exp_id = chosen.reshape(-1)[keep.reshape(-1)]  # (n,)
    gate = gates.reshape(-1)[keep.reshape(-1)]  # (n,)
    order = torch.sort(exp_id, stable=True).indices
    tok, exp_id, gate = tok[order], exp_id[order], gate[order]
    by_owner = kept.view(ep, ep, per).sum(-1)  # (src, dst) rows
    in_splits = by_owner[rank].tolist()
    out_splits = by_owner[:, rank].tolist()

    # dispatch: token rows to the owners of their experts
    recv = AllToAllRows.apply(x[tok], in_splits, out_splits, group)  # (rows in, h)
    # received rows: for each source, this rank's experts in order, kept[src, e] rows each
    local = kept[:, rank * per : (rank + 1) * per]  # (ep, per)
    label = torch.arange(per, device=x.device).repeat(ep)  # (ep per,)
    label = label.repeat_interleave(local.reshape(-1))  # (rows in,)
    out = torch.zeros_like(recv)
    for j in range(per):
        idx = (label == j).nonzero().squeeze(1)
        out = out.index_copy(0, idx, _expert_mlp(recv[idx], params["w1"][j], params["w2"][j]))
    # return: every output row goes back to the token's home rank
    back = AllToAllRows.apply(out, out_splits, in_splits, group)  # (n, h)
    # combine: gated sum over the token's kept copies; dropped copies add nothing
    y = torch.zeros_like(x).index_add(0, tok, back * gate.unsqueeze(1))  # (T, h)
    aux = load_balancing_loss(probs, counts, tokens_total, k, cfg.aux_loss_coef)
    # END SOLUTION
    stats = {
        "counts": counts,
        "kept": kept,
        "capacity": cap,
        "dropped": int(counts.sum() - kept.sum()),
    }
    return y, aux, stats
