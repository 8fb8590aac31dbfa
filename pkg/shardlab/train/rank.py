"""What every rank of ``shardlab train`` runs: :func:`run_rank` (the same under the launcher and
under ``torchrun``).

1. :func:`runner_class` loads by path (:func:`~shardlab.modload.load_file`) the modules
   the layout's ``[train]`` table lists, each under its lab module name (a student's file
   chosen for one of them, whatever its name, in its place), then the lab's runner module,
   so the runner's plain ``import fsdp`` finds the run's choice; nothing edits ``sys.path``;
2. the layout's :class:`~shardlab.train.runner.Runner` builds the model around the lab's
   implementation;
3. step 0 runs inside a ``CommTrace`` (bytes sent, per mesh axis), step 1 inside a
   ``MemoryTrace`` (peak live bytes on CPU; on CUDA ``torch.cuda.max_memory_allocated`` of
   that step), every later step untraced; each is timed after a barrier (so the ranks start
   it together) and, on rank 0, reported to the progress bar; with ``--profile DIR`` a
   :class:`~shardlab.runtime.profile.StepProfiler` records the last steps (never 0 or 1);
4. the rank returns its row: measured and predicted bytes and peak, step times, losses.
"""

from __future__ import annotations

import time
from pathlib import Path

from shardlab.runtime.profile import StepProfiler
from shardlab.train.progress import StepProgress
from shardlab.train.spec import LAYOUTS, TrainSpec


def runner_class(spec: TrainSpec):
    """The layout's runner class, its lab's modules loaded by path in the declared order.

    A module is loaded again when its file changed since the last run in this process, and
    then so is every module after it (they bound names of the old one)."""
    from shardlab.modload import is_loaded, load_file

    lay = LAYOUTS[spec.layout]
    lab = Path(spec.labs_dir) / lay.lab
    fresh = False
    for rel in lay.load:
        fname = Path(rel).name
        path = Path(spec.modules.get(fname, lab / rel)).resolve()
        fresh = fresh or not is_loaded(path, Path(fname).stem)
        load_file(path, Path(fname).stem, fresh=fresh)
    file, cls = lay.runner
    mod = load_file(lab / file, fresh=fresh)
    return getattr(mod, cls)


def run_rank(spec: TrainSpec, progress_path: str | None = None, stream=None) -> dict:
    """Train ``spec.steps`` steps on this rank (the process group exists); return its row.

    Rank 0 reports each step to ``progress_path`` (a file the launching process reads) or
    draws it on ``stream`` (under ``torchrun``)."""
    import torch
    import torch.distributed as dist

    from shardlab.runtime import device

    runner_cls = runner_class(spec)
    if spec.threads:
        torch.set_num_threads(spec.threads)
    dev = device()
    cuda = dev.type == "cuda"
    runner = runner_cls(spec, dev)
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
    prof = StepProfiler(spec.profile, rank, spec.steps, cuda, skip=2)  # no-op without --profile
    with prof:
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
            prof.step()  # the profiler's schedule records only the last steps
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
    if prof.path is not None:
        row["profile_trace"] = str(prof.path)
    if hasattr(runner, "ag"):
        row["coords"] = runner.ag.coords.as_dict()
    return row
