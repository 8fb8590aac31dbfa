"""The expert-parallel notebook's one 2-rank launch: the checks, then a small benchmark.

Nothing of its own is sharded or sent: it runs ``_workers_expert.check_many`` (the MoE layer
against one process, the all-to-all rows, the capacity sweep) and then
``benchmark_expert.benchmark`` on the same ranks, so the notebook's measured sections read one
launch.
"""

from __future__ import annotations

from _workers_expert import check_many
from benchmark_expert import benchmark


def lab_report(cases: list[tuple], sweep: tuple, bench: tuple) -> dict:
    """The notebook's 2-rank launch: :func:`_workers_expert.check_many` ``(cases, sweep)``, then a small
    :func:`benchmark_expert.benchmark` ``(cfg, tokens, steps)`` on the same ranks.

    One launch rather than two: the benchmark reuses the ranks and process groups the checks
    already set up.
    """
    out = check_many(cases, sweep)
    out["bench"] = benchmark(*bench)
    return out
