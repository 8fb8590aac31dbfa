"""Benchmark: this lab's FSDP (flat units and per-parameter) vs PyTorch FSDP2 in one launch.

    python benchmark_fsdp.py [--ranks 2] [--steps 10] [--d-model 64] [--layers 4] [--repeats 1]
    python benchmark_fsdp.py --size 25m --ranks 2 4 [--steps 5] [--save] [--results-dir DIR]
    python benchmark_fsdp.py --hsdp [--size 25m]     # HSDP on 4 ranks, 2 x 2, vs FSDP2

All three wrap one unit per block plus the root, train the same model on the same data, and
are measured in the same processes: median step time (forward + backward + gradient
synchronisation + AdamW) and the peak of live tensor bytes of one step (MemoryTrace). Ratios
are from scratch / FSDP2 (below 1.0: ours is faster or smaller). The same launch times a
*compute floor* (the whole model on each rank, its batch slice, plain AdamW, no collective)
and prints each side's step over it: above 1.0 by what communication leaves exposed (FSDP
also re-gathers what a replica keeps, so its floor is a bound, not a target). Sizes: ``fast`` (default,
``--d-model``/``--layers``, 0.2 M parameters with the defaults; ``make test`` and the lab
notebook use it) and ``25m`` (d_model 512, 8 blocks: 25.2 M parameters, 101 MB of fp32
weights, four 25 MB buckets' worth, every block 12.6 MB), where the collectives move
megabytes and fixed per-call overheads no longer dominate.

What the peak counts (audit, torch 2.13, CPU, 2 ranks, defaults). MemoryTrace counts every
storage an operator touches on the rank's main thread (FSDP2's DTensor shards through their
local tensors, all-gather buffers freed/re-allocated by ``resize_``). Starting the trace
before ``fully_shard`` gives FSDP2's step peak to within 8 bytes, so nothing made at wrap
time is missed. All run the same collectives (8 all-gathers and 4 reduce-scatters of a
block plus the root's), and gloo's worker threads allocate temporaries for them that
MemoryTrace does not see: the CPU allocator's own count (``torch.profiler``,
``profile_memory=True``, all threads, separate runs) was higher by 0.23-0.44 MB for the flat
units and 0.08-0.20 MB for FSDP2 at the fast size. FSDP2's trace peak itself varies by run
(2.49-2.57 MB at the fast size) with the timing of frees; the per-parameter mode frees its
collective buffers with ``resize_``, so its peak does not depend on when gloo lets go.

What the flat units' extra peak is (25m, 2 ranks, 2026-12-04; storages over 1 MB alive at the
peak, MemoryTrace). The peak of both is inside a block's backward. Ours then holds the current
and the prefetched block gathered, the block's gradient, and the previous block's gradient as
the input of its reduce-scatter, still in flight (``overlap_reduce_scatter``, the default: it
overlaps the next block's backward); FSDP2 holds the same except that input, because on CPU its
reduce-scatter blocks (its reduce-scatter "stream" orders nothing on a CPU), so it is gone
before the next block starts. The difference is exactly one block's padded gradient, 12.6 MB:
253.8 against 241.6 MB (1.051). ``flat-wait`` is the same wrapper with
``FSDPConfig(overlap_reduce_scatter=False)``: 241.2 MB (0.998), in 3 % more time in that run
(labs/04_fsdp/test_fsdp.py asserts the one-gradient difference and equal weights and bytes).
The gathered copy is freed before the reduction starts (it reads only the gradient).

``--hsdp``: our ``FSDP(..., replicate_group=...)`` against FSDP2 ``fully_shard`` on the same
2-D DeviceMesh ``("replicate", "shard") = (2, 2)`` (4 ranks, one launch): median step, peak of
live bytes, and the ring-model bytes per rank sent on each axis next to
``accounting.hierarchical.hsdp_step_volume``. Ours equals the formula; FSDP2's shard axis is
lower by one all-gather of the root (it keeps the root gathered from forward to backward) and
both axes carry its per-parameter padding (each parameter's dim 0 padded to a multiple of S).

``--repeats N`` runs N launches per rank count (the first one's table is printed, then each
launch's ratios and their median [min-max]); ``--save`` writes one results file per rank
count, ``fsdp_<size>_<ranks>ranks.json`` (``fsdp_hsdp_<size>_4ranks.json`` with ``--hsdp``),
into ``--results-dir`` (default ``benchmarks/results``;
:func:`shardlab.benchresults.write_results`: machine, load, per launch rank 0's ratios, steps
over the floor and seconds).
"""

from __future__ import annotations

import argparse
from functools import partial

import torch.distributed as dist
from _workers_fsdp import (
    make_batches,
    make_model,
    timed_steps,
    traced_step,
    train_fsdp,
    train_fsdp2,
)
from _workers_fsdp_hsdp import axis_bytes, hsdp_mesh, train_fsdp2_hsdp, train_hsdp
from _workers_fsdp_perparam import train_pp
from fsdp import FSDPConfig
from shardlab.accounting import hierarchical
from shardlab.benchresults import add_arguments, load_average, write_results
from shardlab.models import lm_loss, make_optimizer, rank_slice
from shardlab.testing import median_range

# run as a script, Python puts this folder on sys.path; the ranks it launches find these
# modules the same way (the launcher passes its sys.path on)

SIZES = {"25m": {"d_model": 512, "n_layer": 8}}  # "fast" comes from --d-model / --layers
MODES = ("flat", "flat-wait", "per-param", "fsdp2")  # flat-wait: overlap_reduce_scatter=False
OURS = MODES[:-1]  # the lab's modes, each against FSDP2


# ------------------------------------------------------------------ rank code
def benchmark(steps: int = 10, batch: int = 8, **cfg) -> dict | None:
    """Median step time and peak live bytes: flat units, per-parameter and FSDP2."""
    from shardlab.runtime import MemoryTrace

    x, y = make_batches(1, batch=batch, seed=11)[0]
    x, y = rank_slice(x), rank_slice(y)
    builders = {
        "flat": partial(train_fsdp, "plain", "adamw", None, 0),
        # the same, each reduce-scatter waited for at once (no overlap, one gradient less)
        "flat-wait": partial(
            train_fsdp, "plain", "adamw", FSDPConfig(overlap_reduce_scatter=False), 0
        ),
        "per-param": partial(train_pp, "plain", "adamw", None, 0),
        "fsdp2": partial(train_fsdp2, "plain", "adamw", 0),
        "floor": _compute_floor,  # the same model, batch and AdamW step, no communication
    }
    res = {"model": cfg, "N": sum(p.numel() for p in make_model("plain", **cfg).parameters())}
    for name, build in builders.items():
        model, opt = build(**cfg)
        timed_steps(model, opt, x, y, 2)  # warm-up (Adam state allocated)
        with MemoryTrace() as mt:
            mt.watch(model, opt)
            timed_steps(model, opt, x, y, 1)
        times = sorted(timed_steps(model, opt, x, y, steps))
        res[name] = {"step_s": times[len(times) // 2], "peak_bytes": mt.peak}
        del model, opt
    for name in OURS:
        res[name]["ratio_time"] = res[name]["step_s"] / res["fsdp2"]["step_s"]
        res[name]["ratio_peak"] = res[name]["peak_bytes"] / res["fsdp2"]["peak_bytes"]
    for name in MODES:  # against the limit: above 1 by what is exposed
        res[name]["over_floor"] = res[name]["step_s"] / res["floor"]["step_s"]
    return res if dist.get_rank() == 0 else None


def _compute_floor(**cfg):
    """The whole model on this rank, plain AdamW: the compute of a step with no collective
    (what FSDP's gathers and reduce-scatters are measured against)."""
    model = make_model("plain", **cfg)
    return model, make_optimizer("adamw", model.parameters())


def benchmark_hsdp(steps: int = 5, batch: int = 8, **cfg) -> dict | None:
    """Ours vs FSDP2 HSDP in one launch: median step, peak live bytes, bytes per axis."""
    from shardlab.runtime import MemoryTrace

    mesh = hsdp_mesh()
    R, S = mesh.size(0), mesh.size(1)
    x, y = make_batches(1, batch=batch, seed=11)[0]
    x, y = rank_slice(x), rank_slice(y)
    res = {"model": cfg, "mesh": (R, S)}
    res["N"] = sum(p.numel() for p in make_model("plain", **cfg).parameters())
    for name in ("ours", "fsdp2"):
        build = train_hsdp if name == "ours" else train_fsdp2_hsdp
        model, opt = build("plain", "adamw", 0, mesh=mesh, **cfg)
        timed_steps(model, opt, x, y, 2)  # warm-up (Adam state allocated)
        with MemoryTrace() as mt:
            mt.watch(model, opt)
            timed_steps(model, opt, x, y, 1)
        tr = traced_step(model, opt, x, y) if name == "ours" else _traced_fsdp2(model, opt, x, y)
        times = sorted(timed_steps(model, opt, x, y, steps))
        res[name] = {"step_s": times[len(times) // 2], "peak_bytes": mt.peak,
                     **{k: v["bytes"] for k, v in axis_bytes(tr).items() if k != "other"}}
        if name == "ours":
            res["predicted"] = hierarchical.hsdp_step_volume(model.padded_numel, S, R, 4)
        del model, opt
    res["ratio_time"] = res["ours"]["step_s"] / res["fsdp2"]["step_s"]
    res["ratio_peak"] = res["ours"]["peak_bytes"] / res["fsdp2"]["peak_bytes"]
    return res if dist.get_rank() == 0 else None


def _traced_fsdp2(model, opt, x, y):
    from shardlab.runtime import CommTrace

    with CommTrace() as tr:
        lm_loss(model, x, y).backward()
        opt.step()
    opt.zero_grad()
    return tr


# ------------------------------------------------------------------ launch, print
def run(size: str, ranks: int, steps: int, batch: int, cfg: dict) -> dict:
    from shardlab.runtime import launch

    return launch(
        "benchmark_fsdp:benchmark", ranks, steps=steps, batch=batch, **cfg, quiet=True
    )[0]


def print_table(res: dict, size: str, ranks: int, batch: int, steps: int) -> None:
    print(f"size {size} {res['model']}: {res['N']:,} parameters, {ranks} ranks, "
          f"batch {batch}, median of {steps} steps")
    print(f"{'':10}{'step ms':>10}{'peak bytes':>14}{'time / FSDP2':>14}{'peak / FSDP2':>14}")
    for name in MODES:
        r = res[name]
        ratios = f"{r['ratio_time']:14.2f}{r['ratio_peak']:14.3f}" if name != "fsdp2" else ""
        print(f"{name:10}{r['step_s'] * 1e3:10.2f}{r['peak_bytes']:14,d}{ratios}")
    floor = res["floor"]["step_s"]
    print(f"compute floor (the whole model on each rank, no communication): {floor * 1e3:.2f} ms;"
          " step / floor: " + ", ".join(f"{n} {res[n]['over_floor']:.2f}" for n in MODES))


def run_hsdp(steps: int, batch: int, cfg: dict) -> dict:
    from shardlab.runtime import launch

    return launch("benchmark_fsdp:benchmark_hsdp", 4, steps=steps, batch=batch, **cfg,
                  quiet=True, timeout=600)[0]


def print_hsdp(res: dict, size: str, batch: int, steps: int) -> None:
    R, S = res["mesh"]
    print(f"HSDP size {size} {res['model']}: {res['N']:,} parameters, {R} x {S} mesh "
          f"(replicate x shard), batch {batch}, median of {steps} steps")
    print(f"{'':10}{'step ms':>10}{'peak bytes':>14}{'shard-axis B':>14}{'replicate B':>13}")
    for name in ("predicted", "ours", "fsdp2"):
        r = res[name]
        head = f"{'':10}{'':14}" if name == "predicted" else (
            f"{r['step_s'] * 1e3:10.2f}{r['peak_bytes']:14,d}")
        print(f"{name:10}{head}{r['shard']:14,.0f}{r['replicate']:13,.0f}")
    print(f"ours / FSDP2: time {res['ratio_time']:.2f}, peak {res['ratio_peak']:.3f}")


def print_launches(launches: list[dict], hsdp: bool = False) -> None:
    """Each launch's time ratio ours / FSDP2 and the median [min-max] of every ratio."""
    names = ("ours",) if hsdp else OURS
    pick = (lambda r, n, k: r[k]) if hsdp else (lambda r, n, k: r[n][k])
    more = f", median [min-max] of {len(launches)} launches" if len(launches) > 1 else ""
    print(f"ratio ours / FSDP2{more}")
    for n in names:
        if len(launches) > 1:
            each = " ".join(f"{pick(r, n, 'ratio_time'):.3f}" for r in launches)
            print(f"  {n} time ratio per launch: {each}")
        print(f"  {n}: time {median_range(pick(r, n, 'ratio_time') for r in launches)}, "
              f"peak {median_range(pick(r, n, 'ratio_peak') for r in launches)}")
    if not hsdp:
        print("step / compute floor" + more + ": " + ", ".join(
            f"{n} {median_range(r[n]['over_floor'] for r in launches)}" for n in MODES))


def save_launches(
    launches: list[dict], name: str, config: dict, load_before: list[float],
    results_dir: str | None, hsdp: bool = False,
) -> None:
    """Write ``<results_dir>/<name>.json`` (:func:`shardlab.benchresults.write_results`)."""
    if hsdp:
        rows = [{"ratio": {"step": r["ratio_time"], "peak": r["ratio_peak"]},
                 "seconds": {n: r[n]["step_s"] for n in ("ours", "fsdp2")},
                 "bytes": {n: {k: r[n][k] for k in ("shard", "replicate")}
                           for n in ("predicted", "ours", "fsdp2")}} for r in launches]
        what = "lab 04 HSDP (2 x 2) vs FSDP2 fully_shard on a 2-D mesh (gloo, CPU)"
    else:
        rows = [{"ratio": {n: {"step": r[n]["ratio_time"], "peak": r[n]["ratio_peak"]}
                           for n in OURS},
                 "floor": {n: r[n]["over_floor"] for n in MODES},
                 "seconds": {n: r[n]["step_s"] for n in (*MODES, "floor")}} for r in launches]
        what = ("lab 04 FSDP (flat units; flat units waiting for each reduce-scatter; "
                "per-parameter) vs FSDP2 fully_shard (gloo, CPU)")
    path = write_results(name, rows, benchmark=what, config={**config, "n_params": launches[0]["N"]},
                         load_before=load_before, directory=results_dir)
    print(f"results written to {path.name}")


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", choices=("fast", *SIZES), default="fast")
    ap.add_argument("--ranks", type=int, nargs="+", default=[2])
    ap.add_argument("--steps", type=int, default=None, help="default 10 (fast), 5 (25m)")
    ap.add_argument("--d-model", type=int, default=64)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--hsdp", action="store_true", help="HSDP 2 x 2 on 4 ranks vs FSDP2")
    add_arguments(ap)  # --repeats per rank count; --save: one file per rank count
    a = ap.parse_args(argv)
    cfg = SIZES.get(a.size, {"d_model": a.d_model, "n_layer": a.layers})
    steps = a.steps or (10 if a.size == "fast" else 5)
    setting = {"size": a.size, "model": cfg, "batch": a.batch, "steps": steps, "warmup": 2,
               "repeats": a.repeats}
    if a.hsdp:
        load_before = load_average()
        launches = [run_hsdp(steps, a.batch, cfg) for _ in range(a.repeats)]
        res = launches[0]
        print_hsdp(res, a.size, a.batch, steps)
        if a.repeats > 1:  # the single launch's ratios are printed by print_hsdp already
            print_launches(launches, hsdp=True)
        if a.save:
            save_launches(launches, f"fsdp_hsdp_{a.size}_4ranks",
                          {**setting, "ranks": 4, "mesh": list(res["mesh"])}, load_before,
                          a.results_dir, hsdp=True)
        return res
    for r in a.ranks:
        if r < 1 or a.batch % r:
            raise ValueError(f"--ranks {r} must be >= 1 and divide --batch {a.batch}")
    runs, every = {}, {}
    for ranks in a.ranks:
        load_before = load_average()
        launches = every[ranks] = [
            run(a.size, ranks, steps, a.batch, cfg) for _ in range(a.repeats)
        ]
        res = runs[ranks] = launches[0]
        print_table(res, a.size, ranks, a.batch, steps)
        if a.repeats > 1:  # extra lines; the table above stays as it was
            print_launches(launches)
        if a.save:
            save_launches(launches, f"fsdp_{a.size}_{ranks}ranks", {**setting, "ranks": ranks},
                          load_before, a.results_dir)
    first = runs[a.ranks[0]]
    # the flat units' ratios at the top level (what the lab notebook reads)
    return {**first, "ratio_time": first["flat"]["ratio_time"],
            "ratio_peak": first["flat"]["ratio_peak"], "runs": runs, "launches": every}


if __name__ == "__main__":
    main()
