"""How cost grows: step time and peak bytes per rank against model size and rank count.

    python tools/sweep_scaling.py [--layouts ddp zero2 fsdp tp] [--ranks 1 2 4]
        [--sizes s m l] [--steps N] [--save] [--results-dir DIR] [--quick]

For each layout (lab 02's DDP, lab 03's ZeRO-2, lab 04's FSDP, lab 06's tensor parallelism),
each model size and each rank count, one launch (``shardlab.runtime.launch``, gloo on CPU,
one thread per rank) trains the package's GPT with fp32 AdamW through the lab's own
``shardlab train`` runner (``labs/NN_topic/layout_*.py``, loaded by path with the lab's
reference modules by :func:`shardlab.train.rank.run_rank`): the same wrapper, the same
``train_step``, the same traces and the same predictions the labs' tests and ``shardlab
train`` use. Nothing of the techniques is rewritten here. Per launch:

* ``step_s``: median of the untraced steps (``--steps`` of them, after step 0, traced by
  ``CommTrace``, and step 1, traced by ``MemoryTrace``, which are the warm-up), slowest rank;
  ``step_s_predicted``: ``shardlab.train.report.summarize``'s ``compute + bytes / beta`` at its
  stated CPU assumptions (0.1 TFLOP/s per rank, efficiency 0.5, 1 GB/s);
* ``peak_bytes_measured``: MemoryTrace's peak of live tensor bytes of step 1, largest rank;
  ``peak_bytes_predicted``: the runner's ``predicted_peak`` for that rank
  (``shardlab.models.predicted_step_peak`` / ``accounting.peak.predict_layout_peak`` for
  ddp, zero2 and tp, ``accounting.fsdp_peak.fsdp_step_peak`` for fsdp: every term a formula
  but the saved activations, which the trace measures); ``peak_ratio_worst``: the rank whose
  measured / predicted is farthest from 1;
* ``state_bytes_predicted``: ``accounting.memory.model_state`` of the layout (fp32 AdamW,
  16 bytes per parameter: replicated for ddp, gradients and moments sharded for zero2,
  everything sharded for fsdp (zero3), on padded sizes; tp: this rank's ``1/t`` slice);
* ``sent_bytes_measured`` (CommTrace of step 0) and ``sent_bytes_predicted`` (the layout's
  ``accounting.comm`` formula: ``step_volume`` for ddp/zero2/fsdp, ``tp_volume`` plus the
  embedding/head/loss all-reduces for tp), per rank.

Sizes (:data:`SIZES`): the GPT of ``shardlab.models.SIZES["bench"]`` (vocab 256, seq 32,
4 layers, head width 32) at d_model 128, 256 and 512: 0.86 M, 3.3 M and 12.9 M parameters
(15x). Global batch 8 sequences (a data-parallel rank takes ``8/D``, a tensor-parallel rank
all 8); buckets of about a quarter of the gradients (:func:`bucket_mb`), as
``labs/03_zero/benchmark_zero.py`` chooses them. ``--quick``: the smallest size, 1 timed
step, ranks 1 and 2 (the test). ``--save`` writes ``scaling_sweep.json``
(:func:`shardlab.benchresults.write_results`) into ``--results-dir`` (default
``benchmarks/results``).

For the book: :func:`table` (text) and :func:`render` (matplotlib figure) of one layout from
a results file or its parsed dict.

Measured (torch 2.13, gloo, 2 shared CPU cores; the stored run is in
``benchmarks/results/scaling_sweep.json``): bytes sent equal the prediction in every row. Peak
measured / predicted: ddp 1.000-1.021; tp 0.83-0.90 (the prediction holds every gradient at a
peak where only part exist: under by less than ``4 N_local``); fsdp within 1.5 % at the
smallest size on 1-2 ranks (the labs' test regime) but growing with size and ranks, to 1.27 at
12.9 M on 4 ranks: communication buffers the schedule does not name (4.7 MB at 3.3 M on 2
ranks). ZeRO-2's prediction counted one bucket buffer and was 1.32 at 12.9 M on 4 ranks: at its
peak (backward) up to ``max_in_flight + 1`` bucket buffers are alive; counting them
(``labs/03_zero/layout_zero.py``) gives 0.90-1.07 (below 1 where a reduce-scatter finished
before the next bucket filled).
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAYOUTS = ("ddp", "zero2", "fsdp", "tp")
# accounting.memory layout of each train layout (fsdp is ZeRO-3; tp: one replica of a slice)
STATE_LAYOUT = {"ddp": "ddp", "zero2": "zero2", "fsdp": "zero3", "tp": "ddp"}
# (d_model, n_layer): vocab 256, seq 32, head width 32, ffn 4 d (shardlab.models "bench")
SIZES: dict[str, tuple[int, int]] = {"s": (128, 4), "m": (256, 4), "l": (512, 4)}
BATCH = 8  # global sequences per step
NAME = "scaling_sweep"


def shape(size: str):
    """The ``accounting.compute.ModelShape`` of a sweep size (GPT-style, as ``shardlab train``)."""
    from shardlab.accounting.compute import ModelShape

    d, layers = SIZES[size]
    return ModelShape(layers=layers, hidden=d, heads=d // 32, kv_heads=d // 32, ffn=4 * d,
                      vocab=256, seq_len=32, gated=False, norm="layernorm")


@functools.cache
def n_params(size: str) -> int:
    """Parameters of the whole model (built on the meta device: no memory, no time)."""
    import torch
    from shardlab.models import GPT, GPTConfig

    with torch.device("meta"):
        model = GPT(GPTConfig.from_shape(shape(size)), seed=0)
    return sum(p.numel() for p in model.parameters())


def bucket_mb(size: str) -> float:
    """About four buckets of fp32 gradients (at least 1 MB), as benchmark_zero.py does."""
    return max(1.0, round(4 * n_params(size) / 4 / 1e6, 1))


@functools.cache
def _spec_class():
    from shardlab.train.spec import TrainSpec

    @dataclass(frozen=True)
    class SweepSpec(TrainSpec):
        """A ``TrainSpec`` whose model is a sweep size instead of a ``MODELS`` name."""

        size: str = "s"

        @property
        def shape(self):
            return shape(self.size)

    return SweepSpec


def make_spec(layout: str, size: str, ranks: int, steps: int, bucket: float | None = None):
    """The run's spec (checked in the caller too: bad sizes fail before any rank starts);
    ``bucket``: MB per gradient bucket (default :func:`bucket_mb`)."""
    from shardlab.train.spec import resolve_modules

    modules, source, labs = resolve_modules(layout, labs=str(ROOT / "labs"))
    return _spec_class()(
        layout, ranks=ranks, steps=steps + 2, batch=BATCH,
        bucket_mb=bucket_mb(size) if bucket is None else bucket,
        threads=1, modules=modules, module_source=source, labs_dir=str(labs), size=size,
    )


def rank_run(layout: str, size: str, ranks: int, steps: int, bucket: float | None = None):
    """Rank function: ``shardlab.train.rank.run_rank`` of the sweep spec; this rank's row."""
    from shardlab.train.rank import run_rank

    return run_rank(make_spec(layout, size, ranks, steps, bucket))


def measure(layout: str, size: str, ranks: int, steps: int = 3, bucket: float | None = None,
            raw: bool = False) -> dict:
    """One launch: the sweep's row for ``(layout, size, ranks)`` (``raw``: with every rank's
    ``run_rank`` row under ``"ranks_raw"``, not JSON-clean)."""
    from shardlab.accounting import memory
    from shardlab.runtime import launch
    from shardlab.train.report import summarize
    from shardlab.train.spec import CPU_PEAK_TFLOPS

    spec = make_spec(layout, size, ranks, steps, bucket)
    t0 = time.perf_counter()
    rows = launch("sweep_scaling:rank_run", ranks, layout, size, ranks, steps, bucket,
                  quiet=True, timeout=600)
    wall = time.perf_counter() - t0
    rep = summarize(spec, rows, CPU_PEAK_TFLOPS, "tools/sweep_scaling.py")["rows"]
    big = max(range(ranks), key=lambda r: rows[r]["peak_measured"])
    worst = max((r["peak_measured"] / r["peak_predicted"] for r in rows),
                key=lambda x: abs(x - 1))
    held = rows[big]["params_held"]  # a shard for zero2 / fsdp: N_pad / D
    n_state = held * ranks if layout in ("zero2", "fsdp") else held
    d = 1 if layout == "tp" else ranks
    state = memory.model_state(n_state, d, STATE_LAYOUT[layout], "fp32").total
    out = {
        "layout": layout,
        "size": size,
        "n_params": n_params(size),
        "ranks": ranks,
        "step_s": max(r["step_time_s"]["measured"] for r in rep),
        "step_s_predicted": max(r["step_time_s"]["predicted"] for r in rep),
        "peak_bytes_measured": rows[big]["peak_measured"],
        "peak_bytes_predicted": rows[big]["peak_predicted"],
        "peak_ratio_worst": worst,
        "state_bytes_predicted": state,
        "sent_bytes_measured": max(r["bytes_total"]["measured"] for r in rep),
        "sent_bytes_predicted": max(r["bytes_total"]["predicted"] for r in rep),
        "params_held": held,
        "bucket_mb": spec.bucket_mb,
        "launch_s": wall,
    }
    if raw:
        out["ranks_raw"] = rows
    return out


# ------------------------------------------------------------------ text and figure
def _rows(data, layout: str) -> list[dict]:
    if isinstance(data, (str, Path)):
        data = json.loads(Path(data).read_text())
    rows = data["per_launch"] if isinstance(data, dict) else data
    return sorted((r for r in rows if r["layout"] == layout),
                  key=lambda r: (r["ranks"], r["n_params"]))


def table(data, layout: str) -> str:
    """One layout's rows as text: size, parameters, ranks, step, peak measured / predicted,
    model state predicted, bytes sent measured / predicted (per rank)."""
    head = (f"{'size':>4} {'params':>7} {'ranks':>5} {'step ms':>8} {'peak MB':>8} "
            f"{'pred MB':>8} {'ratio':>6} {'state MB':>8} {'sent MB':>8} {'pred MB':>8}")
    lines = [f"{layout}", head]
    for r in sorted(_rows(data, layout), key=lambda r: (r["n_params"], r["ranks"])):
        lines.append(
            f"{r['size']:>4} {r['n_params'] / 1e6:6.2f}M {r['ranks']:>5} "
            f"{r['step_s'] * 1e3:8.1f} {r['peak_bytes_measured'] / 1e6:8.2f} "
            f"{r['peak_bytes_predicted'] / 1e6:8.2f} "
            f"{r['peak_bytes_measured'] / r['peak_bytes_predicted']:6.3f} "
            f"{r['state_bytes_predicted'] / 1e6:8.2f} "
            f"{r.get('sent_bytes_measured', float('nan')) / 1e6:8.2f} "
            f"{r['sent_bytes_predicted'] / 1e6:8.2f}"
        )
    return "\n".join(lines)


def markdown(data, layout: str) -> str:
    """One layout's rows as a Markdown table for the book (per rank; MB = 10^6 bytes)."""
    lines = [
        "| parameters | ranks | step (ms) | predicted step (ms) | peak (MB) | predicted peak (MB) "
        "| measured / predicted | model state (MB) | sent = predicted (MB) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in sorted(_rows(data, layout), key=lambda r: (r["n_params"], r["ranks"])):
        sent = r["sent_bytes_measured"]
        same = "yes" if sent == r["sent_bytes_predicted"] else f"no ({r['sent_bytes_predicted']:,})"
        lines.append(
            f"| {r['n_params'] / 1e6:.2f} M | {r['ranks']} | {r['step_s'] * 1e3:.0f} "
            f"| {r.get('step_s_predicted', float('nan')) * 1e3:.0f} "
            f"| {r['peak_bytes_measured'] / 1e6:.1f} | {r['peak_bytes_predicted'] / 1e6:.1f} "
            f"| {r['peak_bytes_measured'] / r['peak_bytes_predicted']:.3f} "
            f"| {r['state_bytes_predicted'] / 1e6:.1f} | {sent / 1e6:.2f}: {same} |"
        )
    return "\n".join(lines)


def render(data, layout: str):
    """Log-log step time and peak bytes per rank against parameter count for one layout: one
    colour per rank count, measured as markers, predicted as dashed lines (step: the report's
    ``compute + bytes / beta``; peak: the runner's prediction; dotted: model state alone)."""
    from matplotlib.figure import Figure

    rows = _rows(data, layout)
    fig = Figure(figsize=(9, 3.6), layout="constrained")
    ax_t, ax_m = fig.subplots(1, 2)
    for i, ranks in enumerate(sorted({r["ranks"] for r in rows})):
        rs = [r for r in rows if r["ranks"] == ranks]
        x = [r["n_params"] for r in rs]
        c = f"C{i}"
        ax_t.plot(x, [r["step_s"] for r in rs], "o", color=c, label=f"{ranks} rank(s)")
        if all("step_s_predicted" in r for r in rs):
            ax_t.plot(x, [r["step_s_predicted"] for r in rs], "--", color=c)
        ax_m.plot(x, [r["peak_bytes_measured"] for r in rs], "o", color=c,
                  label=f"{ranks} rank(s)")
        ax_m.plot(x, [r["peak_bytes_predicted"] for r in rs], "--", color=c)
        ax_m.plot(x, [r["state_bytes_predicted"] for r in rs], ":", color=c)
    for ax, what in ((ax_t, "step time (s), slowest rank"), (ax_m, "peak bytes per rank")):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("parameters")
        ax.set_ylabel(what)
        ax.grid(True, which="both", alpha=0.3)
    for style, what in (("ko", "measured"), ("k--", "predicted"), ("k:", "model state")):
        ax_m.plot([], [], style, label=what)
    ax_t.set_title(f"{layout}: step time")
    ax_m.set_title(f"{layout}: peak per rank")
    ax_t.legend(fontsize=8)
    ax_m.legend(fontsize=8)
    return fig


# ------------------------------------------------------------------ command line
def main(argv: list[str] | None = None) -> list[dict]:
    from shardlab.benchresults import add_arguments, load_average, write_results

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layouts", nargs="+", choices=LAYOUTS, default=list(LAYOUTS))
    ap.add_argument("--ranks", nargs="+", type=int, default=[1, 2, 4])
    ap.add_argument("--sizes", nargs="+", choices=list(SIZES), default=list(SIZES))
    ap.add_argument("--steps", type=int, default=3, help="timed steps after the 2 traced ones")
    ap.add_argument("--bucket-mb", type=float, default=None,
                    help="MB per gradient bucket (default: about a quarter of the gradients)")
    add_arguments(ap, launches=None)
    ap.add_argument("--quick", action="store_true",
                    help="smallest size, 1 timed step, ranks 1 and 2 (the test)")
    a = ap.parse_args(argv)
    if a.quick:
        a.sizes, a.steps, a.ranks = [min(SIZES, key=lambda s: SIZES[s])], 1, [1, 2]
    if a.steps < 1 or any(r < 1 for r in a.ranks) or (a.bucket_mb is not None
                                                       and not a.bucket_mb > 0):
        ap.error("--steps, --ranks and --bucket-mb must be positive")
    for layout in a.layouts:  # bad combinations fail here, before any rank starts
        for size in a.sizes:
            for ranks in a.ranks:
                try:
                    make_spec(layout, size, ranks, a.steps, a.bucket_mb)
                except ValueError as exc:
                    ap.error(str(exc))
    before = load_average()
    t0 = time.perf_counter()
    out = []
    for layout in a.layouts:
        for size in a.sizes:
            for ranks in a.ranks:
                out.append(measure(layout, size, ranks, a.steps, a.bucket_mb))
                r = out[-1]
                print(f"{layout:>5} {size} {r['n_params']:>10,d} params {ranks} ranks: step "
                      f"{r['step_s'] * 1e3:7.1f} ms, peak {r['peak_bytes_measured']:>12,d} / "
                      f"predicted {r['peak_bytes_predicted']:>14,.0f} "
                      f"({r['peak_ratio_worst']:.3f}), launch {r['launch_s']:.1f} s", flush=True)
    total = time.perf_counter() - t0
    print()
    for layout in a.layouts:
        print(table(out, layout))
        print()
    print(f"sweep: {len(out)} launches in {total:.0f} s; 1-minute load before {before[:1]}")
    if a.save:
        path = write_results(
            NAME, out, benchmark="tools/sweep_scaling.py",
            config={"layouts": a.layouts, "ranks": a.ranks,
                    "sizes": {s: dict(zip(("d_model", "n_layer"), SIZES[s])) for s in a.sizes},
                    "steps": a.steps, "batch": BATCH,
                    "bucket_mb": a.bucket_mb or "bucket_mb(size): about N/4 fp32 gradients",
                    "threads_per_rank": 1,
                    "backend": "gloo", "sweep_s": round(total, 1),
                    "step_prediction": "shardlab.train.report.summarize: 0.1 TFLOP/s per "
                                       "rank, efficiency 0.5, 1 GB/s"},
            load_before=before, directory=a.results_dir,
        )
        print(f"wrote {path}")
    return out


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import sweep_scaling  # the ranks import this module by name, so run it under that name

    sweep_scaling.main()
