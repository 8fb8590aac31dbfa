"""A small GPT-style transformer for labs and tests.

``GPT(config)`` = token embedding + learned position embedding, ``n_layer`` pre-LayerNorm
blocks (causal self-attention, then a GELU MLP, each with a residual connection), a final
LayerNorm and a language-model head (optionally tied to the token embedding).

Deterministic initialisation: the weights depend only on ``seed`` (a private
``torch.Generator``), never on the global RNG, so every rank builds the same model without
a broadcast. ``model.blocks`` is an ``nn.ModuleList``; FSDP units wrap its entries.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from shardlab.accounting.compute import ModelShape

__all__ = ["GPTConfig", "GPT", "Block", "make_batch"]


@dataclass(frozen=True)
class GPTConfig:
    vocab_size: int = 64
    seq_len: int = 16
    n_layer: int = 2
    n_head: int = 2
    d_model: int = 32
    d_ff: int | None = None  # default 4 * d_model
    tied_embeddings: bool = False
    dropout: float = 0.0

    def __post_init__(self):
        for name in ("vocab_size", "seq_len", "n_layer", "n_head", "d_model"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"GPTConfig: {name}={v!r} must be a positive integer.")
        if self.d_model % self.n_head:
            raise ValueError(
                f"GPTConfig: d_model={self.d_model} is not divisible by n_head={self.n_head}; "
                "each head gets d_model / n_head dimensions."
            )
        if self.d_ff is None:
            object.__setattr__(self, "d_ff", 4 * self.d_model)
        elif not isinstance(self.d_ff, int) or isinstance(self.d_ff, bool) or self.d_ff < 1:
            raise ValueError(f"GPTConfig: d_ff={self.d_ff!r} must be a positive integer.")
        if not (0.0 <= float(self.dropout) < 1.0):
            raise ValueError(f"GPTConfig: dropout={self.dropout!r} must be in [0, 1).")

    @classmethod
    def from_shape(cls, shape: ModelShape, *, dropout: float = 0.0) -> GPTConfig:
        """The GPT of an :class:`shardlab.accounting.compute.ModelShape` (GPT-style: GeLU MLP,
        ``kv_heads = heads``, LayerNorm; anything else is a ``ValueError``). ``dropout`` is the
        probability; ``shape.dropout`` only tells the accounting whether masks are saved."""
        shape.check_gpt_style("GPTConfig.from_shape")
        return cls(vocab_size=shape.vocab, seq_len=shape.seq_len, n_layer=shape.layers,
                   n_head=shape.heads, d_model=shape.hidden, d_ff=shape.ffn,
                   tied_embeddings=shape.tied_embeddings, dropout=dropout)

    def to_shape(self) -> ModelShape:
        """This GPT as the accounting describes it (the reverse of :meth:`from_shape`)."""
        return ModelShape(layers=self.n_layer, hidden=self.d_model, heads=self.n_head,
                          kv_heads=self.n_head, ffn=self.d_ff, vocab=self.vocab_size,
                          seq_len=self.seq_len, gated=False,
                          tied_embeddings=self.tied_embeddings, dropout=self.dropout > 0,
                          norm="layernorm")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_head

    def n_params(self) -> int:
        """Parameter count of :class:`GPT` with this config (matches ``model.numel``)."""
        h, f, v, s, L = self.d_model, self.d_ff, self.vocab_size, self.seq_len, self.n_layer
        block = 2 * 2 * h + (3 * h * h + 3 * h) + (h * h + h) + (h * f + f) + (f * h + h)
        emb = v * h + s * h
        head = 0 if self.tied_embeddings else v * h
        return emb + L * block + 2 * h + head


class Attention(nn.Module):
    def __init__(self, c: GPTConfig):
        super().__init__()
        self.n_head, self.dropout = c.n_head, c.dropout
        self.qkv = nn.Linear(c.d_model, 3 * c.d_model)
        self.proj = nn.Linear(c.d_model, c.d_model)

    def forward(self, x):
        b, s, h = x.shape
        q, k, v = self.qkv(x).split(h, dim=2)
        q, k, v = (t.view(b, s, self.n_head, h // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(
            q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0
        )
        return self.proj(y.transpose(1, 2).reshape(b, s, h))


class MLP(nn.Module):
    def __init__(self, c: GPTConfig):
        super().__init__()
        self.fc = nn.Linear(c.d_model, c.d_ff)
        self.proj = nn.Linear(c.d_ff, c.d_model)
        self.drop = nn.Dropout(c.dropout)

    def forward(self, x):
        return self.drop(self.proj(F.gelu(self.fc(x))))


class Block(nn.Module):
    """Pre-LN transformer block: x + attn(ln1(x)), then x + mlp(ln2(x))."""

    def __init__(self, c: GPTConfig):
        super().__init__()
        self.ln1 = nn.LayerNorm(c.d_model)
        self.attn = Attention(c)
        self.ln2 = nn.LayerNorm(c.d_model)
        self.mlp = MLP(c)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """Small GPT; ``forward(idx, targets=None) -> (logits, loss)`` (loss None without targets)."""

    def __init__(self, config: GPTConfig, seed: int = 0, device=None):
        super().__init__()
        if not isinstance(config, GPTConfig):
            raise TypeError(f"GPT expects a GPTConfig, got {type(config).__name__}.")
        self.config = c = config
        self.tok_emb = nn.Embedding(c.vocab_size, c.d_model)
        self.pos_emb = nn.Embedding(c.seq_len, c.d_model)
        self.drop = nn.Dropout(c.dropout)
        self.blocks = nn.ModuleList(Block(c) for _ in range(c.n_layer))
        self.ln_f = nn.LayerNorm(c.d_model)
        self.lm_head = nn.Linear(c.d_model, c.vocab_size, bias=False)
        if c.tied_embeddings:
            self.lm_head.weight = self.tok_emb.weight
        self.reset_parameters(seed)
        if device is not None:
            self.to(device)

    @torch.no_grad()
    def reset_parameters(self, seed: int = 0) -> None:
        """Initialise every weight from a private generator seeded with ``seed`` (CPU),
        N(0, 0.02) for matrices and embeddings, residual projections scaled by
        1/sqrt(2 n_layer), zeros for biases, ones for LayerNorm weights."""
        g = torch.Generator(device="cpu").manual_seed(int(seed))
        std = 0.02
        resid = std / math.sqrt(2 * self.config.n_layer)
        seen = set()
        for name, p in self.named_parameters():  # deterministic order; tied weight once
            if id(p) in seen:
                continue
            seen.add(id(p))
            if name.endswith("bias"):
                vals = torch.zeros(p.shape)
            elif ".ln" in name or name.startswith("ln_"):
                vals = torch.ones(p.shape)
            else:
                s = resid if name.endswith("proj.weight") else std
                vals = torch.randn(p.shape, generator=g) * s
            p.copy_(vals.to(dtype=p.dtype, device=p.device))

    def forward(self, idx, targets=None):
        b, s = idx.shape
        if s > self.config.seq_len:
            raise ValueError(f"sequence length {s} exceeds config.seq_len={self.config.seq_len}.")
        pos = torch.arange(s, device=idx.device)
        x = self.drop(self.tok_emb(idx) + self.pos_emb(pos))
        for blk in self.blocks:
            x = blk(x)
        logits = self.lm_head(self.ln_f(x))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))
        return logits, loss


def make_batch(config: GPTConfig, batch: int, seed: int = 0, device=None):
    """Deterministic (idx, targets) of shape (batch, seq_len): targets are idx shifted by one
    of a random token stream from a private generator, so the task is learnable."""
    if not isinstance(batch, int) or batch < 1:
        raise ValueError(f"make_batch: batch={batch!r} must be a positive integer.")
    g = torch.Generator(device="cpu").manual_seed(int(seed))
    data = torch.randint(0, config.vocab_size, (batch, config.seq_len + 1), generator=g)
    idx, tgt = data[:, :-1].contiguous(), data[:, 1:].contiguous()
    if device is not None:
        idx, tgt = idx.to(device), tgt.to(device)
    return idx, tgt
