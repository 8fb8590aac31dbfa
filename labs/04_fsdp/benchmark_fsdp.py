"""Benchmark: this lab's FSDP vs PyTorch FSDP2 (``fully_shard``) in one launch.

    python benchmark_fsdp.py [--ranks 2] [--steps 10] [--d-model 64] [--layers 4]

Both wrap one unit per block plus the root, train the same model on the same data, and are
measured in the same processes: median step time (forward + backward + gradient
synchronisation + AdamW) and the peak of live tensor bytes of one step (MemoryTrace).
Ratios are from scratch / PyTorch (below 1.0: ours is faster or smaller).
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def main(argv: list[str] | None = None) -> dict:
    from shardlab.dist import launch

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--d-model", type=int, default=64)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--batch", type=int, default=8)
    a = ap.parse_args(argv)
    res = launch(
        "_workers_fsdp:benchmark", a.ranks, steps=a.steps, batch=a.batch,
        d_model=a.d_model, n_layer=a.layers, quiet=True,
    )[0]  # fmt: skip
    print(f"model {res['model']}, {a.ranks} ranks, batch {a.batch}, median of {a.steps} steps")
    print(f"{'':8}{'step ms':>10}{'peak bytes':>14}")
    for name in ("ours", "fsdp2"):
        r = res[name]
        print(f"{name:8}{r['step_s'] * 1e3:10.2f}{r['peak_bytes']:14,d}")
    print(f"ratio step time (ours / FSDP2): {res['ratio_time']:.2f}")
    print(f"ratio peak bytes (ours / FSDP2): {res['ratio_peak']:.3f}")
    return res


if __name__ == "__main__":
    main()
