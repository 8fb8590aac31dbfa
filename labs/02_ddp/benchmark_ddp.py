"""From-scratch DDP vs torch.nn.parallel.DistributedDataParallel, one 2-rank launch on CPU.

Prints the median step time and the traced peak bytes per rank of both, and the ratios
from scratch / PyTorch (goal: <= 1.0). Run: ``python labs/02_ddp/benchmark_ddp.py``.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from shardlab.dist import launch  # noqa: E402


def main() -> None:
    res = launch("_workers_ddp:benchmark", 2, quiet=True, timeout=300)
    for r, m in enumerate(res):
        t = m["mine"]["step_s"] / m["torch"]["step_s"]
        p = m["mine"]["peak"] / m["torch"]["peak"]
        print(
            f"rank {r}: step {m['mine']['step_s'] * 1e3:.2f} ms vs {m['torch']['step_s'] * 1e3:.2f} ms"
            f" (ratio {t:.2f}); peak {m['mine']['peak']} B vs {m['torch']['peak']} B (ratio {p:.3f})"
        )


if __name__ == "__main__":
    main()
