"""Lab 05's bubble on balanced stages, timed on real ranks (slow: ``make test-slow``).

Two ranks, the 'timing' model (8 equal blocks; embeddings and head under 1 % of a stage),
m = 8, all four schedules, the least disturbed of 5 steps (``_timing_pipeline.analyse``),
three launches; the balance and idle checks use the medians of the three.

Tolerances, and why:

* stage balance: the ranks' median CPU time of F and of B (F only for zb-h1: stage 0 runs its
  whole backward in BW, nothing upstream waits for its BI, so its BI and BW are not the other
  stages' halves) within 25 % of each other. The work is equal; what differs is the core a rank runs on (the 2 cores of this
  machine are shared with other jobs; spreads of 0-20 % were seen on one run, a few % typical).
  GPipe's forward is checked too since the ranks keep glibc's heap between steps
  (``shardlab.testing.steady_malloc``, called by ``_timing_pipeline._timing_rank``): before, its 8 back-to-back forwards took page faults
  to regrow the heap every step and cost one rank up to 40 % more CPU time than the other;
  now 4-5 % was seen;
* simulator fed the run's own per-action costs against the measured makespan: the median of
  the three runs within 15 %. The issue's target is 10 % (seen 1.00-1.09 run alone, and checked
  by ``benchmark_pipeline.py --bubble``); here the test shares the 2 cores with another pytest
  worker, and a single run reached 1.13 (interleaved) in CI;
* idle fraction against the closed form ``accounting.pipeline.schedule_idle_fraction``: not
  asserted here. ``make test-slow`` runs this test beside another pytest worker on the same 2
  cores, so the ranks do not each have a processor, which the closed form assumes (CI run:
  GPipe 15.2-18.2 % against 11.1 %). The 3-point target is checked and printed by
  ``benchmark_pipeline.py --bubble`` (medians of several runs, run alone); this test prints the
  gap;
* orderings the closed form predicts and the measurement must show: interleaved (v = 2) and
  ZB-H1 idle less than 1F1B.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "labs" / "05_pipeline"))

import pytest  # noqa: E402


@pytest.mark.slow
def test_balanced_bubble_two_ranks():
    import statistics

    import _timing_pipeline as T
    import _workers_pipeline as W

    runs = [T.measure_schedules(p=2, m=8) for _ in range(3)]  # medians of 3 launches
    idle = {}
    for key in W.SCHEDULES:
        kind = key[0]
        keys = ("F",) if kind == "zb-h1" else ("F", "B")
        one = [r[key] for r in runs]
        spread = statistics.median(max(a["cpu_spread"][k] for k in keys) for a in one)
        assert spread <= 0.25, (kind, [a["cpu_spread"] for a in one])
        # the simulator fed each run's own costs: median of the three runs within 15 %
        ratios = [a["makespan"] / a["sim_makespan"] for a in one]
        assert 0.85 <= statistics.median(ratios) <= 1.15, (kind, ratios)
        idle[kind] = statistics.median(a["idle"] for a in one)
        closed = statistics.median(a["closed_idle"] for a in one)
        print(
            f"{kind}: idle {idle[kind]:.1%} (runs {[round(a['idle'], 3) for a in one]}), "
            f"closed form {closed:.1%}, gap {100 * (idle[kind] - closed):+.1f} pp"
        )
    assert idle["interleaved"] < idle["1f1b"] and idle["zb-h1"] < idle["1f1b"], idle


def test_events_are_busy_time_after_the_input_arrived():
    """An event is the time a rank worked on an action: one rank's events never overlap, the
    CPU time spent in an action is at most its length (the wait for the input is outside it,
    and it blocks without using the CPU), and no action starts before the one producing its
    boundary tensor (activation or input gradient) on the neighbouring rank started. (Not
    before it *ended*: the producer's end is stamped after its ``isend`` returns, and the
    tensor can be in before that — a send call took milliseconds now and then.)"""
    import _workers_pipeline as W
    from shardlab.accounting.pipeline import Action
    from shardlab.runtime import launch

    p = 2
    ranks = launch("_timing_pipeline:timed_all", p, 4, W.SCHEDULES, 1, quiet=True)
    checked = 0
    for key in W.SCHEDULES:
        ev = [rank[key][0] for rank in ranks]  # one measured step: (start, end, action, cpu)
        last = p * key[1] - 1
        begin = {(r, a): s for r in range(p) for s, _, a, _ in ev[r]}
        for r in range(p):
            assert all(s <= e and c <= e - s + 1e-3 for s, e, _, c in ev[r]), (key, r)
            assert all(x[1] <= y[0] for x, y in zip(ev[r], ev[r][1:])), (key, r)
            for s, _, a, _ in ev[r]:
                k = a.chunk * p + r  # virtual stage
                if a.kind == "F" and k > 0:
                    src = k - 1
                    kinds = ("F",)
                elif a.kind in ("B", "BI") and k < last:
                    src = k + 1
                    kinds = ("B", "BI")
                else:
                    continue
                starts = [begin.get((src % p, Action(x, a.microbatch, src // p))) for x in kinds]
                (s0,) = [x for x in starts if x is not None]
                assert s >= s0, (key, r, str(a), s, s0)
                checked += 1
    assert checked == sum(2 * 4 * (p * v - 1) for _, v in W.SCHEDULES)  # every hand-over
