"""Benchmark results as data: one JSON file per benchmark configuration.

A benchmark calls :func:`load_average` before its launches, then :func:`write_results` with
its per-launch numbers; the file records where and when it ran (machine, CPU capability,
cores, load average before and after, torch and Python versions, UTC date), the command, the
per-launch values and, for every numeric key, the median and range over the launches
(:func:`summarize`). Chapters render these files instead of typed numbers.

Schema (top-level keys): ``benchmark``, ``command``, ``config``, ``machine``, ``date``,
``torch``, ``load`` (``{"before": [1, 5, 15 min], "after": [...], "cores": n}``), ``idle``
(the 1-minute load before the launches was below the core count: the run the book should
show; the load after, which includes the benchmark's own ranks, is recorded beside it), ``per_launch`` (list of dicts), ``summary`` (``{key: {"median", "min", "max", "n"}}``).
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import statistics
import sys
from pathlib import Path

RESULTS_DIR = Path(__file__).resolve().parents[2] / "benchmarks" / "results"


def load_average() -> list[float]:
    """The 1, 5 and 15 minute load averages (empty where the OS has none)."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def machine() -> dict:
    """Where the benchmark ran: platform, processor, CPU dispatch capability, cores."""
    import torch

    return {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cores": _cores(),
        "cpu_count": os.cpu_count(),
        "python": sys.version.split()[0],
    }


def summarize(per_launch: list[dict]) -> dict[str, dict]:
    """Median, min, max and count of every numeric leaf over the launches; nested dicts
    give dotted keys (``{"zero1": {"step": x}}`` -> ``"zero1.step"``)."""

    def leaves(d: dict, prefix: str = ""):
        for k, v in d.items():
            if isinstance(v, dict):
                yield from leaves(v, f"{prefix}{k}.")
            elif isinstance(v, (int, float)) and not isinstance(v, bool):
                yield f"{prefix}{k}", float(v)

    values: dict[str, list[float]] = {}
    for launch in per_launch:
        for k, v in leaves(launch):
            values.setdefault(k, []).append(v)
    return {
        k: {"median": statistics.median(v), "min": min(v), "max": max(v), "n": len(v)}
        for k, v in values.items()
    }


def write_results(
    name: str,
    per_launch: list[dict],
    *,
    benchmark: str,
    config: dict,
    load_before: list[float],
    command: str | None = None,
    directory: Path | str | None = None,
) -> Path:
    """Write ``<directory>/<name>.json`` (default :data:`RESULTS_DIR`) and return its path.

    ``per_launch``: one dict of numbers (nested dicts allowed) per launch; ``config``: what
    was run (sizes, ranks, steps, ...); ``load_before``: :func:`load_average` taken before the
    first launch (the load after is taken here)."""
    import torch

    if not name or "/" in name or name.startswith("."):
        raise ValueError(f"name={name!r} must be a plain file name (no '/', not hidden)")
    if not per_launch:
        raise ValueError("per_launch is empty: nothing was measured")
    after = load_average()
    cores = _cores()
    data = {
        "benchmark": benchmark,
        "command": command
        if command is not None
        else " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "config": config,
        "machine": machine(),
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "torch": torch.__version__,
        "load": {"before": load_before, "after": after, "cores": cores},
        # judged before the launches: the load after includes the benchmark's own ranks (four
        # ranks on two cores always load the machine), so it is recorded, not judged
        "idle": bool(load_before and load_before[0] < cores),
        "per_launch": per_launch,
        "summary": summarize(per_launch),
    }
    out = Path(directory) if directory is not None else RESULTS_DIR
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.json"
    path.write_text(json.dumps(data, indent=1, sort_keys=False) + "\n")
    return path


def is_results(data: object) -> bool:
    """Whether ``data`` (a parsed JSON file) follows this module's schema."""
    return isinstance(data, dict) and {"benchmark", "per_launch", "summary", "load"} <= set(data)


def provenance(data: dict) -> str:
    """One sentence: what ran, where, when, under which load, and whether it was idle."""
    m, load = data["machine"], data["load"]
    before = load["before"][0] if load["before"] else "?"
    after = load["after"][0] if load["after"] else "?"
    idle = "idle" if data["idle"] else "NOT idle (1-minute load before at or above the cores)"
    n = len(data["per_launch"])
    return (
        f"{data['benchmark']}: `{data['command']}`, {n} launch{'es' if n != 1 else ''}, "
        f"{data['date']} on {m['processor']} ({m['cpu_capability']}, {m['cores']} cores), "
        f"torch {data['torch']}; 1-minute load {before} before, {after} after: {idle}."
    )


def summary_rows(
    data: dict, fmt: str = "{:.3f}", prefix: str = "", skip: tuple[str, ...] = ()
) -> list[list[str]]:
    """``[key, "median [min–max]", n]`` for every summary key under ``prefix`` (a top-level
    key of the launches' dicts, e.g. ``"ratio"``; ``""``: every key)."""
    dotted = f"{prefix}." if prefix else ""
    rows = []
    for key, s in data["summary"].items():
        if not key.startswith(dotted) or key.split(".")[0] in skip:
            continue
        lo, mid, hi = (fmt.format(s[k]) for k in ("min", "median", "max"))
        rows.append([key.removeprefix(dotted), mid if lo == hi else f"{mid} [{lo}–{hi}]", s["n"]])
    return rows


def markdown(
    data: dict, prefix: str = "ratio", fmt: str = "{:.3f}", skip: tuple[str, ...] = ()
) -> str:
    """The provenance sentence and a Markdown table of the summary keys under ``prefix``
    (``"ratio"``: ours / PyTorch; ``"floor"``: over the compute floor; ``""``: all), leaving
    out the top-level keys in ``skip`` (e.g. ``"seconds"``)."""
    lines = [provenance(data), "", "| quantity | median [min–max] | launches |", "|---|---|---|"]
    lines += [f"| {k} | {v} | {n} |" for k, v, n in summary_rows(data, fmt, prefix, skip)]
    return "\n".join(lines)


def positive_int(text: str) -> int:
    """An argparse ``type``: a whole number of at least 1 (else one sentence, exit 2)."""
    import argparse

    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"{n} must be at least 1")
    return n


def add_arguments(ap, launches: str | None = "--repeats", default: int = 1) -> None:
    """The options every benchmark shares: ``launches`` (a count of whole launches, at least
    1; ``None``: none) and ``--save`` / ``--results-dir`` (:func:`write_results`)."""
    if launches is not None:
        ap.add_argument(launches, type=positive_int, default=default,
                        help="whole launches (their median [min-max] is printed)")
    ap.add_argument("--save", action="store_true", help="write the run as a results file")
    ap.add_argument("--results-dir", default=None,
                    help="where --save writes (default: benchmarks/results)")
