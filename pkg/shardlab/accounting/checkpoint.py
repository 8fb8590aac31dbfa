"""Bytes of a sharded checkpoint: what each rank writes, and what a rank reads to reshard.

Layout (lab 04's ``checkpoint.py``): one file per rank holding, for every flat parameter of
``numel`` elements padded to ``padded = ceil(numel / D) * D``, its ``padded / D`` slice of
the weights and of each of the optimizer's ``n_states`` per-element tensors (AdamW: 2, its
moments; SGD with momentum: 1), ``itemsize`` bytes per element, plus the rank's RNG state
(``rng_bytes``). The small ``meta.json`` (shapes, offsets, checksums) is not counted here.

Resharding from ``old_world`` to ``new_world`` ranks: the new rank ``r`` needs the elements
``[r s', min((r + 1) s', numel))`` of each flat (``s'`` its new shard length) and reads every
old shard that overlaps that range *whole*, so the checksum of each shard it reads can be
verified; a shard that holds only padding is never read. It also reads one old rank's RNG
state (old rank ``r mod old_world``).
"""

from __future__ import annotations

from ._validate import integer, nonneg_int, positive_int

__all__ = ["shard_numel", "shard_file_bytes", "checkpoint_bytes", "reshard_read_bytes"]


def shard_numel(numel: int, world: int) -> int:
    """Elements of one rank's slice: ``ceil(numel / world)`` (the flat is padded to D of them)."""
    numel, world = positive_int("numel", numel), positive_int("world", world)
    return -(-numel // world)


def shard_file_bytes(
    numels: list[int], world: int, n_states: int, itemsize: int = 4, rng_bytes: int = 0
) -> int:
    """Bytes of one rank's shard file: ``sum_f ceil(n_f / D) * itemsize * (1 + n_states)``
    plus ``rng_bytes``. Every rank's file has this size (padding makes the slices equal)."""
    n_states, rng_bytes = nonneg_int("n_states", n_states), nonneg_int("rng_bytes", rng_bytes)
    itemsize = positive_int("itemsize", itemsize)
    per_elem = itemsize * (1 + n_states)
    return sum(shard_numel(n, world) for n in numels) * per_elem + rng_bytes


def checkpoint_bytes(
    numels: list[int], world: int, n_states: int, itemsize: int = 4, rng_bytes: int = 0
) -> int:
    """Bytes of all ``world`` shard files together (``meta.json`` aside)."""
    return world * shard_file_bytes(numels, world, n_states, itemsize, rng_bytes)


def reshard_read_bytes(
    numels: list[int],
    old_world: int,
    new_world: int,
    rank: int,
    n_states: int,
    itemsize: int = 4,
    rng_bytes: int = 0,
) -> int:
    """Shard-file bytes the new rank ``rank`` of ``new_world`` reads from an ``old_world``
    checkpoint: the whole old slices overlapping its data range, for the weights and each
    optimizer state, plus one RNG state."""
    new_world, rank = positive_int("new_world", new_world), integer("rank", rank, minimum=0)
    n_states, rng_bytes = nonneg_int("n_states", n_states), nonneg_int("rng_bytes", rng_bytes)
    itemsize = positive_int("itemsize", itemsize)
    if rank >= new_world:
        raise ValueError(f"rank={rank} must be < new_world={new_world}")
    elems = 0
    for n in numels:
        s_old, s_new = shard_numel(n, old_world), shard_numel(n, new_world)
        lo, hi = rank * s_new, min((rank + 1) * s_new, n)
        if lo < hi:  # old shards k with [k s_old, (k+1) s_old) meeting [lo, hi)
            elems += ((hi - 1) // s_old - lo // s_old + 1) * s_old
    return elems * itemsize * (1 + n_states) + rng_bytes
