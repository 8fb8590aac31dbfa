"""Benchmark: this lab's FSDP x TP vs PyTorch's FSDP2 + DTensor on the same 2x2 mesh.

    python benchmark_combined.py [--steps 10] [--h 128] [--layers 4] [--batch 8]

Four ranks as ``init_device_mesh("cpu", (2, 2))`` (dp x tp; ours builds the same groups from
``accounting.mesh.Mesh``). PyTorch: ``parallelize_module`` on the tp sub-mesh (vocabulary-
split embedding, column/row-parallel attention and MLP, column-parallel head gathered to
full logits) and ``fully_shard`` of every block and the root on the dp sub-mesh. Ours: lab
06's ``ParallelGPT`` (vocabulary-parallel loss, logits never gathered) wrapped in lab 04's
FSDP on the dp group. Same model, same data, measured in the same processes: median step
time (forward + backward + gradient synchronisation + AdamW, the two interleaved step by
step) and the peak of live tensor bytes of one step (MemoryTrace). Ratios are ours /
PyTorch (below 1.0: ours is faster or smaller). DP x PP is not benchmarked here: lab 05's
benchmark compares the executor with ``torch.distributed.pipelining``, and the data axis
adds one all-reduce.

The script prints the numbers. What holds on CPU at these sizes (the defaults: h=128,
ffn=512, 4 layers, global batch 8): DTensor's per-operator dispatch dominates PyTorch's step,
so ours is several times faster; the peaks are within a few per cent of each other.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def main(argv: list[str] | None = None) -> dict:
    from shardlab.runtime import launch

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--h", type=int, default=128)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--batch", type=int, default=8)
    a = ap.parse_args(argv)
    res = launch(
        "_pytorch_combined:benchmark", 4, steps=a.steps, batch=a.batch, h=a.h,
        ffn=4 * a.h, layers=a.layers, quiet=True, timeout=600,
    )[0]
    print(f"model {res['model']}, 2x2 mesh (dp x tp), global batch {a.batch}, "
          f"median of {a.steps} steps")
    print(f"{'':22}{'step ms':>10}{'peak bytes':>14}")
    for name, label in (("ours", "ours (lab 04 x 06)"), ("pytorch", "FSDP2 + DTensor")):
        r = res[name]
        print(f"{label:22}{r['step_s'] * 1e3:10.2f}{r['peak_bytes']:14,d}")
    print(f"ratio step time (ours / PyTorch): {res['ratio_time']:.2f}")
    print(f"ratio peak bytes (ours / PyTorch): {res['ratio_peak']:.3f}")
    return res


if __name__ == "__main__":
    main()
