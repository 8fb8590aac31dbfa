"""Benchmark: this lab's pipeline executor vs ``torch.distributed.pipelining``, and the bubble
of balanced stages measured against the closed form.

    python benchmark_pipeline.py [--size bench|25m] [--ranks 2 [4]] [--steps 12] [--microbatches 8]
                                 [--repeats 3] [--save] [--results-dir DIR]
    python benchmark_pipeline.py --bubble [--ranks 2 4] [--repeats 3] [--mb-size 8] [--save]

**Step time.** Both sides run the same ``split_stages`` of the same GPT on the same batch in
the same processes, alternating step by step: ours executes ``accounting.pipeline.
schedule(kind, p, m, v)``, PyTorch runs ``PipelineStage`` with ``ScheduleGPipe`` /
``Schedule1F1B`` / ``ScheduleInterleaved1F1B`` (v = 2) / ``ScheduleInterleavedZeroBubble``
with one stage per rank (v = 1: its action order is exactly ours, ZB-H1, checked in the
run) / ``ScheduleZBVZeroBubble`` and ``ScheduleDualPipeV`` on the same V of two stages per
rank (their orders are exactly ours, checked; DualPipe-V's overlapped F/B pairs run one after
the other on both sides: PyTorch's runtime does so without an overlap callback). ``--kinds``
picks a subset. Both sides share the processes, so the same thread count, core binding and glibc
heap settings (``_timing_pipeline._timing_rank``) apply to both. Printed per run: the loss
and gradient difference, the median step time (forward + backward of m microbatches, no
optimizer), the peak of live tensor bytes of one step
(``MemoryTrace``, rank 0) and the ratios ours / PyTorch (below 1.0: ours is faster or
smaller); the compute floor (each rank's chunks run forward and backward on every microbatch
with no send, receive or wait; the slowest rank's) and both sides' step over it, i.e. what
the pipeline's communication and bubble add; then, over the ``--repeats`` launches, the
median time ratio and its range. Sizes (``--size``): ``bench`` (default; vocab 32, 64 tokens,
4 blocks of d_model 128, 8 sequences per microbatch) and ``25m``, the same GPT at d_model 512
and 8 blocks (the DP labs' ``25m``: 25.3 M parameters) with one sequence per microbatch and 2
timed steps, so that one launch of the six schedules stays under 3 minutes on 2 ranks (2 min
50 s measured on 2 shared cores, a step about 2 s). A schedule
whose ``p v`` stages outnumber the blocks (``interleaved``, ``zbv``, ``dualpipev`` on 4 ranks
at ``bench``) is skipped with a note; ``25m`` has the 8 blocks they need.

**Bubble.** ``--bubble`` runs the four schedules on ``--ranks`` ranks with the lab's 'timing'
model (8 equal blocks of h = 128; the embeddings and the head cost under 1 % of a stage),
m = 8 microbatches of ``--mb-size`` sequences of 64 tokens (8, as in the lab notebook; 16 doubles
every action's compute — on 2 shared cores it did not bring the idle fraction closer to the
closed form, because the boundary tensor is there before the next stage asks for it: the
remaining gap is the stages' few-% imbalance and the spread of action times), and prints per
schedule the per-rank CPU cost of F and B (and its spread), the measured idle fraction of the
least disturbed of ``--steps`` (10) steps (median over the repeats, and the range), the
simulator fed the measured costs, the closed form ``accounting.pipeline.schedule_idle_fraction``
and whether measured is within 3 percentage points of it (the target). With more ranks than
cores (``--ranks 4`` on two cores) the closed form, which gives every rank a core, does not
apply; the benchmark then also prints the same schedules simulated with the ranks sharing
the cores (``accounting.pipeline_cores.simulate_shared`` fed each rank's CPU cost per
action): its step time beside the measured one, and the share of the cores' time no rank
computed.

Each rank uses one intra-op thread, and where every rank can have a core of its own, each
rank's threads are bound to its core (``_timing_pipeline._pin_to_core``; ``SHARDLAB_PIN=0``
turns that off). On a machine shared with other jobs, run it under the
lock and, as root, with a raised priority (the stored numbers: ``flock
/tmp/shardlab-heavy.lock nice -n -15 python benchmark_pipeline.py ...``).

``--save`` writes one results file per rank count (:func:`shardlab.benchresults.write_results`:
machine, load before and after, per-launch numbers) into ``--results-dir`` (default
``benchmarks/results``): ``pipeline_<size>_<ranks>ranks.json`` (per launch and schedule: the
ratios ours / PyTorch, each side over the floor, the seconds) or, with ``--bubble``,
``pipeline_bubble_<ranks>ranks.json`` (per launch and schedule: measured, simulated and
closed-form idle fractions, the step's makespan).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.distributed as dist
from _timing_pipeline import _timing_rank
from _workers_pipeline import SIZES, _broadcast_loss, build, config, microbatches, rank_stages
from pipeline import split_stages
from shardlab.accounting import pipeline as acc
from shardlab.benchresults import add_arguments, load_average, write_results
from shardlab.models import GPT, GPTConfig
from shardlab.testing import median_range

# run as a script, Python puts this folder on sys.path; the ranks it launches find these
# modules the same way (the launcher passes its sys.path on)
KINDS = ("gpipe", "1f1b", "interleaved", "zb-h1", "zbv", "dualpipev")
# Overrides of _workers_pipeline.SIZES["bench"] (vocab 32, seq 64, 4 blocks, d_model 128);
# "25m" is the DP labs' 25m (shardlab.models d_model 512, 8 blocks, 8 heads): 25.3 M here
BENCH_SIZES: dict[str, dict[str, int]] = {
    "bench": {},
    "25m": dict(d_model=512, n_layer=8, n_head=8),
}
# sequences per microbatch and default timed steps: one 25m fwd+bwd of a 64-token sequence
# costs ~0.35 s on one core, so 8 per microbatch would put a launch of six schedules (three
# sides, each step's rounds and a traced step) past 15 minutes; 1 and 2 steps keep it under 3
MB_SEQS = {"bench": 8, "25m": 1}
DEFAULT_STEPS = {"bench": 12, "25m": 2}


def bench_config(size: str = "bench") -> GPTConfig:
    """The GPT of ``size``: :data:`BENCH_SIZES`, else one of ``_workers_pipeline.SIZES``."""
    if size in BENCH_SIZES:
        return GPTConfig(**{**SIZES["bench"], **BENCH_SIZES[size]})
    return config(size)


def fits(kind: str, p: int, size: str = "bench") -> bool:
    """Whether ``kind``'s ``p v`` stages each get a block of the model of ``size``."""
    v = 2 if kind in ("interleaved", *acc.V_KINDS) else 1
    return p * v <= bench_config(size).n_layer


# ------------------------------------------------------------------ rank code
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


def _floor_step(chunks, xs, ys, m: int, d_model: int) -> None:
    """The compute floor of one step on this rank: every local chunk's forward and backward of
    every microbatch, on inputs of the right shapes (token ids for the first stage, a random
    (b, s, h) activation elsewhere; the loss on the last, a ones gradient elsewhere) -- no
    send, no receive, no wait for a neighbour: what the step would cost without the pipeline's
    communication and bubble."""
    from pipeline import microbatch_loss

    for x, y in zip(xs, ys):
        for ch in chunks:
            inp = x if ch.first else torch.randn(*x.shape, d_model, requires_grad=True)
            out = ch(inp)
            if ch.last:
                microbatch_loss(out, y, m).backward()
            else:
                out.backward(torch.ones_like(out))


def benchmark(kind, m=8, size="bench", steps=5, n=None):
    """Ours and PyTorch's step (forward + backward over ``m`` microbatches) on the same
    ranks: median step time, peak live bytes (one traced step), loss and gradients.

    The two sides alternate step by step (ours, theirs, theirs, ours, ...), so a burst of
    load from another process hits both. zb-h1 runs PyTorch's
    ``ScheduleInterleavedZeroBubble`` with one stage per rank (``v = 1``), whose action
    order is exactly ``schedule("zb-h1", p, m)``; zbv and dualpipev run
    ``ScheduleZBVZeroBubble`` / ``ScheduleDualPipeV`` on the same V of two stages per rank,
    whose orders (DualPipe-V's overlapped pairs flattened to F then B, as its runtime runs
    them) are exactly ours (checked: ``same_order``). ``floor_s``: the median of the same
    rank's computation without any communication (:func:`_floor_step`), timed between the
    two; ``*_over_floor``: each side's step over the slowest rank's floor."""
    from shardlab.runtime import MemoryTrace

    _timing_rank()  # both sides run in these threads: the same binding and heap for both
    cfg, p = bench_config(size), dist.get_world_size()
    v = 2 if kind in ("interleaved", *acc.V_KINDS) else 1
    n = n or MB_SEQS.get(size, 8) * m
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

    mine_floor, floor_named, _ = build(cfg, kind, p, m, v)  # a third copy, never sent

    def floor():
        for q in floor_named.values():
            q.grad = None
        _floor_step(mine_floor, xs, ys, m, cfg.d_model)

    sides = {"ours": (ours, ours_named), "torch": (theirs, theirs_named)}
    times: dict[str, list[float]] = {"ours": [], "torch": [], "floor": []}
    loss = {}
    for i in range(steps + 1):
        order = ("ours", "floor", "torch") if i % 2 else ("torch", "floor", "ours")
        for name in order:
            if name == "floor":
                dist.barrier()
                t = time.perf_counter()
                floor()
                dt = time.perf_counter() - t
                if i:
                    times["floor"].append(dt)
                continue
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
    floor_t = torch.tensor([statistics.median(times["floor"])], dtype=torch.float64)
    dist.all_reduce(floor_t, op=dist.ReduceOp.MAX)  # the slowest rank's floor bounds the step
    floor_s = floor_t.item()
    return {
        "floor_s": floor_s,
        "ours_over_floor": out["ours"]["step_s"] / floor_s,
        "torch_over_floor": out["torch"]["step_s"] / floor_s,
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
        "n_params": sum(q.numel() for q in GPT(cfg, seed=0).parameters()),
    }


def benchmark_all(
    kinds=("gpipe", "1f1b", "interleaved", "zb-h1", *acc.V_KINDS), m=8, steps=6, size="bench"
):
    return [benchmark(k, m=m, steps=steps, size=size) for k in kinds]


def step_times(
    ranks: int, m: int, steps: int, repeats: int, kinds: tuple[str, ...] = KINDS,
    size: str = "bench", save: bool = False, results_dir: str | None = None,
) -> list[list[dict]]:
    """``repeats`` launches of the side-by-side benchmark; prints every run and the medians.
    ``save``: also write ``pipeline_<size>_<ranks>ranks.json`` into ``results_dir``."""
    from shardlab.runtime import launch

    skipped = [k for k in kinds if not fits(k, ranks, size)]
    kinds = tuple(k for k in kinds if k not in skipped)
    if skipped:  # split_stages needs a block per stage: say so instead of failing the launch
        print(f"skipped on {ranks} ranks at size {size!r} ({bench_config(size).n_layer} blocks, "
              f"fewer than their {2 * ranks} stages): {', '.join(skipped)}")
    if not kinds:
        return []
    load_before = load_average()
    runs = []
    for i in range(repeats):
        rows = launch(
            "benchmark_pipeline:benchmark_all", ranks, kinds, m=m, steps=steps, size=size,
            quiet=True, timeout=900,
        )[0]
        runs.append(rows)
        print(
            f"run {i + 1}: {ranks} ranks, m = {m} microbatches of {MB_SEQS.get(size, 8)} "
            f"sequences, median of {steps} steps (model {size!r}, "
            f"{rows[0]['n_params']:,} parameters)"
        )
        print(
            f"{'ours':12}{'PyTorch':52}{'ours ms':>9}{'torch ms':>10}{'time ratio':>11}"
            f"{'peak ratio':>11}{'|d loss|':>10}{'|d grad|':>10}{'floor ms':>10}"
            f"{'ours/floor':>11}{'torch/floor':>12}"
        )
        for r in rows:
            same = "" if r["same_order"] is None else f", same order: {r['same_order']}"
            name = f"{r['torch_schedule']} (v={r['v']}{same})"
            print(
                f"{r['kind']:12}{name:52}{r['ours_s'] * 1e3:9.1f}{r['torch_s'] * 1e3:10.1f}"
                f"{r['ours_s'] / r['torch_s']:11.2f}{r['ours_peak'] / r['torch_peak']:11.3f}"
                f"{r['loss_diff']:10.1e}{r['grad_max_abs_diff']:10.1e}"
                f"{r['floor_s'] * 1e3:10.1f}{r['ours_over_floor']:11.2f}"
                f"{r['torch_over_floor']:12.2f}"
            )
    print(f"\ntime ratio ours / PyTorch over {repeats} runs: median (min-max)")
    for j, kind in enumerate(kinds):
        ratios = [run[j]["ours_s"] / run[j]["torch_s"] for run in runs]
        print(
            f"{kind:12}{statistics.median(ratios):6.2f}  ({min(ratios):.2f}-{max(ratios):.2f})  "
            + " ".join(f"{x:.2f}" for x in ratios)
        )
    more = f", median [min-max] of {repeats} launches" if repeats > 1 else ""
    print(f"peak ratio ours / PyTorch (rank 0) and step / compute floor (slowest rank){more}")
    for j, kind in enumerate(kinds):
        peak = median_range(run[j]["ours_peak"] / run[j]["torch_peak"] for run in runs)
        ours = median_range(run[j]["ours_over_floor"] for run in runs)
        theirs = median_range(run[j]["torch_over_floor"] for run in runs)
        print(f"{kind:12}peak {peak}, ours/floor {ours}, PyTorch/floor {theirs}")
    if save:
        rows = [
            {
                "ratio": {r["kind"]: {"step": r["ours_s"] / r["torch_s"],
                                      "peak": r["ours_peak"] / r["torch_peak"]} for r in run},
                "floor": {r["kind"]: {"ours": r["ours_over_floor"],
                                      "torch": r["torch_over_floor"]} for r in run},
                "seconds": {r["kind"]: {"ours": r["ours_s"], "torch": r["torch_s"],
                                        "floor": r["floor_s"]} for r in run},
            }
            for run in runs
        ]
        path = write_results(
            f"pipeline_{size}_{ranks}ranks", rows,
            benchmark="lab 05 pipeline schedules vs torch.distributed.pipelining (gloo, CPU)",
            config={"size": size, "ranks": ranks, "n_params": runs[0][0]["n_params"],
                    "model": {k: getattr(bench_config(size), k) for k in
                              ("vocab_size", "seq_len", "n_layer", "n_head", "d_model")},
                    "microbatches": m, "microbatch_seqs": MB_SEQS.get(size, 8), "steps": steps,
                    "warmup": 1, "kinds": list(kinds), "skipped": skipped},
            load_before=load_before, directory=results_dir,
        )
        print(f"results written to {path.name}")
    return runs


def bubble(
    ranks: list[int], repeats: int, m: int = 8, mb_size: int = 8, steps: int = 10,
    save: bool = False, results_dir: str | None = None,
) -> dict:
    """Balanced-stage idle fraction on each world size, ``repeats`` launches each.
    ``save``: also write ``pipeline_bubble_<p>ranks.json`` per world size into ``results_dir``."""
    import _timing_pipeline as T
    import _workers_pipeline as W

    out = {}
    for p in ranks:
        load_before = load_average()
        reps = [T.measure_schedules(p=p, m=m, n=m * mb_size, steps=steps) for _ in range(repeats)]
        out[p] = reps
        print(
            f"\n{p} ranks, m = {m} microbatches of {mb_size} sequences, 'timing' model: "
            f"{8 // p} blocks per stage ({repeats} runs)"
        )
        print(
            f"{'schedule':12}{'CPU ms F per rank':>24}{'F spread':>9}{'B spread':>9}"
            f"{'idle meas.':>11}{'(range)':>14}{'sim.':>7}{'closed':>8}{'|diff|':>8}  within 3 pp"
        )
        shared = [reps[0][key]["shared_idle"] is not None for key in W.SCHEDULES]
        for key in W.SCHEDULES:
            runs = [rep[key] for rep in reps]
            idle = statistics.median(a["idle"] for a in runs)
            a = runs[0]
            f_ms = "/".join(f"{c['F'] * 1e3:.1f}" for c in a["cpu_costs"])
            fs = statistics.median(x["cpu_spread"]["F"] for x in runs)
            # zb-h1: stage 0 runs its whole backward in BW (nothing waits for its BI): no B spread
            bs = statistics.median(x["cpu_spread"].get("B", float("nan")) for x in runs)
            sim = statistics.median(x["sim_idle"] for x in runs)
            closed = statistics.median(x["closed_idle"] for x in runs)
            lo, hi = min(x["idle"] for x in runs), max(x["idle"] for x in runs)
            print(
                f"{key[0]:12}{f_ms:>24}{fs:9.1%}{bs:9.1%}{idle:11.1%}"
                f"{f'({lo:.1%}-{hi:.1%})':>14}{sim:7.1%}{closed:8.1%}"
                f"{abs(idle - closed) * 100:7.1f}  {'yes' if abs(idle - closed) <= 0.03 else 'NO'}"
            )
        if any(shared):  # more ranks than cores: the closed form assumes a core per rank
            cores = reps[0][W.SCHEDULES[0]]["cores"]
            print(
                f"{p} ranks share {cores} cores, so the closed form (a core per rank) does not "
                f"apply. The same schedules simulated with the ranks sharing the cores "
                f"(accounting.pipeline_cores.simulate_shared, fed each rank's CPU cost per "
                f"action), medians: step time, and the share of the cores' time no rank "
                f"computed (1 - CPU time / (cores x step time))"
            )
            print(
                f"{'schedule':12}{'step ms':>9}{'shared sim.':>12}{'ratio':>7}"
                f"{'idle cores':>11}{'shared sim.':>12}{'rank idle meas.':>16}{'shared sim.':>12}"
            )
            for key in W.SCHEDULES:
                runs = [rep[key] for rep in reps]

                def med(name, runs=runs):
                    return statistics.median(a[name] for a in runs)

                ratio = statistics.median(a["makespan"] / a["shared_makespan"] for a in runs)
                print(
                    f"{key[0]:12}{med('makespan') * 1e3:9.1f}{med('shared_makespan') * 1e3:12.1f}"
                    f"{ratio:7.2f}{med('core_idle'):11.1%}{med('shared_core_idle'):12.1%}"
                    f"{med('idle'):16.1%}{med('shared_idle'):12.1%}"
                )
        if save:
            rows = [
                {
                    "idle": {k[0]: rep[k]["idle"] for k in W.SCHEDULES},
                    "sim_idle": {k[0]: rep[k]["sim_idle"] for k in W.SCHEDULES},
                    "closed_idle": {k[0]: rep[k]["closed_idle"] for k in W.SCHEDULES},
                    # measured minus closed form: the target is |diff| <= 0.03
                    "diff": {k[0]: rep[k]["idle"] - rep[k]["closed_idle"] for k in W.SCHEDULES},
                    "seconds": {k[0]: rep[k]["makespan"] for k in W.SCHEDULES},
                }
                for rep in reps
            ]
            path = write_results(
                f"pipeline_bubble_{p}ranks", rows,
                benchmark="lab 05 balanced-stage bubble vs the closed form (gloo, CPU)",
                config={"ranks": p, "model": "timing", "n_params": sum(
                            q.numel() for q in GPT(config("timing"), seed=0).parameters()),
                        "microbatches": m, "mb_size": mb_size, "steps": steps,
                        "schedules": [k[0] for k in W.SCHEDULES]},
                load_before=load_before, directory=results_dir,
            )
            print(f"results written to {path.name}")
    return out


def main(argv: list[str] | None = None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", choices=list(BENCH_SIZES), default="bench")
    ap.add_argument("--ranks", type=int, nargs="+", default=None)
    ap.add_argument(
        "--steps", type=int, default=None,
        help="measured steps per launch (12 bench, 2 25m; --bubble: 10)",
    )
    ap.add_argument("--microbatches", type=int, default=8)
    add_arguments(ap, default=3)  # --repeats; --save: one results file per rank count
    ap.add_argument("--bubble", action="store_true", help="measure the balanced-stage bubble")
    ap.add_argument("--mb-size", type=int, default=8, help="sequences per microbatch (--bubble)")
    ap.add_argument("--kinds", nargs="+", default=list(KINDS), choices=KINDS)
    a = ap.parse_args(argv)
    if a.bubble:
        return bubble(a.ranks or [2, 4], a.repeats, a.microbatches, a.mb_size, a.steps or 10,
                      a.save, a.results_dir)
    steps, ranks = a.steps or DEFAULT_STEPS[a.size], a.ranks or [2]
    runs = {
        p: step_times(p, a.microbatches, steps, a.repeats, tuple(a.kinds), a.size, a.save,
                      a.results_dir)
        for p in ranks
    }
    # one rank count (the default): the list of launches, as before
    return runs[ranks[0]] if len(ranks) == 1 else runs


if __name__ == "__main__":
    main()
