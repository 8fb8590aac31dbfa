"""Record a ``torch.profiler`` trace of a few steps of a real run, one file per rank.

:class:`StepProfiler` wraps a training loop: the caller calls :meth:`StepProfiler.step` once
at the end of every step, and the profiler's schedule (``wait``, ``warmup``, ``active``)
records only the ``active`` steps — by default the last ``active`` steps of the loop, so the
first steps (which ``shardlab train`` traces for bytes and memory) run unprofiled. Each
recorded step is a ``ProfilerStep#N`` event; the collectives appear as gloo's
``gloo:all_reduce`` / ``gloo:all_gather`` ... and the c10d ``record_param_comms`` events
(nccl on CUDA, together with the GPU kernels). The trace is a Chrome / Perfetto JSON file,
``DIR/rank<R>.pt.trace.json``: open it at https://ui.perfetto.dev or ``chrome://tracing``,
or read it with :mod:`shardlab.runtime.trace_timeline`.

Activities: CPU always; CUDA too when the rank computes on a GPU. The recorded steps' times
include the profiler's own overhead (a few microseconds per op).

:func:`check_profile_dir` is the validation ``shardlab train --profile DIR`` runs before any
rank starts: one sentence when DIR is a file, cannot be created, or is not writable, or when
there are too few steps to record one after the warm-up.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

WARMUP = 1  # steps the profiler runs but discards (its own start-up cost lands there)
ACTIVE = 3  # steps recorded at most


def trace_path(folder: str | os.PathLike, rank: int) -> Path:
    """Where rank ``rank``'s trace is written."""
    return Path(folder) / f"rank{rank}.pt.trace.json"


def check_profile_dir(folder: str | os.PathLike, steps: int, skip: int = 0) -> str:
    """``folder`` as an absolute path, created if missing, after checking a file can be
    written there; and that ``steps`` leave, after ``skip`` untouched steps and one warm-up
    step, at least one step to record. Otherwise one ``ValueError`` sentence."""
    need = skip + WARMUP + 1
    if steps < need:
        raise ValueError(
            f"--profile needs at least {need} steps ({skip} traced for bytes and memory, "
            f"{WARMUP} profiler warm-up, 1 recorded); steps={steps}."
        )
    p = Path(folder).expanduser()
    if p.exists() and not p.is_dir():
        raise ValueError(f"--profile {str(folder)!r} is a file, not a folder for the traces.")
    try:
        p.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=p, prefix=".shardlab-probe-"):
            pass
    except OSError as exc:
        raise ValueError(
            f"--profile {str(folder)!r} is not a folder this process can write to "
            f"({exc.strerror or exc})."
        ) from None
    return str(p.resolve())


def profile_schedule(steps: int, skip: int = 0, active: int = ACTIVE) -> tuple[int, int, int]:
    """``(wait, warmup, active)`` recording the last ``min(active, steps - skip - WARMUP)``
    steps of a loop of ``steps`` steps (``wait`` covers the rest)."""
    act = max(1, min(active, steps - skip - WARMUP))
    return steps - WARMUP - act, WARMUP, act


class StepProfiler:
    """``torch.profiler.profile`` over a loop of ``steps`` steps, writing
    :func:`trace_path` ``(folder, rank)`` when the recorded steps end. ``folder=None``:
    a do-nothing context (the loop needs no ``if``)."""

    def __init__(self, folder: str | None, rank: int, steps: int, cuda: bool = False,
                 skip: int = 0, active: int = ACTIVE) -> None:
        self.folder, self.rank, self.steps, self.cuda = folder, rank, steps, cuda
        self.wait, self.warmup, self.active = profile_schedule(steps, skip, active)
        self.path: Path | None = None
        self._prof = None

    def __enter__(self) -> StepProfiler:
        if self.folder is None:
            return self
        from torch.profiler import ProfilerActivity, profile, schedule

        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.cuda else [])
        self._prof = profile(
            activities=acts,
            schedule=schedule(wait=self.wait, warmup=self.warmup, active=self.active, repeat=1),
            on_trace_ready=self._write,
            record_shapes=False,
            with_stack=False,
        )
        self._prof.__enter__()
        return self

    def _write(self, prof) -> None:
        path = trace_path(self.folder, self.rank)
        prof.export_chrome_trace(str(path))
        self.path = path

    def step(self) -> None:
        """Call at the end of every step of the loop."""
        if self._prof is not None:
            self._prof.step()

    def __exit__(self, *exc) -> None:
        if self._prof is not None:
            self._prof.__exit__(*exc)
            self._prof = None
