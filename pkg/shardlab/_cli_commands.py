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


# comm's options per mode, with their defaults (None in the parser: given or not is known)
COLLECTIVE_OPTIONS = {"op": "all_reduce", "bytes": 1e9, "alpha_us": 5.0, "beta_gbps": 100.0,
                      "algo": "ring"}
STEP_OPTIONS = {"dp": None, "q": 2, "microbatches": 1, "no_sync": False}


def _given(args: argparse.Namespace, names) -> list[str]:
    """The flags among ``names`` the user gave (``--no-sync`` given means True)."""
    return [f"--{n.replace('_', '-')}" for n in names if getattr(args, n) not in (None, False)]


def _with_defaults(args: argparse.Namespace, defaults: dict) -> dict:
    return {k: d if getattr(args, k) is None else getattr(args, k) for k, d in defaults.items()}


def _refuse(given: list[str], why: str) -> None:
    if given:
        raise ValueError(f"{', '.join(given)} {'applies' if len(given) == 1 else 'apply'} {why}")


def _comm(args: argparse.Namespace):
    """The collective table, or with ``--params`` (or ``--layout``) the per-step volume; the
    options of the other mode are refused, not ignored."""
    from shardlab.widgets.comm import comm_report, step_report

    if args.layout is not None or args.params is not None:
        if args.params is None:
            raise ValueError("--layout needs --params (number of parameters N)")
        _refuse(_given(args, COLLECTIVE_OPTIONS), "to the collective table, without --params.")
        o = _with_defaults(args, STEP_OPTIONS)
        dp = o["dp"] if o["dp"] is not None else args.ranks
        sync = not o["no_sync"]
        return step_report(args.params, dp, o["q"], args.layout, o["microbatches"], sync)
    _refuse(_given(args, STEP_OPTIONS), "to the per-step volume: give --params N as well.")
    o = _with_defaults(args, COLLECTIVE_OPTIONS)
    return comm_report(o["op"], o["bytes"], args.ranks, o["alpha_us"], o["beta_gbps"], o["algo"])


# which of the four action costs each schedule uses (zero-bubble splits the backward)
COSTS_USED = {"gpipe": ("F", "B"), "1f1b": ("F", "B"), "interleaved": ("F", "B"),
              "zb-h1": ("F", "BI", "BW"), "zbv": ("F", "BI", "BW"),
              "dualpipev": ("F", "B", "BI", "BW")}
COST_DEFAULTS = {"F": 1, "B": 2, "BI": 1, "BW": 1}


def _bubble(args: argparse.Namespace):
    from shardlab.widgets.pipeline import pipeline_report

    given = {k: getattr(args, f"cost_{k.lower()}") for k in COST_DEFAULTS}
    used = COSTS_USED.get(args.schedule, tuple(COST_DEFAULTS))
    unused = [f"--cost-{k.lower()}" for k, x in given.items() if x is not None and k not in used]
    _refuse(unused, f"to no action of schedule {args.schedule} (it times {', '.join(used)}).")
    costs = {k: COST_DEFAULTS[k] if x is None else x for k, x in given.items()}
    return pipeline_report(args.schedule, args.stages, args.microbatches, args.chunks, costs=costs)


def _mesh(args: argparse.Namespace):
    from shardlab.widgets.mesh import mesh_report

    if args.etp is not None and args.ep is None:
        raise ValueError(f"--etp {args.etp} applies to MoE folding only: give --ep as well.")
    etp = 1 if args.etp is None else args.etp
    return mesh_report(
        args.gpus, args.dp, args.tp, args.pp, args.cp, rank=args.rank, ep=args.ep, etp=etp
    )


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
        module_source=source, labs_dir=str(labs), profile=args.profile,
    )
    timeout = float(args.timeout)
    if not 0 < timeout <= MAX_TIMEOUT_S:
        raise ValueError(f"--timeout {args.timeout} must be in (0, {MAX_TIMEOUT_S:,}] seconds.")
    return run(spec, as_json=args.json, timeout=timeout)


MAX_TIMEOUT_S = 30 * 86_400  # 30 days: the ranks' process-group timeout must fit a timedelta
