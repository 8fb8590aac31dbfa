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
of the model's own layer (:attr:`.compute.ModelShape.activation_layer`: MLP width, a gated
MLP's third ``f``-wide tensor, grouped-query attention's ``kv_heads``, dropout, norm; the
Korthikanti constants only for a GPT-style layer) at the local sequence ``s/c`` times the
layers times the chunks in flight (:func:`inflight_chunks`); ``recompute_scratch`` = one
layer's recomputed tensors (selective:
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

from dataclasses import dataclass, field

from . import _validate as chk
from .compute import ModelShape
from .context import kv_heads_per_rank
from .layout_cost import (
    AXES,
    FIELDS,
    LLAMA3_CLUSTER,
    RECOMPUTE_MODES,
    ZERO_LAYOUTS,
    Candidate,
    Cluster,
    Layout,
    Rejection,
    _check_opts,
    _inside,
    _Opts,
    _pow2,
    cost_layouts,
    inflight_chunks,
    recompute_scratch,
)
from .pipeline import idle_fraction

__all__ = [
    "AXES", "CHUNKS", "FIELDS", "LLAMA3_CLUSTER", "LLAMA3_CONFIGS", "REASONS",
    "RECOMPUTE_MODES", "ZERO_LAYOUTS", "Candidate", "Cluster", "Layout", "Plan", "Rejection",
    "evaluate", "inflight_chunks", "plan", "recompute_scratch",
]  # fmt: skip

REASONS = ("divisibility", "t beyond a node", "too many stages", "bubble too large",
           "out of memory")  # fmt: skip
CHUNKS = (1, 2, 4, 8)

# Llama 3 405B, Table 4 of the report: about 16M tokens per step at both context lengths
# (2,048 sequences of 8,192 tokens; 128 of 131,072) and the two meshes it used.
LLAMA3_CONFIGS = {
    "8k": {"seq_len": 8192, "global_batch": 2048, "layout": {"t": 8, "c": 1, "p": 16, "D": 128}},
    "128k": {"seq_len": 131072, "global_batch": 128, "layout": {"t": 8, "c": 16, "p": 16, "D": 8}},
}


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
    return cost_layouts(model, cluster, lay.D, lay.t, lay.p, lay.c, lay.v, lay.ep, (lay.zero,),
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
                        for r in cost_layouts(model, cluster, D, t, p, c, vv, ep, zeros, recs, o):
                            (feasible if isinstance(r, Candidate) else rejected).append(r)
    feasible.sort(key=lambda c: (c.step_time, c.peak))
    settings = {"microbatch": o.b, "recipe": o.recipe, "reserve": o.reserve,
                "max_bubble": o.max_bubble, "q": o.q, "causal": o.causal, "max_cp": max_c,
                "min_local_seq": min_s, "budget_bytes": cluster.gpu_memory * (1 - o.reserve)}  # fmt: skip
    return Plan(model, cluster, o.batch, tuple(feasible), tuple(rejected), settings)
