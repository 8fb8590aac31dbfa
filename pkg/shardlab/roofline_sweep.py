"""A matmul sweep on this machine and the roofline fitted to it (chapter 0).

**What is measured.** For each shape ``(m, k, n)`` of :data:`SHAPES`, the seconds one
``torch.matmul`` of an ``m x k`` by a ``k x n`` matrix takes on one device, in one dtype: the
fastest of ``reps`` repetitions, each of which runs the product enough times back to back to
last at least ``min_time`` seconds (interference from other programs only ever adds time, so
the fastest repetition is the best estimate). With one thread on a CPU the clock is the
process's CPU time (``time.process_time``): the time the core really spent on the products, not
the time the operating system gave to other programs meanwhile, which on a shared machine can
be most of the wall-clock time. Otherwise (several threads, a GPU) it is the wall clock, and on
a GPU the device is synchronized before the clock is read. The FLOPs and bytes of a point are ``accounting.gemm.matmul_flops`` and
``matmul_bytes`` (the fewest bytes the product can move), so a point's achieved FLOP/s is
``flops / seconds`` and its intensity ``accounting.gemm.gemm_intensity``.

**The fit** (:func:`fit_roofline`): the lowest roofline that no point rises above. Its compute
roof is the fastest FLOP rate any point reached and its bandwidth the fastest byte rate any
point reached (achieved FLOP/s divided by intensity = bytes moved per second). A least-squares
line, as chapter 1 fits α and β, would be pulled down by points that are slow for reasons the
roofline does not model (a kernel that handles a skinny shape badly, a core taken by another
job); the roofline is an upper bound, and the envelope is the estimate of a bound. Each point's
``fraction`` is its achieved rate over the fitted roofline at its intensity (1.0 on the roof).

**Stored data.** ``python -m shardlab.roofline_sweep --out book/data/roofline_cpu.json``
writes a sweep (two passes by default, the fastest per shape: :func:`fastest_of`) with the machine it ran on (CPU model, kernel capability, cores, threads, torch
version, date); :func:`load_sweep` reads it back. The chapter renders the stored file, so its
compared outputs are the same on every machine, and re-measures in a cell whose output nbval
does not compare.

torch is imported only by :func:`sweep` and :func:`machine_info`; fitting, loading and
plotting work without it.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import time
from pathlib import Path
from typing import Any

from shardlab.accounting import gemm

WIDE = 4096  # k = n of the skinny family: a 4096 x 4096 fp32 weight is 64 MiB, above most L3s
# From matrix-vector (intensity about 1/2 FLOP/byte in fp32) to large square products.
SHAPES: tuple[tuple[int, int, int], ...] = (
    *((m, WIDE, WIDE) for m in (1, 2, 4, 8, 16, 32, 64, 128, 256)),
    *((s, s, s) for s in (128, 256, 512, 1024, 2048)),
)
# A shorter sweep for a notebook cell (a few seconds on one core).
QUICK_SHAPES: tuple[tuple[int, int, int], ...] = (
    (1, WIDE, WIDE), (16, WIDE, WIDE), (64, WIDE, WIDE), (256, 256, 256), (1024, 1024, 1024),
)


def family(m: int, k: int, n: int) -> str:
    """``"square"`` for ``m = k = n``, else ``"skinny"`` (few rows against a wide matrix)."""
    return "square" if m == k == n else "skinny"


def machine_info(device: str = "cpu", threads: int | None = None) -> dict[str, Any]:
    """Where a sweep ran: CPU model and PyTorch's kernel choice (``get_cpu_capability``),
    cores, intra-op threads, torch and Python versions, the GPU name on CUDA, the date."""
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
        cpu = names[0] if names else cpu
    except OSError:
        pass
    info: dict[str, Any] = {
        "cpu": cpu,
        "arch": platform.machine(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cores": os.cpu_count(),
        "threads": threads if threads is not None else torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "date": datetime.date.today().isoformat(),
    }
    if torch.device(device).type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(torch.device(device))
    return info


def clock_for(device: str, threads: int) -> str:
    """``"cpu"`` (process CPU time) for one thread on a CPU, else ``"wall"``."""
    return "cpu" if device == "cpu" and threads == 1 else "wall"


def time_matmul(m: int, k: int, n: int, dtype: Any = None, device: str = "cpu", reps: int = 5,
                min_time: float = 0.05, clock: str = "wall", weight: Any = None) -> float:
    """Seconds of one ``m x k`` by ``k x n`` ``torch.matmul`` (see the module docstring);
    ``clock`` ``"cpu"`` reads ``time.process_time``, ``"wall"`` ``time.perf_counter``.
    ``weight``: the ``k x n`` operand to reuse (a fresh random one when None)."""
    import torch

    if clock not in ("cpu", "wall"):
        raise ValueError(f"clock={clock!r} is not one of 'cpu', 'wall'")
    now = time.process_time if clock == "cpu" else time.perf_counter
    dev = torch.device(device)
    dtype = dtype or torch.float32
    a = torch.randn(m, k, dtype=dtype, device=dev)
    b = torch.randn(k, n, dtype=dtype, device=dev) if weight is None else weight
    out = torch.empty(m, n, dtype=dtype, device=dev)

    def sync() -> None:
        if dev.type == "cuda":  # kernels run asynchronously: wait before reading the clock
            torch.cuda.synchronize(dev)

    def run(calls: int) -> float:
        sync()
        t0 = now()
        for _ in range(calls):
            torch.matmul(a, b, out=out)
        sync()
        return now() - t0

    run(1)  # warm-up: first-call allocation and kernel selection
    calls = max(1, math.ceil(min_time / max(run(1), 1e-9)))
    return min(run(calls) / calls for _ in range(int(reps)))


def point(m: int, k: int, n: int, seconds: float, q: float) -> dict[str, Any]:
    """One measured product with its FLOPs, bytes and intensity from ``accounting.gemm``."""
    flops = gemm.matmul_flops(m, k, n)
    return {"family": family(m, k, n), "m": m, "k": k, "n": n, "seconds": seconds,
            "flops": flops, "bytes": gemm.matmul_bytes(m, k, n, q),
            "intensity": gemm.gemm_intensity(m, k, n, q), "flops_per_s": flops / seconds}


def sweep(shapes=SHAPES, dtype: str = "float32", device: str = "cpu", threads: int | None = 1,
          reps: int = 5, min_time: float = 0.05) -> dict[str, Any]:
    """Time every shape; returns the machine, the settings and one :func:`point` per shape.

    ``threads`` sets torch's intra-op threads for the sweep (restored afterwards; ``None``
    keeps the current setting). One thread measures one core, which other jobs on a shared
    machine disturb least.
    """
    import torch

    dt = getattr(torch, dtype)
    q = torch.empty((), dtype=dt).element_size()
    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(int(threads))
    try:
        info = machine_info(device, torch.get_num_threads())
        clock = clock_for(device, info["threads"])
        points, held = [], None  # held: the last (k, n) operand, reused by the next shape
        for m, k, n in shapes:
            if held is None or tuple(held.shape) != (k, n):
                held = None  # free the old operand before making the new one
                held = torch.randn(k, n, dtype=dt, device=device)
            seconds = time_matmul(m, k, n, dt, device, reps, min_time, clock, held)
            points.append(point(m, k, n, seconds, q))
    finally:
        torch.set_num_threads(before)
    return {"machine": info, "device": device, "dtype": dtype, "bytes_per_element": q,
            "clock": clock, "reps": reps, "min_time_s": min_time, "points": points}


def fastest_of(sweeps: list[dict[str, Any]]) -> dict[str, Any]:
    """One sweep from several of the same shapes: per shape the fastest pass (the first
    sweep's settings, ``passes`` set to how many were merged)."""
    first = sweeps[0]
    shapes = [(p["m"], p["k"], p["n"]) for p in first["points"]]
    for other in sweeps[1:]:
        if [(p["m"], p["k"], p["n"]) for p in other["points"]] != shapes:
            raise ValueError("fastest_of needs sweeps of the same shapes in the same order")
    q = first["bytes_per_element"]
    points = [point(*shape, min(sw["points"][i]["seconds"] for sw in sweeps), q)
              for i, shape in enumerate(shapes)]
    return {**first, "passes": len(sweeps), "points": points}


def fit_roofline(points: list[dict[str, Any]]) -> dict[str, Any]:
    """The envelope roofline of measured points (module docstring).

    Returns ``peak_flops`` (FLOP/s), ``bandwidth`` (bytes/s), ``ridge`` (FLOP/byte), which
    points set them (``peak_from``, ``bandwidth_from``: indices), and per point the fitted
    ``roofline`` rate and the achieved ``fraction`` of it.
    """
    if not points:
        raise ValueError("fit_roofline needs at least one measured point")
    rates = [p["flops_per_s"] for p in points]
    byte_rates = [p["flops_per_s"] / p["intensity"] for p in points]
    i_peak = max(range(len(points)), key=rates.__getitem__)
    i_bw = max(range(len(points)), key=byte_rates.__getitem__)
    peak, bw = rates[i_peak], byte_rates[i_bw]
    roof = [gemm.roofline_flops(p["intensity"], peak, bw) for p in points]
    return {
        "peak_flops": peak,
        "bandwidth": bw,
        "ridge": gemm.ridge(peak, bw),
        "peak_from": i_peak,
        "bandwidth_from": i_bw,
        "roofline": roof,
        "fraction": [r / f for r, f in zip(rates, roof)],
    }


def save_sweep(data: dict[str, Any], path: str | os.PathLike[str]) -> Path:
    """Write a sweep as JSON (creating the folder); returns the path."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=1) + "\n")
    return out


def load_sweep(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a sweep :func:`save_sweep` wrote; a file without points is refused by name."""
    data = json.loads(Path(path).read_text())
    if not data.get("points"):
        raise ValueError(f"{os.fspath(path)} holds no measured points")
    return data


def plot_roofline(
    data: dict[str, Any],
    fit: dict[str, Any],
    cap: float | None = None,
    also: tuple[dict[str, Any], dict[str, Any]] | None = None,
    axes=None,
):
    """Two panels: achieved FLOP/s against intensity with the fitted roofline (left), and the
    share of the fitted peak against intensity with the planner's ``min(cap, I / ridge)``
    (right; ``cap=None``: the roof alone). ``also``: a second ``(data, fit)`` drawn hollow,
    e.g. a fresh sweep next to the stored one. Returns the figure."""
    import matplotlib.pyplot as plt

    if axes is None:
        _, axes = plt.subplots(1, 2, figsize=(11, 4))
    left, right = axes
    mach, threads = data.get("machine", {}), data.get("machine", {}).get("threads", 1)
    where = mach.get("gpu") or f"{mach.get('cpu', 'cpu')}, {threads} thread{'s' * (threads != 1)}"
    runs = [(data, fit, True)] + ([(*also, False)] if also else [])
    xs = [p["intensity"] for d, _, _ in runs for p in d["points"]]
    grid = [min(xs) / 2 * (4 * max(xs) / min(xs)) ** (i / 120) for i in range(121)]
    for d, f, filled in runs:
        tag = "stored" if filled else "this run"
        color = "C0" if filled else "C1"
        for fam, marker in (("skinny", "o"), ("square", "s")):
            pts = [(p, fr) for p, fr in zip(d["points"], f["fraction"]) if p["family"] == fam]
            if not pts:
                continue
            style = dict(marker=marker, ls="none", color=color,
                         mfc=color if filled else "none", label=f"{fam} ({tag})")
            left.plot([p["intensity"] for p, _ in pts], [p["flops_per_s"] for p, _ in pts], **style)
            right.plot([p["intensity"] for p, _ in pts],
                       [p["flops_per_s"] / f["peak_flops"] for p, _ in pts], **style)
        roof = [gemm.roofline_flops(x, f["peak_flops"], f["bandwidth"]) for x in grid]
        left.plot(grid, roof, "-" if filled else "--", color=color, lw=1.2,
                  label=f"fitted roofline ({tag})")
        left.axvline(f["ridge"], color=color, ls=":", lw=0.8)
    f0 = fit
    right.plot(grid, [gemm.roofline_flops(x, f0["peak_flops"], f0["bandwidth"]) / f0["peak_flops"]
                      for x in grid], "-", color="C0", lw=1.2, label="min(1, I / ridge)")
    if cap is not None:
        right.plot(grid, [gemm.gemm_efficiency(x, f0["ridge"], cap) for x in grid], "--",
                   color="C3", lw=1.2, label=f"planner: min({cap:.2f}, I / ridge)")
    left.set(xscale="log", yscale="log", xlabel="arithmetic intensity (FLOP/byte)",
             ylabel="achieved FLOP/s", title=f"{data['dtype']} matmul, {where}")
    right.set(xscale="log", xlabel="arithmetic intensity (FLOP/byte)",
              ylabel="share of the fitted peak", title="efficiency against intensity")
    for ax in axes:
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    left.figure.tight_layout()
    return left.figure


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Time a matmul sweep and store it as JSON.")
    ap.add_argument("--out", type=Path, required=True, help="JSON file to write")
    ap.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    ap.add_argument("--dtype", default="float32", help="float32 (default), bfloat16, ...")
    ap.add_argument("--threads", type=int, default=1, help="intra-op threads (default 1)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--min-time", type=float, default=0.05, help="seconds per repetition")
    ap.add_argument("--passes", type=int, default=2, help="whole sweeps; the fastest per shape")
    args = ap.parse_args(argv)
    data = fastest_of([sweep(SHAPES, args.dtype, args.device, args.threads, args.reps,
                             args.min_time) for _ in range(max(1, args.passes))])
    fit = fit_roofline(data["points"])
    save_sweep(data, args.out)
    print(f"{args.out}: {len(data['points'])} shapes on {data['machine']['cpu']}; fitted peak "
          f"{fit['peak_flops'] / 1e9:.1f} GFLOP/s, bandwidth {fit['bandwidth'] / 1e9:.1f} GB/s, "
          f"ridge {fit['ridge']:.1f} FLOP/byte")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
