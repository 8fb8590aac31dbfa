"""From-scratch DDP vs torch.nn.parallel.DistributedDataParallel, on CPU with gloo.

    python benchmark_ddp.py [--size bench|25m] [--ranks 2] [--steps 20] [--repeats 1]

Same model (the package's GPT: ``bench`` in ``shardlab.models.SIZES``, 0.86 M parameters,
or ``25m``, the same GPT at d_model 512 and 8 layers, 25.5 M parameters = 102 MB of fp32
gradients, four 25 MB buckets), same data (8 sequences per step in all), same 25 MB buckets,
fp32 AdamW. Step time: median over ``--steps`` steps after the warm-up steps, the two
implementations alternating step by step so both see the same machine noise. Peak: one step
after a warm-up step, each side built inside the meters. Ratios are from scratch / PyTorch
(goal: <= 1.0): the slowest rank's step, the largest rank's peak; with ``--repeats`` the
launches are repeated and the median and range of the ratios printed. ``main()`` without
arguments is the fast run the lab notebook shows.

Two peaks, same for both sides (:func:`peaks`):

* ``trace``: MemoryTrace's largest live tensor bytes during the measured step. Everything made
  at wrap time counts: PyTorch's C++ Reducer bucket (with the default
  ``gradient_as_bucket_view=False`` a flat copy of all gradients held *in addition to*
  ``param.grad``) and our buckets (which *are* ``param.grad``).
* ``alloc``: the CPU allocator's own count (``torch.profiler``, ``profile_memory=True``,
  started before construction) while the measured step runs; it also sees what gloo
  allocates on its worker threads, which the trace cannot. Both sides only all-reduce, in
  place, so the two peaks agree (to 0-4 KB on PyTorch's side).

Measured 2026-12-01 (torch 2.13, gloo, 2 CPU cores shared with other jobs, load average 3-5
during the runs; ``--repeats 3``; ratio ours / PyTorch, median [min-max] of 3 launches; the
peaks repeat to the byte)::

    size   ranks  step time            peak trace  peak alloc
    bench    2    0.967 [0.946-0.998]  0.993       0.993
    bench    4    0.985 [0.906-1.018]  0.919       0.919
    25m      2    0.958 [0.936-0.973]  0.862       0.862
    25m      4    0.985 [0.958-1.044]  0.829       0.829

Step time: the medians are below 1.0 at both sizes; single launches at 4 ranks (4 processes
on 2 cores) scatter by +-6 %. What separates the two at 25m is the tail, the all-reduce of the
bucket filled last, which no backward work can hide: PyTorch rebuilds its buckets after the
first step in the order gradients arrived and closes a bucket once it *reaches* the cap, so
its last bucket holds 16.4 MB (buckets 29.9, 29.4, 26.3, 16.4 MB, from
``reducer._get_zeros_like_grad_buckets()``), while ours, cut *below* the cap in reverse
parameter order, are 25.7, 25.2, 25.2 and 25.8 MB; our wait for that tail measured 30-56 ms
of a 0.55-0.6 s step (2 ranks). Our side copies each gradient once (into its bucket view)
where PyTorch's default copies it in and back out, which is why the ratio stays below 1.0.
Peak: ours is lower at both sizes because the bucket is the only copy of the gradients
(518.4 MB vs 447.1 MB at 25m, 2 ranks; an earlier audit at ``bench`` found PyTorch with
``gradient_as_bucket_view=True`` at exactly our peak). Weights: equal to the bit at 2 ranks; at 4, gloo's ring sums
an element in an order that depends on where it sits in its bucket, the buckets differ, and
AdamW turns last-bit gradient differences on near-zero gradients into update differences of
up to ``lr`` (largest gap after 23 steps: 9.5e-03 at ``bench``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from shardlab.runtime import launch  # noqa: E402
from shardlab.runtime.allocator_peak import allocator_peak  # noqa: E402

# Overrides of shardlab.models.SIZES["bench"] (vocab 256, seq 32, 4 layers, d_model 128).
BENCH_SIZES: dict[str, dict[str, int]] = {
    "bench": {},  # 0.86 M parameters: fixed per-step overheads dominate
    "25m": dict(d_model=512, n_layer=8, n_head=8),  # 25.5 M: 102 MB of gradients
}
BATCH = 8  # global sequences per step


def _build(impl: str, size: str, bucket_size_mb: float):
    """(model, wrapped, finish) for ``"mine"`` or ``"torch"``."""
    from _workers_ddp import DDP
    from shardlab.models import tiny_gpt
    from torch.nn.parallel import DistributedDataParallel

    model = tiny_gpt("plain", size="bench", **BENCH_SIZES[size])
    if impl == "mine":
        w = DDP(model, bucket_size_mb=bucket_size_mb)
        return model, w, w.finish_gradient_synchronization
    return model, DistributedDataParallel(model, bucket_cap_mb=bucket_size_mb), None


def peaks(size: str = "bench", bucket_size_mb: float = 25.0, n: int = BATCH) -> dict:
    """Rank function: ``{impl: {"trace": bytes, "alloc": bytes}}`` of one measured step."""
    import torch
    from shardlab.models import lm_loss, make_optimizer, rank_slice, step_batch, train_step
    from shardlab.runtime import MemoryTrace, phase
    from torch.profiler import ProfilerActivity, profile, record_function

    torch.set_num_threads(1)
    out = {}
    for impl in ("mine", "torch"):
        with (
            profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof,
            MemoryTrace() as mt,
        ):
            model, w, finish = _build(impl, size, bucket_size_mb)
            opt = make_optimizer("adamw", model.parameters())
            mt.watch(model, opt)
            xy = rank_slice(step_batch(model.config, 0, n))
            train_step(w, opt, xy, finish)  # warm-up: AdamW state (and any bucket rebuild)
            opt.zero_grad(set_to_none=True)
            with phase("measured"), record_function("measured"):
                lm_loss(w, *xy).backward()
                if finish is not None:
                    finish()
                opt.step()
        tl = mt.timeline()
        s, e = (i for i, name, _ in tl.markers if name == "measured")
        out[impl] = {"trace": max(tl.total()[s : e + 1]), "alloc": allocator_peak(prof)}
        del model, w, opt, prof, mt
    return out


def run(
    size: str = "bench", steps: int = 20, warmup: int = 3, bucket_size_mb: float = 25.0,
    n: int = BATCH, with_peaks: bool = True,
) -> dict:  # fmt: skip
    """Rank function: median step times (alternating step by step), weight gap, peaks."""
    import time

    import torch
    import torch.distributed as dist
    from shardlab.models import make_optimizer, rank_slice, step_batch, train_step

    torch.set_num_threads(1)
    runs = {impl: _build(impl, size, bucket_size_mb) for impl in ("mine", "torch")}
    opts = {impl: make_optimizer("adamw", runs[impl][0].parameters()) for impl in runs}
    xy = rank_slice(step_batch(runs["mine"][0].config, 0, n))
    times: dict = {impl: [] for impl in runs}
    for i in range(warmup + steps):
        for impl, (_, w, finish) in runs.items():  # interleaved: both see the same noise
            dist.barrier()
            t0 = time.perf_counter()
            train_step(w, opts[impl], xy, finish)
            if i >= warmup:
                times[impl].append(time.perf_counter() - t0)
    out: dict = {impl: {"step_s": statistics.median(ts)} for impl, ts in times.items()}
    out["n_params"] = sum(p.numel() for p in runs["mine"][0].parameters())
    # 0 at 2 ranks; at 4, gloo's ring sums an element in an order that depends on where it
    # sits in its bucket, and the two sides' buckets differ, so the last bits may too
    out["max_diff"] = max(
        (a - b).abs().max().item()
        for a, b in zip(runs["mine"][0].parameters(), runs["torch"][0].parameters())
    )
    del runs, opts
    if with_peaks:
        for impl, p in peaks(size, bucket_size_mb, n).items():
            out[impl].update(p)
    return out


def ratios(res: list[dict]) -> dict[str, float]:
    """One launch's ratios ours / PyTorch: step time of the slowest rank (every step ends in
    a collective, so the ranks agree to within noise), peaks (if measured) of the largest."""
    out = {"step": max(m["mine"]["step_s"] for m in res) / max(m["torch"]["step_s"] for m in res)}
    for k in ("trace", "alloc"):
        if k in res[0]["mine"]:
            out[k] = max(m["mine"][k] for m in res) / max(m["torch"][k] for m in res)
    return out


def main(
    size: str = "bench", ranks: int = 2, steps: int | None = None, repeats: int = 1
) -> list[dict]:
    """Run ``repeats`` launches; print the first one per rank, then the ratios (median and
    range over the launches: gloo's worker threads make even the allocator peak vary)."""
    if size not in BENCH_SIZES:
        raise ValueError(f"size={size!r} is not one of {', '.join(BENCH_SIZES)}")
    if repeats < 1 or ranks < 1:
        raise ValueError(f"repeats={repeats} and ranks={ranks} must be >= 1")
    if BATCH % ranks:
        raise ValueError(f"ranks={ranks} must divide the global batch of {BATCH} sequences")
    kw = {"steps": steps or (20 if size == "bench" else 6)}
    kw["warmup"] = 3 if size == "bench" else 2
    launches = [
        launch("benchmark_ddp:run", ranks, size, quiet=True, timeout=900, **kw)
        for i in range(repeats)
    ]
    per_launch = [ratios(res) for res in launches]
    res = launches[0]
    print(
        f"N = {res[0]['n_params']:,} parameters ({size}), {ranks} ranks, gloo, fp32 AdamW, "
        f"median of {kw['steps']} steps"
    )
    diff = max(m["max_diff"] for r in launches for m in r)
    print(f"largest |weight - PyTorch's| after the timed steps: {diff:.1e}")
    print(f"{'rank':>4s} {'impl':>6s} {'step ms':>8s} {'peak trace B':>13s} {'peak alloc B':>13s}")
    for r, m in enumerate(res):
        for impl in ("mine", "torch"):
            d = m[impl]
            print(f"{r:4d} {impl:>6s} {d['step_s'] * 1e3:8.1f} {d['trace']:13,d} {d['alloc']:13,d}")
    if repeats > 1:
        print("step ratio per launch: " + " ".join(f"{p['step']:.3f}" for p in per_launch))
    more = f", median [min-max] of {repeats} launches" if repeats > 1 else ""
    print(f"ratio ours / PyTorch{more}")
    for k, label in (("step", "step time"), ("trace", "peak trace"), ("alloc", "peak alloc")):
        v = [p[k] for p in per_launch if k in p]
        spread = f" [{min(v):.3f}-{max(v):.3f}]" if len(v) > 1 else ""
        print(f"  {label:10s} {statistics.median(v):.3f}{spread}")
    return per_launch


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", choices=list(BENCH_SIZES), default="bench")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--steps", type=int, default=None, help="timed steps (20 bench, 6 25m)")
    ap.add_argument("--repeats", type=int, default=1)
    a = ap.parse_args()
    main(a.size, a.ranks, a.steps, a.repeats)
