"""From-scratch ZeRO-1 / ZeRO-2 vs PyTorch DDP + ZeroRedundancyOptimizer, one 2-rank launch.

Same model (the package's GPT, ``bench`` size in ``shardlab.models.SIZES``), same data,
1 MB buckets (about 4 for this model; one 25 MB bucket would hold every gradient at once and
undo ZeRO-2's saving), AdamW. Step time: median over 20 steps after 3 warm-up steps, the three
implementations alternating step by step. Peak: traced by MemoryTrace over one step.
Prints a table per rank with the ratios from scratch / PyTorch (goal: <= 1.0).
Run: ``python labs/03_zero/benchmark_zero.py``.

What the peak counts (audit, torch 2.13, CPU, 2 ranks). MemoryTrace counts every storage an
operator touches on the rank's main thread. PyTorch side: DDP's C++ Reducer bucket (made at
wrap time, before the trace; 3.45 MB = all gradients, held besides ``param.grad``) and
ZeroRedundancyOptimizer's state are counted in full: starting the trace before building gives
the same step peak to the byte (15,293,276 B), and so does the CPU allocator's own count
(``torch.profiler``, ``profile_memory=True``, all threads, separate runs). From-scratch side:
flat buffers are tagged; but gloo's worker threads allocate temporaries for
``reduce_scatter_tensor``/``all_gather_into_tensor`` that MemoryTrace does not see (PyTorch's
side only all-reduces and broadcasts in place). The allocator count was 0-2.1 MB higher than
the trace for ZeRO-1/2, depending on timing: ZeRO-1 15.16-17.26 MB (ratio 0.99-1.13),
ZeRO-2 14.76-16.35 MB (0.97-1.07), against the trace's 0.991 and 0.939. The printed ratios
are the trace's, so they may flatter ZeRO-1/2 by up to about 0.13.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from shardlab.runtime import launch  # noqa: E402


def main() -> None:
    res = launch("_workers_zero:benchmark", 2, quiet=True, timeout=300)
    print(f"N = {res[0]['n_params']} parameters, 2 ranks, gloo, fp32 AdamW")
    diff = max(d for m in res for d in m["max_diff"].values())
    print(f"largest |weight - PyTorch's| after the timed steps: {diff:.1e}")
    print(f"{'rank':>4s} {'impl':>6s} {'step ms':>8s} {'ratio':>6s} {'peak KiB':>9s} {'ratio':>6s}")
    for r, m in enumerate(res):
        ref = m["torch"]
        for impl in ("torch", "zero1", "zero2"):
            t = m[impl]["step_s"] / ref["step_s"]
            p = m[impl]["peak"] / ref["peak"]
            print(
                f"{r:4d} {impl:>6s} {m[impl]['step_s'] * 1e3:8.2f} {t:6.2f}"
                f" {m[impl]['peak'] / 2**10:9.1f} {p:6.3f}"
            )


if __name__ == "__main__":
    main()
