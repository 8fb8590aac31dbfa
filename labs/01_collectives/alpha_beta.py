"""Measure α and β on this machine: time all-reduces over a range of sizes and fit the α–β model.

The model (``shardlab.accounting.comm.alpha_beta_time``) is

    T(V) = rounds(op, D) · α + ring_sent_bytes(op, V, D) / β

so for a fixed op and group size it is a straight line in the per-rank sent bytes: the
intercept is the latency part, the slope is 1/β. :func:`fit_alpha_beta` solves that line by
least squares on *relative* errors (every size counts equally, not only the largest), with
the features taken from ``accounting.comm`` (one copy of every formula).

Workflow (the lab notebook does this)::

    from shardlab.runtime import launch
    import alpha_beta as ab
    per_rank = launch(ab.sweep_worker, 2, ab.DEFAULT_SIZES, reps=5)
    sweep = ab.merge_ranks(per_rank)              # slowest rank per size
    fit = ab.fit_alpha_beta(sweep["sizes"], sweep["dist"], group_size=2)
    ab.save_fit(fit, "this_machine.json")         # {"alpha": s, "beta": bytes/s, ...}
    comm_calculator(machine_json="this_machine.json")   # preset "this machine"

The JSON file is regenerated on every run and is machine-specific; keep it out of git.
"""

from __future__ import annotations

import json
import math
import os
import statistics

from shardlab.accounting import comm as acc
from shardlab.testing import interleaved_times

#: message sizes in bytes (full tensor V): 1 KiB ... 4 MiB, one per power of two
DEFAULT_SIZES = [2**k for k in range(10, 23)]
FIT_KEYS = ("alpha", "beta")


def sweep_worker(
    sizes: list[int], reps: int = 5, warmup: int = 1, impls: tuple[str, ...] = ("dist", "ring")
) -> dict:
    """On each rank: median seconds of one float32 all-reduce of every size, per implementation.

    ``impls``: ``"dist"`` is ``torch.distributed.all_reduce`` (gloo or NCCL), ``"ring"`` the
    lab's ``collectives.ring_all_reduce`` (left out while it raises ``NotImplementedError``).
    A barrier before every repetition lines the ranks
    up, so a measurement does not include waiting for a late peer.
    """
    import torch
    import torch.distributed as dist
    from shardlab.runtime import device

    ops = {"dist": lambda t: dist.all_reduce(t)}
    if "ring" in impls:
        import collectives

        ops["ring"] = collectives.ring_all_reduce
    dev = device()
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    out: dict = {"sizes": list(sizes)}
    for name in impls:
        try:  # the lab's ring is skipped (on every rank alike) until it is implemented
            ops[name](torch.ones(8, device=dev))
        except NotImplementedError:
            continue
        medians = []
        for nbytes in sizes:
            x = torch.ones(nbytes // 4, dtype=torch.float32, device=dev)
            call = {name: lambda op=ops[name], x=x: op(x)}
            times = interleaved_times(call, reps, warmup, sync)[name]
            medians.append(statistics.median(times))
        out[name] = medians
    out["group_size"] = dist.get_world_size()
    out["backend"] = dist.get_backend()
    return out


def merge_ranks(per_rank: list[dict]) -> dict:
    """Combine every rank's medians: a collective is done when its slowest rank is."""
    first = per_rank[0]
    merged = {k: first[k] for k in ("sizes", "group_size", "backend")}
    for name in first:
        if name in merged:
            continue
        merged[name] = [max(r[name][i] for r in per_rank) for i in range(len(first["sizes"]))]
    return merged


def fit_alpha_beta(
    sizes: list[float], seconds: list[float], group_size: int, op: str = "all_reduce"
) -> dict:
    """Least-squares α (s/round) and β (bytes/s) of ``T = rounds·α + sent/β`` (relative errors).

    Returns a dict with ``alpha``, ``beta`` (the keys the communication calculator reads),
    the inputs, the model's prediction per size and the root-mean-square relative error.
    Falls back to α = 0 (pure bandwidth) if the unconstrained fit gives a negative α.
    """
    if len(sizes) != len(seconds) or len(sizes) < 2:
        raise ValueError(f"need >= 2 matching sizes and times, got {len(sizes)} and {len(seconds)}")
    if any(t <= 0 for t in seconds):
        raise ValueError(f"times must be > 0, got {seconds}")
    n_rounds = acc.rounds(op, group_size)
    sent = [acc.ring_sent_bytes(op, v, group_size) for v in sizes]
    # Minimise sum(((a*x1 + b*x2) - t)/t)^2 with x1 = rounds, x2 = sent bytes, a = α, b = 1/β.
    rows = [(n_rounds / t, s / t) for s, t in zip(sent, seconds)]
    s11 = sum(r[0] * r[0] for r in rows)
    s12 = sum(r[0] * r[1] for r in rows)
    s22 = sum(r[1] * r[1] for r in rows)
    y1 = sum(r[0] for r in rows)  # right-hand side: rows · 1 (t/t)
    y2 = sum(r[1] for r in rows)
    det = s11 * s22 - s12 * s12
    a, b = (s22 * y1 - s12 * y2) / det, (s11 * y2 - s12 * y1) / det
    if a < 0:  # latency not resolvable: fit bandwidth only
        a, b = 0.0, y2 / s22
    if b <= 0:
        raise ValueError("the fitted time does not grow with message size; measure larger sizes")
    alpha, beta = a, 1.0 / b
    pred = [acc.alpha_beta_time(op, v, group_size, alpha, beta) for v in sizes]
    rel = math.sqrt(sum(((p - t) / t) ** 2 for p, t in zip(pred, seconds)) / len(sizes))
    return {
        "alpha": alpha,
        "beta": beta,
        "alpha_us": alpha * 1e6,
        "beta_gbps": beta / 1e9,
        "op": op,
        "group_size": group_size,
        "rounds": n_rounds,
        "sizes": list(sizes),
        "seconds": list(seconds),
        "predicted": pred,
        "rel_rms_error": rel,
    }


POOR_FIT = 0.2  # rms relative error above which the line does not describe the times


def fit_warning(fit: dict, ranks: int, cores: int, load: float | None = None) -> str:
    """A sentence on why a fit is poor (rms relative error above :data:`POOR_FIT`), or ``""``.

    ``ranks``: processes that were timed; ``cores``: CPU cores they could use; ``load``: the
    1-minute load average during the run (``os.getloadavg()[0]``), when known. The reasons
    named are the ones this lab meets: ranks sharing the cores with this notebook's process
    and other programs (small messages then wait for a core, far above the line), small
    messages far slower than the line (a fixed cost per call that is not per round), and too
    few sizes for two parameters.
    """
    err = fit["rel_rms_error"]
    if err <= POOR_FIT:
        return ""
    reasons = []
    if load is not None and load > cores - 0.5:
        reasons.append(
            f"the machine was busy (load average {load:.1f} on {cores} cores): a rank that "
            "waits for a core adds milliseconds that are not communication"
        )
    elif ranks + 1 > cores:
        reasons.append(
            f"{ranks} ranks and this notebook's process share {cores} cores, so a rank often "
            "waits for a core"
        )
    small = [
        (t - p) / p for v, t, p in zip(fit["sizes"], fit["seconds"], fit["predicted"]) if v <= 16384
    ]
    if small and max(small) > 0.5:
        reasons.append(
            f"messages up to 16 KiB take up to {1 + max(small):.1f}x the line's time (a fixed "
            "cost per call, Python and thread wake-ups, that the per-round α does not model)"
        )
    if len(fit["sizes"]) < 6:
        reasons.append(f"only {len(fit['sizes'])} sizes for two parameters")
    why = "; ".join(reasons) or "the times are noisy"
    return (
        f"poor fit: rms relative error {err:.0%} (above {POOR_FIT:.0%}), so read α and β as rough "
        f"— {why}. Rerun on an idle machine (more repetitions help) before comparing."
    )


def save_fit(fit: dict, path: str | os.PathLike[str], **extra) -> str:
    """Write the fit (plus ``extra`` entries) as JSON; returns the path."""
    with open(path, "w") as f:
        json.dump({**fit, **extra}, f, indent=1)
    return os.fspath(path)


def load_fit(path: str | os.PathLike[str]) -> dict:
    """Read a fit written by :func:`save_fit` (must have ``alpha`` and ``beta``)."""
    with open(path) as f:
        fit = json.load(f)
    missing = [k for k in FIT_KEYS if k not in fit]
    if missing:
        raise ValueError(f"{os.fspath(path)} lacks {missing}")
    return fit


def plot_fit(sweep: dict, fits: dict[str, dict], ax=None):
    """Log-log plot of measured times (markers) and fitted α–β lines, one colour per impl."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(6.4, 4.0))
    for (name, fit), color in zip(fits.items(), ("#0072B2", "#D55E00", "#009E73")):
        ax.loglog(sweep["sizes"], sweep[name], "o", color=color, label=f"{name}: measured")
        label = f"{name}: α={fit['alpha_us']:.1f} µs, β={fit['beta_gbps']:.2f} GB/s"
        ax.loglog(fit["sizes"], fit["predicted"], "-", color=color, label=label)
    ax.set_xlabel("message size V (bytes, full tensor)")
    ax.set_ylabel("all-reduce time (s)")
    ax.set_title(f"all-reduce on D={sweep['group_size']} ranks ({sweep['backend']})")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    return ax
