"""From-scratch DDP vs torch.nn.parallel.DistributedDataParallel, one 2-rank launch on CPU.

Same model (the package's GPT, ``bench`` size in ``shardlab.models.SIZES``), same data, same
25 MB buckets, AdamW. Step time: median over 20 steps after 3 warm-up steps, the two
implementations alternating step by step so both see the same machine noise
(``_workers_ddp.benchmark``). Prints a table per rank and the ratios from scratch / PyTorch
(goal: <= 1.0). Run: ``python labs/02_ddp/benchmark_ddp.py``.

What the peak counts (same for both sides; :func:`peaks` below). Each side is built *inside*
a MemoryTrace, so everything made at wrap time counts from the start: PyTorch's C++ Reducer bucket (one flat copy of all gradients,
3.45 MB here = ``bucket_sizes`` of ``_get_ddp_logging_data()``; with the default
``gradient_as_bucket_view=False`` it is held *in addition to* ``param.grad``) and our buckets
(which are ``param.grad``). Peak = largest live bytes during the measured step (after one
warm-up step). Audit (torch 2.13, CPU, 2 ranks): this equals, to the byte for both sides,
(a) the peak of the trace started after wrapping (``_workers_ddp.profile_step``) and (b) the
CPU allocator's own peak (``torch.profiler`` with ``profile_memory=True``, all threads,
around construction and two steps; separate runs, not in this script). So the trace
missed nothing; the reason it was already right after wrapping is that the Reducer bucket is
touched (``mul_out`` into its view) at the first gradient, before the backward peak, and a
storage counts whole. Measured (2 ranks): peak ratio 0.993 = 18,613,212 / 18,745,308;
the difference is PyTorch's extra gradient copy being partly alive at the backward peak
(torch with ``gradient_as_bucket_view=True`` has exactly our peak).
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from shardlab.runtime import launch  # noqa: E402


def peaks(size: str = "bench", bucket_size_mb: float = 25.0, n: int = 8) -> dict:
    """Rank function: peak bytes of one step for each side, built inside both meters."""
    import torch
    from _workers_ddp import DDP
    from shardlab.models import (
        lm_loss,
        make_optimizer,
        rank_slice,
        step_batch,
        tiny_gpt,
        train_step,
    )
    from shardlab.runtime import MemoryTrace, phase
    from torch.nn.parallel import DistributedDataParallel

    torch.set_num_threads(1)
    out = {}
    for impl in ("mine", "torch"):
        with MemoryTrace() as mt:
            model = tiny_gpt("plain", size=size)
            opt = make_optimizer("adamw", model.parameters())
            mt.watch(model, opt)
            if impl == "mine":
                w = DDP(model, bucket_size_mb=bucket_size_mb)
                finish = w.finish_gradient_synchronization
            else:  # the Reducer allocates its flat bucket here, inside the trace
                w, finish = DistributedDataParallel(model, bucket_cap_mb=bucket_size_mb), None
            xy = rank_slice(step_batch(model.config, 0, n))
            train_step(w, opt, xy, finish)  # warm-up: AdamW state (and any bucket rebuild)
            opt.zero_grad(set_to_none=True)
            with phase("measured"):
                lm_loss(w, *xy).backward()
                if finish is not None:
                    finish()
                opt.step()
        tl = mt.timeline()
        s, e = (i for i, name, _ in tl.markers if name == "measured")
        out[impl] = max(tl.total()[s : e + 1])
    return out


def main() -> None:
    mem = launch("benchmark_ddp:peaks", 2, quiet=True)
    res = launch("_workers_ddp:benchmark", 2, quiet=True, timeout=300)
    for m, p in zip(res, mem):
        for impl in ("mine", "torch"):
            m[impl]["after_wrap"] = m[impl]["peak"]  # the workers' trace, started after wrapping
            m[impl]["peak"] = p[impl]
    print(f"N = {res[0]['n_params']} parameters, 2 ranks, gloo, fp32 AdamW")
    print(f"weights equal after the timed steps: {all(m['same_weights'] for m in res)}")
    print(f"{'rank':>4s} {'impl':>8s} {'step ms':>8s} {'peak B':>11s} {'after wrap':>11s}")
    for r, m in enumerate(res):
        for impl in ("mine", "torch"):
            d = m[impl]
            print(
                f"{r:4d} {impl:>8s} {d['step_s'] * 1e3:8.2f} {d['peak']:11,d} {d['after_wrap']:11,d}"
            )
        t = m["mine"]["step_s"] / m["torch"]["step_s"]
        p = m["mine"]["peak"] / m["torch"]["peak"]
        a = m["mine"]["after_wrap"] / m["torch"]["after_wrap"]
        print(f"{r:4d} {'ratio':>8s} {t:8.2f} {p:11.3f} {a:11.3f}")


if __name__ == "__main__":
    main()
