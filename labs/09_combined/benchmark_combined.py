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

import _earlier  # noqa: F401  (labs 04, 05 and 06 by file)
import torch
import torch.distributed as dist
from _cases_combined import FSDP_TP_MESH, TP_MODEL, _dp_slice
from _pytorch_combined import pytorch_backward, pytorch_fsdp_tp_model
from combined import build_axis_groups, fsdp_tp_backward, fsdp_tp_model
from shardlab.accounting.mesh import Mesh
from tensor_reference import ModelConfig, SerialGPT, make_batch

# run as a script, Python puts this folder on sys.path; the ranks it launches find these
# modules the same way (the launcher passes its sys.path on)


# ------------------------------------------------------------------ rank code
def benchmark(steps: int = 10, batch: int = 8, **model_kw) -> dict | None:
    """Median step time (forward, backward, gradient synchronisation, AdamW) and the peak of
    live tensor bytes of one step (MemoryTrace): ours vs FSDP2 + DTensor on the same 2x2 mesh,
    model and data. ``batch`` is global (``batch / dp`` per dp rank)."""
    from shardlab.runtime import MemoryTrace
    from shardlab.testing import interleaved_times

    cfg = ModelConfig(**{**TP_MODEL.__dict__, **model_kw})
    mesh = Mesh(**FSDP_TP_MESH)
    ag = build_axis_groups(mesh)
    idx, tgt = (_dp_slice(z, ag.coords.dp, mesh.dp) for z in make_batch(cfg, batch, seed=11))
    res: dict = {"model": model_kw, "batch": batch, "mesh": FSDP_TP_MESH}
    runs = {}
    for name in ("ours", "pytorch"):
        if name == "ours":
            model = fsdp_tp_model(SerialGPT(cfg), ag)
            fn = fsdp_tp_backward
        else:
            model = pytorch_fsdp_tp_model(cfg)
            fn = pytorch_backward
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

        def step(model=model, opt=opt, fn=fn):
            fn(model, idx, tgt)
            opt.step()
            opt.zero_grad()

        step()
        step()  # warm-up: AdamW state exists
        with MemoryTrace() as mt:
            mt.watch(model, opt)
            step()
        res[name] = {"peak_bytes": mt.peak}
        runs[name] = step
    times = interleaved_times(runs, steps)  # interleaved: other processes' load hits both alike
    for name, ts in times.items():
        res[name]["step_s"] = sorted(ts)[len(ts) // 2]
    res["ratio_time"] = res["ours"]["step_s"] / res["pytorch"]["step_s"]
    res["ratio_peak"] = res["ours"]["peak_bytes"] / res["pytorch"]["peak_bytes"]
    return res if dist.get_rank() == 0 else None


# ------------------------------------------------------------------ launch, print


def main(argv: list[str] | None = None) -> dict:
    from shardlab.runtime import launch

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--h", type=int, default=128)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--batch", type=int, default=8)
    a = ap.parse_args(argv)
    res = launch(
        "benchmark_combined:benchmark", 4, steps=a.steps, batch=a.batch, h=a.h,
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
