"""Arguments of the ``shardlab`` calculator subcommands (memory, activations, comm, bubble, mesh, plan).

:func:`add_calculator_parsers` adds one sub-parser per calculator to the command line built
by :func:`shardlab.cli.build_parser`; every option names its unit and default in its help.
"""

from __future__ import annotations

import argparse

from shardlab._cli_commands import _activations, _add_json, _bubble, _comm, _memory, _mesh, _number
from shardlab._cli_plan import add_plan_parser


def add_calculator_parsers(sub: argparse._SubParsersAction) -> None:
    """Add the memory, activations, comm, bubble and mesh sub-parsers to ``sub``."""
    from shardlab.accounting.memory import LAYOUTS, RECIPES

    p = sub.add_parser(
        "memory",
        help="persistent model state per rank for DDP / ZeRO-1/2/3",
        description="Per-rank model-state bytes (weights, gradients, master weights, Adam "
        "moments, accumulation buffer) for each layout; totals in decimal GB (10^9 bytes) "
        "and GiB (2^30 bytes).",
    )
    p.add_argument(
        "--params",
        type=_number,
        required=True,
        metavar="N",
        help="number of model parameters N (a count; 7e9 accepted)",
    )
    p.add_argument(
        "--dp",
        type=_number,
        default=8,
        metavar="D",
        help="data-parallel degree D (ranks; default 8)",
    )
    p.add_argument(
        "--recipe",
        default="mixed-adam-16",
        choices=[*RECIPES, "custom"],
        help="precision recipe (bytes per parameter per object; default "
        "mixed-adam-16). 'custom' starts from mixed-adam-16; override objects "
        "with the options below",
    )
    p.add_argument(
        "--layout",
        default="all",
        choices=["all", *LAYOUTS],
        help="show one layout or all (default all)",
    )
    for obj in ("weights", "grads", "master", "moment1", "moment2", "grad_accum"):
        p.add_argument(
            f"--{obj.replace('_', '-')}",
            dest=obj,
            type=_number,
            metavar="BYTES",
            help=f"override {obj} bytes per parameter (makes the recipe custom)",
        )
    _add_json(p)
    p.set_defaults(func=_memory)

    # activations -------------------------------------------------------------
    p = sub.add_parser(
        "activations",
        help="saved activation bytes per layer (Korthikanti et al.) for every mode",
        description="Saved-activation bytes per layer and per L layers for no parallelism, "
        "TP, TP+SP, TP+SP+selective recompute and full recompute; bytes, MiB (2^20 bytes), "
        "GiB (2^30 bytes).",
    )
    p.add_argument(
        "--s", type=_number, default=2048, help="sequence length s (tokens; default 2048)"
    )
    p.add_argument("--b", type=_number, default=1, help="microbatch size b (sequences; default 1)")
    p.add_argument(
        "--h", type=_number, default=4096, help="hidden width h (elements; default 4096)"
    )
    p.add_argument("--a", type=_number, default=32, help="attention heads a (count; default 32)")
    p.add_argument(
        "--t", type=_number, default=1, help="tensor-parallel degree t (ranks; default 1)"
    )
    p.add_argument(
        "--layers",
        type=_number,
        default=1,
        metavar="L",
        help="number of transformer layers L (count; default 1)",
    )
    _add_json(p)
    p.set_defaults(func=_activations)

    # comm --------------------------------------------------------------------
    from shardlab.accounting.comm import ALGOS, COLLECTIVES, STEP_LAYOUTS

    p = sub.add_parser(
        "comm",
        help="collective cost under the α–β model, or per-step volume of a DP layout",
        description="Without --layout/--params: per-rank sent bytes, rounds and α–β time "
        "T = rounds·α + bytes/β of every collective (ring and tree), --op highlighted. "
        "With --layout/--params: per-rank sent bytes per optimizer step of DDP and "
        "ZeRO-1/2/3.",
    )
    p.add_argument(
        "--op",
        default=None,
        choices=COLLECTIVES,
        help="collective to highlight (default all_reduce)",
    )
    p.add_argument(
        "--bytes",
        type=_number,
        default=None,
        metavar="V",
        help="full tensor size V in bytes (all-gather output, reduce-scatter input, "
        "all-reduce tensor; default 1e9)",
    )
    p.add_argument(
        "--ranks", type=_number, default=8, metavar="D", help="group size D (ranks; default 8)"
    )
    p.add_argument(
        "--alpha-us",
        type=_number,
        default=None,
        metavar="US",
        help="latency α per round in microseconds (default 5)",
    )
    p.add_argument(
        "--beta-gbps",
        type=_number,
        default=None,
        metavar="GBPS",
        help="bandwidth β in GB/s, 10^9 bytes per second (default 100)",
    )
    p.add_argument(
        "--algo",
        default=None,
        choices=ALGOS,
        help="algorithm for the summary line (default ring; the table shows both)",
    )
    p.add_argument(
        "--layout",
        choices=STEP_LAYOUTS,
        default=None,
        help="data-parallel layout to highlight in the per-step volume table",
    )
    p.add_argument(
        "--params",
        type=_number,
        default=None,
        metavar="N",
        help="number of parameters N (a count; selects the per-step volume table)",
    )
    p.add_argument(
        "--dp",
        type=_number,
        default=None,
        metavar="D",
        help="data-parallel degree D (ranks; default --ranks)",
    )
    p.add_argument(
        "--q",
        type=_number,
        default=None,
        metavar="BYTES",
        help="bytes per communicated element q (default 2, bf16)",
    )
    p.add_argument(
        "--microbatches",
        type=_number,
        default=None,
        metavar="M",
        help="accumulated microbatches per optimizer update (count; default 1)",
    )
    p.add_argument(
        "--no-sync",
        action="store_true",
        help="reduce gradients once per update instead of every microbatch",
    )
    _add_json(p)
    p.set_defaults(func=_comm)

    # bubble ------------------------------------------------------------------
    from shardlab.widgets.pipeline import SCHEDULE_CHOICES

    p = sub.add_parser(
        "bubble",
        help="pipeline bubble fractions and a simulated schedule",
        description="Closed-form bubble/useful ratio, idle fraction and utilization, and "
        "the simulated makespan, per-stage idle time and peak in-flight microbatches of "
        "the generated schedule. Costs are in arbitrary time units (one forward = 1).",
    )
    p.add_argument(
        "--stages", type=_number, required=True, metavar="P", help="pipeline stages p (ranks)"
    )
    p.add_argument(
        "--microbatches",
        type=_number,
        required=True,
        metavar="M",
        help="microbatches m per step (count)",
    )
    p.add_argument(
        "--schedule",
        default="1f1b",
        metavar="KIND",
        help=f"schedule to simulate: {', '.join(SCHEDULE_CHOICES)} (default 1f1b; --chunks > 1 "
        "needs interleaved, zbv and dualpipev need --chunks 2); checked by accounting.pipeline.check_kind",
    )
    p.add_argument(
        "--chunks",
        type=_number,
        default=1,
        metavar="V",
        help="model chunks v per rank for interleaving (count; default 1)",
    )
    for kind, default, what in (
        ("f", 1, "one forward"),
        ("b", 2, "one full backward"),
        ("bi", 1, "an input-gradient backward, zero-bubble"),
        ("bw", 1, "a weight-gradient backward, zero-bubble"),
    ):
        p.add_argument(
            f"--cost-{kind}",
            type=_number,
            default=None,
            metavar="T",
            help=f"time of {what} (time units; default {default})",
        )
    _add_json(p)
    p.set_defaults(func=_bubble)

    # mesh --------------------------------------------------------------------
    p = sub.add_parser(
        "mesh",
        help="device mesh G = dp·tp·pp·cp: checks, rank coordinates and groups",
        description="Checks G = D·t·p·c, lists the process groups per axis (tp innermost) and "
        "looks up a rank's coordinates and group members.",
    )
    p.add_argument(
        "--gpus",
        type=_number,
        required=True,
        metavar="G",
        help="total number of GPUs / ranks G (count)",
    )
    p.add_argument(
        "--tp", type=_number, default=1, help="tensor-parallel degree t (ranks; default 1)"
    )
    p.add_argument(
        "--cp", type=_number, default=1, help="context-parallel degree c (ranks; default 1)"
    )
    p.add_argument(
        "--pp", type=_number, default=1, help="pipeline-parallel degree p (ranks; default 1)"
    )
    p.add_argument(
        "--dp", type=_number, default=None, help="data-parallel degree D (ranks; default G/(t·c·p))"
    )
    p.add_argument("--rank", type=_number, default=None, help="global rank to look up (0 .. G-1)")
    p.add_argument(
        "--ep",
        type=_number,
        default=None,
        help="MoE expert-parallel degree for parallel folding (ranks; optional)",
    )
    p.add_argument(
        "--etp",
        type=_number,
        default=None,
        help="MoE expert tensor-parallel degree for folding (ranks; default 1)",
    )
    _add_json(p)
    p.set_defaults(func=_mesh)

    add_plan_parser(sub)


def add_train_parser(sub: argparse._SubParsersAction) -> None:
    """``shardlab train``: a lab's layout on real ranks, measured vs predicted (shardlab.train)."""
    from shardlab._cli_commands import _train
    from shardlab.train.spec import CPU_PEAK_TFLOPS, CUDA_PEAK_TFLOPS, LAYOUTS, MODELS

    p = sub.add_parser(
        "train",
        help="train a lab's layout on N ranks; measured vs predicted memory, bytes, time, MFU",
        description="Trains the model with the labs' implementation of --layout on N ranks "
        "(shardlab's launcher here, or each process of a torchrun / Slurm job) and prints per "
        "rank the measured peak memory, bytes sent, step time, tokens/s and MFU next to "
        "shardlab.accounting's prediction. Uses the student's module when the current "
        "directory holds one of the same name (or --module / --from-cwd).",
    )
    p.add_argument("--layout", required=True, metavar="L",
                   help=f"one of {', '.join(LAYOUTS)}")
    p.add_argument("--model", default="tiny", metavar="M",
                   help=f"model shape, one of {', '.join(MODELS)} (default tiny)")
    p.add_argument("--ranks", type=_number, default=None, metavar="N",
                   help="ranks to start (default 2, 4 for fsdp+tp; under torchrun: WORLD_SIZE)")
    p.add_argument("--steps", type=_number, default=10, metavar="S",
                   help="training steps, at least 2 (default 10)")
    p.add_argument("--batch", type=_number, default=8, metavar="B",
                   help="global batch in sequences per step (default 8)")
    p.add_argument("--seq", type=_number, default=None, metavar="S",
                   help="sequence length in tokens (default: the model's)")
    p.add_argument("--tp", type=_number, default=None, metavar="T",
                   help="tensor-parallel degree of fsdp+tp (default 2; tp uses every rank)")
    p.add_argument("--microbatches", type=_number, default=None, metavar="M",
                   help="pipeline microbatches per step, pp only (default: the ranks)")
    p.add_argument("--schedule", default=None, choices=["1f1b", "gpipe"],
                   help="pipeline schedule, pp only (default 1f1b)")
    p.add_argument("--bucket-mb", type=_number, default=25.0, metavar="MB",
                   help="bucket size of ddp/zero1/zero2 in MB (default 25)")
    p.add_argument("--threads", type=_number, default=None, metavar="K",
                   help="intra-op threads per rank (default: cores / ranks on this machine)")
    p.add_argument("--peak-tflops", type=_number, default=None, metavar="TF",
                   help="peak FLOP rate per rank for MFU, TFLOP/s (default "
                   f"{CPU_PEAK_TFLOPS:g} on CPU, {CUDA_PEAK_TFLOPS:g} on CUDA: fp32)")
    p.add_argument("--efficiency", type=_number, default=0.5, metavar="E",
                   help="achievable fraction of the peak for the predicted time (default 0.5)")
    p.add_argument("--beta-gbps", type=_number, default=1.0, metavar="GBPS",
                   help="link bandwidth for the predicted time, GB/s (default 1: loopback gloo)")
    p.add_argument("--module", default=None, metavar="PATH",
                   help="the student's module file (replaces the layout's main module) or a "
                   "folder of the layout's module files")
    p.add_argument("--from-cwd", action="store_true",
                   help="use the current directory's module(s) of the layout's file names")
    p.add_argument("--labs", default=None, metavar="PATH",
                   help="the labs/ folder (default: found above the current directory or "
                   "next to the package)")
    p.add_argument("--profile", default=None, metavar="DIR",
                   help="record a torch.profiler trace of the last steps (up to 3, after a "
                   "warm-up step) into DIR, one Chrome/Perfetto JSON file per rank")
    p.add_argument("--timeout", type=_number, default=900, metavar="S",
                   help="seconds before the launcher stops the ranks (default 900)")
    _add_json(p)
    p.set_defaults(func=_train)
