"""The calculator subcommands of the ``shardlab`` command line: argument types and handlers.

Each handler takes the parsed arguments and returns the :class:`~shardlab.widgets._common.Report`
of the same ``shardlab.widgets.*_report`` function the widgets render; :mod:`shardlab.cli`
prints it as a table or JSON. The arguments themselves are declared in
:mod:`shardlab._cli_parsers`.
"""

from __future__ import annotations

import argparse


def _number(text: str) -> int | float:
    """Accept ``7e9``, ``7_000_000_000``, ``1.5``; integral values become int."""
    from shardlab.widgets._common import parse_number

    try:
        return parse_number("value", text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None


def _bool(text: str) -> bool:
    t = text.strip().lower()
    if t in ("1", "true", "yes", "on"):
        return True
    if t in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"{text!r} is not true/false")


def _add_json(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--json", action="store_true", help="print the numbers as JSON (for scripts) instead"
    )


# --------------------------------------------------------------------------- subcommands


def _memory(args: argparse.Namespace):
    from shardlab.widgets.memory import memory_report

    custom = {
        o: getattr(args, o)
        for o in ("weights", "grads", "master", "moment1", "moment2", "grad_accum")
        if getattr(args, o) is not None
    }
    return memory_report(args.params, args.dp, args.recipe, args.layout, custom or None)


def _activations(args: argparse.Namespace):
    from shardlab.widgets.activations import activations_report

    return activations_report(args.s, args.b, args.h, args.a, args.t, args.layers)


def _comm(args: argparse.Namespace):
    from shardlab.widgets.comm import comm_report, step_report

    if args.layout is not None or args.params is not None:
        if args.params is None:
            raise ValueError("--layout needs --params (number of parameters N)")
        return step_report(
            args.params,
            args.dp if args.dp is not None else args.ranks,
            args.q,
            args.layout,
            args.microbatches,
            not args.no_sync,
        )
    return comm_report(args.op, args.bytes, args.ranks, args.alpha_us, args.beta_gbps, args.algo)


def _bubble(args: argparse.Namespace):
    from shardlab.widgets.pipeline import pipeline_report

    return pipeline_report(
        args.schedule,
        args.stages,
        args.microbatches,
        args.chunks,
        costs={"F": args.cost_f, "B": args.cost_b, "BI": args.cost_bi, "BW": args.cost_bw},
    )


def _mesh(args: argparse.Namespace):
    from shardlab.widgets.mesh import mesh_report

    return mesh_report(
        args.gpus, args.dp, args.tp, args.pp, args.cp, rank=args.rank, ep=args.ep, etp=args.etp
    )


def _plan(args: argparse.Namespace):
    from shardlab.widgets.planner import PRESETS, planner_report

    kwargs = dict(PRESETS[args.preset])
    for name in PLAN_OPTIONS:
        value = getattr(args, name)
        if value is not None:
            kwargs[name] = value
    return planner_report(**kwargs)


# planner_report's arguments that `shardlab plan` exposes (flag = name with - for _)
PLAN_OPTIONS = (
    "layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "seq_len", "global_batch", "gpus",
    "gpu_memory_gb", "gpus_per_node", "alpha_intra_us", "beta_intra_gbps", "alpha_inter_us",
    "beta_inter_gbps", "peak_tflops", "efficiency", "reserve", "max_bubble", "microbatch",
    "recipe", "gated", "dropout", "norm", "experts", "top_k", "top", "mark",
)  # fmt: skip


def _train(args: argparse.Namespace) -> int:
    """``shardlab train``: validate everything before any rank starts, then run."""
    import os

    from shardlab.train.main import run, under_torchrun
    from shardlab.train.spec import LAYOUTS, TrainSpec, resolve_modules

    if args.layout not in LAYOUTS:
        raise ValueError(f"layout={args.layout!r} is not one of {', '.join(LAYOUTS)}.")
    ranks = args.ranks
    if under_torchrun():
        world = int(os.environ["WORLD_SIZE"])
        if ranks is not None and ranks != world:
            raise ValueError(f"--ranks {ranks} but torchrun started WORLD_SIZE={world} ranks.")
        ranks = world
    modules, source, labs = resolve_modules(args.layout, args.module, args.from_cwd, args.labs)
    spec = TrainSpec(
        layout=args.layout, model=args.model, ranks=ranks, steps=args.steps, batch=args.batch,
        seq=args.seq, tp=args.tp, microbatches=args.microbatches, schedule=args.schedule,
        bucket_mb=args.bucket_mb, threads=args.threads, peak_tflops=args.peak_tflops,
        efficiency=args.efficiency, beta_gbps=args.beta_gbps, modules=modules,
        module_source=source, labs_dir=str(labs),
    )  # fmt: skip
    return run(spec, as_json=args.json, timeout=float(args.timeout))
