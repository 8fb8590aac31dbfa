"""What the labs' tests, rank harnesses and benchmarks share: comparing, timing, repeating.

* :func:`ulps` -- the largest distance of two fp32 tensors in units in the last place (0:
  equal to the bit), the measure of "equal to one process" where summation orders differ.
* :func:`stub_or_raise` -- one case of a rank harness: an unfinished function
  (``NotImplementedError``) is reported as text, any other error ends the run
  (:mod:`shardlab.runtime.cases` says why).
* :func:`interleaved_times` -- seconds of every step of several implementations, alternating
  step by step after a barrier, so that load from other processes hits them alike;
  :func:`timed_steps` -- seconds of training steps of one model.
* :func:`steady_malloc` -- keep freed memory in glibc's heap between steps (the CPU
  counterpart of CUDA's caching allocator), so that timed steps do not pay page faults.
* :func:`compare_launches` and :func:`median_range` -- the repeated launches of a benchmark
  against PyTorch's own implementation (``benchmark_<topic>.py``'s ``main()``): the checks, the
  header, the per-rank table, and ratios as median [min-max] over the launches.

Importing this module imports no torch (the functions import it when they run).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterable, Mapping

from shardlab.runtime.cases import stub_or_raise

__all__ = [
    "bench_steps",
    "compare_launches",
    "interleaved_times",
    "median_range",
    "steady_malloc",
    "stub_or_raise",
    "timed_steps",
    "ulps",
]


def steady_malloc() -> None:
    """Keep freed memory for the next step (glibc, Linux only; elsewhere nothing).

    PyTorch's CPU allocator has no cache: tensors come from glibc's malloc. By default glibc
    serves large blocks with fresh mappings and returns the top of its heap to the kernel, so
    a step that frees and re-allocates large buffers takes page faults (the kernel zeroing
    pages, charged to the computing thread) every time; CUDA's caching allocator keeps them.
    Fixing the thresholds keeps the memory: measured steps reuse it. Applied to every side of
    a benchmark alike (lab 05's timing runs, lab 03's ZeRO benchmark)."""
    import ctypes
    import sys

    if sys.platform != "linux":
        return
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:  # not glibc
        return
    m_trim_threshold, m_mmap_threshold = -1, -3
    libc.mallopt(m_mmap_threshold, 32 << 20)  # glibc's largest: serve big blocks from the heap
    libc.mallopt(m_trim_threshold, 1 << 30)  # never shrink the heap between steps


def ulps(a, b) -> int:
    """Largest distance in units in the last place between two fp32 tensors (0: bitwise)."""
    import torch

    def ordered(t):  # fp32 bits as integers that increase with the value
        i = t.detach().float().contiguous().view(torch.int32).long()
        return torch.where(i < 0, -(i & 0x7FFFFFFF), i)

    return int((ordered(a) - ordered(b)).abs().max()) if a.numel() else 0


def interleaved_times(
    fns: Mapping[str, Callable[[], object]],
    steps: int,
    warmup: int = 0,
    sync: Callable[[], object] | None = None,
) -> dict[str, list[float]]:
    """Seconds of each of ``steps`` calls of every function of ``fns``, after ``warmup`` calls
    not counted; the functions alternate call by call and every call starts after a barrier of
    the default group (and ``sync()``, e.g. ``torch.cuda.synchronize``, before and after)."""
    import torch.distributed as dist

    times: dict[str, list[float]] = {name: [] for name in fns}
    for i in range(warmup + steps):
        for name, fn in fns.items():
            dist.barrier()  # ranks start together: no waiting for a late peer is counted
            if sync is not None:
                sync()
            t0 = time.perf_counter()
            fn()
            if sync is not None:
                sync()
            if i >= warmup:
                times[name].append(time.perf_counter() - t0)
    return times


def timed_steps(model, opt, x, y, steps: int, finish: Callable[[], object] | None = None):
    """Seconds of each of ``steps`` training steps (language-model loss on ``(x, y)``,
    backward, ``finish()`` -- e.g. a wrapper's gradient synchronization --, optimizer step)."""
    from shardlab.models import lm_loss

    out = []
    for _ in range(steps):
        t0 = time.perf_counter()
        lm_loss(model, x, y).backward()
        if finish is not None:
            finish()
        opt.step()
        opt.zero_grad()
        out.append(time.perf_counter() - t0)
    return out


def median_range(values: Iterable[float]) -> str:
    """``"0.967"`` for one value, ``"0.967 [0.946-0.998]"`` (median [min-max]) for several."""
    v = list(values)
    spread = f" [{min(v):.3f}-{max(v):.3f}]" if len(v) > 1 else ""
    return f"{statistics.median(v):.3f}{spread}"


def bench_steps(size: str, steps: int | None) -> dict[str, int]:
    """The step keywords a benchmark's rank function gets: ``steps`` timed steps (default 20
    at size ``"bench"``, 6 at larger ones) after ``warmup`` steps (3 at ``"bench"``, else 2)."""
    return {"steps": steps or (20 if size == "bench" else 6), "warmup": 3 if size == "bench" else 2}


def compare_launches(
    worker: str,
    *,
    size: str,
    sizes: Iterable[str],
    batch: int,
    ranks: int,
    steps: int | None,
    repeats: int,
    impls: Iterable[str],
    detail: str = "",
    max_diff: Callable[[dict], float] = lambda m: m["max_diff"],
) -> list[list[dict]]:
    """``repeats`` launches of the rank function ``worker`` (``"module:run"``, called as
    ``run(size, steps=..., warmup=...)``) on ``ranks`` ranks; prints the model, the largest
    weight difference from PyTorch (``max_diff`` of a rank's result) and the first launch's
    step time and peaks per rank and implementation; returns every launch's results.

    Checked first (``ValueError``): ``size`` is one of ``sizes``, ``repeats`` and ``ranks`` are
    at least 1, ``ranks`` divides the global ``batch``. Steps: ``steps`` (default 20 at size
    ``"bench"``, 6 at larger ones) after 3 (``"bench"``) or 2 warm-up steps. ``detail`` is
    inserted into the header line before "median of"."""
    from shardlab.runtime import launch

    sizes, impls = list(sizes), list(impls)
    if size not in sizes:
        raise ValueError(f"size={size!r} is not one of {', '.join(sizes)}")
    if repeats < 1 or ranks < 1:
        raise ValueError(f"repeats={repeats} and ranks={ranks} must be >= 1")
    if batch % ranks:
        raise ValueError(f"ranks={ranks} must divide the global batch of {batch} sequences")
    kw = bench_steps(size, steps)
    launches = [
        launch(worker, ranks, size, quiet=True, timeout=900, **kw) for _ in range(repeats)
    ]
    res = launches[0]
    print(
        f"N = {res[0]['n_params']:,} parameters ({size}), {ranks} ranks, gloo, fp32 AdamW, "
        f"{detail}median of {kw['steps']} steps"
    )
    diff = max(max_diff(m) for r in launches for m in r)
    print(f"largest |weight - PyTorch's| after the timed steps: {diff:.1e}")
    print(f"{'rank':>4s} {'impl':>6s} {'step ms':>8s} {'peak trace B':>13s} {'peak alloc B':>13s}")
    for r, m in enumerate(res):
        for impl in impls:
            d = m[impl]
            print(f"{r:4d} {impl:>6s} {d['step_s'] * 1e3:8.1f} {d['trace']:13,d} {d['alloc']:13,d}")
    return launches
