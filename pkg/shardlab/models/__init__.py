"""Small models for labs and tests: :class:`GPTConfig`, :class:`GPT`, :func:`make_batch`, and
the data-parallel labs' tiny-GPT setup (:mod:`shardlab.models.tiny`)."""

from shardlab.models.gpt import GPT, Block, GPTConfig, make_batch
from shardlab.models.tiny import (
    GLOBAL_BATCH,
    KINDS,
    OPTIMIZERS,
    SIZES,
    lm_loss,
    make_optimizer,
    predicted_step_peak,
    rank_slice,
    split_microbatches,
    step_batch,
    tiny_gpt,
    train_step,
)

__all__ = [
    "GPT",
    "GPTConfig",
    "Block",
    "make_batch",
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
