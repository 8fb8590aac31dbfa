"""Lab 06, part 2 — a tensor- and sequence-parallel GPT with selective and full recompute.

What is sharded. Built from a :class:`tensor_reference.SerialGPT` (the weights are sliced, so
the two compute the same function): attention heads ``a/t`` per rank (the ``q/k/v``
projections column-parallel, fused rank-major into one ``(3h/t, h)`` weight; ``o`` row-parallel),
MLP columns ``ffn/t`` (``fc`` column-, ``proj`` row-parallel), vocabulary rows ``V/t`` of the
embedding and of the head, whose logits stay split (:func:`tensor.vocab_parallel_cross_entropy`).
Replicated: LayerNorms, position embedding, row-parallel biases.

Sequence parallelism (``sequence_parallel=True``). Between the tensor-parallel blocks (the
LayerNorms, the output dropouts, the residual adds: operations that never mix tokens) each
rank keeps only positions ``[r s/t, (r+1) s/t)``, a (b, s/t, h) shard. Column-parallel layers
all-gather their input, row-parallel layers reduce-scatter their output. The replicated
parameters then see only their rank's tokens, so their gradients are partial:
:func:`sync_sequence_parallel_grads` all-reduces them over the tp group after backward.

Dropout. Every rank draws the *full* mask from a generator seeded by
``tensor_reference.dropout_seed(seed, layer, site)`` and keeps its slice (its heads for the
attention probabilities, its positions under SP; the whole mask where the tensor is
replicated), so the result is one process's for any ``t``, and a recomputed forward redraws
the same mask. (Megatron instead seeds each rank differently inside sharded regions: cheaper,
but not bitwise one process.)

Recompute (``recompute``): ``"selective"`` checkpoints the attention core (scores, softmax,
dropout: the ``a s^2 b`` term) from Q, K, V; ``"full"`` checkpoints each whole layer, keeping
only its input. Both use ``torch.utils.checkpoint`` with ``use_reentrant=True``: that variant
keeps its inputs with ``save_for_backward``, exactly what a saved-tensor hook (``MemoryTrace``)
sees. The full recompute reruns the layer's forward collectives in backward.

Bytes: communication per layer per microbatch ``accounting.comm.tp_volume`` (see
:mod:`tensor`); saved activations per layer ``accounting.activations.activation_bytes_per_layer``
with this layer's constants (:func:`activation_kwargs`).

Using it from another lab (e.g. tensor x data parallel)::

    groups = TPGroups.from_world(tp)                 # tp innermost; groups.dp_group for DP
    cfg = TPConfig(model_cfg, tp, sequence_parallel=True, recompute="selective")
    model = ParallelGPT(SerialGPT(model_cfg), groups, cfg)
    model(idx, target, seed).backward()              # seed: the step's dropout seed
    sync_sequence_parallel_grads(model, groups)      # then reduce gradients over dp_group

In production: Megatron-Core's ``TransformerLayer`` with ``sequence_parallel`` and
``recompute_granularity="selective"``; PyTorch: DTensor ``parallelize_module`` plus
``torch.utils.checkpoint`` (or selective activation checkpointing policies).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from tensor import (
    ColumnParallelLinear,
    RowParallelLinear,
    TPGroups,
    VocabParallelEmbedding,
    all_reduce,
    vocab_parallel_cross_entropy,
)
from tensor_reference import (
    ModelConfig,
    SerialBlock,
    SerialGPT,
    apply_dropout,
    attention_core,
    dropout_mask,
    merge_heads,
    split_heads,
)
from torch import nn
from torch.utils.checkpoint import checkpoint

RECOMPUTE = ("none", "selective", "full")


@dataclass(frozen=True)
class TPConfig:
    """A model config and how to parallelize it over ``t`` ranks (validated here, before
    any rank starts: every divisibility error names both numbers)."""

    model: ModelConfig
    t: int = 1
    sequence_parallel: bool = False
    recompute: str = "none"
    regather: bool = True  # SP: keep only the input's shard, all-gather it again in backward

    def __post_init__(self) -> None:
        if not isinstance(self.model, ModelConfig):
            raise ValueError(f"model={self.model!r} must be a ModelConfig")
        t, m = self.t, self.model
        if not isinstance(t, int) or isinstance(t, bool) or t < 1:
            raise ValueError(f"t={t!r} must be a positive integer")
        for name in ("sequence_parallel", "regather"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name}={getattr(self, name)!r} must be True or False")
        if self.recompute not in RECOMPUTE:
            raise ValueError(f"recompute={self.recompute!r} is not one of {RECOMPUTE}")
        checks = [("hidden width h", m.h), ("heads a", m.a), ("MLP width ffn", m.ffn),
                  ("vocabulary V", m.vocab)]
        if self.sequence_parallel:
            checks.append(("sequence length s", m.seq))
        for what, n in checks:
            if n % t:
                raise ValueError(f"{what}={n} is not divisible by the tensor-parallel degree t={t}")


def activation_kwargs(m: ModelConfig, q: int = 4) -> dict:
    """This layer's constants for ``accounting.activations`` (fp32 elements, 1-byte bool
    masks, MLP width ``ffn``, dropout on or off, LayerNorm's two fp32 statistics per token)."""
    return dict(q=q, mask_bytes=1, ffn=m.ffn, dropout=m.dropout > 0,
                attn_dropout=m.attn_dropout > 0, norm="layernorm", norm_stat_bytes=4)


def _rank_major_qkv(ws: list[torch.Tensor], t: int) -> torch.Tensor:
    """[Wq, Wk, Wv] (each (h, ...)) -> rows ordered rank by rank, [q_0 k_0 v_0 q_1 k_1 v_1 ..]:
    rank r's contiguous 1/t of the rows are the q, k and v rows of its own heads."""
    return torch.cat([torch.cat([w.chunk(t)[r] for w in ws]) for r in range(t)])


def _copy_norm(src: nn.LayerNorm, sp: bool) -> nn.LayerNorm:
    ln = nn.LayerNorm(src.normalized_shape)
    ln.load_state_dict(src.state_dict())
    for p in ln.parameters():
        p.sequence_parallel = sp  # partial gradients under SP: summed by the sync below
    return ln


class ParallelAttention(nn.Module):
    """Causal attention with ``a/t`` heads per rank: column-parallel fused qkv, local core,
    row-parallel output projection (``f`` ... ``g``, or all-gather ... reduce-scatter)."""

    def __init__(self, serial: SerialBlock, groups: TPGroups, cfg: TPConfig):
        super().__init__()
        self.groups, self.cfg, self.layer = groups, cfg, serial.layer
        self.heads = groups.shard(cfg.model.a, "heads a")  # a/t local heads
        sp = cfg.sequence_parallel
        projs = (serial.q_proj, serial.k_proj, serial.v_proj)
        w = _rank_major_qkv([p.weight for p in projs], groups.tp)  # (3h, h)
        b = _rank_major_qkv([p.bias for p in projs], groups.tp)  # (3h,)
        self.qkv = ColumnParallelLinear(w, b, groups, sp, cfg.regather)
        self.o = RowParallelLinear(serial.o_proj.weight, serial.o_proj.bias, groups, sp)

    def core(self, q, k, v, seed: int) -> torch.Tensor:
        """Softmax attention of this rank's heads (b, a/t, s, dh), dropout mask included."""
        b, _, s, _ = q.shape
        m = self.cfg.model
        # BEGIN SOLUTION hint: draw the full (b, a, s, s) mask (dropout_mask, site "attn"), keep this rank's heads (clone the slice), call attention_core
        mask = dropout_mask((b, m.a, s, s), m.attn_dropout, seed, self.layer, "attn", q.device)
        if mask is not None:
            lo = self.groups.tp_rank * self.heads
            mask = mask[:, lo : lo + self.heads].clone()  # a compact copy: saved for backward
        return attention_core(q, k, v, mask, m.attn_dropout)
        # END SOLUTION

    def forward(self, x: torch.Tensor, seed: int) -> torch.Tensor:
        # BEGIN SOLUTION hint: qkv -> (b, s, 3h/t), split into q, k, v, split_heads(a/t); core (checkpointed when recompute == "selective"); merge_heads; o
        qkv = self.qkv(x)  # (b, s, 3h/t)
        q, k, v = (split_heads(z, self.heads) for z in qkv.chunk(3, dim=-1))  # (b, a/t, s, dh)
        if self.cfg.recompute == "selective":
            ctx = checkpoint(self.core, q, k, v, seed, use_reentrant=True,
                             preserve_rng_state=False)
        else:
            ctx = self.core(q, k, v, seed)
        return self.o(merge_heads(ctx))  # (b, s, h), or (b, s/t, h) under SP
        # END SOLUTION


class ParallelMLP(nn.Module):
    """Column-parallel ``fc`` (ffn/t columns), GeLU on the local slice, row-parallel ``proj``."""

    def __init__(self, serial: SerialBlock, groups: TPGroups, cfg: TPConfig):
        super().__init__()
        sp = cfg.sequence_parallel
        groups.shard(cfg.model.ffn, "MLP width ffn")
        self.fc = ColumnParallelLinear(serial.fc.weight, serial.fc.bias, groups, sp, cfg.regather)
        self.proj = RowParallelLinear(serial.proj.weight, serial.proj.bias, groups, sp)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # BEGIN SOLUTION hint: proj(gelu(fc(x))): GeLU is elementwise, so it acts on the local columns
        return self.proj(F.gelu(self.fc(x)))
        # END SOLUTION


class ParallelBlock(nn.Module):
    """Pre-LN block ``x + drop(attn(ln1 x))``, ``x + drop(mlp(ln2 x))`` on (b, s, h), or on
    (b, s/t, h) sequence shards under SP."""

    def __init__(self, serial: SerialBlock, groups: TPGroups, cfg: TPConfig):
        super().__init__()
        self.groups, self.cfg, self.layer = groups, cfg, serial.layer
        self.ln1 = _copy_norm(serial.ln1, cfg.sequence_parallel)
        self.ln2 = _copy_norm(serial.ln2, cfg.sequence_parallel)
        self.attn = ParallelAttention(serial, groups, cfg)
        self.mlp = ParallelMLP(serial, groups, cfg)

    def _dropout(self, o: torch.Tensor, seed: int, site: str) -> torch.Tensor:
        m = self.cfg.model
        b, s_loc, h = o.shape
        # BEGIN SOLUTION hint: full (b, s, h) mask; under SP keep (a clone of) this rank's positions
        s = s_loc * self.groups.tp if self.cfg.sequence_parallel else s_loc
        mask = dropout_mask((b, s, h), m.dropout, seed, self.layer, site, o.device)
        if mask is not None and self.cfg.sequence_parallel:
            lo = self.groups.tp_rank * s_loc
            mask = mask[:, lo : lo + s_loc].clone()  # (b, s/t, h)
        return apply_dropout(o, mask, m.dropout)
        # END SOLUTION

    def _forward(self, x: torch.Tensor, seed: int) -> torch.Tensor:
        x = x + self._dropout(self.attn(self.ln1(x), seed), seed, "attn_out")
        return x + self._dropout(self.mlp(self.ln2(x)), seed, "mlp_out")

    def forward(self, x: torch.Tensor, seed: int = 0) -> torch.Tensor:
        if self.cfg.recompute == "full":
            # BEGIN SOLUTION hint: checkpoint the whole _forward (use_reentrant=True; preserve_rng_state=False: the masks are seeded)
            return checkpoint(self._forward, x, seed, use_reentrant=True, preserve_rng_state=False)
            # END SOLUTION
        return self._forward(x, seed)


class ParallelGPT(nn.Module):
    """Tensor-parallel :class:`SerialGPT`: ``forward(idx, target, seed)`` returns the mean
    loss; :meth:`logits` the (b, s, V/t) vocabulary slice of the logits."""

    def __init__(self, serial: SerialGPT, groups: TPGroups, cfg: TPConfig):
        super().__init__()
        if groups.tp != cfg.t:
            raise ValueError(f"TPConfig t={cfg.t} but the tp group has {groups.tp} ranks")
        self.groups, self.cfg, sp = groups, cfg, cfg.sequence_parallel
        self.tok = VocabParallelEmbedding(serial.tok.weight, groups, sp)
        self.pos = nn.Parameter(serial.pos.detach().clone())
        self.pos.sequence_parallel = sp
        self.blocks = nn.ModuleList(ParallelBlock(b, groups, cfg) for b in serial.blocks)
        self.ln_f = _copy_norm(serial.ln_f, sp)
        self.head = ColumnParallelLinear(serial.head.weight, None, groups, sp, cfg.regather)

    def logits(self, idx: torch.Tensor, seed: int = 0) -> torch.Tensor:
        x = self.tok(idx)  # (b, s, h), or (b, s/t, h) under SP
        s_loc = x.shape[1]
        lo = self.groups.tp_rank * s_loc if self.cfg.sequence_parallel else 0
        x = x + self.pos[lo : lo + s_loc]
        for blk in self.blocks:
            x = blk(x, seed)
        return self.head(self.ln_f(x))  # (b, s, V/t)

    def forward(self, idx: torch.Tensor, target: torch.Tensor, seed: int = 0) -> torch.Tensor:
        return vocab_parallel_cross_entropy(self.logits(idx, seed), target, self.groups)


def sync_sequence_parallel_grads(model: nn.Module, groups: TPGroups) -> None:
    """Sum over the tp group the gradients of replicated parameters that saw only this
    rank's sequence shard (marked ``p.sequence_parallel``); no-op without SP."""
    # BEGIN SOLUTION hint: for every parameter with sequence_parallel True and a grad, replace the grad by its all-reduced sum
    for p in model.parameters():
        if getattr(p, "sequence_parallel", False) and p.grad is not None:
            p.grad = all_reduce(p.grad, groups)
    # END SOLUTION
