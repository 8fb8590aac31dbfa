"""The tiny-GPT training setup the data-parallel labs (DDP, ZeRO, FSDP) share.

* :func:`tiny_gpt`: the package's :class:`~shardlab.models.GPT` at a named size
  (:data:`SIZES`) in one of the variants the correctness tests need (:data:`KINDS`): plain,
  tied embeddings, frozen parameters, odd sizes, almost nothing trainable;
* :data:`OPTIMIZERS` / :func:`make_optimizer`: the labs' AdamW and SGD hyperparameters;
* :func:`step_batch`: the global token batch of a training step, the same on every rank;
* :func:`rank_slice`: a rank's contiguous share of a global batch (data parallelism);
* :func:`split_microbatches`: microbatches for gradient accumulation;
* :func:`lm_loss`: the language-model loss, computed in fp32 whatever the compute dtype;
* :func:`train_step`: one step (forward, backward, gradient sync, optimizer) in labelled
  phases, so a running ``CommTrace``/``MemoryTrace`` can tell them apart;
* :func:`predicted_step_peak`: the predicted peak of one profiled fp32 AdamW step.

Every function is deterministic (weights from ``seed`` only, see :class:`GPT`), so every
rank builds the same model and the single-process reference can be rebuilt anywhere.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from shardlab.models.gpt import GPT, GPTConfig, make_batch

__all__ = [
    "GLOBAL_BATCH",
    "KINDS",
    "OPTIMIZERS",
    "SIZES",
    "lm_loss",
    "make_optimizer",
    "predicted_step_peak",
    "rank_slice",
    "split_microbatches",
    "step_batch",
    "tiny_gpt",
    "train_step",
]

# GPTConfig arguments by size name.
SIZES: dict[str, dict[str, int]] = {
    "small": dict(vocab_size=16, seq_len=8, n_layer=1, n_head=2, d_model=8),
    # sizes that divide by none of 2, 3, 4: every flat buffer needs padding
    "odd": dict(vocab_size=13, seq_len=7, n_layer=1, n_head=2, d_model=6, d_ff=11),
    # two blocks (root + 2 FSDP units), d_model 10: units of uneven sizes
    "two-block": dict(vocab_size=37, seq_len=8, n_layer=2, n_head=2, d_model=10),
    # profiling and benchmarking: big enough that the model state is most of the memory
    "profile": dict(vocab_size=256, seq_len=16, n_layer=2, n_head=2, d_model=32),
    "bench": dict(vocab_size=256, seq_len=32, n_layer=4, n_head=4, d_model=128),
}

KINDS = {
    "plain": "every parameter trains",
    "tied": "token embedding = LM head (one tensor reached twice)",
    "frozen": "pos_emb fixed",
    "frozen-ln1": "pos_emb and blocks[0].ln1 fixed (frozen outside and inside a block)",
    "odd": "plain, at size 'odd' unless another size is given",
    "two": "only lm_head.weight and ln_f.bias train (fewer tensors than ranks)",
}

GLOBAL_BATCH = 24  # sequences per step: divides by 2, 3, 4 ranks and 2 microbatches per rank

OPTIMIZERS: dict[str, tuple[type[torch.optim.Optimizer], dict]] = {
    "adamw": (torch.optim.AdamW, {"lr": 1e-2, "weight_decay": 0.1}),
    "sgd": (torch.optim.SGD, {"lr": 0.1, "momentum": 0.9}),
}


def tiny_gpt(kind: str = "plain", seed: int = 0, size: str | None = None, **overrides) -> GPT:
    """A tiny GPT of variant ``kind`` (:data:`KINDS`) at ``size`` (:data:`SIZES`; default
    ``"odd"`` for kind ``"odd"``, else ``"small"``); ``overrides`` replace config fields."""
    if kind not in KINDS:
        raise ValueError(f"tiny_gpt: kind={kind!r} is not one of {', '.join(KINDS)}.")
    size = size or ("odd" if kind == "odd" else "small")
    if size not in SIZES:
        raise ValueError(f"tiny_gpt: size={size!r} is not one of {', '.join(SIZES)}.")
    cfg = GPTConfig(**{**SIZES[size], **overrides}, tied_embeddings=kind == "tied")
    model = GPT(cfg, seed=seed)
    if kind in ("frozen", "frozen-ln1"):
        model.pos_emb.requires_grad_(False)
    if kind == "frozen-ln1":
        model.blocks[0].ln1.requires_grad_(False)
    if kind == "two":
        model.requires_grad_(False)
        model.lm_head.weight.requires_grad_(True)
        model.ln_f.bias.requires_grad_(True)
    return model


def make_optimizer(name: str, params) -> torch.optim.Optimizer:
    """``OPTIMIZERS[name]`` over the parameters of ``params`` that require a gradient."""
    if name not in OPTIMIZERS:
        raise ValueError(f"make_optimizer: name={name!r} is not one of {', '.join(OPTIMIZERS)}.")
    cls, kw = OPTIMIZERS[name]
    return cls([p for p in params if p.requires_grad], **kw)


def step_batch(
    config: GPTConfig, step: int, n: int = GLOBAL_BATCH
) -> tuple[torch.Tensor, torch.Tensor]:
    """Global ``(idx, targets)`` batch of ``n`` sequences for training step ``step``:
    :func:`make_batch` seeded with ``1000 + step``, so every rank builds the same one."""
    return make_batch(config, n, seed=1000 + step)


def rank_slice(batch, rank: int | None = None, world: int | None = None, group=None):
    """Rank ``rank``'s contiguous ``1/world`` of a global batch along dim 0: a tensor, or a
    tuple of tensors (each sliced, e.g. ``(idx, targets)``). Views, no copy. ``rank`` and
    ``world`` default to this process's rank and size in ``group`` (``torch.distributed``)."""
    if rank is None or world is None:
        import torch.distributed as dist

        rank = dist.get_rank(group) if rank is None else rank
        world = dist.get_world_size(group) if world is None else world
    if not 0 <= rank < world:
        raise ValueError(f"rank_slice: rank={rank} must be in [0, world={world}).")
    if torch.is_tensor(batch):
        if batch.shape[0] % world:
            raise ValueError(
                f"rank_slice: batch of {batch.shape[0]} rows does not divide by world={world}."
            )
        return batch.chunk(world)[rank]
    return tuple(rank_slice(t, rank, world) for t in batch)


def split_microbatches(batch, m: int) -> list[tuple[torch.Tensor, ...]]:
    """``batch`` (a tuple of tensors) cut into ``m`` microbatches along dim 0: a list of
    ``m`` tuples (fewer when dim 0 has fewer than ``m`` rows), views, no copy."""
    if not isinstance(m, int) or m < 1:
        raise ValueError(f"split_microbatches: m={m!r} must be a positive integer.")
    return list(zip(*(t.chunk(m) for t in batch)))


def lm_loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy of ``model(x)`` against ``y``, in fp32 (low-precision
    logits are upcast first; in fp32 this equals ``GPT``'s own loss bit for bit)."""
    logits, _ = model(x)  # (b, s, V)
    return F.cross_entropy(logits.float().flatten(0, 1), y.flatten())


def train_step(model: nn.Module, optimizer, batch, finish=None) -> torch.Tensor:
    """One training step on ``batch`` ``(idx, targets)``: ``optimizer.zero_grad()``, then
    forward with :func:`lm_loss`, backward, ``finish()`` (e.g. a wrapper's
    ``finish_gradient_synchronization``; ``None``: nothing) and ``optimizer.step()`` inside
    :func:`shardlab.runtime.phase` ``"forward"``, ``"backward"`` and ``"optimizer"``. Returns
    the loss."""
    from shardlab.runtime import phase

    optimizer.zero_grad()
    with phase("forward"):
        loss = lm_loss(model, *batch)
    with phase("backward"):
        loss.backward()
        if finish is not None:
            finish()
    with phase("optimizer"):
        optimizer.step()
    return loss


def predicted_step_peak(prof: dict, layout: str, dp: int):
    """Predicted peak (:class:`~shardlab.accounting.peak.PeakBreakdown`) of one profiled fp32
    AdamW step on CPU. ``prof`` holds ``timeline`` (a MemoryTrace timeline), ``n_state``
    (elements the layout's model-state formula applies to), ``stepped`` (numel of each tensor
    this rank's AdamW steps) and ``logits_shape`` (``(b, s, V)`` of this rank's fp32 logits). Every
    term comes from a formula except the saved activations, the trace's largest
    ``activations``:

    * persistent: ``model_state(n_state, dp, layout, "fp32")``;
    * start of backward: + activations + ``logits_workspace`` (gradients of the
      log-probabilities and of the logits, ``2 b s V q``);
    * ``optimizer.step()``: + ``adam_workspace`` of the tensors this rank steps
      (single-tensor AdamW on CPU: two temporaries the size of the largest one).
    """
    from shardlab.accounting.peak import adam_workspace, logits_workspace, predict_layout_peak

    return predict_layout_peak(
        prof["n_state"], dp, layout, "fp32",
        activation_bytes=max(prof["timeline"].bytes["activations"]),
        backward_workspace_bytes=logits_workspace(*prof["logits_shape"], 4),
        optimizer_workspace_bytes=adam_workspace(prof["stepped"]),
    )
