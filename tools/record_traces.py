"""Record the profiler traces the book's timeline figures render, as data.

For each layout (lab 02's bucketed DDP, lab 04's FSDP with prefetch, lab 05's 1F1B pipeline)
this runs
``shardlab train --layout L --model small --ranks 2 --profile DIR`` in-process (the same
:func:`shardlab.train.rank.run_rank` on ranks started by :func:`shardlab.runtime.launch`),
reduces each rank's full ``torch.profiler`` trace to a compact timeline
(:func:`shardlab.runtime.trace_timeline.timeline_record`: the steps, every collective, compute
merged into forward/backward/optimizer blocks; compute, communication and exposed
communication per rank from the full trace) and writes
``benchmarks/results/traces/<layout>_<model>_2ranks.json`` with the machine, date and torch.

    .venv/bin/python tools/record_traces.py [--launches 3] [--keep DIR] [--model tiny] [ddp fsdp]

With several launches the file keeps every launch's per-rank times (``per_launch``) and the
events of the last one: on a shared machine the exposed share moves from launch to launch.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results" / "traces"
# lab 02's DDP with 1 MB buckets, so the small model's ~14 MB of gradients go in several
# all-reduces that can overlap backward; FSDP prefetches the next unit's all-gather.
# lab 05's 1F1B pipeline with 4 microbatches: its send/recv run on the Python thread.
RUNS = {"ddp": dict(bucket_mb=1.0), "fsdp": {}, "pp": dict(microbatches=4)}


def record(layout: str, folder: str, model: str = "small") -> dict:
    import torch
    from shardlab.runtime import launch
    from shardlab.runtime.trace_timeline import timeline_record
    from shardlab.train.spec import TrainSpec, resolve_modules

    modules, source, labs = resolve_modules(layout, labs=str(ROOT / "labs"))
    spec = TrainSpec(layout, model=model, ranks=2, steps=5, batch=8, threads=1,
                     modules=modules, module_source=source, labs_dir=str(labs),
                     profile=folder, **RUNS[layout])
    load = list(os.getloadavg())
    rows = launch("shardlab.train.rank:run_rank", 2, spec, None, quiet=True, timeout=900)
    meta = {
        "benchmark": f"torch.profiler trace of {spec.steps - 3} steps of {layout} on 2 ranks, "
                     "reduced to a timeline",
        "statistic": "one launch; times are sums over the recorded steps, in µs",
        "source": "tools/record_traces.py (shardlab.runtime.trace_timeline.timeline_record)",
        "layout": layout, "model": model, "ranks": 2, "steps_recorded": spec.steps - 3,
        "command": f"shardlab train --layout {layout} --model {model} --ranks 2 --steps 5 "
                   "--batch 8 --threads 1 --profile DIR"
                   + "".join(f" --{k.replace('_', '-')} {v:g}" for k, v in RUNS[layout].items()),
        "backend": rows[0]["backend"], "device": rows[0]["device"],
        "machine": {"platform": platform.platform(), "processor": platform.machine(),
                    "cpu_capability": torch.backends.cpu.get_cpu_capability(),
                    "cores": os.cpu_count(), "python": sys.version.split()[0]},
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "torch": torch.__version__,
        "load": {"before": [round(x, 2) for x in load],
                 "after": [round(x, 2) for x in os.getloadavg()]},
    }
    return timeline_record([r["profile_trace"] for r in rows], meta)


def record_launches(layout: str, launches: int, keep: str | None, model: str = "small") -> dict:
    """:func:`record` ``launches`` times; the last launch's record with ``per_launch``
    (every launch's per-rank times) added."""
    recs = []
    for k in range(launches):
        with tempfile.TemporaryDirectory() as tmp:
            recs.append(record(layout, str(Path(keep) / f"{layout}{k}") if keep else tmp, model))
    stat = (f"the last of {launches} launches (its events and per-rank times; per_launch: every "
            "launch's per-rank times); times are sums over the recorded steps, in µs")
    return {**recs[-1], "statistic": stat, "launches": launches,
            "per_launch": [r["ranks"] for r in recs]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("layouts", nargs="*", metavar="LAYOUT", help=f"of {', '.join(RUNS)} (default all)")
    ap.add_argument("--launches", type=int, default=3, help="launches per layout (default 3)")
    ap.add_argument("--keep", default=None, help="keep the full traces in this folder")
    ap.add_argument("--model", default="small", choices=("tiny", "small"),
                    help="model shape (default small; the book's timelines)")
    args = ap.parse_args(argv)
    unknown = [x for x in args.layouts if x not in RUNS]
    if unknown:
        ap.error(f"{', '.join(unknown)}: not one of {', '.join(RUNS)}")
    OUT.mkdir(parents=True, exist_ok=True)
    for layout in args.layouts or list(RUNS):
        rec = record_launches(layout, max(1, args.launches), args.keep, args.model)
        path = OUT / f"{layout}_{args.model}_2ranks.json"
        path.write_text(json.dumps(rec, indent=1) + "\n")
        for r in rec["ranks"]:
            print(f"{layout} rank {r['rank']}: comm {r['comm_us'] / 1e3:.1f} ms, exposed "
                  f"{r['exposed_us'] / 1e3:.1f} ms, compute {r['compute_us'] / 1e3:.1f} ms, "
                  f"{len(rec['events'])} events -> {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
