"""Which form of reduce-scatter and all-gather gloo runs faster, by bucket size and rank count.

    python benchmark_gloo_forms.py [--ranks 2 4] [--sizes-mb 0.25 1 4 16 25] [--reps 10] [--save]

ZeRO-1 and ZeRO-2 (``zero1.py``, ``zero2.py``) move each bucket with one of two forms of the
same collective, and gloo runs them differently:

* the single-tensor forms, ``reduce_scatter_tensor`` / ``all_gather_into_tensor``: one
  collective over one contiguous ``(D c,)`` buffer (gloo: an all-reduce of a copy of the
  input, and an all-gather). ZeRO-1's owner-major rows put a chunk's ``D`` pieces ``S``
  apart, so it packs them into a send buffer first (and copies a receive buffer back), a
  bucket-sized copy on the training thread;
* the list forms, ``reduce_scatter`` / ``all_gather`` over ``D`` tensors: they read and write
  the rows' pieces where they are (no packing), but gloo runs the list reduce-scatter as
  ``D`` all-reduces, one per output piece (``torch.profiler`` shows ``D`` ``gloo:all_reduce``
  events per call), and the list all-gather through a flat copy: the same wire bytes
  (``accounting.wire``), ``D`` times the latency terms.

So the single forms win while latency dominates (small buckets, more ranks) and the list forms
once a bucket's copy costs more than ``D - 1`` extra collectives' latency. This script times
both forms of both collectives, each call started async and waited for (as the labs do), the
single forms including ZeRO-1's pack and copy-back, alternating the forms; it prints the
median time per call of each and the ratio list / single. ``shardlab.runtime.collective_forms.LIST_FORM_MIN_MB``
is the bucket size from which the labs use the list reduce-scatter, chosen from these runs; ``--save`` writes
``gloo_forms.json`` (:func:`shardlab.benchresults.write_results`).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.distributed as dist
from shardlab.benchresults import add_arguments, load_average, write_results
from shardlab.runtime import launch
from shardlab.runtime.collective_forms import LIST_FORM_MIN_MB

FORMS = ("single", "list")


def _reduce_scatter(form: str, grads: torch.Tensor, r: int) -> None:
    D = grads.shape[0]
    if form == "list":
        dist.reduce_scatter(grads[r], list(grads.unbind(0)), async_op=True).wait()
    else:
        send = torch.empty(grads.numel(), dtype=grads.dtype)
        send.view(D, -1).copy_(grads)  # the pack ZeRO-1's owner-major rows need
        dist.reduce_scatter_tensor(grads[r], send, async_op=True).wait()


def _all_gather(form: str, weights: torch.Tensor, r: int) -> None:
    D = weights.shape[0]
    if form == "list":
        own = weights[r].clone()
        dist.all_gather(list(weights.unbind(0)), own, async_op=True).wait()
    else:
        recv = torch.empty(weights.numel(), dtype=weights.dtype)
        dist.all_gather_into_tensor(recv, weights[r], async_op=True).wait()
        weights.copy_(recv.view(D, -1))  # the copy-back


def _time(sizes_mb: list[float], reps: int) -> dict:
    """On every rank: median ms per call, per collective, size and form (rank 0's answer is
    kept; every rank waits for the same collectives)."""
    D, r = dist.get_world_size(), dist.get_rank()
    out: dict = {}
    for mb in sizes_mb:
        c = max(1, int(mb * 2**20 / 4) // D)  # fp32 elements per piece
        rows = torch.randn(D, c)  # a (D, c) chunk of the owner-major rows
        for name, fn in (("reduce_scatter", _reduce_scatter), ("all_gather", _all_gather)):
            for form in FORMS:  # warm-up
                fn(form, rows, r)
            times: dict[str, list[float]] = {f: [] for f in FORMS}
            for i in range(reps):
                for form in FORMS if i % 2 == 0 else FORMS[::-1]:  # alternate the order
                    dist.barrier()
                    t = time.perf_counter()
                    fn(form, rows, r)
                    times[form].append((time.perf_counter() - t) * 1e3)
            out[f"{name}_{mb:g}MB"] = {f: statistics.median(v) for f, v in times.items()}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--sizes-mb", type=float, nargs="+", default=[0.25, 1, 4, 16, 25])
    ap.add_argument("--reps", type=int, default=10)
    add_arguments(ap, launches=None)  # --save: gloo_forms.json
    args = ap.parse_args()
    before = load_average()
    run: dict = {}  # one run: every rank count's medians
    for D in args.ranks:
        res = launch("benchmark_gloo_forms:_time", D, args.sizes_mb, args.reps, timeout=600)[0]
        print(f"{D} ranks (ms per call, median of {args.reps}; ratio list / single)")
        ratios = {}
        for key, v in res.items():
            ratios[key] = v["list"] / v["single"]
            print(f"  {key:>22}: single {v['single']:8.2f}  list {v['list']:8.2f}  {ratios[key]:5.2f}")
        run[f"ranks{D}"] = {"ratio": ratios, "ms": res}
    if args.save:
        path = write_results(
            "gloo_forms", [run], load_before=before,
            benchmark="gloo's single-tensor vs list forms of reduce-scatter and all-gather",
            command="benchmark_gloo_forms.py " + " ".join(
                [f"--ranks {' '.join(map(str, args.ranks))}",
                 f"--sizes-mb {' '.join(f'{s:g}' for s in args.sizes_mb)}", f"--reps {args.reps}"]),
            config={"ranks": args.ranks, "sizes_mb": args.sizes_mb, "reps": args.reps,
                    "dtype": "float32", "backend": "gloo",
                    "labs_list_form_min_mb": LIST_FORM_MIN_MB},
            directory=args.results_dir,
        )
        print(f"results written to {path.name}")


if __name__ == "__main__":
    main()
