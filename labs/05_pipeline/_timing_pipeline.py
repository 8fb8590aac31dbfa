"""How the pipeline lab times a step: per-action start/end times on every rank, the idle fraction.

Nothing is sharded or sent here beyond what the schedule itself does (``pipeline.py``'s
executor; boundary activations and gradients point to point). :func:`timed` runs a schedule
for a few steps and records each action's start, end and CPU time on every rank;
:func:`analyse` turns the least disturbed step into the measured makespan, idle fraction and
per-action costs, and feeds those costs to ``accounting.pipeline.simulate`` (and, with more
ranks than cores, to ``accounting.pipeline_cores.simulate_shared``); :func:`disturbance` says
whether another process took a rank's core. :func:`_timing_rank` is how every timed rank runs
(one thread, the glibc heap kept, its own core) -- both sides of ``benchmark_pipeline.py`` too.
"""

from __future__ import annotations

import os
import statistics
import time

import torch
import torch.distributed as dist
from _workers_pipeline import SCHEDULES, THREADS, build, config, microbatches
from shardlab.accounting import pipeline as acc
from shardlab.accounting.pipeline_cores import simulate_shared
from shardlab.runtime.launch import _cores
from shardlab.testing import steady_malloc


def _pin_to_core() -> None:
    """Bind every thread of this rank (the computing one and gloo's I/O threads) to core
    ``rank``, as a GPU rank owns its device; only when every rank can have a core of its own
    (Linux). Unbound, the scheduler may run one rank's thread on the other rank's core (a
    posted receive was seen to take 6-7 ms now and then, a time slice, instead of 0.1 ms);
    in two A/B runs of ``benchmark_pipeline.py --bubble`` bound ranks came within 1.7 points
    of the closed form, unbound ones within 3.3. ``SHARDLAB_PIN=0`` turns it off."""
    if not hasattr(os, "sched_setaffinity") or os.environ.get("SHARDLAB_PIN") == "0":
        return
    cores = sorted(os.sched_getaffinity(0))
    if dist.get_world_size() > len(cores):
        return
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), {cores[dist.get_rank()]})
        except OSError:  # the thread ended meanwhile
            pass


def _timing_rank() -> None:
    """How every timed rank runs (the bubble runs and both sides of the benchmark): one
    intra-op thread (a busy rank never waits for a thread of its own), glibc's heap kept
    between steps, and its threads bound to a core of its own where there are enough."""
    torch.set_num_threads(THREADS)
    steady_malloc()  # freed activations stay mapped: an action's CPU time is its computation
    _pin_to_core()


def timed(kind, m, v, size="timing", n=None, steps=5, layers=None):
    """Run ``steps`` + 1 steps (the first warms up); return this rank's events of every
    measured step relative to the step's common start (a barrier), each event with the
    action's CPU time appended: ``(start, end, action, cpu)``."""
    _timing_rank()
    cfg, p = config(size), dist.get_world_size()
    n = n or 8 * m
    mine, named, ex = build(cfg, kind, p, m, v, layers=layers)
    runs = []
    for step in range(steps + 1):
        xs, ys = microbatches(cfg, step, n, m)
        for q in named.values():
            q.grad = None
        dist.barrier()
        t0 = torch.tensor([time.perf_counter()], dtype=torch.float64)
        dist.all_reduce(t0, op=dist.ReduceOp.MIN)  # one clock (CLOCK_MONOTONIC) per machine
        ex.step(xs, ys)
        if step:
            runs.append(
                [(s - t0.item(), e - t0.item(), a, c) for (s, e, a), c in zip(ex.events, ex.cpu)]
            )
    return runs


def analyse(runs_per_rank, kind, m, v, comm=0.0, cores=None):
    """Measured and simulated numbers of the least disturbed step (smallest makespan).

    ``runs_per_rank[r][i]``: events of step ``i`` on rank ``r``. The machine is shared with
    other jobs; a step during which one of them took a rank's core is longer, and its extra
    time shows up as idle time on the other ranks, so the fastest step is the best estimate
    of the schedule's own bubble (the usual minimum of a timing benchmark). Per-action
    costs fed to the simulator are each rank's means of that step (so simulated and
    measured busy time agree), times ``v`` (the simulator's costs are per whole rank; a
    chunk action costs ``cost / v``). ``spread``: per action kind, the largest rank's mean
    cost over the smallest's, minus 1 (0: balanced stages); ``cpu_costs`` / ``cpu_spread``: the
    same from each action's CPU time (median over every measured step), which does not grow
    while another process holds the core. ``closed_idle``: the closed form
    of balanced stages, ``accounting.pipeline.schedule_idle_fraction`` (for zb-h1 with the
    rank-averaged costs; see :func:`_closed_idle` when those put BW above F + BI). When the ranks outnumber the machine's ``cores`` (default: the
    cores this process may run on), ``shared_idle`` is the idle fraction of
    ``accounting.pipeline_cores.simulate_shared`` fed the CPU costs: the same schedule with
    the ranks sharing the cores, which is what such a run measures; ``shared_makespan``
    its step time; ``core_idle`` the share of the cores' time (cores x makespan) in which no
    rank computed (1 - CPU time of all actions over it) and ``shared_core_idle`` the same
    in the shared simulation.
    """
    p = len(runs_per_rank)
    spans = [
        max(ev[1] for rk in runs_per_rank for ev in rk[i]) for i in range(len(runs_per_rank[0]))
    ]
    i = min(range(len(spans)), key=spans.__getitem__)
    events = [[ev[:3] for ev in rk[i]] for rk in runs_per_rank]
    cpu = [  # CPU ms per action kind per rank, medians over every measured step
        {
            k: statistics.median(ev[3] for step in rk for ev in step if ev[2].kind == k)
            for k in acc.ACTION_KINDS
            if any(ev[2].kind == k for ev in rk[0])
        }
        for rk in runs_per_rank
    ] if len(runs_per_rank[0][0][0]) > 3 else None
    makespan = spans[i]
    busy = [sum(e - s for s, e, _ in ev) for ev in events]
    # wall time over CPU time of the step's actions, per rank: above 1 by the share of the
    # step another process held the rank's core (the gap a disturbed measurement leaves)
    stretch = [b / max(1e-12, sum(ev[3] for ev in rk[i])) for b, rk in zip(busy, runs_per_rank)
               ] if cpu else None
    costs = [
        {
            k: statistics.fmean([e - s for s, e, a in ev if a.kind == k]) * v
            for k in acc.ACTION_KINDS
            if any(a.kind == k for _, _, a in ev)
        }
        for ev in events
    ]
    mean = {k: statistics.fmean(c[k] for c in costs) for k in costs[0]}
    sim = acc.simulate(acc.schedule(kind, p, m, v), p, comm=comm, stage_costs=costs)
    if cores is None:
        cores = _cores()
    shared = core_idle = shared_core_idle = None
    if cpu and cores and p > cores:  # work per whole rank: a chunk action's CPU time times v
        sched = acc.schedule(kind, p, m, v)
        work = [{k: x * v for k, x in c.items()} for c in cpu]
        shared = simulate_shared(sched, p, cores, comm=comm, stage_costs=work)
        # share of the machine's core time no rank computed: CPU time over cores x makespan
        used = sum(ev[3] for rk in runs_per_rank for ev in rk[i])
        core_idle = 1 - used / (cores * makespan)
        sim_used = sum(cpu[r][a.kind] for r in range(p) for a in sched[r])
        shared_core_idle = 1 - sim_used / (cores * shared.makespan)
    return {
        "kind": kind,
        "v": v,
        "p": p,
        "events": events,
        "makespan": makespan,
        "makespans": spans,
        "idle": sum(makespan - b for b in busy) / (p * makespan),
        "idle_per_rank": [(makespan - b) / makespan for b in busy],
        "sim": sim,
        "sim_makespan": sim.makespan,
        "sim_idle": sim.bubble_fraction,
        "closed_idle": _closed_idle(kind, p, m, v, mean),
        "costs": costs,
        "spread": _spread(costs),
        "cpu_costs": cpu,
        "cpu_spread": _spread(cpu) if cpu else None,
        "cores": cores,
        "shared_idle": shared.bubble_fraction if shared else None,
        "shared_makespan": shared.makespan if shared else None,
        "core_idle": core_idle,
        "shared_core_idle": shared_core_idle,
        "stretch": stretch,
    }


# A rank that keeps its core runs an action in its CPU time (plus two clock reads); when the
# actions of the fastest step took more than 10 % longer on the wall clock, another process
# held the core for that share of them and the idle fractions measure that wait as well.
DISTURBED_STRETCH = 1.10


def disturbance(analyses) -> str:
    """One sentence on whether the timed runs (``analyse`` results) were disturbed."""
    worst = max(((a["stretch"][r], r, a["kind"]) for a in analyses if a.get("stretch")
                 for r in range(a["p"])), default=None)
    if worst is None:
        return "no CPU times recorded: cannot tell whether another process disturbed the run"
    x, r, kind = worst
    if x <= DISTURBED_STRETCH:
        return (f"undisturbed: on every rank the actions took at most {DISTURBED_STRETCH:.2f}x "
                "their CPU time")
    return (f"DISTURBED: rank {r}'s actions ({kind}) took {x:.2f}x their CPU time, so another "
            "process held its core for part of the step and the idle fractions include that "
            "wait; rerun on an idle machine (python benchmark_pipeline.py --bubble) before "
            "reading them against the closed form")


def _closed_idle(kind: str, p: int, m: int, v: int, mean: dict[str, float]) -> float:
    """Idle share of balanced stages: the closed form, or for zb-h1 whose measured ``BW``
    exceeds ``F + BI`` (the closed form's premise; on these CPUs BW measured 27 ms against
    F + BI = 17 + 10 ms once) the simulation of the same order with those costs on every
    stage, which is what that order achieves and what the bound no longer states."""
    if kind == "zb-h1" and mean["BW"] > mean["F"] + mean["BI"]:
        return acc.simulate(acc.schedule(kind, p, m, v), p, mean).bubble_fraction
    return acc.schedule_idle_fraction(kind, p, m, v, mean if kind == "zb-h1" else None)


def _spread(costs: list[dict]) -> dict:
    """Per action kind: the costliest rank's cost over the cheapest's, minus 1."""
    return {k: max(c[k] for c in costs) / min(c[k] for c in costs) - 1 for k in costs[0]}


def timed_all(m=8, schedules=SCHEDULES, steps=5, layers=None, size="timing", n=None):
    """:func:`timed` for several schedules in one launch: ``{(kind, v): runs}``."""
    return {
        (k, v): timed(k, m, v, size=size, n=n, steps=steps, layers=layers) for k, v in schedules
    }


def measure_schedules(p=2, m=8, schedules=SCHEDULES, steps=5, layers=None, size="timing", n=None):
    """Launch :func:`timed_all` on ``p`` ranks and :func:`analyse` every schedule; ``n``
    samples per step (default ``8 m``: microbatches of 8 sequences)."""
    from shardlab.runtime import launch

    runs = launch(
        "_timing_pipeline:timed_all", p, m, schedules, steps, layers, size, n, quiet=True,
        timeout=900,
    )
    return {key: analyse([r[key] for r in runs], key[0], m, key[1]) for key in schedules}
