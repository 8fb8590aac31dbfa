"""Cost of one layout: per-rank peak memory by term, traffic per axis, step time, MFU.

The engine of :mod:`.planner` (whose docstring states the model); split off to keep each
module short. :func:`cost_layouts` costs every ZeRO stage and recompute mode of one
``(D, t, p, c, v, ep)`` geometry, sharing what they have in common, and returns a
:class:`Candidate` or an out-of-memory :class:`Rejection` for each; every number comes from
:mod:`.memory`, :mod:`.peak`, :mod:`.activations`, :mod:`.comm`, :mod:`.context`,
:mod:`.pipeline` and :mod:`.compute`. Also here: the inputs (:class:`Cluster`,
:class:`Layout`), :func:`inflight_chunks` and :func:`recompute_scratch`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from . import _validate as chk
from . import activations as act
from . import comm
from .compute import ModelShape, Roofline, collective_roofline, compute_time, mfu, roofline
from .context import kv_bytes
from .memory import GB, get_recipe, model_state
from .peak import logits_workspace, predict_peak
from .pipeline import bubble_time, idle_fraction

RECOMPUTE_MODES = {"none": "tp_sp", "selective": "tp_sp_selective", "full": "full_recompute"}
ZERO_LAYOUTS = {0: "ddp", 1: "zero1", 2: "zero2", 3: "zero3"}
AXES = ("tp", "cp", "ep", "pp", "dp")
FIELDS = ("D", "t", "p", "c", "ep", "zero", "recompute", "m", "v")


@dataclass(frozen=True)
class Cluster:
    """GPUs and links: memory in bytes, alpha in s per round, beta in bytes/s per GPU, peak in
    FLOP/s; ``efficiency`` is the achievable fraction of the peak (an assumption)."""

    gpus: int
    gpu_memory: float
    gpus_per_node: int
    alpha_intra: float
    beta_intra: float
    alpha_inter: float
    beta_inter: float
    peak_flops: float
    efficiency: float = 0.6

    def __post_init__(self) -> None:
        for name in ("gpus", "gpus_per_node"):
            object.__setattr__(self, name, chk.positive_int(name, getattr(self, name)))
        for name in ("gpu_memory", "beta_intra", "beta_inter", "peak_flops", "efficiency"):
            chk.number(name, getattr(self, name))
        chk.nonneg_number("alpha_intra", self.alpha_intra)
        chk.nonneg_number("alpha_inter", self.alpha_inter)
        if self.efficiency > 1:
            raise ValueError(f"efficiency={self.efficiency!r} must be in (0, 1]")
        if self.gpus % self.gpus_per_node and self.gpus > self.gpus_per_node:
            raise ValueError(f"gpus_per_node={self.gpus_per_node} does not divide gpus={self.gpus}")

    def link(self, inside: bool) -> tuple[float, float]:
        return (
            (self.alpha_intra, self.beta_intra) if inside else (self.alpha_inter, self.beta_inter)
        )


# 16,384 H100s of 80 GB in servers of 8; the book's illustrative alpha-beta pairs; bf16 dense
# peak 989 TFLOP/s.
LLAMA3_CLUSTER = dict(gpus=16384, gpu_memory=80e9, gpus_per_node=8, alpha_intra=3e-6,
                      beta_intra=300e9, alpha_inter=10e-6, beta_inter=50e9, peak_flops=989e12)  # fmt: skip


@dataclass(frozen=True)
class Layout:
    """One layout. In a :class:`Rejection`, ``None`` fields mean "every value"."""

    D: int
    t: int
    p: int
    c: int
    ep: int | None
    zero: int | None
    recompute: str | None
    m: int
    v: int | None

    @property
    def label(self) -> str:
        def f(x: object) -> str:
            return "*" if x is None else str(x)

        ep = "" if self.ep in (1, None) else f" ep{self.ep}"
        return (f"t{self.t} c{self.c} p{self.p} D{self.D}{ep} ZeRO-{f(self.zero)} "
                f"{f(self.recompute)} m{self.m} v{f(self.v)}")  # fmt: skip

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
    """A feasible layout: memory terms of its fuller stage, traffic per axis, step time."""

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

    def as_dict(self) -> dict[str, object]:
        return {
            "layout": self.layout.as_dict(), "label": self.layout.label,
            "memory": dict(self.memory), "peak_bytes": self.peak, "peak_stage": self.peak_stage,
            "budget_bytes": self.budget, "comm": {a: r.as_row() for a, r in self.comm.items()},
            "times": dict(self.times), "step_time": self.step_time, "mfu": self.mfu,
            "tokens_per_s": self.tokens_per_s, "idle_fraction": self.idle_fraction,
        }  # fmt: skip


def inflight_chunks(p: int, m: int, v: int = 1, rank: int = 0) -> int:
    """Most (microbatch, chunk) pairs whose activations ``rank`` holds at once.

    1F1B (``v = 1``): ``min(p - r, m)``; interleaved: ``min(2 (p - r - 1) + (v - 1) p + 1, m v)``
    (the warm-up forwards of :func:`.pipeline.schedule` plus the one in progress).
    """
    p, m, vv = (chk.positive_int(k, x) for k, x in (("p", p), ("m", m), ("v", v)))
    r = chk.nonneg_int("rank", rank)
    if r >= p:
        raise ValueError(f"rank={r} must be below p={p}")
    if vv == 1:
        return min(p - r, m)
    return min(2 * (p - r - 1) + (vv - 1) * p + 1, m * vv)


def recompute_scratch(s: int, b: int, h: int, a: int, t: int, recompute: str, **layer) -> float:
    """Bytes a recomputing layer re-creates during its backward (one layer at a time).

    ``"selective"``: the attention core of one layer, ``tp_sp - tp_sp_selective``;
    ``"full"``: everything one layer saves without recomputation, ``tp_sp`` (``none`` when
    ``t = 1``); ``"none"``: 0. :func:`.activations.activation_bytes_per_layer` with the
    layer's keyword arguments (``ffn``, ``dropout``, ``norm``, ...); chapters 2 and 4 add the
    same scratch to a recomputing layout's peak.
    """
    rc = chk.choice("recompute", recompute, RECOMPUTE_MODES)
    if rc == "none":
        return 0.0
    kept = act.activation_bytes_per_layer(s, b, h, a, t, "tp_sp", **layer)
    if rc == "full":
        return kept
    return kept - act.activation_bytes_per_layer(s, b, h, a, t, "tp_sp_selective", **layer)


def _inside(stride: int, size: int, node: int) -> bool:
    """A group of ``size`` ranks ``stride`` apart stays in one aligned node of ``node`` GPUs."""
    span = stride * size
    return size == 1 or (span <= node and node % span == 0)


def _pow2(limit: int) -> list[int]:
    out, x = [], 1
    while x <= limit:
        out.append(x)
        x *= 2
    return out


@dataclass(frozen=True)
class _Opts:
    batch: int
    b: int
    recipe: str
    reserve: float
    max_bubble: float
    q: float
    causal: bool


def _check_opts(global_batch, microbatch, recipe, reserve, max_bubble, q, causal) -> _Opts:
    batch = chk.positive_int("global_batch", global_batch)
    b = chk.positive_int("microbatch", microbatch)
    get_recipe(recipe)
    res = chk.nonneg_number("reserve", reserve)
    if res >= 1:
        raise ValueError(f"reserve={reserve!r} must be a fraction of GPU memory below 1")
    mb = chk.nonneg_number("max_bubble", max_bubble)
    return _Opts(batch, b, recipe, res, mb, chk.number("q", q), chk.flag("causal", causal))


def _params_per_rank(model: ModelShape, t: int, ep: int, layers_rank: int):
    """(dense params per layer on a rank, expert params per layer on a rank)."""
    dense = model.attn_params + model.router_params + 2 * model.hidden
    if model.experts == 1:
        return (dense + model.mlp_params) / t, 0.0
    return dense / t, model.experts * model.mlp_params / ep


def cost_layouts(model, cl, D, t, p, c, vv, ep, zeros, recs, o: _Opts) -> list:
    """Every (ZeRO, recompute) layout of one (D, t, p, c, v, ep): candidates and rejections."""
    G, node, L, h = cl.gpus, cl.gpus_per_node, model.layers, model.hidden
    m = max(1, o.batch // (D * o.b))
    s_loc = model.seq_len // c
    layers_rank = math.ceil(L / (p * vv)) * vv
    dense_l, exp_l = _params_per_rank(model, t, ep, layers_rank)
    rec_spec = get_recipe(o.recipe)
    budget = cl.gpu_memory * (1 - o.reserve)
    stages = ((0, "first"), (p - 1, "last")) if p > 1 else ((0, "first"),)
    edp = D * c * t // ep
    # ---- compute per microbatch on the busiest rank (ops split t ways, tokens c ways)
    f = 0.5 if o.causal else 1.0
    tokens = o.b * s_loc / t
    attn_tok = 4.0 * model.seq_len * h * f
    layer_fwd = 2.0 * model.layer_matmul_params + attn_tok
    fwd = (layers_rank * layer_fwd + 2.0 * model.vocab * h / p) * tokens
    pk_f, eff = cl.peak_flops, cl.efficiency
    t_f, t_b = compute_time(fwd, pk_f, eff), compute_time(2 * fwd, pk_f, eff)
    # ---- traffic that does not depend on ZeRO or recompute
    count = layers_rank * m
    q = o.q
    cp_link = cl.link(_inside(t, c, node))
    pp_link = cl.link(_inside(t * c, p, node))
    dp_link = cl.link(_inside(t, c, node) and _inside(t * c * p, D, node))
    ep_link = cl.link((ep <= t * c or p == 1) and _inside(1, ep, node))
    tp_r = collective_roofline("all_reduce", o.b * s_loc * h * q, t, 4 * count, *cl.link(True),
                               0.0, pk_f, eff, name="tp")  # fmt: skip
    kv = kv_bytes(o.b, model.seq_len, model.kv_heads, model.head_dim, q, t)
    cp_r = collective_roofline("all_gather", kv, c, 3 * count, *cp_link,
                               3 * attn_tok * tokens * count, pk_f, eff, name="cp")  # fmt: skip
    a2a = model.top_k * max(1, round(tokens)) * h * q
    ep_r = collective_roofline("all_to_all", a2a, ep, 4 * count if model.experts > 1 else 0,
                               *ep_link, 0.0, pk_f, eff, name="ep")  # fmt: skip
    pp_bytes = comm.pipeline_p2p_volume(o.b, s_loc, h, q, m, vv) / t if p > 1 else 0.0
    pp_time = comm.p2p_time(pp_bytes, *pp_link, messages=2 * m * vv)
    fill = 2 * (p * vv - 1)
    fill_time = comm.p2p_time(pp_bytes / (2 * m * vv) * fill, *pp_link, messages=fill)
    per_mb = (tp_r.exposed + ep_r.exposed + cp_r.exposed) / m
    kind = "interleaved" if vv > 1 else "1f1b"
    model_flops = model.flops_per_token("step", o.causal) * o.batch * model.seq_len
    # ---- per recompute mode: saved activations per layer, scratch, extra FLOPs
    per_rec = {}
    layer = model.activation_layer  # Llama- or GPT-style constants of accounting.activations
    for rc in recs:
        a_l = act.activation_bytes_per_layer(
            s_loc, o.b, h, model.heads, t, RECOMPUTE_MODES[rc], **layer
        )
        scratch = recompute_scratch(s_loc, o.b, h, model.heads, t, rc, **layer)
        r_flops = layers_rank * {"none": 0.0, "selective": attn_tok, "full": layer_fwd}[rc] * tokens
        per_rec[rc] = (a_l, scratch, r_flops)
    out = []
    for zero in zeros:
        layout_name = ZERO_LAYOUTS[zero]
        # persistent state and ZeRO-3 units per stage
        state = {}
        for stage, _ in stages:
            n_dense = layers_rank * dense_l + (model.embedding_params / t if stage == 0 else 0)
            n_dense += model.head_params / t if stage == p - 1 else 0
            st = model_state(max(1, round(n_dense)), D * c, layout_name, o.recipe).total
            if exp_l:
                st += model_state(round(layers_rank * exp_l), edp, layout_name, o.recipe).total
            state[stage] = st
        units = grads = []
        if zero == 3:
            units = [rec_spec.weights * (dense_l + exp_l)] * layers_rank
            grads = [rec_spec.grads * (dense_l + exp_l)] * layers_rank
        dp_t, dp_b = _dp_traffic(model, D, c, t, p, ep, m, zero, layers_rank, q, dp_link)
        for rc in recs:
            a_l, scratch, r_flops = per_rec[rc]
            lay = Layout(D, t, p, c, ep, zero, rc, m, vv)
            best = (-1.0, {}, "")
            for stage, sname in stages:
                activ = a_l * (layers_rank // vv) * inflight_chunks(p, m, vv, stage)
                ws = None
                if stage == p - 1:
                    ws = logits_workspace(o.b, s_loc, model.vocab // t, 4)
                pk = predict_peak(state[stage], units, activ, scratch, prefetch=1,
                                  grad_unit_bytes=grads or None, backward_workspace_bytes=ws)  # fmt: skip
                if pk.total > best[0]:
                    terms = {("recompute_scratch" if k == "buffers" else k): x
                             for k, x in pk.terms.items()}  # fmt: skip
                    best = (pk.total, terms, sname)
            peak, terms, sname = best
            if peak > budget:
                out.append(Rejection(lay, "out of memory",
                                     f"out of memory by {(peak - budget) / GB:.1f} GB ({sname} "
                                     f"stage {peak / GB:.1f} GB > budget {budget / GB:.1f} GB)",
                                     peak - budget))  # fmt: skip
                continue
            t_r = compute_time(r_flops, pk_f, eff)
            mb = 3 * fwd + r_flops  # one microbatch's compute
            hide = {0: mb, 1: mb, 2: fwd + m * (2 * fwd + r_flops), 3: m * mb}[zero]
            rl = {"tp": tp_r, "cp": cp_r, "ep": ep_r,
                  "pp": roofline("pp", pp_time, pp_bytes, m * mb, pk_f, eff, pp_link[1]),
                  "dp": roofline("dp", dp_t, dp_b, hide, pk_f, eff, dp_link[1])}  # fmt: skip
            costs = {"F": t_f + per_mb / 2, "B": t_b + t_r + per_mb / 2}
            bub = bubble_time(kind, p, costs, vv) + (fill_time if p > 1 else 0.0)
            times = {"compute": m * (t_f + t_b), "recompute": m * t_r, "bubble": bub}
            times.update({f"exposed_{a}": rl[a].exposed for a in AXES})
            step = sum(times.values())
            out.append(Candidate(lay, terms, peak, sname, budget, rl, times, step,
                                 mfu(model_flops, step, G, pk_f),
                                 o.batch * model.seq_len / step, idle_fraction(p, m, vv)))  # fmt: skip
    return out


def _dp_traffic(model, D, c, t, p, ep, m, zero, layers_rank, q, link) -> tuple[float, float]:
    """(seconds, bytes) per step of the gradient reduction and ZeRO gathers over the ``D c``
    ranks that hold the same dense weights (and the ``edp`` ranks of the same experts)."""
    dense_l, exp_l = _params_per_rank(model, t, ep, layers_rank)
    dense = layers_rank * dense_l + (model.embedding_params + model.head_params) / (t * p)
    groups = [(dense, D * c)]
    if exp_l:
        groups.append((layers_rank * exp_l, D * c * t // ep))
    total_t = total_b = 0.0
    for n, g in groups:
        nb = q * n
        ops = {0: [("all_reduce", nb, 1)],
               1: [("reduce_scatter", nb, 1), ("all_gather", nb, 1)],
               2: [("reduce_scatter", nb, m), ("all_gather", nb, 1)],
               3: [("all_gather", nb / layers_rank, 2 * m * layers_rank),
                   ("reduce_scatter", nb / layers_rank, m * layers_rank)]}[zero]  # fmt: skip
        for op, each, k in ops:
            total_t += comm.collectives_time(op, each, g, k, *link)
            total_b += k * comm.sent_bytes(op, each, g)
    return total_t, total_b
