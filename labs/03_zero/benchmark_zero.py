"""From-scratch ZeRO-1 / ZeRO-2 vs PyTorch DDP + ZeroRedundancyOptimizer, on CPU with gloo.

    python benchmark_zero.py [--size bench|25m] [--ranks 2] [--steps 20] [--repeats 1]

Same model (the package's GPT: ``bench`` in ``shardlab.models.SIZES``, 0.86 M parameters,
or ``25m``, the same GPT at d_model 512 and 8 layers, 25.5 M parameters), same data (8
sequences per step in all), fp32 AdamW, same bucket size on all three sides: 1 MB at
``bench`` (about 4 buckets; one 25 MB bucket would hold every gradient at once and undo
ZeRO-2's saving), 25 MB at ``25m`` (four buckets or chunks for 102 MB of gradients). Step time:
median over ``--steps`` steps after the warm-up steps, the three implementations alternating
step by step. Ratios are from scratch / PyTorch (goal: <= 1.0); with ``--repeats`` the
launches are repeated and the median and range of the ratios printed. ``main()`` without
arguments is the fast run the lab notebook shows.

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
  (our side; PyTorch's side only all-reduces and broadcasts in place), which the trace
  cannot, so it is the fair one for ZeRO-1/2.

Measured 2026-12-01 (torch 2.13, gloo, 2 CPU cores shared with other jobs, load average 3-5
during the runs; ``--repeats 3``; ratio ours / PyTorch, median [min-max] of 3 launches; the
trace peaks repeat to the byte)::

    size   ranks  layout  step time            peak trace  peak alloc
    bench    2    ZeRO-1  0.805 [0.717-0.807]  0.991       1.129 [1.080-1.149]
    bench    2    ZeRO-2  0.691 [0.657-0.729]  0.939       1.057 [0.965-1.104]
    bench    4    ZeRO-1  0.778 [0.762-0.890]  0.871       1.106 [0.978-1.163]
    bench    4    ZeRO-2  0.750 [0.723-0.799]  0.779       0.965 [0.938-1.011]
    25m      2    ZeRO-1  1.156 [1.147-1.236]  0.883       1.001 [0.946-1.088]
    25m      2    ZeRO-2  1.055 [1.029-1.085]  0.839       0.991 [0.930-1.001]
    25m      4    ZeRO-1  1.165 [1.151-1.169]  0.854       1.043 [0.994-1.064]
    25m      4    ZeRO-2  1.062 [1.027-1.188]  0.724       0.929 [0.878-0.950]

What limits the ratios above 1.0, measured:

* Allocator peak. gloo's ``reduce_scatter_tensor`` and ``all_gather_into_tensor`` allocate a
  copy of the whole collective buffer on a worker thread (a 1 MiB reduce-scatter input: a
  1 MiB temporary; an all-gather: one output-sized temporary, twice; all-reduce and broadcast:
  none), freed when gloo releases the work, so one or two bucket-sized temporaries (1 MB at
  ``bench``, 25 MB at ``25m``) sit on top of our peak, and how many overlap varies by run. Our
  own tensors (the trace) stay below PyTorch's at every size, because PyTorch's DDP keeps its
  buckets as a second copy of the gradients. Ours to change only by smaller buckets (more
  collectives) or another backend (NCCL writes in place).
* Step time at ``25m``. One step on 2 ranks, phases timed separately (medians of 5 steps, two
  launches, same machine): PyTorch 0.50-0.56 s = forward 0.11 + backward 0.29-0.34 (its
  all-reduces overlap backward and lengthen it by about 0.10 s over a plain backward) +
  optimizer 0.11 (AdamW on its half, broadcasts). ZeRO-1 0.63-0.66 s = forward 0.10 +
  backward 0.19-0.24 (no communication) + ``step()`` 0.29-0.38, of which the reduce-scatters
  take 0.12-0.20 s and the all-gathers 0.08-0.10 s: all of ZeRO-1's communication runs after
  backward, none of it hidden, and gloo's reduce-scatter is an all-reduce of a copy of the
  input (``accounting.wire``: ``2 V c`` on the wire, as much as DDP's all-reduce). ZeRO-2
  0.58-0.61 s = backward 0.36-0.38 (0.15 s over a plain backward, of which 0.03-0.08 s
  blocked waiting for the previous bucket's reduce-scatter: at most two bucket buffers are
  alive by design) + ``step()`` 0.12-0.14 (all-gathers 0.06-0.08). At ``bench`` the same
  collectives are small and ours wins by 20-30 %. (Measured before the overlap below.)
* Since issue 29 ZeRO-1's reduce-scatters start from the gradient hooks (``no_sync()`` keeps
  accumulation at one reduction per update) and ZeRO-2's all-gathers run asynchronously until
  each module's forward pre-hook; both allow ``max_in_flight=2`` reduce-scatters at once.
  25m, 2 ranks, 2026-12-02, load 5-9 on 2 shared cores: ZeRO-1 step 1.253 [1.152-1.267]
  (before: 1.244 [1.201-1.254]), ZeRO-2 1.060 [1.042-1.099] (before: 1.151 [1.098-1.287]);
  peak trace / alloc 0.923 / 1.104 and 0.879 / 0.999. With 4 in flight: ZeRO-2 1.090,
  alloc 1.091; ZeRO-1 alloc 1.213. On a saturated machine an overlapped collective competes
  with backward for the same cores. gloo's all-reduce + slice measured within noise of its
  reduce-scatter (0.078-0.080 s against 0.082-0.086 s at 25 MB), so the lab keeps the
  reduce-scatter the book counts. Idle rerun, 2026-12-03 (1-minute load below 0.8 before each
  launch), 25m: ZeRO-1 1.120 [1.058-1.160] on 2 ranks, 1.110 [1.105-1.124] on 4; ZeRO-2 0.984
  [0.942-1.013] and 0.924 [0.876-0.982]. What kept ZeRO-1 above ZeRO-2 was local work, not
  bytes (both move the same): the owner-major ``(D, S)`` layout leaves each chunk's ``D``
  pieces apart, so every ``reduce_scatter_single`` needed a packed send copy and every
  ``all_gather_single`` a receive buffer copied back, each a fresh bucket-sized allocation on
  the training thread. Tried first: keeping the send buffers between steps, 1.047 but a trace
  peak of 1.165; reusing finished ones within a backward, no gain; a quarter-size chunk 0,
  1.200. What worked (2026-12-04): the list forms ``reduce_scatter`` / ``all_gather``, which
  take the rows' views as they are (gloo still runs an all-reduce of a copy, made on its own
  thread; the same wire bytes). Idle, 25m, per run of 3 launches: ZeRO-1 on 2 ranks 0.889,
  0.966, 0.926, 0.928, 0.898 (alloc peak 0.95-0.97, before 1.10-1.19), on 4 ranks 0.941,
  0.958 (alloc 0.92-0.94); ZeRO-2 (stored runs) 1.028 [1.008-1.221] on 2 ranks, 1.010
  [1.008-1.128] on 4. ZeRO-2 with the list form reduce-scatter: time within noise of the
  single-tensor form (1.064, 1.018 against 1.051, 1.137 on 2 ranks, alternated), alloc peak
  0.909 against 0.999
  (gloo no longer copies the whole bucket). What keeps ZeRO-2 near 1.05 on 2 ranks: the
  reduce-scatters still queued when backward ends, 50-80 ms per step waited for in
  ``finish_gradient_synchronization`` (phase timing, 2 ranks: forward 103, backward 300, finish
  81, step 52 ms against PyTorch's 100 / 326 / 0 / 126); DDP starts with a 1 MB first bucket
  and ends inside backward. Smaller last buckets (a change to exercise 4's bucketing) would
  shorten that tail.
* The list forms cost the small size dearly on 4 ranks: the ``bench`` runs (1 MB buckets)
  went from 0.65-0.71 (ZeRO-1) and 0.53-0.55 (ZeRO-2) with the single forms to 1.25-1.37
  and 1.17-1.24 with the list forms (A/B, same machine, alternated). ``torch.profiler`` shows
  why: gloo runs a list ``reduce_scatter`` as ``D`` all-reduces, one per output piece (same
  wire bytes, ``D`` times the latency). ``benchmark_gloo_forms.py`` times both forms of both
  collectives by size: the list all-gather took 0.5-1.2x the single one's time (within
  noise or faster), the list reduce-scatter 1.1-2.7x up to 8 MB on 4 ranks and 0.59-0.84x
  from 16 MB. Since then (2026-12-04) the
  gradient reduce-scatter takes the list form only from ``shardlab.runtime.collective_forms.LIST_FORM_MIN_MB`` (16 MB)
  and the weights always the list all-gather. Idle, stored runs: ``bench`` ZeRO-1 0.664 /
  0.638 (2 / 4 ranks), ZeRO-2 0.609 / 0.556; ``25m`` ZeRO-1 0.936 / 0.955, ZeRO-2 0.972
  [0.859-1.012] on 2 ranks and 1.028 [1.025-1.160] on 4 (four ranks on two cores; the run
  before it: 1.112 [1.064-1.206]).
  ``--save`` writes
  ``benchmarks/results/zero_<size>_<ranks>ranks.json``.
"""

from __future__ import annotations

import argparse
import statistics

# run as a script, Python puts this folder on sys.path; the ranks it launches find its
# modules the same way (the launcher passes its sys.path on)
from shardlab.benchresults import add_arguments, load_average, write_results
from shardlab.runtime.allocator_peak import allocator_peak
from shardlab.testing import bench_steps, compare_launches, median_range

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
