"""What every rank of ``shardlab train`` runs: :func:`run_rank` (the same under the launcher and
under ``torchrun``).

1. :func:`prepare_imports` puts the chosen modules first on ``sys.path`` (a student's folder,
   then the lab folder; a student's file of another name is loaded under the lab's module
   name), so the lab's worker helpers import the student's code when it was chosen;
2. the layout's :class:`~shardlab.train._runner.Runner` builds the model around the lab's
   implementation;
3. step 0 runs inside a ``CommTrace`` (bytes sent, per mesh axis), step 1 inside a
   ``MemoryTrace`` (peak live bytes on CPU; on CUDA ``torch.cuda.max_memory_allocated`` of
   that step), every later step untraced; each is timed after a barrier (so the ranks start
   it together) and, on rank 0, reported to the progress bar;
4. the rank returns its row: measured and predicted bytes and peak, step times, losses.
"""

from __future__ import annotations

import importlib.util
import sys
import time
from pathlib import Path

from shardlab.train.progress import StepProgress
from shardlab.train.spec import EXTRA_LABS, LAYOUTS, TrainSpec


def prepare_imports(spec: TrainSpec) -> None:
    """Make ``import ddp`` (etc.) find the modules ``spec`` chose, before the lab's own."""
    lay = LAYOUTS[spec.layout]
    labs = Path(spec.labs_dir)
    lab_dirs = [labs / lay.lab] + [labs / x for x in EXTRA_LABS.get(spec.layout, ())]
    chosen = [str(Path(p).parent) for p in spec.modules.values()]
    for folder in reversed(list(dict.fromkeys([*chosen, *map(str, lab_dirs)]))):
        if folder in sys.path:
            sys.path.remove(folder)
        sys.path.insert(0, folder)
    for fname, path in spec.modules.items():
        name = Path(fname).stem
        if Path(path).stem != name and name not in sys.modules:  # --module my_ddp.py
            mspec = importlib.util.spec_from_file_location(name, path)
            mod = importlib.util.module_from_spec(mspec)
            sys.modules[name] = mod
            mspec.loader.exec_module(mod)


def _runner_class(layout: str):
    from shardlab.train import layouts_dp, layouts_mp

    return {
        "ddp": layouts_dp.DDPRunner, "zero1": layouts_dp.Zero1Runner,
        "zero2": layouts_dp.Zero2Runner, "fsdp": layouts_dp.FSDPRunner,
        "tp": layouts_mp.TPRunner, "pp": layouts_mp.PPRunner,
        "fsdp+tp": layouts_mp.FSDPTPRunner,
    }[layout]  # fmt: skip


def run_rank(spec: TrainSpec, progress_path: str | None = None, stream=None) -> dict:
    """Train ``spec.steps`` steps on this rank (the process group exists); return its row.

    Rank 0 reports each step to ``progress_path`` (a file the launching process reads) or
    draws it on ``stream`` (under ``torchrun``)."""
    import torch
    import torch.distributed as dist

    from shardlab.runtime import device

    prepare_imports(spec)
    if spec.threads:
        torch.set_num_threads(spec.threads)
    dev = device()
    cuda = dev.type == "cuda"
    runner = _runner_class(spec.layout)(spec, dev)
    elsewhere = sorted({str(p.device) for p in runner.params()} - {str(dev)})
    if elsewhere:  # e.g. a module that allocates its flat buffers with torch.zeros(n) on CUDA
        raise RuntimeError(
            f"layout {spec.layout}: the module(s) {', '.join(spec.modules.values())} keep "
            f"parameters on {', '.join(elsewhere)} while this rank computes on {dev}; they "
            "must allocate on the parameters' device to run there."
        )
    rank = dist.get_rank()
    bar = StepProgress(spec.steps, path=progress_path, stream=stream) if rank == 0 else None
    times, losses = [], []
    sent = tl = extra = cuda_peak = None
    for i in range(spec.steps):
        dist.barrier()  # every rank starts the step together (outside the traces)
        t0 = time.perf_counter()
        if i == 0:
            tr = runner.comm_trace()
            with tr:
                loss = runner.step(i)
            sent = runner.sent(tr)
        elif i == 1:
            if cuda:
                torch.cuda.reset_peak_memory_stats(dev)
            loss, tl, extra = runner.memory_step(i)
            if cuda:
                cuda_peak = torch.cuda.max_memory_allocated(dev)
        else:
            loss = runner.step(i)
        if cuda:
            torch.cuda.synchronize(dev)
        times.append(time.perf_counter() - t0)
        losses.append(None if loss is None else float(loss))
        if bar is not None:
            bar.update(i + 1, losses[-1], times[-1])
    if bar is not None:
        bar.close()
    pred = runner.predicted_peak(tl, extra)
    row = {
        "rank": rank,
        "device": str(dev),
        "backend": dist.get_backend(),
        "bytes_measured": sent,
        "bytes_predicted": runner.predicted_bytes(),
        "peak_measured": cuda_peak if cuda else tl.peak,
        "peak_source": "torch.cuda.max_memory_allocated" if cuda else "MemoryTrace",
        "peak_predicted": pred.total,
        "peak_terms": {k: v for k, v in pred.terms.items() if v},
        "peak_phase": pred.phase_of_peak,
        "peak_measured_breakdown": {k: v for k, v in tl.peak_breakdown.items() if v},
        "step_times": times,
        "losses": losses,
        "params_held": sum(p.numel() for p in runner.params()),
        "threads": torch.get_num_threads(),
    }
    if hasattr(runner, "ag"):
        row["coords"] = runner.ag.coords.as_dict()
    return row
