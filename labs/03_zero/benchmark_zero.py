"""From-scratch ZeRO-1 / ZeRO-2 vs PyTorch DDP + ZeroRedundancyOptimizer, one 2-rank launch.

Prints the median step time and the traced peak bytes per rank, and the ratios
from scratch / PyTorch (goal: <= 1.0). Run: ``python labs/03_zero/benchmark_zero.py``.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from shardlab.dist import launch  # noqa: E402


def main() -> None:
    res = launch("_workers_zero:benchmark", 2, quiet=True, timeout=300)
    for r, m in enumerate(res):
        ref = m["torch"]
        print(f"rank {r}: PyTorch step {ref['step_s'] * 1e3:.2f} ms, peak {ref['peak']} B")
        for impl in ("zero1", "zero2"):
            t = m[impl]["step_s"] / ref["step_s"]
            p = m[impl]["peak"] / ref["peak"]
            print(
                f"  {impl}: step {m[impl]['step_s'] * 1e3:.2f} ms (ratio {t:.2f}),"
                f" peak {m[impl]['peak']} B (ratio {p:.3f})"
            )


if __name__ == "__main__":
    main()
