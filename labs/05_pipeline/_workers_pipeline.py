"""Rank functions and analysis of the pipeline lab (imported by the ranks, tests, notebook).

* :func:`check_all`: train 3 AdamW steps with every schedule on the launched ranks; return
  losses, weights and gradients (by the full model's parameter names), the bytes each rank
  sent in one step (``CommTrace``) and its saved-activation peak (``MemoryTrace``);
* :func:`reference`: the same 3 steps in one process, the same microbatches accumulated in
  order, and the ordinary full-batch run;
* :func:`timed`: per-action start/end times of a step on every rank; :func:`analyse` turns
  them into the measured makespan, idle fraction and per-action costs, and feeds the costs to
  ``accounting.pipeline.simulate``;
* :func:`faulty`: a rank raising in the middle of a schedule.
"""

from __future__ import annotations

import os
import statistics
import time

import torch
import torch.distributed as dist
from pipeline import PipeConfig, PipelineExecutor, split_stages
from shardlab.accounting import pipeline as acc
from shardlab.accounting.pipeline_cores import simulate_shared
from shardlab.models import GPT, GPTConfig, lm_loss, step_batch
from shardlab.runtime.launch import _cores
from shardlab.testing import ulps

# n_layer 8: 8 virtual stages for p=4, v=2. "timing": one block costs ~10 ms per microbatch
# forward on one core, 1000x the loopback latency of its 64 KiB boundary tensor.
SIZES = {
    "test": dict(vocab_size=16, seq_len=8, n_layer=8, n_head=2, d_model=8),
    "timing": dict(vocab_size=32, seq_len=64, n_layer=8, n_head=4, d_model=128),
    "bench": dict(vocab_size=32, seq_len=64, n_layer=4, n_head=4, d_model=128),
}
SCHEDULES = [("gpipe", 1), ("1f1b", 1), ("interleaved", 2), ("zb-h1", 1)]
V_SCHEDULES = [("zbv", 2), ("dualpipev", 2)]  # two chunks per rank in a V


def schedules_for(p: int, m: int) -> list[tuple[str, int]]:
    """The schedules the public tests run on ``p`` ranks with ``m`` microbatches: the four
    of the notebook and the V schedules that accept ``(p, m)`` (dualpipev needs m >= 2p)."""
    return SCHEDULES + [(k, v) for k, v in V_SCHEDULES if k != "dualpipev" or m >= 2 * p]


def rank_stages(kind: str, p: int, v: int, rank: int) -> list[int]:
    """The virtual stages of ``rank``, chunk by chunk (``accounting.pipeline.virtual_stage``)."""
    return [acc.virtual_stage(rank, c, p, acc.placement(kind)) for c in range(v)]


LR, WD, STEPS = 1e-2, 0.1, 3
# Against the full-batch step only rounding differs (test_pipeline.py says why): the loss within
# FULL_BATCH_ULPS, every weight within FULL_BATCH_ATOL after STEPS AdamW steps. Seen on three
# kernel choices (AVX512, AVX2, default at one thread): up to 3e-7 at the tests' size and 1.0e-6
# at the notebook's; 4e-6 keeps a 4x margin for other CPUs and is still lr / 2500.
FULL_BATCH_ULPS, FULL_BATCH_ATOL = 4, 4e-6
# CPU kernels split their reductions over intra-op threads: the same thread count on the
# ranks and in the single-process reference, or the last bits differ
THREADS = 1


def config(size: str = "test") -> GPTConfig:
    return GPTConfig(**SIZES[size])


def microbatches(cfg: GPTConfig, step: int, n: int, m: int):
    """The ``m`` microbatches of step ``step`` as separate storages (a microbatch's tokens are
    then counted once per microbatch by MemoryTrace, not as one shared global buffer)."""
    idx, tgt = step_batch(cfg, step, n)
    return [t.clone() for t in idx.chunk(m)], [t.clone() for t in tgt.chunk(m)]


def build(cfg, kind, p, m, v, layers=None, seed=0):
    """This rank's chunks, its parameters by full-model name, and the executor."""
    model = GPT(cfg, seed=seed)
    stages = split_stages(model, p, v, layers)
    group = dist.group.WORLD
    mine = [stages[k] for k in rank_stages(kind, p, v, dist.get_rank())]  # r, r + p, ... or a V
    ids = {id(q) for ch in mine for q in ch.parameters()}
    named = {n: q for n, q in model.named_parameters() if id(q) in ids}
    return mine, named, PipelineExecutor(mine, PipeConfig(kind, p, m, v), group)


def _broadcast_loss(loss, p, kind="1f1b", v=1):
    t = torch.zeros(()) if loss is None else loss.detach().clone()
    # the last virtual stage lives on rank p - 1 (rank 0 in a V)
    dist.broadcast(t, src=acc.stage_rank(p * v - 1, p, acc.placement(kind)))
    return t


def train(cfg, kind, p, m, v, n, steps=STEPS, trace=False, layers=None):
    from shardlab.runtime import CommTrace, MemoryTrace

    mine, named, ex = build(cfg, kind, p, m, v, layers=layers)
    opt = torch.optim.AdamW(list(named.values()), lr=LR, weight_decay=WD)
    out = {"losses": [], "sent": None, "act_peak": None}
    out["bounds"] = [(ch.lo, ch.hi) for ch in mine]
    if trace:  # bytes one microbatch leaves saved on each chunk (forward only, then dropped)
        out["chunk_bytes"], out["kept_bytes"] = [], []
        xs, ys = microbatches(cfg, 0, n, m)
        for ch, k in zip(mine, rank_stages(kind, p, v, dist.get_rank())):
            shape = ex_shape(cfg, n, m)
            inp = xs[0] if k == 0 else torch.zeros(shape, device=xs[0].device).requires_grad_()
            with MemoryTrace() as mt:
                mt.watch(list(named.values()))  # weights saved by matmuls are not activations
                caps = []  # (input, output) of every weight-owning layer, as the executor's hook
                hooks = [
                    mod.register_forward_hook(lambda _m, a, o, c=caps: c.append((a[0].detach(), o)))
                    for mod in ch.modules()
                    if any(True for _ in mod.parameters(recurse=False))
                ]
                y = ch(inp)
                for hk in hooks:
                    hk.remove()
                if k == p * v - 1:
                    y = lm_loss_from_logits(y, ys[0], m)
                out["chunk_bytes"].append(mt.live_bytes("activations"))
                # a BI without the graph: what stays saved is the layers' inputs (kept_bytes)
                wanted = ([inp] if k > 0 else []) + [o for _, o in caps]
                grads = torch.autograd.grad(y, wanted, None if y.dim() == 0 else torch.ones_like(y))
                del y, grads, wanted
                caps = [xin for xin, _ in caps]
                # virtual stage 0's BI keeps everything for BW (pipeline.py says why)
                kept = out["chunk_bytes"][-1] if k == 0 else mt.live_bytes("activations")
                out["kept_bytes"].append(kept)
            del caps
    for step in range(steps):
        xs, ys = microbatches(cfg, step, n, m)
        opt.zero_grad(set_to_none=True)
        if trace and step == 0:
            with CommTrace() as tr:
                loss = ex.step(xs, ys)
            out["sent"] = tr.sent_bytes()
            out["sends"] = sum(r.op == "send" for r in tr.records)
        elif trace and step == 1:
            with MemoryTrace() as mt:
                mt.watch(list(named.values()))
                loss = ex.step(xs, ys)
            out["act_peak"] = max(mt.timeline().bytes["activations"])
        else:
            loss = ex.step(xs, ys)
        out["losses"].append(_broadcast_loss(loss, p, kind, v))
        out["order"] = [str(a) for _, _, a in ex.events]  # what really ran, in order
        if step == steps - 1:
            out["grads"] = {k: q.grad.clone() for k, q in named.items()}
        opt.step()
    out["weights"] = {k: q.detach().clone() for k, q in named.items()}
    return out


def ex_shape(cfg, n, m):
    return (n // m, cfg.seq_len, cfg.d_model)  # (b, s, h) boundary tensor of one microbatch


def lm_loss_from_logits(logits, y, m):
    from pipeline import microbatch_loss

    return microbatch_loss(logits, y, m)


def check_all(size="test", m=4, n=8, schedules=SCHEDULES, trace=True, layers=None):
    """Every schedule on the launched ranks; every rank returns its own report."""
    torch.set_num_threads(THREADS)
    cfg, p = config(size), dist.get_world_size()
    return {
        (kind, v): train(cfg, kind, p, m, v, n, trace=trace, layers=layers) for kind, v in schedules
    }


def launch_checks(p: int, m: int = 4, schedules=SCHEDULES, size="test", **kw):
    """Validate every ``(kind, p, m, v, n_layer)`` (a ``ValueError`` naming the values, before
    any rank starts), then run :func:`check_all` on ``p`` ranks."""
    from shardlab.runtime import launch

    for kind, v in schedules:
        acc.check_pipeline(kind, p, m, v, None if kw.get("layers") else config(size).n_layer)
    return launch("_workers_pipeline:check_all", p, size, m, 2 * m, schedules, quiet=True, **kw)


def reference(size="test", m=4, n=8, steps=STEPS, full_batch=False):
    """One process: the same AdamW steps, the ``m`` microbatches accumulated in order (or the
    whole batch at once with ``full_batch``)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(THREADS)
    try:
        return _reference(size, m, n, steps, full_batch)
    finally:
        torch.set_num_threads(threads)


def _reference(size, m, n, steps, full_batch):
    cfg = config(size)
    model = GPT(cfg, seed=0)
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WD)
    losses = []
    for step in range(steps):
        xs, ys = microbatches(cfg, step, n, m)
        opt.zero_grad(set_to_none=True)
        if full_batch:
            total = lm_loss(model, torch.cat(xs), torch.cat(ys))
            total.backward()
        else:
            total = None
            for x, y in zip(xs, ys):
                li = lm_loss(model, x, y) / m  # the mean over the global batch, in pieces
                li.backward()
                total = li.detach() if total is None else total + li.detach()
        losses.append(total.detach())
        if step == steps - 1:
            grads = {k: q.grad.clone() for k, q in model.named_parameters()}
        opt.step()
    return {"losses": losses, "grads": grads, "weights": dict(model.state_dict())}


def compare(reports: list[dict], ref: dict) -> dict:
    """Largest ulp distance of losses, last-step gradients and final weights over all ranks."""
    out = {"loss": 0, "grads": 0, "weights": 0, "params": 0, "max_abs": 0.0}
    for rep in reports:
        out["loss"] = max(out["loss"], *(ulps(a, b) for a, b in zip(rep["losses"], ref["losses"])))
        for what in ("grads", "weights"):
            for k, t in rep[what].items():
                out[what] = max(out[what], ulps(t, ref[what][k]))
                if what == "weights":
                    diff = (t - ref[what][k]).abs().max().item()
                    out["max_abs"] = max(out["max_abs"], diff)
        out["params"] += len(rep["weights"])
    out["params_total"] = len(ref["weights"])
    return out


# ------------------------------------------------------------------ timing
def _steady_malloc() -> None:
    """Keep freed activation memory for the next step (glibc, Linux only).

    PyTorch's CPU allocator has no cache: tensors come from glibc's malloc. By default glibc
    returns the top of its heap to the kernel once a step frees its activations, so every step
    takes page faults (the kernel zeroing pages, charged to the computing thread) to grow it
    again — the more so the more microbatches a schedule keeps alive (GPipe: all m). The
    warm-up step then no longer warms anything up. Fixing the thresholds keeps the memory:
    measured steps reuse it and an action's CPU time is its computation."""
    import ctypes
    import sys

    if sys.platform != "linux":
        return
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:  # not glibc
        return
    m_trim_threshold, m_mmap_threshold = -1, -3
    libc.mallopt(m_mmap_threshold, 32 << 20)  # glibc's largest: serve (b, s, 4h) from the heap
    libc.mallopt(m_trim_threshold, 1 << 30)  # never shrink the heap between steps


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
    _steady_malloc()
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


def faulty(kind="1f1b", m=4, fail_rank=1, fail_at="F2"):
    """Raise inside action ``fail_at`` on ``fail_rank``; the other ranks block on a receive."""
    cfg, p = config("test"), dist.get_world_size()
    mine, named, ex = build(cfg, kind, p, m, 1)
    if dist.get_rank() == fail_rank:
        ex.stop_after = fail_at
    xs, ys = microbatches(cfg, 0, 8, m)
    ex.step(xs, ys)
    return "finished"


# ------------------------------------------------------------------ benchmark
TORCH_SCHEDULES = {
    "gpipe": "ScheduleGPipe",
    "1f1b": "Schedule1F1B",
    "interleaved": "ScheduleInterleaved1F1B",
    "zb-h1": "ScheduleInterleavedZeroBubble",
    "zbv": "ScheduleZBVZeroBubble",
    "dualpipev": "ScheduleDualPipeV",
}


def _torch_pipeline(cfg, kind, p, m, v):
    """PyTorch's ``torch.distributed.pipelining`` on the same stages (a second model copy)."""
    import torch.distributed.pipelining as pp
    import torch.nn.functional as F

    model = GPT(cfg, seed=0)
    stages = split_stages(model, p, v)
    r = dist.get_rank()
    mine = [  # the same stages as ours, chunk by chunk (a V for zbv and dualpipev)
        pp.PipelineStage(stages[k], k, p * v, torch.device("cpu"), group=dist.group.WORLD)
        for k in rank_stages(kind, p, v, r)
    ]

    def loss_fn(logits, y):
        return F.cross_entropy(logits.float().flatten(0, 1), y.flatten())

    cls = getattr(pp, TORCH_SCHEDULES[kind])
    # these take a list of stages per rank (zb-h1: ScheduleInterleavedZeroBubble with a list
    # of one stage, v = 1; the V schedules two stages, r and 2p-1-r)
    multi = kind in ("interleaved", "zb-h1", *acc.V_KINDS)
    sched = cls(mine if multi else mine[0], n_microbatches=m, loss_fn=loss_fn)
    ids = {id(q) for st in mine for q in st.submod.parameters()}
    named = {n: q for n, q in model.named_parameters() if id(q) in ids}
    return sched, named, mine


def benchmark(kind, m=8, size="bench", steps=5, n=None):
    """Ours and PyTorch's step (forward + backward over ``m`` microbatches) on the same
    ranks: median step time, peak live bytes (one traced step), loss and gradients.

    The two sides alternate step by step (ours, theirs, theirs, ours, ...), so a burst of
    load from another process hits both. zb-h1 runs PyTorch's
    ``ScheduleInterleavedZeroBubble`` with one stage per rank (``v = 1``), whose action
    order is exactly ``schedule("zb-h1", p, m)``; zbv and dualpipev run
    ``ScheduleZBVZeroBubble`` / ``ScheduleDualPipeV`` on the same V of two stages per rank,
    whose orders (DualPipe-V's overlapped pairs flattened to F then B, as its runtime runs
    them) are exactly ours (checked: ``same_order``)."""
    from shardlab.runtime import MemoryTrace

    _timing_rank()  # both sides run in these threads: the same binding and heap for both
    cfg, p = config(size), dist.get_world_size()
    v = 2 if kind in ("interleaved", *acc.V_KINDS) else 1
    n = n or 8 * m
    r = dist.get_rank()
    last = r == acc.stage_rank(p * v - 1, p, acc.placement(kind))  # p - 1, or 0 in a V
    _, ours_named, ex = build(cfg, kind, p, m, v)
    sched, theirs_named, _ = _torch_pipeline(cfg, kind, p, m, v)
    same = None
    if kind in ("zb-h1", *acc.V_KINDS):  # PyTorch's order (None = an idle slot) against ours
        key = {"F": "F", "I": "BI", "W": "BW", "B": "B"}
        chunk = {k: c for c, k in enumerate(rank_stages(kind, p, v, r))}
        theirs_order = [
            str(acc.Action(key[y.computation_type.value], y.microbatch_index, chunk[y.stage_index]))
            for x in sched.pipeline_order[r]
            if x is not None
            for y in (x.sub_actions or (x,))  # DualPipe-V's overlapped pair: F, then B
        ]
        same = theirs_order == [str(x) for x in ex.actions]
    xs, ys = microbatches(cfg, 0, n, m)
    x, y = torch.cat(xs), torch.cat(ys)

    def ours():
        for q in ours_named.values():
            q.grad = None
        return ex.step(xs, ys)

    def theirs():
        for q in theirs_named.values():
            q.grad = None
        losses = []
        if r == 0:
            sched.step(x, target=y if last else None, losses=losses)
        elif last:
            sched.step(target=y, losses=losses)
        else:
            sched.step()
        return torch.stack(losses).sum() / m if last else None

    sides = {"ours": (ours, ours_named), "torch": (theirs, theirs_named)}
    times: dict[str, list[float]] = {"ours": [], "torch": []}
    loss = {}
    for i in range(steps + 1):
        order = ("ours", "torch") if i % 2 else ("torch", "ours")
        for name in order:
            dist.barrier()
            t = time.perf_counter()
            loss[name] = sides[name][0]()
            dist.barrier()
            if i:  # the first round warms up (PyTorch infers shapes on it)
                times[name].append(time.perf_counter() - t)
    out = {}
    for name, (fn, named) in sides.items():
        with MemoryTrace() as mt:
            mt.watch(list(named.values()))
            fn()
        out[name] = {
            "step_s": statistics.median(times[name]),
            "peak_bytes": mt.peak,
            "loss": _broadcast_loss(loss[name], p, kind, v),
            "grads": {k: q.grad.clone() for k, q in named.items()},
        }
    full = {}
    for name in ("ours", "torch"):  # every rank's gradients
        parts = [None] * p
        dist.all_gather_object(parts, out[name]["grads"])
        full[name] = {k: t for part in parts for k, t in part.items()}
    diff = max((full["ours"][k] - full["torch"][k]).abs().max().item() for k in full["ours"])
    agree = [None] * p
    dist.all_gather_object(agree, same)
    return {
        "kind": kind,
        "torch_schedule": TORCH_SCHEDULES[kind],
        "v": v,
        "same_order": None if same is None else all(agree),
        "ours_s": out["ours"]["step_s"],
        "torch_s": out["torch"]["step_s"],
        "ours_peak": out["ours"]["peak_bytes"],
        "torch_peak": out["torch"]["peak_bytes"],
        "loss_diff": abs(out["ours"]["loss"] - out["torch"]["loss"]).item(),
        "grad_max_abs_diff": diff,
    }


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
        "_workers_pipeline:timed_all", p, m, schedules, steps, layers, size, n, quiet=True,
        timeout=900,
    )
    return {key: analyse([r[key] for r in runs], key[0], m, key[1]) for key in schedules}


def benchmark_all(kinds=("gpipe", "1f1b", "interleaved", "zb-h1", *acc.V_KINDS), m=8, steps=6):
    return [benchmark(k, m=m, steps=steps) for k in kinds]
