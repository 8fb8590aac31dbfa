"""The lab notebook's timed launch: every 2-rank timing measurement in one launch.

Starting ranks costs seconds (each is a fresh interpreter importing torch), so the notebook's
bubble, unbalanced-split and side-by-side sections read one launch of :func:`timed_suite`:

* ``balanced``: :func:`_workers_pipeline.timed` for every schedule on the 'timing' model
  (equal stages), ``{(kind, v): events of each measured step}``;
* ``unbalanced``: the same for 1F1B with the blocks split ``layers`` (one block moved from
  the first stage to the second);
* ``bench``: :func:`_workers_pipeline.benchmark` per schedule, ours beside
  ``torch.distributed.pipelining`` on the same stages and batch.

Nothing here is used by the tests or the grader; ``benchmark_pipeline.py`` runs the longer
versions (several launches, more steps, medians).
"""

from __future__ import annotations

import _workers_pipeline as W


def timed_suite(
    m: int = 8,
    steps: int = 3,
    layers: tuple[int, int] = (3, 5),
    bench_m: int = 8,
    bench_steps: int = 2,
    schedules=W.SCHEDULES,
) -> dict:
    """Run on 2 ranks: the balanced timing of ``schedules``, the unbalanced 1F1B, the
    benchmark rows (see the module docstring). Each rank returns its own events."""
    balanced = {(k, v): W.timed(k, m, v, steps=steps) for k, v in schedules}
    unbalanced = W.timed("1f1b", m, 1, steps=steps, layers=list(layers))
    bench = [W.benchmark(k, m=bench_m, steps=bench_steps) for k, _ in schedules]
    return {"balanced": balanced, "unbalanced": unbalanced, "bench": bench}
