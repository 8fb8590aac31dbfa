"""``shardlab train``: start the ranks (launcher or ``torchrun``), collect the rows, report.

* Laptop / one machine: :func:`run` starts ``spec.ranks`` processes with
  :func:`shardlab.runtime.launch` (gloo on CPU; nccl when CUDA has a device per rank), draws
  rank 0's progress from a file while they run, and prints the report.
* Under ``torchrun`` (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` and ``MASTER_ADDR`` set; also in
  the Slurm template ``shardlab/slurm/train.sbatch``): every process joins the process group
  torchrun describes (:func:`shardlab.runtime.init_from_env`: nccl on CUDA with
  ``cuda:LOCAL_RANK``, gloo on CPU), runs its rank, and rank 0 gathers the rows and prints.
"""

from __future__ import annotations

import json
import os
import sys
import threading

from shardlab.train.spec import CPU_PEAK_TFLOPS, CUDA_PEAK_TFLOPS, TrainSpec

TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR")


def under_torchrun() -> bool:
    """True when torchrun (or Slurm through it) already describes this process's rank."""
    return all(k in os.environ for k in TORCHRUN_VARS)


def _peak(spec: TrainSpec, device: str) -> tuple[float, str]:
    """The peak FLOP/s per rank MFU is measured against, and where it came from."""
    if spec.peak_tflops is not None:
        return spec.peak_tflops, "--peak-tflops"
    if device.startswith("cuda"):
        return CUDA_PEAK_TFLOPS, "default for CUDA: fp32 without tensor cores; set --peak-tflops"
    return CPU_PEAK_TFLOPS, "default for CPU: one core's fp32 FMA rate; set --peak-tflops"


def _print(summary: dict, as_json: bool) -> None:
    from shardlab.train.report import format_text

    if as_json:
        print(json.dumps(summary, indent=2))
    else:
        sys.stdout.write(format_text(summary))
    sys.stdout.flush()


def _say_traces(spec: TrainSpec, rows: list[dict]) -> None:
    """One line naming the profiler traces (``--profile``), on stderr beside the progress."""
    paths = [r["profile_trace"] for r in rows if r and r.get("profile_trace")]
    if spec.profile is not None:
        print(f"shardlab train: {len(paths)} profiler trace(s) in {spec.profile} (open them at "
              "https://ui.perfetto.dev or chrome://tracing)", file=sys.stderr)


def _stop_on_sigterm() -> None:
    """Turn SIGTERM into an ordinary exit, so the launcher's cleanup (stop the ranks, remove
    the scratch files) runs as it does on Ctrl-C."""
    import signal

    def _exit(signum, frame):
        raise SystemExit(128 + signum)

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _exit)


def run(spec: TrainSpec, as_json: bool = False, timeout: float = 900.0) -> int:
    """Run ``spec`` and print the report; returns the exit status.

    Ctrl-C stops the ranks and prints one sentence (status 130); a timeout prints the stacks
    every rank was in; a rank's failure prints its traceback.
    """
    if under_torchrun():
        return _run_torchrun(spec, as_json)
    from shardlab.runtime import LaunchError, LaunchTimeout, launch
    from shardlab.runtime._scratch import make_progress_file
    from shardlab.train.progress import follow
    from shardlab.train.report import summarize

    _stop_on_sigterm()
    path = make_progress_file()  # shardlab-train-<pid>-*.progress: swept once we are gone
    stop = threading.Event()
    drawer = threading.Thread(target=follow, args=(path, stop), daemon=True)
    drawer.start()
    try:
        rows = launch("shardlab.train.rank:run_rank", spec.ranks, spec, path, quiet=True,
                      timeout=timeout)
    except KeyboardInterrupt:
        stop.set()
        drawer.join()
        print("\nshardlab train: interrupted (Ctrl-C); every rank was stopped.", file=sys.stderr)
        return 130
    except LaunchError as exc:
        stop.set()
        drawer.join()
        lines = str(exc).splitlines()
        # a timeout's message is the sentence and then every rank's stack; keep them all
        shown = lines if isinstance(exc, LaunchTimeout) else lines[:1]
        print(f"shardlab train: {chr(10).join(shown)}", file=sys.stderr)
        tb = getattr(exc, "remote_traceback", "") or ""
        if tb:
            print(tb.rstrip(), file=sys.stderr)
        return 1
    finally:
        stop.set()
        drawer.join()
        os.unlink(path)
    how = "shardlab.runtime.launch"
    peak, source = _peak(spec, rows[0]["device"])
    _print(summarize(spec, rows, peak, how, source), as_json)
    _say_traces(spec, rows)
    return 0


def _run_torchrun(spec: TrainSpec, as_json: bool) -> int:
    import torch.distributed as dist

    from shardlab.runtime import init_from_env
    from shardlab.train.rank import run_rank
    from shardlab.train.report import summarize

    init_from_env()  # nccl + cuda:LOCAL_RANK when CUDA has the devices, else gloo
    try:
        rank, world = dist.get_rank(), dist.get_world_size()
        row = run_rank(spec, stream=sys.stderr if rank == 0 else None)
        rows = [None] * world
        dist.all_gather_object(rows, row)
        if rank == 0:
            how = f"torchrun ({os.environ.get('LOCAL_WORLD_SIZE', '?')} per node)"
            peak, source = _peak(spec, rows[0]["device"])
            _print(summarize(spec, rows, peak, how, source), as_json)
            _say_traces(spec, rows)
    finally:
        dist.destroy_process_group()
    return 0
