"""Lab 06 — the single-process model the tensor-parallel one must reproduce (given, not graded).

:class:`SerialGPT` is a small pre-LayerNorm GPT in ordinary PyTorch: token and position
embeddings, ``layers`` blocks (causal attention with separate ``q/k/v/o`` projections and
attention dropout, then a GeLU MLP of width ``ffn``, each followed by dropout on its output
and a residual add), a final LayerNorm and an untied head. It is the reference for the
correctness tests and the module DTensor's ``parallelize_module`` shards in the benchmark.

Dropout masks are drawn from a private ``torch.Generator`` seeded by
:func:`dropout_seed` ``(seed, layer, site)`` for the *full* tensor, never from the global
RNG. The tensor-parallel model draws the same full mask on every rank and keeps its slice
(its heads, or its sequence positions), so its randomness is that of one process for every
``t``; and a recomputed forward (activation checkpointing) redraws the same mask.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from shardlab.accounting.compute import ModelShape
from torch import nn

SITES = {"attn": 0, "attn_out": 1, "mlp_out": 2}  # where a layer draws dropout masks


@dataclass(frozen=True)
class ModelConfig:
    """Sizes of the lab's GPT (fp32). ``ffn`` is the MLP width (not 4h on purpose)."""

    vocab: int = 64
    seq: int = 16
    h: int = 32
    a: int = 4
    ffn: int = 96
    layers: int = 2
    dropout: float = 0.1  # on each block's output
    attn_dropout: float = 0.1  # on the attention probabilities

    def __post_init__(self) -> None:
        for name in ("vocab", "seq", "h", "a", "ffn", "layers"):
            x = getattr(self, name)
            if not isinstance(x, int) or isinstance(x, bool) or x < 1:
                raise ValueError(f"{name}={x!r} must be a positive integer")
        if self.h % self.a:
            raise ValueError(f"hidden width h={self.h} is not divisible by heads a={self.a}")
        for name in ("dropout", "attn_dropout"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"{name}={getattr(self, name)!r} must be in [0, 1)")

    @classmethod
    def from_shape(
        cls, shape: ModelShape, *, dropout: float = 0.0, attn_dropout: float = 0.0
    ) -> ModelConfig:
        """The lab's GPT of an ``accounting.compute.ModelShape`` (GPT-style, untied head;
        anything else is a ``ValueError``); the dropout probabilities default to none."""
        shape.check_gpt_style("ModelConfig.from_shape")
        if shape.tied_embeddings:
            raise ValueError("ModelConfig.from_shape: SerialGPT's head is untied; this shape "
                             "has tied_embeddings=True.")
        return cls(vocab=shape.vocab, seq=shape.seq_len, h=shape.hidden, a=shape.heads,
                   ffn=shape.ffn, layers=shape.layers, dropout=dropout,
                   attn_dropout=attn_dropout)

    def to_shape(self) -> ModelShape:
        """This model as the accounting describes it (the reverse of :meth:`from_shape`)."""
        return ModelShape(layers=self.layers, hidden=self.h, heads=self.a, kv_heads=self.a,
                          ffn=self.ffn, vocab=self.vocab, seq_len=self.seq, gated=False,
                          dropout=self.dropout > 0 or self.attn_dropout > 0, norm="layernorm")


def dropout_seed(seed: int, layer: int, site: str) -> int:
    """The generator seed of one dropout call: a fixed function of (step seed, layer, site)."""
    return (seed * 1_000_003 + layer * 101 + SITES[site]) % (2**62)


def dropout_mask(
    shape, p: float, seed: int, layer: int, site: str, device=None
) -> torch.Tensor | None:
    """Full-size boolean mask, True = dropped (``None`` when ``p == 0``); drawn on the CPU
    (the same numbers on every machine), then moved to ``device``."""
    if p == 0:
        return None
    gen = torch.Generator().manual_seed(dropout_seed(seed, layer, site))
    return (torch.rand(shape, generator=gen) < p).to(device)


def apply_dropout(x: torch.Tensor, mask: torch.Tensor | None, p: float) -> torch.Tensor:
    """``x`` with masked elements zeroed, scaled by 1/(1-p); backward keeps only the
    1-byte mask (``masked_fill`` saves it, a product with a Python number saves nothing)."""
    return x if mask is None else x.masked_fill(mask, 0.0) * (1.0 / (1.0 - p))


def causal_bias(s: int, device=None) -> torch.Tensor:
    """(s, s) additive mask: 0 on and below the diagonal, -inf above (adding it saves nothing)."""
    return torch.full((s, s), float("-inf"), device=device).triu(1)


def attention_core(q, k, v, mask: torch.Tensor | None, p: float) -> torch.Tensor:
    """Causal softmax attention on (b, heads, s, dh) contiguous q, k, v -> (b, heads, s, dh).

    Saved for backward: q, k (the scores' matmul), the softmax output, the dropout mask and
    the dropped-out probabilities with v (the second matmul)."""
    scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]))  # (b, heads, s, s)
    att = (scores + causal_bias(q.shape[2], q.device)).softmax(-1)
    return apply_dropout(att, mask, p) @ v


def split_heads(x: torch.Tensor, heads: int) -> torch.Tensor:
    """(b, s, heads*dh) -> contiguous (b, heads, s, dh)."""
    b, s, w = x.shape
    return x.view(b, s, heads, w // heads).transpose(1, 2).contiguous()


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    """(b, heads, s, dh) -> (b, s, heads*dh)."""
    b, n, s, dh = x.shape
    return x.transpose(1, 2).reshape(b, s, n * dh)


class SerialBlock(nn.Module):
    def __init__(self, c: ModelConfig, layer: int):
        super().__init__()
        self.c, self.layer = c, layer
        self.ln1, self.ln2 = nn.LayerNorm(c.h), nn.LayerNorm(c.h)
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (nn.Linear(c.h, c.h) for _ in range(4))
        self.fc, self.proj = nn.Linear(c.h, c.ffn), nn.Linear(c.ffn, c.h)

    def forward(self, x: torch.Tensor, seed: int = 0) -> torch.Tensor:  # (b, s, h)
        c, b = self.c, x.shape[0]
        y = self.ln1(x)
        q, k, v = (p(y) for p in (self.q_proj, self.k_proj, self.v_proj))  # (b, s, h_local)
        s = q.shape[1]  # the full sequence, also when DTensor's SequenceParallel shards x
        heads = q.shape[-1] // (c.h // c.a)  # from the local width: DTensor shards give a/t
        lo = _rank() * heads if heads < c.a else 0
        mask = dropout_mask((b, c.a, s, s), c.attn_dropout, seed, self.layer, "attn", x.device)
        mask = None if mask is None else mask[:, lo : lo + heads].clone()
        ctx = attention_core(*(split_heads(z, heads) for z in (q, k, v)), mask, c.attn_dropout)
        o = self.o_proj(merge_heads(ctx))
        x = x + apply_dropout(o, self._out_mask(o, s, seed, "attn_out"), c.dropout)
        m = self.proj(F.gelu(self.fc(self.ln2(x))))
        return x + apply_dropout(m, self._out_mask(m, s, seed, "mlp_out"), c.dropout)

    def _out_mask(self, o: torch.Tensor, s: int, seed: int, site: str):
        """The full (b, s, h) mask, or this rank's positions if ``o`` is a sequence shard."""
        b, s_loc, h = o.shape
        mask = dropout_mask((b, s, h), self.c.dropout, seed, self.layer, site, o.device)
        if mask is None or s_loc == s:
            return mask
        return mask[:, _rank() * s_loc : (_rank() + 1) * s_loc].clone()


def _rank() -> int:
    """This process's rank: the tp rank when DTensor shards the block over the whole world."""
    import torch.distributed as dist

    return dist.get_rank() if dist.is_initialized() else 0


class SerialGPT(nn.Module):
    """The whole model in one process: ``forward(idx, seed) -> logits (b, s, V)``."""

    def __init__(self, c: ModelConfig, seed: int = 0):
        super().__init__()
        self.c = c
        self.tok = nn.Embedding(c.vocab, c.h)
        self.pos = nn.Parameter(torch.zeros(c.seq, c.h))
        self.blocks = nn.ModuleList(SerialBlock(c, i) for i in range(c.layers))
        self.ln_f = nn.LayerNorm(c.h)
        self.head = nn.Linear(c.h, c.vocab, bias=False)
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():  # weights from the seed only: every rank builds the same model
            for name, p in self.named_parameters():
                if "ln" in name:
                    p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
                else:
                    p.copy_(0.1 * torch.randn(p.shape, generator=gen))

    def forward(self, idx: torch.Tensor, seed: int = 0) -> torch.Tensor:
        x = self.tok(idx) + self.pos[: idx.shape[1]]  # (b, s, h)
        for blk in self.blocks:
            x = blk(x, seed)
        return self.head(self.ln_f(x))  # (b, s, V)


def make_batch(c: ModelConfig, b: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(idx, target), each (b, seq), from a private generator."""
    gen = torch.Generator().manual_seed(10_000 + seed)
    data = torch.randint(0, c.vocab, (b, c.seq + 1), generator=gen)
    return data[:, :-1].contiguous(), data[:, 1:].contiguous()
