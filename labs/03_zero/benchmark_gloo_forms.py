"""Which form of reduce-scatter and all-gather gloo runs faster, by bucket size and rank count.

    python benchmark_gloo_forms.py [--ranks 2 4] [--sizes-mb 0.25 1 4 16 25] [--reps 10] [--save]

ZeRO-1 and ZeRO-2 (``zero1.py``, ``zero2.py``) move each bucket with one of several forms of
the same collective, and gloo runs them differently:

* ``single``: the single-tensor forms, ``reduce_scatter_tensor`` / ``all_gather_into_tensor``,
  one collective over one contiguous ``(D c,)`` buffer (gloo: an all-reduce of a copy of the
  input, and an all-gather through temporaries). ZeRO-1's owner-major rows put a chunk's
  ``D`` pieces ``S`` apart, so it packs them into a send buffer first (and copies a receive
  buffer back), a bucket-sized copy on the training thread;
* ``list``: ``reduce_scatter`` / ``all_gather`` over ``D`` tensors, reading and writing the
  rows' pieces where they are; gloo runs the list reduce-scatter as ``D`` all-reduces, one per
  output piece (``torch.profiler`` shows ``D`` ``gloo:all_reduce`` events per call), through
  copies, and the list all-gather through a flat copy;
* ``gloo``: the labs' gloo forms (``shardlab.runtime.collective_forms``): the reduce-scatter as
  ``D`` in-place ``all_reduce`` calls of the rows' pieces (ZeRO-1), the all-gather as ``D``
  in-place ``broadcast`` calls, each piece from its owner;
* ``gloo_flat`` (reduce-scatter only): one in-place ``all_reduce`` of the contiguous buffer
  (ZeRO-2's bucket).

All move the same wire bytes per rank (``accounting.wire``: gloo's reduce-scatter is already an
all-reduce's ``2 V c``; a broadcast tree has ``D - 1`` edges, so ``D`` broadcasts from ``D``
roots send ``V c`` per rank, as the all-gather does). This script times every form of both
collectives, each call started async and waited for (as the labs do), ``single`` including
ZeRO-1's pack and copy-back, the forms' order rotated call by call; it prints the median time
per call of each and the ratio of each to ``single``.
``shardlab.runtime.collective_forms.GLOO_FORM_MIN_MB`` is the bucket size from which the labs
use the gloo forms, chosen from these runs; ``--save`` writes ``gloo_forms.json``
(:func:`shardlab.benchresults.write_results`).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.distributed as dist
from shardlab.benchresults import add_arguments, load_average, write_results
from shardlab.runtime import launch
from shardlab.runtime.collective_forms import GLOO_FORM_MIN_MB, all_reduce_pieces, broadcast_pieces

FORMS = {"reduce_scatter": ("single", "list", "gloo", "gloo_flat"),
         "all_gather": ("single", "list", "gloo")}


def _reduce_scatter(form: str, grads: torch.Tensor, r: int) -> None:
    D = grads.shape[0]
    if form == "list":
        dist.reduce_scatter(grads[r], list(grads.unbind(0)), async_op=True).wait()
    elif form == "gloo":
        all_reduce_pieces(list(grads.unbind(0))).wait()
    elif form == "gloo_flat":
        all_reduce_pieces([grads.view(-1)]).wait()
    else:
        send = torch.empty(grads.numel(), dtype=grads.dtype)
        send.view(D, -1).copy_(grads)  # the pack ZeRO-1's owner-major rows need
        dist.reduce_scatter_tensor(grads[r], send, async_op=True).wait()


def _all_gather(form: str, weights: torch.Tensor, r: int) -> None:
    D = weights.shape[0]
    if form == "list":
        own = weights[r].clone()
        dist.all_gather(list(weights.unbind(0)), own, async_op=True).wait()
    elif form == "gloo":
        broadcast_pieces(list(weights.unbind(0))).wait()
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
            forms = FORMS[name]
            for form in forms:  # warm-up
                fn(form, rows, r)
            times: dict[str, list[float]] = {f: [] for f in forms}
            for i in range(reps):
                k = i % len(forms)
                for form in forms[k:] + forms[:k]:  # rotate the order
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
        print(f"{D} ranks (ms per call, median of {args.reps}; in brackets: form / single)")
        ratios = {}
        for key, v in res.items():
            cells = []
            for form, ms in v.items():
                ratios[f"{key}.{form}"] = ms / v["single"]
                cells.append(f"{form} {ms:8.2f}" + ("" if form == "single" else
                                                    f" [{ms / v['single']:4.2f}]"))
            print(f"  {key:>20}: " + "  ".join(cells))
        run[f"ranks{D}"] = {"ratio": ratios, "ms": res}
    if args.save:
        path = write_results(
            "gloo_forms", [run], load_before=before,
            benchmark="gloo's forms of reduce-scatter and all-gather (single, list, in-place)",
            command="benchmark_gloo_forms.py " + " ".join(
                [f"--ranks {' '.join(map(str, args.ranks))}",
                 f"--sizes-mb {' '.join(f'{s:g}' for s in args.sizes_mb)}", f"--reps {args.reps}"]),
            config={"ranks": args.ranks, "sizes_mb": args.sizes_mb, "reps": args.reps,
                    "dtype": "float32", "backend": "gloo",
                    "labs_gloo_form_min_mb": GLOO_FORM_MIN_MB},
            directory=args.results_dir,
        )
        print(f"results written to {path.name}")


if __name__ == "__main__":
    main()
