"""The lab notebook's launches: several measurements per launch, so the notebook starts few ranks.

Each launch sets up ranks, process groups and models again, and the notebook's own process
would import what the first ``torch.optim.AdamW`` needs only to compute references. So:

* :func:`launch_checks` runs :func:`_workers_pipeline.check_all` (3 AdamW steps per schedule,
  one step traced for bytes, one for saved activations) and, on rank 0 after it, the
  one-process references :func:`_workers_pipeline.reference` (the same microbatches
  accumulated in order, and the full batch): the ranks have paid for AdamW's imports already,
  the notebook's own process then never does;
* :func:`timed_suite` serves the bubble, unbalanced-split and side-by-side sections:
  ``balanced``: :func:`_timing_pipeline.timed_all` (``timed`` for every schedule) on the
  'timing' model, ``{(kind, v): events of each measured step}``; ``unbalanced``: the same for 1F1B with the
  blocks split ``layers`` (one block moved from the first stage to the second); ``bench``:
  :func:`benchmark_pipeline.benchmark` per schedule, ours beside ``torch.distributed.pipelining``
  on the same stages and batch.

Nothing here is used by the tests or the grader; ``benchmark_pipeline.py`` runs the longer
measurements (more microbatches and steps, several launches, medians).
"""

from __future__ import annotations

import _timing_pipeline as T
import _workers_pipeline as W
import benchmark_pipeline as B
import torch.distributed as dist
from shardlab.accounting import pipeline as acc


def checks(size: str, m: int, n: int, schedules) -> tuple[dict, tuple[dict, dict] | None]:
    """On each rank: its :func:`_workers_pipeline.check_all` report; rank 0 also returns the
    references ``(microbatched, full batch)`` (``None`` on the other ranks)."""
    runs = W.check_all(size, m, n, schedules)
    refs = None
    if dist.get_rank() == 0:  # one process, the same batch: what the pipeline must equal
        refs = (W.reference(size, m, n), W.reference(size, m, n, full_batch=True))
    return runs, refs


def launch_checks(p: int, m: int, schedules, size: str = "test"):
    """Validate every ``(kind, p, m, v, n_layer)`` (a ``ValueError`` naming the values, before
    any rank starts), run :func:`checks` on ``p`` ranks with ``2 m`` sequences per step;
    return ``(reports per rank, (reference, full-batch reference))``."""
    from shardlab.runtime import launch

    for kind, v in schedules:
        acc.check_pipeline(kind, p, m, v, W.config(size).n_layer)
    out = launch("_workers_pipeline_nb:checks", p, size, m, 2 * m, schedules, quiet=True)
    return [runs for runs, _ in out], out[0][1]


def timed_suite(
    m: int = 4,
    steps: int = 4,
    layers: tuple[int, int] = (3, 5),
    bench_m: int = 4,
    bench_steps: int = 2,
    schedules=W.SCHEDULES,
) -> dict:
    """Run on 2 ranks: the balanced timing of ``schedules``, the unbalanced 1F1B, the
    benchmark rows (see the module docstring). Each rank returns its own events."""
    balanced = T.timed_all(m, schedules, steps)
    unbalanced = T.timed("1f1b", m, 1, steps=steps, layers=list(layers))
    bench = [B.benchmark(k, m=bench_m, steps=bench_steps) for k, _ in schedules]
    return {"balanced": balanced, "unbalanced": unbalanced, "bench": bench}
