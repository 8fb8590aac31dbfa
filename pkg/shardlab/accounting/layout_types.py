"""The planner's inputs and outputs: :class:`Cluster`, :class:`Layout`, :class:`Candidate`,
:class:`Rejection`, the options of a search, and two small formulas (:func:`inflight_chunks`,
:func:`recompute_scratch`). Split off :mod:`.layout_cost` to keep each module short.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from . import _validate as chk
from . import activations as act
from .compute import Roofline
from .gemm import DEFAULT_CAP
from .memory import Recipe, get_recipe

# planner recompute mode -> accounting.activations mode, with and without sequence parallelism
RECOMPUTE_MODES = {"none": "tp_sp", "selective": "tp_sp_selective", "full": "full_recompute"}
NO_SP_MODES = {"none": "tp", "selective": "tp_selective", "full": "full_recompute"}
ZERO_LAYOUTS = {0: "ddp", 1: "zero1", 2: "zero2", 3: "zero3"}
AXES = ("tp", "cp", "ep", "pp", "dp")
FIELDS = ("D", "t", "p", "c", "ep", "zero", "recompute", "m", "v", "sp", "reshard", "replicas")
# Bounds of one search (larger inputs are refused; within them layout_bound keeps every
# search within a second):
MAX_GPUS = 2**21  # 2,097,152 GPUs: its divisors are found by trial division up to 1,449
MAX_LAYERS = 1024


@dataclass(frozen=True)
class Cluster:
    """GPUs and links: memory in bytes, alpha in s per round, beta in bytes/s per GPU, peak in
    FLOP/s. ``efficiency``: the cap of the per-GEMM model (:mod:`.gemm`), the share of the
    peak the largest products reach; ``hbm_bandwidth`` (bytes/s) turns the roofline on
    (``None``: every product at ``efficiency``, the constant model)."""

    gpus: int
    gpu_memory: float
    gpus_per_node: int
    alpha_intra: float
    beta_intra: float
    alpha_inter: float
    beta_inter: float
    peak_flops: float
    efficiency: float = DEFAULT_CAP
    hbm_bandwidth: float | None = None

    def __post_init__(self) -> None:
        for name in ("gpus", "gpus_per_node"):
            object.__setattr__(self, name, chk.positive_int(name, getattr(self, name)))
        for name in ("gpu_memory", "beta_intra", "beta_inter", "peak_flops", "efficiency"):
            chk.number(name, getattr(self, name))
        chk.nonneg_number("alpha_intra", self.alpha_intra)
        chk.nonneg_number("alpha_inter", self.alpha_inter)
        if self.hbm_bandwidth is not None:
            chk.number("hbm_bandwidth", self.hbm_bandwidth)
        if self.efficiency > 1:
            raise ValueError(f"efficiency={self.efficiency!r} must be in (0, 1]")
        if self.gpus % self.gpus_per_node and self.gpus > self.gpus_per_node:
            raise ValueError(f"gpus_per_node={self.gpus_per_node} does not divide gpus={self.gpus}")

    def link(self, inside: bool) -> tuple[float, float]:
        return (
            (self.alpha_intra, self.beta_intra) if inside else (self.alpha_inter, self.beta_inter)
        )


# The one memory reserve of the book, the planner, the CLI and the calculators: a layout fits
# a GPU when its predicted peak is at most (1 - DEFAULT_RESERVE) of the GPU's memory; the rest
# is kept for what the predictions leave out (kernel workspaces, communication buffers, the
# CUDA context, allocator fragmentation). A GPU's memory is its marketed figure in GB = 10^9
# bytes (an "80 GB" GPU: 80e9), the book's one convention (book/how_to_read.md).
DEFAULT_RESERVE = 0.1

# 16,384 H100s of 80 GB in servers of 8; the book's illustrative alpha-beta pairs; bf16 dense
# peak 989 TFLOP/s and 3.35 TB/s of HBM (accounting.gemm.DEVICES["h100"]).
LLAMA3_CLUSTER = dict(gpus=16384, gpu_memory=80e9, gpus_per_node=8, alpha_intra=3e-6,
                      beta_intra=300e9, alpha_inter=10e-6, beta_inter=50e9, peak_flops=989e12,
                      hbm_bandwidth=3.35e12)


@dataclass(frozen=True)
class Layout:
    """One layout. In a :class:`Rejection`, ``None`` fields mean "every value". ``sp``:
    sequence parallelism on the tensor group (meaningless, and ``True``, when ``t = 1``);
    ``reshard``: ZeRO-3 frees each gathered layer after its forward (``False``: FSDP's
    ``reshard_after_forward=False``, kept until its backward; ``True`` for ZeRO-0/1/2).
    ``replicas``: hybrid sharding (HSDP) when above 1: the ZeRO state is sharded over
    ``D c / replicas`` ranks (a shard group, ``D / replicas`` data ranks and the ``c`` context
    ranks) and replicated ``replicas`` times; the gradient shards are all-reduced across the
    replicas once per step. ``1``: the ZeRO stage shards over all ``D c`` ranks."""

    D: int | None
    t: int
    p: int | None
    c: int | None
    ep: int | None
    zero: int | None
    recompute: str | None
    m: int | None
    v: int | None
    sp: bool | None = True
    reshard: bool | None = True
    replicas: int | None = 1

    @property
    def label(self) -> str:
        def f(x: object) -> str:
            return "*" if x is None else str(x)

        ep = "" if self.ep in (1, None) else f" ep{self.ep}"
        sp = " noSP" if self.sp is False and self.t > 1 else ""
        sp += " keep" if self.reshard is False else ""
        sp += f" hsdp×{self.replicas}" if self.replicas not in (1, None) else ""
        return (f"t{self.t} c{f(self.c)} p{f(self.p)} D{f(self.D)}{ep} ZeRO-{f(self.zero)} "
                f"{f(self.recompute)} m{f(self.m)} v{f(self.v)}{sp}")

    def as_dict(self) -> dict[str, object]:
        return {k: getattr(self, k) for k in FIELDS}


@dataclass(frozen=True)
class Rejection:
    layout: Layout
    reason: str
    detail: str
    over_bytes: float = 0.0  # out of memory: by how much


@dataclass(frozen=True)
class Candidate:
    """A feasible layout: memory terms of its fuller stage, traffic per axis, step time; MFU
    counts the model's FLOPs, HFU adds the recomputed ones."""

    layout: Layout
    memory: dict[str, float]
    peak: float
    peak_stage: str
    budget: float
    comm: dict[str, Roofline]
    times: dict[str, float]  # compute, recompute, bubble, exposed_<axis>
    step_time: float
    mfu: float
    tokens_per_s: float
    idle_fraction: float
    hfu: float = 0.0
    gemm_efficiency: float = 0.0  # forward FLOPs / (forward time x peak) of one microbatch

    def as_dict(self) -> dict[str, object]:
        return {
            "layout": self.layout.as_dict(), "label": self.layout.label,
            "memory": dict(self.memory), "peak_bytes": self.peak, "peak_stage": self.peak_stage,
            "budget_bytes": self.budget, "comm": {a: r.as_row() for a, r in self.comm.items()},
            "times": dict(self.times), "step_time": self.step_time, "mfu": self.mfu,
            "hfu": self.hfu, "gemm_efficiency": self.gemm_efficiency,
            "tokens_per_s": self.tokens_per_s, "idle_fraction": self.idle_fraction,
        }


def inflight_chunks(p: int, m: int, v: int = 1, rank: int = 0) -> int:
    """Most (microbatch, chunk) pairs whose activations ``rank`` holds at once.

    1F1B (``v = 1``): ``min(p - r, m)``; interleaved: ``min(2 (p - r - 1) + (v - 1) p + 1, m v)``
    (the warm-up forwards of :func:`.pipeline.schedule` plus the one in progress).
    """
    p, m, vv = (chk.positive_int(k, x) for k, x in (("p", p), ("m", m), ("v", v)))
    r = chk.nonneg_int("rank", rank)
    if r >= p:
        raise ValueError(f"rank={r} must be below p={p}")
    return _inflight(p, m, vv, r)


def _inflight(p: int, m: int, vv: int, r: int) -> int:
    # inflight_chunks without its checks, for the planner's bounds (checked inputs)
    if vv == 1:
        return min(p - r, m)
    return min(2 * (p - r - 1) + (vv - 1) * p + 1, m * vv)


def activation_mode(recompute: str, sp: bool) -> str:
    """The :mod:`.activations` mode of a planner recompute mode with or without SP."""
    return (RECOMPUTE_MODES if sp else NO_SP_MODES)[chk.choice("recompute", recompute,
                                                               RECOMPUTE_MODES)]


def recompute_scratch(s: int, b: int, h: int, a: int, t: int, recompute: str, sp: bool = True,
                      **layer) -> float:
    """Bytes a recomputing layer re-creates during its backward (one layer at a time).

    ``"selective"``: the attention core of one layer, ``tp_sp - tp_sp_selective`` (without
    SP ``tp - tp_selective``: the same core); ``"full"``: everything one layer saves without
    recomputation, ``tp_sp`` (``tp`` without SP); ``"none"``: 0.
    :func:`.activations.activation_bytes_per_layer` with the layer's keyword arguments
    (``ffn``, ``dropout``, ``norm``, ...); chapters 2 and 4 add the same scratch to a
    recomputing layout's peak.
    """
    rc = chk.choice("recompute", recompute, RECOMPUTE_MODES)
    if rc == "none":
        return 0.0
    kept = act.activation_bytes_per_layer(s, b, h, a, t, activation_mode("none", sp), **layer)
    if rc == "full":
        return kept
    return kept - act.activation_bytes_per_layer(s, b, h, a, t, activation_mode(rc, sp), **layer)


def _inside(stride: int, size: int, node: int) -> bool:
    """A group of ``size`` ranks ``stride`` apart stays in one aligned node of ``node`` GPUs."""
    span = stride * size
    return size == 1 or (span <= node and node % span == 0)


def zero_choices(D: int, c: int, experts: int) -> tuple:
    """The ZeRO stages a cell is costed with: 0-3 and ZeRO-3 kept gathered (``(3, False)``),
    or ZeRO-0 alone when nothing is sharded (``D c = 1`` and no experts: ZeRO-1/2/3 would be
    ZeRO-0 again)."""
    return (*ZERO_LAYOUTS, (3, False)) if D * c > 1 or experts > 1 else (0,)


def hsdp_replicas(D: int, c: int) -> list[int]:
    """Replica counts of the hybrid-sharded layouts searched for a data degree ``D``: every
    divisor ``R`` of ``D`` above 1 whose shard group (``D / R`` data ranks and the ``c``
    context ranks) has more than one rank (:mod:`.layout_search` says why none is pruned)."""
    return [r for r in divisors(D)[1:] if (D // r) * c > 1]


def divisors(n: int) -> list[int]:
    """Every divisor of ``n`` in increasing order (trial division up to ``sqrt(n)``)."""
    n = chk.positive_int("n", n)
    small, large = [], []
    for d in range(1, math.isqrt(n) + 1):
        if n % d == 0:
            small.append(d)
            if d * d != n:
                large.append(n // d)
    return small + large[::-1]


@dataclass(frozen=True)
class _Opts:
    batch: int
    b: int
    recipe: str | Recipe
    reserve: float
    max_bubble: float
    q: float
    causal: bool
    embedding_in_split: bool = False
    offload: bool = False  # ZeRO-1/2: master weights and moments on the host (ZeRO-Offload)
    pcie_bandwidth: float = 25e9  # bytes/s each way between a GPU and its host
    host_bandwidth: float = 100e9  # bytes/s of the host memory the optimizer step streams


def _check_opts(global_batch, microbatch, recipe, reserve, max_bubble, q, causal,
                embedding_in_split: bool = False, offload: bool = False,
                pcie_bandwidth: float = 25e9, host_bandwidth: float = 100e9) -> _Opts:
    batch = chk.positive_int("global_batch", global_batch)
    b = chk.positive_int("microbatch", microbatch)
    get_recipe(recipe)
    res = chk.nonneg_number("reserve", reserve)
    if res >= 1:
        raise ValueError(f"reserve={reserve!r} must be a fraction of GPU memory below 1")
    mb = chk.nonneg_number("max_bubble", max_bubble)
    if mb > 1:
        raise ValueError(f"max_bubble={max_bubble!r} must be an idle fraction in [0, 1]")
    return _Opts(batch, b, recipe, res, mb, chk.number("q", q), chk.flag("causal", causal),
                 chk.flag("embedding_in_split", embedding_in_split), chk.flag("offload", offload),
                 chk.number("pcie_bandwidth", pcie_bandwidth),
                 chk.number("host_bandwidth", host_bandwidth))
