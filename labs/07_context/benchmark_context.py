"""Benchmark: ring and all-gather context-parallel attention vs full single-process SDPA.

    python benchmark_context.py [--ranks 2] [--seq 2048] [--heads 8] [--kv-heads 2]
                                [--head-dim 64] [--repeats 5] [--no-causal] [--zigzag]
                                [--launches 1] [--save] [--results-dir DIR]

PyTorch's own context parallelism (``torch.distributed.tensor.experimental.context_parallel``)
does not run on CPU ("aten._scaled_dot_product_flash_attention_for_cpu.default does not have a
sharding strategy registered"), so the comparison is with what it would replace: PyTorch's
``scaled_dot_product_attention`` over the whole sequence in one process (the same function
the tests compare against), and with this lab's all-gather variant. Times are the median of
``--repeats`` forward + backward passes (after one warm-up), with rank 0's SDPA run on the
same number of threads as one rank. Ratios below 1.0: the CP version takes less time per
rank than one process does for the whole sequence.

``--repeats`` counts passes inside one launch (the lab notebook's meaning); ``--launches N``
repeats the whole launch N times and prints each launch's ratios and their median [min-max].
``--save`` writes ``context_<seq>_<ranks>ranks.json`` (``_nocausal`` / ``_zigzag`` appended
for those variants, so they do not overwrite the default) into ``--results-dir`` (default
``benchmarks/results``; :func:`shardlab.benchresults.write_results`: machine, load, per launch
the ratios to SDPA and the seconds).
"""

from __future__ import annotations

import argparse
import time

import ring_attention as ra
import torch.distributed as dist
from _workers_context import VARIANTS, make_inputs, reference
from ring_attention import CPConfig
from shardlab.benchresults import add_arguments, load_average, write_results
from shardlab.testing import median_range

# run as a script, Python puts this folder on sys.path; the ranks it launches find these
# modules the same way (the launcher passes its sys.path on)


# ------------------------------------------------------------------ rank code
def benchmark(cfg: CPConfig, repeats: int = 5) -> dict:
    """Median fwd+bwd seconds of ring and all-gather attention on this rank, and (rank 0) of
    full single-process SDPA over the whole sequence with the same thread count."""
    med = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
    c, r = dist.get_world_size(), dist.get_rank()
    x = make_inputs(cfg)
    mine = {n: ra.shard(t, r, c, cfg.zigzag) for n, t in x.items()}
    out = {}
    for variant in ("ring", "all_gather"):
        times = []
        for _ in range(repeats + 1):  # no CommTrace here: plain ops only
            q, k, v = (mine[n].detach().requires_grad_(True) for n in "qkv")
            dist.barrier()
            t0 = time.perf_counter()
            VARIANTS[variant](q, k, v, None, cfg.causal, cfg.zigzag).backward(mine["dout"])
            times.append(time.perf_counter() - t0)
        out[variant] = med(times[1:])
    dist.barrier()
    if dist.get_rank() == 0:
        times = []
        for _ in range(repeats + 1):
            t0 = time.perf_counter()
            reference(cfg)
            times.append(time.perf_counter() - t0)
        out["sdpa_full"] = med(times[1:])
    dist.barrier()
    return out


# ------------------------------------------------------------------ launch, print


def main(argv: list[str] | None = None) -> dict:
    from shardlab.runtime import launch

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--no-causal", action="store_true")
    ap.add_argument("--zigzag", action="store_true")
    add_arguments(ap, "--launches")  # --save: context_<seq>_<ranks>ranks.json
    a = ap.parse_args(argv)
    cfg = CPConfig(
        s=a.seq, c=a.ranks, heads=a.heads, kv_heads=a.kv_heads, head_dim=a.head_dim,
        causal=not a.no_causal, zigzag=a.zigzag,
    )
    load_before = load_average()
    every = [
        launch("benchmark_context:benchmark", a.ranks, cfg, a.repeats, quiet=True, timeout=600)
        for _ in range(a.launches)
    ]
    res = every[0]
    full = res[0]["sdpa_full"]
    print(f"{cfg}, median of {a.repeats} forward+backward passes")
    print(f"{'':28}{'ms (slowest rank)':>18}{'ratio to SDPA':>15}")
    print(f"{'SDPA, whole sequence, 1 proc':28}{full * 1e3:18.1f}{1.0:15.2f}")
    for name in ("ring", "all_gather"):
        t = max(r[name] for r in res)
        print(f"{name + f' over {a.ranks} ranks':28}{t * 1e3:18.1f}{t / full:15.2f}")
    # per launch: SDPA (rank 0) and each variant's slowest rank, in seconds
    seconds = [
        {"sdpa_full": r[0]["sdpa_full"], **{n: max(x[n] for x in r) for n in ("ring", "all_gather")}}
        for r in every
    ]
    rows = [
        {"ratio": {n: t[n] / t["sdpa_full"] for n in ("ring", "all_gather")}, "seconds": t}
        for t in seconds
    ]
    if a.launches > 1:
        print(f"ratio to SDPA, median [min-max] of {a.launches} launches")
        for n in ("ring", "all_gather"):
            each = " ".join(f"{row['ratio'][n]:.3f}" for row in rows)
            print(f"  {n}: {median_range(row['ratio'][n] for row in rows)} (per launch: {each})")
    if a.save:
        tail = ("_nocausal" if a.no_causal else "") + ("_zigzag" if a.zigzag else "")
        path = write_results(
            f"context_{a.seq}_{a.ranks}ranks{tail}", rows,
            benchmark="lab 07 ring / all-gather context-parallel attention vs one-process SDPA "
                      "(gloo, CPU)",
            config={"seq": a.seq, "ranks": a.ranks, "heads": a.heads, "kv_heads": a.kv_heads,
                    "head_dim": a.head_dim, "batch": cfg.batch, "causal": cfg.causal,
                    "zigzag": cfg.zigzag, "passes": a.repeats, "launches": a.launches,
                    "n_params": 0},  # attention alone: q, k, v are inputs, no weights
            load_before=load_before, directory=a.results_dir,
        )
        print(f"results written to {path.name}")
    return seconds[0]


if __name__ == "__main__":
    main()
