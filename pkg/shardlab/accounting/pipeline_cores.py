"""Pipeline schedules on fewer processors than ranks: the simulator with shared cores.

:func:`shardlab.accounting.pipeline.simulate` gives every rank a processor of its own, which
is what the closed form ``(p-1)/(v m + p-1)`` assumes. Four CPU ranks on a two-core machine
do not have that: once the pipe is full, four ranks are ready to compute and two cores serve
them. :func:`simulate_shared` runs the same schedule with the same dependency rules, but the
ranks that have a ready action share ``cores`` processors evenly (processor sharing: what the
operating system's scheduler does on average): while ``n`` ranks compute, each advances at
``min(1, cores / n)`` of its own speed. ``costs`` are therefore *work* (CPU seconds an action
needs on a core of its own, e.g. ``time.thread_time`` measured per action), and an action's
wall time is that work stretched by the sharing while it runs. A rank is idle only while it
has nothing ready; waiting for a core is counted as busy, as a real rank's wall-clock action
time counts it. Nothing is sent: this module adds no bytes to any formula.

Properties (tested): with ``cores >= p`` the timeline is :func:`~.pipeline.simulate`'s; with
``cores = 1`` some rank is always ready until the last action ends, so the makespan is the
sum of all action costs; in between the makespan lies between both bounds: the dedicated
simulation's and (total work) / cores.
"""

from __future__ import annotations

from . import _validate as chk
from .pipeline import Action, SimResult
from .pipeline_sim import _check_schedule, _finish, _per_rank_costs, _ready_time, _result


def simulate_shared(
    sched: list[list[Action]],
    p: int,
    cores: int,
    costs: dict[str, float] | None = None,
    comm: float = 0.0,
    stage_costs: list[dict[str, float]] | None = None,
) -> SimResult:
    """:func:`~.pipeline.simulate` with the ``p`` ranks sharing ``cores`` processors evenly.

    ``costs`` / ``stage_costs`` / ``comm`` as in ``simulate`` (work per microbatch for a whole
    rank; a chunk action costs ``cost / v``). The timeline's ``(start, end)`` are wall times.
    """
    p = chk.positive_int("p", p)
    cores = chk.positive_int("cores", cores)
    per_rank = _per_rank_costs(costs, stage_costs, p)
    delay = chk.nonneg_number("comm", comm)
    nchunks = _check_schedule(sched, p)
    place = getattr(sched, "placement", "loop")  # where the chunks live (loop or V)
    done: dict[tuple[str, int, int], tuple[float, int]] = {}
    pos = [0] * p
    running: dict[int, list] = {}  # rank -> [action, work left, start]
    timeline: list[list[tuple[float, float, Action]]] = [[] for _ in range(p)]
    now, remaining = 0.0, sum(len(s) for s in sched)
    while remaining:
        soon = []  # ready times still ahead of now (a message in flight)
        for r in range(p):
            if r in running or pos[r] == len(sched[r]):
                continue
            a = sched[r][pos[r]]
            t = _ready_time(done, p, nchunks, delay, r, a, place)
            if t is None:
                continue
            if t <= now:
                running[r] = [a, per_rank[r][a.kind] / nchunks, now]
            else:
                soon.append(t)
        if not running and not soon:
            stuck = {r: str(sched[r][pos[r]]) for r in range(p) if pos[r] < len(sched[r])}
            raise ValueError(f"schedule deadlocks; waiting actions per stage: {stuck}")
        rate = min(1.0, cores / len(running)) if running else 0.0
        step = min([w / rate for _, w, _ in running.values()] + [t - now for t in soon])
        now += step
        for r in sorted(running):
            job = running[r]
            job[1] -= step * rate
            if job[1] <= 1e-12 * max(1.0, now):  # done (up to rounding)
                a, _, start = job
                timeline[r].append((start, now, a))
                _finish(done, p, r, a, now, place)
                del running[r]
                pos[r] += 1
                remaining -= 1
    return _result(sched, timeline)
