"""From-scratch ZeRO-1 / ZeRO-2 vs PyTorch DDP + ZeroRedundancyOptimizer, on CPU with gloo.

    python benchmark_zero.py [--size bench|25m] [--ranks 2] [--steps 20] [--repeats 1]

Same model (the package's GPT: ``bench`` in ``shardlab.models.SIZES``, 0.86 M parameters,
or ``25m``, the same GPT at d_model 512 and 8 layers, 25.5 M parameters), same data (8
sequences per step in all), fp32 AdamW, same bucket size on all three sides: 1 MB at
``bench`` (about 4 buckets; one 25 MB bucket would hold every gradient at once and undo
ZeRO-2's saving), 25 MB at ``25m`` (four buckets or chunks for 102 MB of gradients; on gloo
ZeRO-1 and ZeRO-2 move buckets of 16 MB and more in the gloo forms, in-place all-reduces and
broadcasts: ``shardlab.runtime.collective_forms``). Step time: after the warm-up steps, the
implementations take turns in blocks: one untimed lead-in step, then ``BLOCK`` timed steps back
to back, the median over the blocks of the mean step. ZeRO's all-gathers run on after
``step()`` until the next forward of the same model needs the weights, so a step is only
timed fairly inside a run of that model's steps; the lead-in's gathers fall into the first
timed step. (Until 2026-12-07 the implementations alternated step by step, each step after a
barrier, and gloo's barrier waits for the work still in flight: the all-gathers were finished
inside the untimed barrier. Measured then, 25m, 2 ranks: the barrier after a ZeRO-2 step took
106 ms, after ZeRO-1 62 ms, after PyTorch's 2 ms.) Ratios are from scratch / PyTorch (goal:
<= 1.0); with ``--repeats`` the launches are repeated and the median and range of the ratios
printed. ``main()`` without arguments is the fast run the lab notebook shows.

**Against the limit.** The same launch also times a *compute floor*: the same model, batch and
whole AdamW step on each rank with no communication, interleaved with the three; each side's
step over the floor's (slowest rank) is above 1.0 by the share communication leaves exposed.

Two peaks of one step after a warm-up step, each side built inside both meters
(:func:`peaks`):

* ``trace``: MemoryTrace's largest live tensor bytes on the rank's main thread. PyTorch's
  side is counted in full (DDP's Reducer bucket, a flat copy of all gradients held besides
  ``param.grad``; ZeroRedundancyOptimizer's state).
* ``alloc``: the CPU allocator's own count (``torch.profiler``, ``profile_memory=True``) from
  before construction to the end of the measured step. It also sees the temporaries gloo
  allocates on its worker threads for ``reduce_scatter_tensor`` / ``all_gather_into_tensor``
  (our side with the standard forms, at ``bench``; PyTorch's side only all-reduces and
  broadcasts in place, as do the gloo forms at ``25m``), which the trace cannot, so it is
  the fair one for ZeRO-1/2.

Stored runs: ``benchmarks/results/zero_<size>_<ranks>ranks.json`` (``--save``), rendered with
their load and machine in the book's appendix ("Measuring against PyTorch"). What limits the
ratios, measured (2026-12-07, 25m, CPU time per step per rank with ``time.process_time``, gloo
threads included): with four ranks on two cores the step is bound by the CPU time every rank
needs, communication included, not by overlap. gloo's reduce-scatter costs more CPU than its
all-reduce (25 MB, 4 ranks: 33-36 ms against 22-24 ms per call, the copy of its input) and
its all-gather more than ``D`` broadcasts (19-20 against 9-10 ms); with the standard forms
ZeRO-2 used 436-480 ms of CPU per step against PyTorch's 367-412 ms, with the gloo forms
374 ms against 367 ms (the same launch). ZeRO-2 keeps a bucket's full-size buffer only while
it is reduced (its gradient-memory saving), and with glibc's defaults each step's fresh buffers
took 9,200-15,600 minor page faults per rank (``ru_minflt``; ZeRO-1 3-5, PyTorch 12-20) and
ZeRO-2's CPU per step was 397-404 ms against ZeRO-1's 337-375. :func:`run` therefore applies
:func:`shardlab.testing.steady_malloc` (glibc keeps freed memory in its heap, the CPU
counterpart of CUDA's caching allocator) on every side alike: ZeRO-2's faults fell to 2-4 per
step and its CPU to 357-385 ms; ZeRO-1's and PyTorch's did not change (4 ranks, 25m).
"""

from __future__ import annotations

import argparse
import statistics

# run as a script, Python puts this folder on sys.path; the ranks it launches find its
# modules the same way (the launcher passes its sys.path on)
from shardlab.benchresults import add_arguments, load_average, write_results
from shardlab.runtime.allocator_peak import allocator_peak
from shardlab.testing import bench_steps, compare_launches, median_range, steady_malloc

# Overrides of shardlab.models.SIZES["bench"] (vocab 256, seq 32, 4 layers, d_model 128).
BENCH_SIZES: dict[str, dict[str, int]] = {
    "bench": {},  # 0.86 M parameters: fixed per-step overheads dominate
    "25m": dict(d_model=512, n_layer=8, n_head=8),  # 25.5 M: 102 MB of gradients
}
BUCKET_MB = {"bench": 1.0, "25m": 25.0}
BATCH = 8  # global sequences per step
IMPLS = ("zero1", "zero2", "torch")
BLOCK = 2  # timed steps per block, each block after one untimed lead-in step (run())


def _build(impl: str, size: str, bucket_size_mb: float):
    """(model, forward module, optimizer-like, finish, inner optimizer) for one layout."""
    from _workers_zero import ShardedOptimizer, ZeRO2
    from shardlab.models import OPTIMIZERS, tiny_gpt
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel

    cls, kw = OPTIMIZERS["adamw"]
    model = tiny_gpt("plain", size="bench", **BENCH_SIZES[size])
    if impl == "zero1":
        opt = ShardedOptimizer(
            list(model.parameters()), cls, bucket_size_mb=bucket_size_mb, overlap_gather=True, **kw
        )
        return model, model, opt, None, opt.optim
    if impl == "zero2":
        z = ZeRO2(model, cls, bucket_size_mb=bucket_size_mb, **kw)
        return model, z, z, z.finish_gradient_synchronization, z.optimizer
    ddp = DistributedDataParallel(model, bucket_cap_mb=bucket_size_mb)
    zro = ZeroRedundancyOptimizer(list(model.parameters()), cls, **kw)
    return model, ddp, zro, None, zro.optim


def peaks(size: str = "bench", bucket_size_mb: float = 1.0, n: int = BATCH) -> dict:
    """Rank function: ``{impl: {"trace": bytes, "alloc": bytes}}`` of one measured step."""
    import torch
    from shardlab.models import lm_loss, rank_slice, step_batch, train_step
    from shardlab.runtime import MemoryTrace, phase
    from torch.profiler import ProfilerActivity, profile, record_function

    torch.set_num_threads(1)
    out = {}
    for impl in IMPLS:
        with (
            profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof,
            MemoryTrace() as mt,
        ):
            model, fwd, opt, finish, inner = _build(impl, size, bucket_size_mb)
            mt.watch(model, inner)
            xy = rank_slice(step_batch(model.config, 0, n))
            train_step(fwd, opt, xy, finish)  # warm-up: creates the AdamW state
            opt.zero_grad()
            with phase("measured"), record_function("measured"):
                lm_loss(fwd, *xy).backward()
                if finish is not None:
                    finish()
                opt.step()
        tl = mt.timeline()
        s, e = (i for i, name, _ in tl.markers if name == "measured")
        out[impl] = {"trace": max(tl.total()[s : e + 1]), "alloc": allocator_peak(prof)}
        del model, fwd, opt, finish, inner, prof, mt
    return out


def run(
    size: str = "bench", steps: int = 20, warmup: int = 3, bucket_size_mb: float | None = None,
    n: int = BATCH, with_peaks: bool = True,
) -> dict:
    """Rank function: median step times (alternating step by step), weight gaps, peaks."""
    import time

    import torch
    import torch.distributed as dist
    from shardlab.models import OPTIMIZERS, rank_slice, step_batch, tiny_gpt, train_step

    torch.set_num_threads(1)
    # every side alike: freed buffers stay in the heap (ZeRO-2 frees its bucket buffers after
    # each reduce; with glibc's defaults it re-faulted 36-61 MB of pages per step, see above)
    steady_malloc()
    bucket = BUCKET_MB[size] if bucket_size_mb is None else bucket_size_mb
    runs = {impl: _build(impl, size, bucket) for impl in IMPLS}
    # the compute floor: the same model, batch and AdamW step on this rank with no
    # communication (every collective of ZeRO left out: the whole optimizer on every rank)
    floor = tiny_gpt("plain", size="bench", **BENCH_SIZES[size])
    cls, kw = OPTIMIZERS["adamw"]
    runs["floor"] = (floor, floor, cls(floor.parameters(), **kw), None, None)
    xy = rank_slice(step_batch(runs["zero1"][0].config, 0, n))
    times: dict = {impl: [] for impl in runs}
    for _ in range(warmup):
        for _, fwd, opt, finish, _ in runs.values():
            dist.barrier()
            train_step(fwd, opt, xy, finish)
    # Steady-state steps. ZeRO's all-gathers run on after step() until the next forward of
    # the same model needs the weights, so a step is timed only inside a run of that model's
    # steps: per block, one untimed lead-in step (its gathers overlap the first timed
    # forward), then BLOCK timed steps back to back. The barrier before the next block
    # finishes the last timed step's gathers untimed, so every timed step carries exactly one
    # step's gathers, as in training. (Timing single steps between barriers would hide the
    # gathers in the barrier: measured 2026-12-07, see the docstring.)
    for _ in range(-(-steps // BLOCK)):
        for impl, (_, fwd, opt, finish, _) in runs.items():
            dist.barrier()
            train_step(fwd, opt, xy, finish)  # lead-in
            t0 = time.perf_counter()
            for _ in range(BLOCK):
                train_step(fwd, opt, xy, finish)
            times[impl].append((time.perf_counter() - t0) / BLOCK)
    for impl in ("zero1", "zero2"):  # their last all-gathers run until the next forward
        runs[impl][2].wait_for_weights()
    out: dict = {impl: {"step_s": statistics.median(ts)} for impl, ts in times.items()}
    ref = list(runs["torch"][0].parameters())
    out["max_diff"] = {
        impl: max((a - b).abs().max().item() for a, b in zip(runs[impl][0].parameters(), ref))
        for impl in ("zero1", "zero2")
    }
    out["n_params"] = sum(p.numel() for p in ref)
    del runs
    if with_peaks:
        for impl, p in peaks(size, bucket, n).items():
            out[impl].update(p)
    return out


def ratios(res: list[dict]) -> dict[str, dict[str, float]]:
    """One launch's ratios ours / PyTorch per layout: step time of the slowest rank (every
    step ends in a collective), peaks (if measured) of the largest rank (ZeRO-1's owners are
    uneven)."""
    keys = [k for k in ("step_s", "trace", "alloc") if k in res[0]["torch"]]
    ref = {k: max(m["torch"][k] for m in res) for k in keys}
    out = {
        impl: {k.removesuffix("_s"): max(m[impl][k] for m in res) / ref[k] for k in keys}
        for impl in ("zero1", "zero2")
    }
    # against the limit: each side's step over the compute floor's (no communication)
    floor = max(m["floor"]["step_s"] for m in res)
    out["floor"] = {impl: max(m[impl]["step_s"] for m in res) / floor for impl in IMPLS}
    return out


def main(
    size: str = "bench", ranks: int = 2, steps: int | None = None, repeats: int = 1,
    save: bool = False, results_dir: str | None = None,
) -> list[dict]:
    """Run ``repeats`` launches; print the first one per rank, then the ratios (median and
    range over the launches: gloo's worker threads make even the allocator peak vary).
    ``save``: also write ``benchmarks/results/zero_<size>_<ranks>ranks.json``
    (:func:`shardlab.benchresults.write_results`: machine, load, per-launch numbers)."""
    load_before = load_average()
    buckets = f"{BUCKET_MB.get(size, 0):g} MB buckets, "  # a bad size is refused by the call
    launches = compare_launches(
        "benchmark_zero:run", size=size, sizes=BENCH_SIZES, batch=BATCH, ranks=ranks,
        steps=steps, repeats=repeats, impls=IMPLS, detail=buckets,
        max_diff=lambda m: max(m["max_diff"].values()),
    )
    per_launch = [ratios(res) for res in launches]
    res, kw = launches[0], bench_steps(size, steps)
    more = f", median [min-max] of {repeats} launches" if repeats > 1 else ""
    print(f"ratio ours / PyTorch (slowest rank's step, largest rank's peak){more}")
    for impl in ("zero1", "zero2"):
        if repeats > 1:
            each = " ".join(f"{p[impl]['step']:.3f}" for p in per_launch)
            print(f"  {impl} step ratio per launch: {each}")
        cells = [f"{k} {median_range(p[impl][k] for p in per_launch if k in p[impl])}"
                 for k in ("step", "trace", "alloc")]
        print(f"  {impl}: " + ", ".join(cells))
    print(f"step time / compute floor (same model, batch and step, no communication){more}")
    print("  " + ", ".join(f"{impl} {median_range(p['floor'][impl] for p in per_launch)}"
                           for impl in IMPLS))
    if save:
        rows = [
            {"ratio": p, "seconds": {i: max(m[i]["step_s"] for m in res) for i in (*IMPLS, "floor")}}
            for p, res in zip(per_launch, launches)
        ]
        path = write_results(
            f"zero_{size}_{ranks}ranks", rows,
            benchmark="lab 03 ZeRO-1 / ZeRO-2 vs DDP + ZeroRedundancyOptimizer (gloo, CPU)",
            config={"size": size, "ranks": ranks, "n_params": res[0]["n_params"],
                    "bucket_mb": BUCKET_MB[size], "batch": BATCH, **kw},
            load_before=load_before, directory=results_dir,
        )
        print(f"results written to {path.name}")
    return per_launch


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", choices=list(BENCH_SIZES), default="bench")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--steps", type=int, default=None, help="timed steps (20 bench, 6 25m)")
    add_arguments(ap)  # --save: zero_<size>_<ranks>ranks.json
    a = ap.parse_args()
    main(a.size, a.ranks, a.steps, a.repeats, a.save, a.results_dir)
