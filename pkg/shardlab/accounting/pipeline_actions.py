"""The vocabulary of pipeline schedules: actions, their default costs, stage placement.

A leaf of :mod:`.pipeline` (which re-exports everything here), so that the schedule
generators of :mod:`.pipeline_v`, the simulator of :mod:`.pipeline_sim` and the byte counts
of :mod:`.pipeline_bytes` can share it without importing :mod:`.pipeline` back.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import _validate as chk

ACTION_KINDS = ("F", "B", "BI", "BW")
DEFAULT_COSTS = {"F": 1.0, "B": 2.0, "BI": 1.0, "BW": 1.0}
PLACEMENTS = ("loop", "v")  # where a rank's chunks sit: virtual stages c p + r, or r and 2p-1-r


def _pmv(p, m, vv=1):
    """``(p, m, v)`` checked: stages, microbatches and chunks per rank, each a positive int."""
    return chk.positive_int("p", p), chk.positive_int("m", m), chk.positive_int("v", vv)


@dataclass(frozen=True, order=True)
class Action:
    """One unit of work on a rank: ``kind`` of ``microbatch`` on model ``chunk``."""

    kind: str
    microbatch: int
    chunk: int = 0

    def __post_init__(self) -> None:
        chk.choice("kind", self.kind, ACTION_KINDS)
        chk.nonneg_int("microbatch", self.microbatch)
        chk.nonneg_int("chunk", self.chunk)

    def __str__(self) -> str:
        return f"{self.kind}{self.microbatch}" + (f".{self.chunk}" if self.chunk else "")


def virtual_stage(rank: int, chunk: int, p: int, placement: str = "loop") -> int:
    """The virtual stage of ``chunk`` on ``rank``: ``chunk p + rank`` in a loop; in a V
    chunk 0 is stage ``rank`` and chunk 1 stage ``2p-1-rank``."""
    if placement == "v":
        if chunk > 1:
            raise ValueError(f"a V holds chunks 0 and 1 per rank, got chunk={chunk}")
        return rank if chunk == 0 else 2 * p - 1 - rank
    return chunk * p + rank


def stage_rank(k: int, p: int, placement: str = "loop") -> int:
    """The rank holding virtual stage ``k`` (``k % p`` in a loop, ``min(k, 2p-1-k)`` in a V)."""
    return min(k, 2 * p - 1 - k) if placement == "v" else k % p


def _costs(costs: dict[str, float] | None) -> dict[str, float]:
    c = dict(DEFAULT_COSTS)
    for k, x in (costs or {}).items():
        chk.choice("costs key", k, ACTION_KINDS)
        c[k] = chk.nonneg_number(f"costs[{k!r}]", x)
    return c
