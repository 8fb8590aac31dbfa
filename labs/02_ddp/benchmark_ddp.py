"""From-scratch DDP vs torch.nn.parallel.DistributedDataParallel, one 2-rank launch on CPU.

Same model (the package's GPT, ``bench`` size in ``_workers_ddp.CONFIGS``), same data, same
25 MB buckets, AdamW. Step time: median over 20 steps after 3 warm-up steps, the two
implementations alternating step by step so both see the same machine noise. Peak: traced
by MemoryTrace over one step. Prints a table per rank and the ratios from scratch / PyTorch
(goal: <= 1.0). Run: ``python labs/02_ddp/benchmark_ddp.py``.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from shardlab.dist import launch  # noqa: E402


def main() -> None:
    res = launch("_workers_ddp:benchmark", 2, quiet=True, timeout=300)
    print(f"N = {res[0]['n_params']} parameters, 2 ranks, gloo, fp32 AdamW")
    print(f"weights equal after the timed steps: {all(m['same_weights'] for m in res)}")
    print(f"{'rank':>4s} {'impl':>8s} {'step ms':>8s} {'peak KiB':>9s}")
    for r, m in enumerate(res):
        for impl in ("mine", "torch"):
            print(
                f"{r:4d} {impl:>8s} {m[impl]['step_s'] * 1e3:8.2f} {m[impl]['peak'] / 2**10:9.1f}"
            )
        t = m["mine"]["step_s"] / m["torch"]["step_s"]
        p = m["mine"]["peak"] / m["torch"]["peak"]
        print(f"{r:4d} {'ratio':>8s} {t:8.2f} {p:9.3f}")


if __name__ == "__main__":
    main()
