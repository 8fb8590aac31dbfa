"""Layout planner: every ``(D, t, p, c, ep, ZeRO, recompute, m, v)`` checked, costed and ranked.

Lecture 8, "Real runs combine layouts"; Narayanan et al., *Megatron-LM* (2021), Sec. 3;
Grattafiori et al., *The Llama 3 Herd of Models* (2024), Sec. 3.3. Pure Python, closed forms
only, so :func:`plan` answers in well under a second for a 16,384-GPU cluster.

**Search.** ``t`` (powers of two up to twice a node), ``c`` and ``p`` (powers of two),
``D = G / (t c p)``, ``v`` in ``1, 2, 4, 8``, ``ep`` (powers of two dividing the experts, MoE
only), ZeRO stage 0-3 over the ``D c`` ranks that hold the same weights (context ranks hold
the same weights as data ranks; expert weights over ``edp = D c t / ep``), recompute
``none``/``selective``/``full``; ``m = global batch / (D b)`` microbatches. Sequence
parallelism is always on with ``t > 1`` (it costs no extra bytes, :func:`.comm.tp_volume`).

**Rejected**, with the first reason that applies (:data:`REASONS`): ``divisibility``
(``t c p`` vs ``G``, heads/K-V heads/FFN/vocabulary vs ``t``, sequence vs ``c`` and ``t``, batch
vs ``D b``, ``m % p`` for ``v > 1``, experts vs ``ep``); ``t beyond a node`` (a tensor group
must sit inside one node); ``too many stages`` (``p v > L``); ``bubble too large``
(:func:`.pipeline.idle_fraction` above ``max_bubble``); ``out of memory`` (by how much).

**Memory** of the first and the last stage (the larger counts), term by term, through
:func:`.peak.predict_peak`: ``persistent`` = :func:`.memory.model_state` of the rank's
parameters (``ceil(L / (p v)) v`` layers, ``1/t`` of dense weights, ``1/ep`` of expert
weights; embedding on the first stage, head on the last); ZeRO-3 gathers one layer at a
time with one prefetched; ``activations`` = :func:`.activations.activation_bytes_per_layer`
at the local sequence ``s/c`` times the layers times the chunks in flight
(:func:`inflight_chunks`); ``recompute_scratch`` = one layer's recomputed tensors (selective:
its attention core; full: all of it), as chapters 2 and 4 add it; ``backward_workspace`` =
:func:`.peak.logits_workspace` of the vocabulary-parallel logits on the last stage.

**Time** (:mod:`.compute`): per microbatch a rank computes forward ``F``, backward ``2F`` and
the recomputation at ``peak x efficiency``; tensor-parallel collectives and the MoE
all-to-alls sit on the critical path (exposed); context-parallel K/V passes hide behind the
attention core (roofline); pipeline sends hide behind other microbatches except along the
fill and drain (``2 (p v - 1)`` transfers, counted in the bubble); the gradient reduction
hides behind one microbatch's compute (ZeRO-2: every backward; ZeRO-3's gathers behind every
microbatch). Step = ``m`` microbatches + :func:`.pipeline.bubble_time` + exposed traffic;
MFU = :func:`.compute.mfu` of the model FLOPs. Heads and embedding work is spread evenly
over the stages (Llama 3 moves a layer off the first and the last stage for this).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from . import _validate as chk
from . import activations as act
from . import comm
from .compute import ModelShape, Roofline, collective_roofline, compute_time, mfu, roofline
from .context import kv_bytes, kv_heads_per_rank
from .memory import GB, get_recipe, model_state
from .peak import logits_workspace, predict_peak
from .pipeline import bubble_time, idle_fraction

REASONS = ("divisibility", "t beyond a node", "too many stages", "bubble too large",
           "out of memory")  # fmt: skip
RECOMPUTE_MODES = {"none": "tp_sp", "selective": "tp_sp_selective", "full": "full_recompute"}
ZERO_LAYOUTS = {0: "ddp", 1: "zero1", 2: "zero2", 3: "zero3"}
AXES = ("tp", "cp", "ep", "pp", "dp")
CHUNKS = (1, 2, 4, 8)
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


# Llama 3 405B, Table 4 of the report: about 16M tokens per step at both context lengths
# (2,048 sequences of 8,192 tokens; 128 of 131,072) and the two meshes it used.
LLAMA3_CONFIGS = {
    "8k": {"seq_len": 8192, "global_batch": 2048, "layout": {"t": 8, "c": 1, "p": 16, "D": 128}},
    "128k": {"seq_len": 131072, "global_batch": 128, "layout": {"t": 8, "c": 16, "p": 16, "D": 8}},
}


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


def _geometry(model, cl, D, t, p, c, vv, ep, zeros, recs, o: _Opts) -> list:
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
        mode = RECOMPUTE_MODES[rc]
        a_l = act.activation_bytes_per_layer(s_loc, o.b, h, model.heads, t, mode, **layer)
        kept = act.activation_bytes_per_layer(s_loc, o.b, h, model.heads, t, "tp_sp", **layer)
        scratch = {"none": 0.0, "selective": kept - a_l, "full": kept}[rc]
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


def _geometry_rejection(model, cl, D, t, p, c, o: _Opts) -> Rejection | None:
    lay = Layout(D, t, p, c, None, None, None, max(1, o.batch // (D * o.b)), None)
    for name, value in (("heads", model.heads), ("hidden", model.hidden), ("ffn", model.ffn),
                        ("vocab", model.vocab)):  # fmt: skip
        if value % t:
            return Rejection(lay, "divisibility", f"t={t} does not divide {name}={value}")
    try:
        kv_heads_per_rank(model.kv_heads, t)
    except ValueError as exc:
        return Rejection(lay, "divisibility", str(exc))
    s = model.seq_len
    if s % c:
        return Rejection(lay, "divisibility", f"c={c} does not divide seq_len={s}")
    if (s // c) % t:
        return Rejection(lay, "divisibility",
                         f"t={t} does not divide the local sequence s/c={s // c} (sequence "
                         "parallelism)")  # fmt: skip
    if o.batch % (D * o.b):
        return Rejection(lay, "divisibility",
                         f"D*b = {D}*{o.b} does not divide global_batch={o.batch}")  # fmt: skip
    if not _inside(1, t, cl.gpus_per_node):
        return Rejection(lay, "t beyond a node",
                         f"t={t} tensor ranks do not fit in one node of {cl.gpus_per_node} GPUs")  # fmt: skip
    return None


def _chunk_rejection(model, D, t, p, c, vv, m, o: _Opts) -> Rejection | None:
    lay = Layout(D, t, p, c, None, None, None, m, vv)
    if p * vv > model.layers:
        return Rejection(lay, "too many stages",
                         f"p*v = {p}*{vv} = {p * vv} virtual stages > layers={model.layers}")  # fmt: skip
    if vv > 1 and m % p:
        return Rejection(lay, "divisibility", f"interleaving (v={vv}) needs p={p} to divide m={m}")
    idle = idle_fraction(p, m, vv)
    if idle > o.max_bubble:
        return Rejection(lay, "bubble too large",
                         f"idle fraction {idle:.1%} of p={p}, m={m}, v={vv} exceeds "
                         f"max_bubble={o.max_bubble:.0%}")  # fmt: skip
    return None


def _ep_rejection(model, D, t, p, c, vv, ep, m) -> Rejection | None:
    if model.experts == 1:
        return None
    lay = Layout(D, t, p, c, ep, None, None, m, vv)
    if model.experts % ep:
        return Rejection(lay, "divisibility", f"ep={ep} does not divide experts={model.experts}")
    if (D * c * t) % ep:
        return Rejection(lay, "divisibility", f"ep={ep} does not divide D*c*t = {D * c * t}")
    return None


def _check_inputs(model, cluster) -> None:
    if not isinstance(model, ModelShape):
        raise ValueError(f"model={model!r} must be a ModelShape")
    if not isinstance(cluster, Cluster):
        raise ValueError(f"cluster={cluster!r} must be a Cluster")


def evaluate(
    model: ModelShape,
    cluster: Cluster,
    layout: Layout,
    global_batch: int,
    microbatch: int = 1,
    recipe: str = "mixed-adam-16",
    reserve: float = 0.1,
    max_bubble: float = 0.25,
    q: float = 2,
    causal: bool = True,
) -> Candidate | Rejection:
    """Check and cost one layout (module docstring); a :class:`Rejection` says why not.

    ``layout.m`` must equal ``global_batch / (D b)`` (the planner derives it)."""
    _check_inputs(model, cluster)
    o = _check_opts(global_batch, microbatch, recipe, reserve, max_bubble, q, causal)
    lay = layout
    if not isinstance(lay, Layout):
        raise ValueError(f"layout={lay!r} must be a Layout")
    for name in ("D", "t", "p", "c", "ep", "zero", "m", "v"):
        chk.integer(name, getattr(lay, name), minimum=0 if name == "zero" else 1)
    chk.choice("zero", str(lay.zero), [str(z) for z in ZERO_LAYOUTS])
    chk.choice("recompute", lay.recompute, RECOMPUTE_MODES)
    if lay.D * lay.t * lay.c * lay.p != cluster.gpus:
        return Rejection(lay, "divisibility",
                         f"D*t*c*p = {lay.D}*{lay.t}*{lay.c}*{lay.p} != G={cluster.gpus}")  # fmt: skip
    m = max(1, o.batch // (lay.D * o.b))
    if lay.m != m:
        raise ValueError(f"m={lay.m} but global_batch/(D*b) = {o.batch}/({lay.D}*{o.b}) gives {m}")
    rj = (_geometry_rejection(model, cluster, lay.D, lay.t, lay.p, lay.c, o)
          or _chunk_rejection(model, lay.D, lay.t, lay.p, lay.c, lay.v, m, o)
          or _ep_rejection(model, lay.D, lay.t, lay.p, lay.c, lay.v, lay.ep, m))  # fmt: skip
    if rj is not None:
        return Rejection(lay, rj.reason, rj.detail)
    return _geometry(model, cluster, lay.D, lay.t, lay.p, lay.c, lay.v, lay.ep, (lay.zero,),
                     (lay.recompute,), o)[0]  # fmt: skip


@dataclass(frozen=True)
class Plan:
    """Feasible layouts ranked by predicted step time, and the rejected ones with reasons.

    A rejection whose layout has ``None`` fields covers every value of those fields (a
    tensor group beyond a node is rejected for every ZeRO stage and recompute mode)."""

    model: ModelShape
    cluster: Cluster
    global_batch: int
    feasible: tuple[Candidate, ...]
    rejected: tuple[Rejection, ...]
    settings: dict[str, object] = field(default_factory=dict)

    def find(self, **fields: object) -> list[Candidate]:
        """Feasible candidates whose layout matches every given field (e.g. ``t=8, p=16``)."""
        return [c for c in self.feasible
                if all(getattr(c.layout, k) == x for k, x in fields.items())]  # fmt: skip

    def find_rejected(self, **fields: object) -> list[Rejection]:
        """Rejections matching every given field (``None`` in a rejection matches anything)."""
        return [r for r in self.rejected
                if all(getattr(r.layout, k) in (x, None) for k, x in fields.items())]  # fmt: skip

    def rank_of(self, cand: Candidate) -> int:
        """1-based position of ``cand`` in the ranking."""
        return self.feasible.index(cand) + 1

    def rejected_counts(self) -> dict[str, int]:
        out = {r: 0 for r in REASONS}
        for rj in self.rejected:
            out[rj.reason] += 1
        return out

    def compare(self, better: Candidate, worse: Candidate) -> dict[str, float]:
        """Seconds per step by which each time term of ``worse`` exceeds ``better``'s."""
        return {k: worse.times[k] - better.times[k] for k in better.times}

    def explain(self, cand: Candidate, against: Candidate | None = None, terms: int = 3) -> str:
        """One sentence: where ``cand`` ranks and which time terms put ``against`` (default:
        the first-ranked layout) ahead of it, largest differences first."""
        top = self.feasible[0] if against is None else against
        rank = self.rank_of(cand)
        if top is cand:
            return f"{cand.layout.label} ranks 1 of {len(self.feasible)}."
        diff = sorted(self.compare(top, cand).items(), key=lambda kv: -abs(kv[1]))[:terms]
        parts = ", ".join(f"{k.replace('_', ' ')} {d:+.2f} s" for k, d in diff if d)
        return (
            f"{cand.layout.label} ranks {rank} of {len(self.feasible)} "
            f"({cand.step_time:.2f} s per step, MFU {cand.mfu:.1%}); "
            f"{top.layout.label} takes {top.step_time:.2f} s (MFU {top.mfu:.1%}). "
            f"Per step it spends, relative to that layout: {parts}."
        )


def plan(
    model: ModelShape,
    cluster: Cluster,
    global_batch: int,
    microbatch: int = 1,
    recipe: str = "mixed-adam-16",
    reserve: float = 0.1,
    max_bubble: float = 0.25,
    q: float = 2,
    causal: bool = True,
    max_cp: int = 32,
    min_local_seq: int = 1024,
) -> Plan:
    """Enumerate, check and rank layouts of ``model`` on ``cluster`` (module docstring).

    ``global_batch`` sequences per step, ``microbatch`` sequences per microbatch, ``reserve``
    the fraction of GPU memory kept free for what the accounting leaves out, ``max_bubble``
    the largest pipeline idle fraction accepted, ``q`` bytes per communicated element.
    The search bounds: ``c <= max_cp`` and ``s / c >= min_local_seq`` tokens per context rank.
    """
    _check_inputs(model, cluster)
    o = _check_opts(global_batch, microbatch, recipe, reserve, max_bubble, q, causal)
    max_c = chk.positive_int("max_cp", max_cp)
    min_s = chk.positive_int("min_local_seq", min_local_seq)
    G = cluster.gpus
    ts = [t for t in _pow2(2 * cluster.gpus_per_node) if t <= model.heads]
    cs = [c for c in _pow2(max_c) if c == 1 or model.seq_len // c >= min_s]
    ps = _pow2(min(model.layers, G))
    eps = [e for e in _pow2(model.experts) if model.experts % e == 0] if model.experts > 1 else [1]
    zeros, recs = tuple(ZERO_LAYOUTS), tuple(RECOMPUTE_MODES)
    feasible, rejected = [], []
    for t in ts:
        for c in cs:
            for p in ps:
                if G % (t * c * p):
                    continue  # not a mesh of G ranks
                D = G // (t * c * p)
                rj = _geometry_rejection(model, cluster, D, t, p, c, o)
                if rj:
                    rejected.append(rj)
                    continue
                m = o.batch // (D * o.b)
                for vv in CHUNKS if p > 1 else (1,):
                    rj = _chunk_rejection(model, D, t, p, c, vv, m, o)
                    if rj:
                        rejected.append(rj)
                        continue
                    for ep in eps:
                        rj = _ep_rejection(model, D, t, p, c, vv, ep, m)
                        if rj:
                            rejected.append(rj)
                            continue
                        for r in _geometry(model, cluster, D, t, p, c, vv, ep, zeros, recs, o):
                            (feasible if isinstance(r, Candidate) else rejected).append(r)
    feasible.sort(key=lambda c: (c.step_time, c.peak))
    settings = {"microbatch": o.b, "recipe": o.recipe, "reserve": o.reserve,
                "max_bubble": o.max_bubble, "q": o.q, "causal": o.causal, "max_cp": max_c,
                "min_local_seq": min_s, "budget_bytes": cluster.gpu_memory * (1 - o.reserve)}  # fmt: skip
    return Plan(model, cluster, o.batch, tuple(feasible), tuple(rejected), settings)
