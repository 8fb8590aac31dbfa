"""Benchmark: this lab's pipeline executor vs ``torch.distributed.pipelining``, in one launch.

    python benchmark_pipeline.py [--ranks 2] [--steps 5] [--microbatches 8]

Both sides run the same ``split_stages`` of the same GPT on the same batch in the same
processes: ours executes ``accounting.pipeline.schedule(kind, p, m, v)``, PyTorch runs
``PipelineStage`` with ``ScheduleGPipe`` / ``Schedule1F1B`` / ``ScheduleInterleaved1F1B``
(v = 2) / ``ScheduleInterleavedZeroBubble`` (v = 2: PyTorch's zero-bubble schedule is the
interleaved one, ours ZB-H1 with v = 1). Printed: the loss and gradient difference (PyTorch
scales the summed gradient by 1/m at the end, we scale each microbatch's loss; seen
bitwise equal on 2 ranks), the median step time (forward + backward of m microbatches, no
optimizer), the peak of live tensor bytes of one step (``MemoryTrace`` with parameters
watched, rank 0), and the ratios ours / PyTorch (below 1.0: ours is faster or smaller).
Each rank uses one intra-op thread (2 ranks on 2 cores).
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

KINDS = ("gpipe", "1f1b", "interleaved", "zb-h1")


def main(argv: list[str] | None = None) -> list[dict]:
    from shardlab.runtime import launch

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--microbatches", type=int, default=8)
    a = ap.parse_args(argv)
    rows = launch(
        "_workers_pipeline:benchmark_all", a.ranks, KINDS, m=a.microbatches, steps=a.steps,
        quiet=True, timeout=600,
    )[0]  # fmt: skip
    print(f"{a.ranks} ranks, m = {a.microbatches}, median of {a.steps} steps (model size 'bench')")
    print(
        f"{'ours':12}{'PyTorch':32}{'ours ms':>9}{'torch ms':>10}{'time ratio':>11}"
        f"{'peak ratio':>11}{'|d loss|':>10}{'|d grad|':>10}"
    )
    for r in rows:
        print(
            f"{r['kind']:12}{r['torch_schedule'] + ' (v=' + str(r['v_torch']) + ')':32}"
            f"{r['ours_s'] * 1e3:9.1f}{r['torch_s'] * 1e3:10.1f}"
            f"{r['ours_s'] / r['torch_s']:11.2f}{r['ours_peak'] / r['torch_peak']:11.3f}"
            f"{r['loss_diff']:10.1e}{r['grad_max_abs_diff']:10.1e}"
        )
    return rows


if __name__ == "__main__":
    main()
