"""Small models for labs and tests: :class:`GPTConfig`, :class:`GPT`, :func:`make_batch`."""

from shardlab.models.gpt import GPT, Block, GPTConfig, make_batch

__all__ = ["GPT", "GPTConfig", "Block", "make_batch"]
