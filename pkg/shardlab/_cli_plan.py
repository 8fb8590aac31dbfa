"""``shardlab plan``: its arguments and its handler (over :func:`shardlab.widgets.planner.planner_report`).

Options not given come from ``--preset`` (the model and cluster of Llama 3 405B), then from
``--device`` (a GPU's memory, peak and HBM bandwidth from its data sheet), then from the
explicit flags.
"""

from __future__ import annotations

import argparse

from shardlab._cli_commands import _add_json, _number

# planner_report's arguments that `shardlab plan` exposes (flag = name with - for _)
PLAN_OPTIONS = (
    "layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "seq_len", "global_batch", "gpus",
    "gpu_memory_gb", "gpus_per_node", "alpha_intra_us", "beta_intra_gbps", "alpha_inter_us",
    "beta_inter_gbps", "peak_tflops", "hbm_tbps", "efficiency", "reserve", "max_bubble",
    "microbatch", "recipe", "recipe_bytes", "gated", "dropout", "norm", "causal", "sp",
    "tied_embeddings", "embedding_in_split", "hsdp", "offload", "pcie_gbps", "host_gbps",
    "experts", "top_k", "top", "mark",
)


def _plan(args: argparse.Namespace):
    from shardlab.widgets.planner import DEVICE_OPTIONS, PRESETS, planner_report

    kwargs = dict(PRESETS[args.preset])
    if args.device is not None:
        kwargs.update(DEVICE_OPTIONS[args.device])
    for name in PLAN_OPTIONS:
        value = getattr(args, name)
        if value is not None:
            kwargs[name] = value
    tokens = getattr(args, "global_batch_tokens", None)
    if tokens is not None:
        if args.global_batch is not None:
            raise ValueError("--global-batch and --global-batch-tokens both given; choose one")
        s = kwargs["seq_len"]
        seqs = tokens / s
        if tokens <= 0 or not float(seqs).is_integer():
            raise ValueError(f"--global-batch-tokens {tokens:,.0f} is not a whole number of "
                             f"sequences of s={s:,} tokens")
        kwargs["global_batch"] = int(seqs)
    if args.recipe_bytes is not None and args.recipe is not None:
        raise ValueError("--recipe and --recipe-bytes both given; choose one")
    return planner_report(**kwargs)


def add_plan_parser(sub: argparse._SubParsersAction) -> None:
    """``shardlab plan``: rank layouts of a model on a cluster (accounting.planner)."""
    from shardlab.accounting.gemm import DEFAULT_CAP, DEVICES
    from shardlab.accounting.memory import RECIPES
    from shardlab.accounting.planner import DEFAULT_RESERVE
    from shardlab.widgets.planner import PRESETS, SP_CHOICES

    p = sub.add_parser(
        "plan",
        help="rank layouts (D, t, p, c, ep, ZeRO, recompute, m, v, SP) of a model on a cluster",
        description="Checks every layout of the model on the cluster (every divisor of G for "
        "t, c and p; above 10,000 layouts a bounded search whose first 50 ranks are those of "
        "the full search) and ranks the feasible ones by predicted step time, with per-rank peak "
        "memory by term (GB = 10^9 bytes), communication time per axis and its hidden share, "
        "MFU and HFU; rejected layouts are counted by reason. Each GEMM runs at the efficiency "
        "its arithmetic intensity allows against the GPU's FLOP/byte ridge, capped by "
        "--efficiency. Options not given come from --preset, then --device.",
    )
    p.add_argument(
        "--preset",
        default="llama3-405b-8k",
        choices=list(PRESETS),
        help="starting values: Llama 3 405B at 8K or 128K context on 16,384 GPUs of 80 GB, "
        "its mesh marked (default llama3-405b-8k)",
    )
    p.add_argument(
        "--device", choices=list(DEVICES), default=None,
        help="GPU data-sheet values: memory (GB), dense bf16 peak (TFLOP/s) and HBM bandwidth "
        "(TB/s) of " + ", ".join(f"{k} ({d.name})" for k, d in DEVICES.items())
        + " (default: the preset's H100)",
    )
    for flag, metavar, what in (
        ("layers", "L", "transformer layers L (count)"),
        ("hidden", "H", "hidden width h (elements)"),
        ("heads", "A", "attention (query) heads (count)"),
        ("kv-heads", "K", "key/value heads (count; = heads without grouped-query attention)"),
        ("ffn", "F", "MLP width f (elements)"),
        ("vocab", "V", "vocabulary size (tokens)"),
        ("seq-len", "S", "sequence length s (tokens)"),
        ("global-batch", "B", "global batch (sequences per optimizer step)"),
        ("global-batch-tokens", "T", "global batch in tokens (microbatch x accumulation x "
         "data-parallel ranks x sequence length); replaces --global-batch, must be a multiple "
         "of the sequence length"),
        ("gpus", "G", "number of GPUs G (count)"),
        ("gpu-memory-gb", "GB", "memory per GPU (GB, 10^9 bytes)"),
        ("gpus-per-node", "N", "GPUs per node, the fast-link domain (count)"),
        ("alpha-intra-us", "US", "latency α inside a node (microseconds per round)"),
        ("beta-intra-gbps", "GBPS", "bandwidth β inside a node (GB/s per GPU, 10^9 bytes/s)"),
        ("alpha-inter-us", "US", "latency α across nodes (microseconds per round)"),
        ("beta-inter-gbps", "GBPS", "bandwidth β across nodes (GB/s per GPU, 10^9 bytes/s)"),
        ("peak-tflops", "TF", "peak dense FLOP rate per GPU (TFLOP/s, 10^12 FLOP/s)"),
        ("hbm-tbps", "TBPS", "HBM bandwidth per GPU for the GEMM roofline (TB/s, 10^12 "
         "bytes/s; 0 = every GEMM at --efficiency)"),
        ("efficiency", "E", f"cap: fraction of the peak the largest GEMMs reach (0-1; default "
         f"{DEFAULT_CAP})"),
        ("reserve", "R", f"fraction of GPU memory kept free (0-1; default {DEFAULT_RESERVE})"),
        ("max-bubble", "X", "largest pipeline idle fraction accepted (0-1; default 0.25)"),
        ("microbatch", "B", "sequences per microbatch b (count; default 1)"),
        ("experts", "E", "MoE experts per layer (count; default 1 = dense)"),
        ("top-k", "K", "experts per token (count; default 1)"),
        ("top", "N", "feasible layouts to show (count; default 10)"),
    ):
        p.add_argument(f"--{flag}", type=_number, default=None, metavar=metavar, help=what)
    p.add_argument(
        "--recipe", choices=list(RECIPES), default=None,
        help="precision recipe, bytes per parameter (default mixed-adam-16)",
    )
    p.add_argument(
        "--recipe-bytes", default=None, metavar="W,G,M,M1,M2",
        help="a recipe not in the list: bytes per parameter of weights, gradients, master "
        "weights, first and second moments, e.g. 2,4,4,4,4",
    )
    p.add_argument(
        "--gated", action=argparse.BooleanOptionalAction, default=None,
        help="gated (SwiGLU, 3 matrices) MLP, or --no-gated for a GeLU MLP (default gated)",
    )
    p.add_argument(
        "--dropout", action=argparse.BooleanOptionalAction, default=None,
        help="dropout in the layer (saved masks; default off, as in Llama)",
    )
    p.add_argument(
        "--norm", choices=["rmsnorm", "layernorm"], default=None,
        help="normalisation layer (default rmsnorm)",
    )
    p.add_argument(
        "--causal", action=argparse.BooleanOptionalAction, default=None,
        help="causal attention skips the masked half of the scores (default); --no-causal "
        "computes and counts the full score matrix. The memory model assumes a kernel that "
        "materializes the scores",
    )
    p.add_argument(
        "--sp", choices=list(SP_CHOICES), default=None,
        help="sequence parallelism: auto (on where t divides s/c; default), on, off",
    )
    p.add_argument(
        "--tied-embeddings", action=argparse.BooleanOptionalAction, default=None,
        help="output head shares the embedding (under pipelining the last stage keeps a copy; "
        "default untied)",
    )
    p.add_argument(
        "--embedding-in-split", action=argparse.BooleanOptionalAction, default=None,
        help="count the embedding and the output head as one layer each when splitting the "
        "layers into pipeline stages (the first and last stage hold one layer fewer; default "
        "off)",
    )
    p.add_argument(
        "--hsdp", action=argparse.BooleanOptionalAction, default=None,
        help="also rank hybrid-sharded layouts (ZeRO-1/2/3 sharded over part of the data axis, "
        "replicated over the rest; default on)",
    )
    p.add_argument(
        "--offload", action=argparse.BooleanOptionalAction, default=None,
        help="ZeRO-Offload: ZeRO-1/2 layouts keep master weights and Adam moments on the host "
        "(off the GPU's peak) and pay PCIe transfers and a host-speed update each step "
        "(default off)",
    )
    p.add_argument("--pcie-gbps", type=_number, default=None,
                   help="GB/s each way between a GPU and its host, for --offload (default 25)")
    p.add_argument("--host-gbps", type=_number, default=None,
                   help="GB/s of host memory the offloaded update streams (default 100)")
    p.add_argument(
        "--mark", default=None, metavar="FIELDS",
        help="layouts to locate in the ranking, e.g. 't=8,c=1,p=16,D=128' (fields D t p c ep "
        "zero recompute m v sp reshard replicas, sp/reshard on or off; several separated by ';'; default: "
        "the preset's Llama 3 mesh)",
    )
    _add_json(p)
    p.set_defaults(func=_plan)
