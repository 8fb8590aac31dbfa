"""Lab 05's bubble on balanced stages, timed on real ranks (slow: ``make test-slow``).

Two ranks, the 'timing' model (8 equal blocks; embeddings and head under 1 % of a stage),
m = 8, all four schedules, the least disturbed of 5 steps (``_timing_pipeline.analyse``),
three launches; the balance and idle checks use the medians of the three.

Tolerances, and why:

* stage balance: asserted from the work, not from the clock
  (:func:`test_timing_stages_balanced_in_flops`, fast): each rank's forward + backward FLOPs,
  counted by ``torch.utils.flop_counter.FlopCounterMode``, within 2 % of each other (the head,
  0.5 % of a rank's FLOPs at p = 2, 1.0 % at p = 4). The ranks' CPU time per action is printed
  here, not asserted: on a CI runner shared with another pytest worker GPipe's forward took
  8-39 % more CPU time on one rank than on the other (three launches, one CI run), with the
  same FLOPs on both, so a CPU-time tolerance measured the runner, not the stages. The
  benchmark (``benchmark_pipeline.py --bubble``, run alone) prints the CPU spread beside the
  closed form;
* simulator fed the run's own per-action costs against the measured makespan: the least
  disturbed of the three launches (smallest ``|ratio - 1|``) within 15 %. A disturbance
  (another process taking a rank's core) moves one launch off the model in either direction;
  a wrong simulator moves all three. The issue's target is 10 % (seen 1.00-1.09 run alone,
  and checked by ``benchmark_pipeline.py --bubble``); a single launch reached 1.13
  (interleaved) in CI;
* idle fraction against the closed form ``accounting.pipeline.schedule_idle_fraction``: not
  asserted here. ``make test-slow`` runs this test beside another pytest worker on the same 2
  cores, so the ranks do not each have a processor, which the closed form assumes (CI run:
  GPipe 15.2-18.2 % against 11.1 %). The 3-point target is checked and printed by
  ``benchmark_pipeline.py --bubble`` (medians of several runs, run alone); this test prints the
  gap;
* orderings the closed form predicts and the measurement must show, on each schedule's least
  disturbed launch (smallest idle): interleaved (v = 2) and ZB-H1 idle less than 1F1B (closed
  form at p = 2, m = 8: 5.9 % and about 0 against 11.1 %).
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

    runs = [T.measure_schedules(p=2, m=8) for _ in range(3)]  # three launches
    idle = {}
    for key in W.SCHEDULES:
        kind = key[0]
        one = [r[key] for r in runs]
        # the simulator fed each run's own costs: the least disturbed launch within 15 %
        ratios = [a["makespan"] / a["sim_makespan"] for a in one]
        assert min(abs(x - 1) for x in ratios) <= 0.15, (kind, ratios)
        idle[kind] = min(a["idle"] for a in one)
        closed = statistics.median(a["closed_idle"] for a in one)
        print(
            f"{kind}: idle {idle[kind]:.1%} (runs {[round(a['idle'], 3) for a in one]}), "
            f"closed form {closed:.1%}, gap {100 * (idle[kind] - closed):+.1f} pp; "
            f"CPU spread per launch {[a['cpu_spread'] for a in one]}"
        )
    assert idle["interleaved"] < idle["1f1b"] and idle["zb-h1"] < idle["1f1b"], idle


def test_timing_stages_balanced_in_flops():
    """The 'timing' model's stages do equal work: each rank's forward + backward FLOPs of one
    microbatch (all its chunks), counted by ``FlopCounterMode``, within 2 % of the other
    ranks' for every schedule on 2 and 4 ranks (the head is the only difference: 0.5 % of a
    rank at p = 2, 1.0 % at p = 4). A split that gave one rank an extra block would be
    12.5 % off at p = 2."""
    import _workers_pipeline as W
    import torch
    from pipeline import split_stages
    from shardlab.models import GPT
    from torch.utils.flop_counter import FlopCounterMode

    cfg = W.config("timing")
    for p in (2, 4):
        for kind, v in W.SCHEDULES:
            stages = split_stages(GPT(cfg, seed=0), p, v)
            xs, _ = W.microbatches(cfg, 0, 8, 1)
            flops = []
            for k, st in enumerate(stages):
                x = (
                    xs[0]
                    if k == 0
                    else torch.randn(8, cfg.seq_len, cfg.d_model, requires_grad=True)
                )
                with FlopCounterMode(display=False) as fc:
                    st(x).float().sum().backward()  # (8, s, h) or (8, s, V) logits
                flops.append(fc.get_total_flops())
            per_rank = [sum(flops[k] for k in W.rank_stages(kind, p, v, r)) for r in range(p)]
            assert min(per_rank) > 0 and max(per_rank) / min(per_rank) - 1 <= 0.02, (
                p,
                kind,
                per_rank,
            )


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
