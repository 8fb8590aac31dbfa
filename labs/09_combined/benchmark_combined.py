"""Benchmark: this lab's FSDP x TP vs PyTorch's FSDP2 + DTensor on the same 2x2 mesh.

    python benchmark_combined.py [--steps 10] [--h 128] [--layers 4] [--batch 8]
    python benchmark_combined.py --size 25m [--repeats 3] [--save] [--results-dir D]

Four ranks as ``init_device_mesh("cpu", (2, 2))`` (dp x tp; ours builds the same groups from
``accounting.mesh.Mesh``; ``--ranks`` accepts 4 only: both sides are built on that mesh).
PyTorch: ``parallelize_module`` on the tp sub-mesh (vocabulary-split embedding, column/row-
parallel attention and MLP, column-parallel head gathered to full logits) and ``fully_shard``
of every block and the root on the dp sub-mesh. Ours: lab 06's ``ParallelGPT`` (vocabulary-
parallel loss, logits never gathered) wrapped in lab 04's FSDP on the dp group. Same model,
same data, measured in the same processes: median step time of the slowest rank (forward +
backward + gradient synchronisation + AdamW, the sides interleaved step by step) and the peak
of live tensor bytes of one step (MemoryTrace). Ratios are ours / PyTorch (below 1.0: ours
is faster or smaller). DP x PP is not benchmarked here: lab 05's benchmark compares the
executor with ``torch.distributed.pipelining``, and the data axis adds one all-reduce.

Sizes: ``bench`` (default) h=128, ffn=512, 4 layers (0.8 M parameters); ``25m`` h=512,
ffn=2048, 8 layers (25.3 M parameters: every dp all-gather or reduce-scatter of a block's tp
slice moves 6 MB), 6 timed steps. Sequence 16, vocabulary 64, global batch 8 at both.
``--repeats N`` repeats the launch (per-launch ratios, then median [min-max]); ``--save``
writes ``combined_<size>_4ranks.json`` (:func:`shardlab.benchresults.write_results`).

**Against the limit.** The same launch also times a *compute floor*, interleaved with the two
sides: a third copy of ours (same shards, same batch, same AdamW) stepped inside
:func:`_no_comm`, where every collective lab 04's FSDP and lab 06's layers call is a local
no-op of the right shape: the all-gather of the dp shards writes ``D`` copies of this rank's
shard into the full-size buffer, the reduce-scatter copies this rank's slice, the tp
all-reduces leave their (already cloned) input as it is. So each rank does exactly its
per-rank GEMMs on its tp slice and moves nothing; ``step / floor`` is above 1.0 by what
communication (and, for PyTorch, DTensor's bookkeeping) adds.

The script prints the numbers. What holds on CPU at ``bench``: DTensor's per-operator
dispatch dominates PyTorch's step, so ours is several times faster; the peaks are within a
few per cent of each other. The peak is also measured for ours with
``FSDPConfig(overlap_reduce_scatter=False)`` (``ours-wait``, peak only): lab 04's FSDP keeps
one reduce-scatter in flight during the next block's backward, so its input, one block's
gradient shard-group slice, is alive at the peak, while FSDP2's reduce-scatter blocks on CPU
(benchmark_fsdp.py says what was measured). 25m, 2026-12-04, idle: peak 1.047 overlapped,
0.995 waiting; step 0.660 [0.616-0.680].
"""

from __future__ import annotations

import argparse
import contextlib

import _earlier  # noqa: F401  (labs 04, 05 and 06 by file)
import torch
import torch.distributed as dist
from _cases_combined import FSDP_TP_MESH, TP_MODEL, _dp_slice
from _pytorch_combined import pytorch_backward, pytorch_fsdp_tp_model
from combined import build_axis_groups, fsdp_tp_backward, fsdp_tp_model
from fsdp import FSDPConfig
from shardlab.accounting.mesh import Mesh
from tensor_reference import ModelConfig, SerialGPT, make_batch

# run as a script, Python puts this folder on sys.path; the ranks it launches find these
# modules the same way (the launcher passes its sys.path on)

SIZES = {"bench": dict(h=128, layers=4, steps=10), "25m": dict(h=512, layers=8, steps=6)}


# ------------------------------------------------------------------ rank code
class _Done:
    """The finished ``Work`` an async no-op collective hands back."""

    def wait(self, *_a, **_k) -> bool:
        return True

    def is_completed(self) -> bool:
        return True


@contextlib.contextmanager
def _no_comm():
    """The compute floor: the collectives of lab 04 (``fsdp_units``) and lab 06 (``tensor``)
    as local no-ops of the right shapes, so a step does this rank's computation only."""
    import fsdp_units
    import tensor

    def gather(out, inp, *_, async_op=False, **__):  # (n,) -> (D n,): D copies of our shard
        out.view(-1, inp.numel()).copy_(inp.reshape(1, -1))
        return _Done() if async_op else None

    def scatter(out, inp, *_, async_op=False, **__):  # (D n,) -> (n,): our slice, unsummed
        out.copy_(inp.reshape(-1, out.numel())[0])
        return _Done() if async_op else None

    def reduce(x, *_, async_op=False, **__):  # in place: the input is its own result
        return _Done() if async_op else None

    mods = (fsdp_units, tensor)
    saved = [(m.all_gather_into_tensor, m.reduce_scatter_tensor) for m in mods]
    saved_all_reduce = dist.all_reduce  # tensor.py calls it as dist.all_reduce
    for m in mods:
        m.all_gather_into_tensor, m.reduce_scatter_tensor = gather, scatter
    dist.all_reduce = reduce
    try:
        yield
    finally:
        for m, (g, s) in zip(mods, saved):
            m.all_gather_into_tensor, m.reduce_scatter_tensor = g, s
        dist.all_reduce = saved_all_reduce


def benchmark(steps: int = 10, batch: int = 8, **model_kw) -> dict | None:
    """Median step time (forward, backward, gradient synchronisation, AdamW; the slowest
    rank's) and the peak of live tensor bytes of one step (MemoryTrace): ours vs FSDP2 +
    DTensor on the same 2x2 mesh, model and data; and the compute floor (ours under
    :func:`_no_comm`), ``over_floor`` each side's step over it. ``batch`` is global
    (``batch / dp`` per dp rank)."""
    from shardlab.runtime import MemoryTrace
    from shardlab.testing import interleaved_times

    cfg = ModelConfig(**{**TP_MODEL.__dict__, **model_kw})
    mesh = Mesh(**FSDP_TP_MESH)
    ag = build_axis_groups(mesh)
    idx, tgt = (_dp_slice(z, ag.coords.dp, mesh.dp) for z in make_batch(cfg, batch, seed=11))
    res: dict = {"model": model_kw, "batch": batch, "mesh": FSDP_TP_MESH}
    runs = {}
    for name in ("ours", "pytorch", "floor", "ours-wait"):
        if name == "pytorch":
            model, fn = pytorch_fsdp_tp_model(cfg), pytorch_backward
        else:
            serial = SerialGPT(cfg)
            res["n_params"] = sum(p.numel() for p in serial.parameters())
            # ours-wait: each reduce-scatter waited for at once (peak only; benchmark_fsdp.py)
            wait = FSDPConfig(overlap_reduce_scatter=False) if name == "ours-wait" else None
            model, fn = fsdp_tp_model(serial, ag, wait), fsdp_tp_backward
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

        def step(model=model, opt=opt, fn=fn, floor=name == "floor"):
            with _no_comm() if floor else contextlib.nullcontext():
                fn(model, idx, tgt)
                opt.step()
                opt.zero_grad()

        step()
        step()  # warm-up: AdamW state exists
        if name != "floor":
            with MemoryTrace() as mt:
                mt.watch(model, opt)
                step()
            res[name] = {"peak_bytes": mt.peak}
        if name != "ours-wait":
            runs[name] = step
    res["floor"] = {}
    times = interleaved_times(runs, steps)  # interleaved: other processes' load hits all alike
    medians = torch.tensor([sorted(times[n])[steps // 2] for n in runs], dtype=torch.float64)
    dist.all_reduce(medians, op=dist.ReduceOp.MAX)  # the slowest rank's: it sets the pace
    for name, s in zip(runs, medians.tolist()):
        res[name]["step_s"] = s
    res["ratio_time"] = res["ours"]["step_s"] / res["pytorch"]["step_s"]
    res["ratio_peak"] = res["ours"]["peak_bytes"] / res["pytorch"]["peak_bytes"]
    res["ratio_peak_wait"] = res["ours-wait"]["peak_bytes"] / res["pytorch"]["peak_bytes"]
    res["over_floor"] = {n: res[n]["step_s"] / res["floor"]["step_s"] for n in ("ours", "pytorch")}
    return res if dist.get_rank() == 0 else None


# ------------------------------------------------------------------ launch, print
def _row(res: dict) -> dict:
    """One launch for the results file."""
    return {"ratio": {"step": res["ratio_time"], "peak": res["ratio_peak"],
                      "peak_wait": res["ratio_peak_wait"]},
            "floor": {"ours": res["over_floor"]["ours"], "torch": res["over_floor"]["pytorch"]},
            "seconds": {k: res[k]["step_s"] for k in ("ours", "pytorch", "floor")}}


def main(argv: list[str] | None = None) -> dict:
    from shardlab.benchresults import add_arguments, load_average, write_results
    from shardlab.runtime import launch
    from shardlab.testing import median_range

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", choices=list(SIZES), default="bench")
    ap.add_argument("--ranks", type=int, default=4, help="4 only: the 2x2 (dp x tp) mesh")
    ap.add_argument("--steps", type=int, default=None, help="default 10 (bench), 6 (25m)")
    ap.add_argument("--h", type=int, default=None, help="default 128 (bench), 512 (25m)")
    ap.add_argument("--layers", type=int, default=None, help="default 4 (bench), 8 (25m)")
    ap.add_argument("--batch", type=int, default=8)
    add_arguments(ap)
    a = ap.parse_args(argv)
    if a.ranks != FSDP_TP_MESH["G"]:
        ap.error(f"--ranks {a.ranks}: both sides are built on the 2x2 mesh, 4 ranks")
    size = SIZES[a.size]
    h, layers, steps = a.h or size["h"], a.layers or size["layers"], a.steps or size["steps"]
    load_before, launches, first = load_average(), [], None
    for _ in range(a.repeats):
        res = launch(
            "benchmark_combined:benchmark", a.ranks, steps=steps, batch=a.batch, h=h,
            ffn=4 * h, layers=layers, quiet=True, timeout=900,
        )[0]
        launches.append(_row(res))
        first = first or res
    res = first
    print(f"model {res['model']}, 2x2 mesh (dp x tp), global batch {a.batch}, "
          f"median of {steps} steps")
    print(f"{'':22}{'step ms':>10}{'peak bytes':>14}")
    for name, label in (("ours", "ours (lab 04 x 06)"), ("pytorch", "FSDP2 + DTensor")):
        r = res[name]
        print(f"{label:22}{r['step_s'] * 1e3:10.2f}{r['peak_bytes']:14,d}")
    print(f"{'compute floor':22}{res['floor']['step_s'] * 1e3:10.2f}  (collectives as no-ops)")
    print(f"ratio step time (ours / PyTorch): {res['ratio_time']:.2f}")
    print(f"ratio peak bytes (ours / PyTorch): {res['ratio_peak']:.3f}; ours waiting for each "
          f"reduce-scatter (overlap_reduce_scatter=False): {res['ratio_peak_wait']:.3f}")
    more = f", median [min-max] of {a.repeats} launches" if a.repeats > 1 else ""
    if a.repeats > 1:
        each = " ".join(f"{x['ratio']['step']:.3f}" for x in launches)
        print(f"step ratio (ours / PyTorch) per launch: {each}; "
              f"median {median_range(x['ratio']['step'] for x in launches)}")
    print(f"step time / compute floor{more}: "
          f"ours {median_range(x['floor']['ours'] for x in launches)}, "
          f"PyTorch {median_range(x['floor']['torch'] for x in launches)}")
    if a.save:
        path = write_results(
            f"combined_{a.size}_{a.ranks}ranks", launches,
            benchmark="lab 09 FSDP x TP (labs 04 x 06) vs FSDP2 + DTensor on a 2x2 mesh "
                      "(gloo, CPU)",
            config={"size": a.size, "ranks": a.ranks, "mesh": FSDP_TP_MESH,
                    "n_params": res["n_params"], "h": h, "ffn": 4 * h, "layers": layers,
                    "seq": TP_MODEL.seq, "vocab": TP_MODEL.vocab, "batch": a.batch,
                    "steps": steps, "warmup": 2},
            load_before=load_before, directory=a.results_dir,
        )
        print(f"results written to {path.name}")
    return res


if __name__ == "__main__":
    main()
