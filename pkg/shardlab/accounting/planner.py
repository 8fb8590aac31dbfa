"""Layout planner: every ``(D, t, p, c, ep, ZeRO, recompute, m, v, SP)`` checked, costed and ranked.

Lecture 8, "Real runs combine layouts"; Narayanan et al., *Megatron-LM* (2021), Sec. 3;
Korthikanti et al. (2022); Grattafiori et al., *The Llama 3 Herd of Models* (2024), Sec. 3.3.
Pure Python, closed forms only: :func:`plan` costs every layout of a search of the size of
Llama 3 405B on 16,384 GPUs in well under a second; a larger search (a highly composite
cluster size, 1,024 layers, many experts) ranks its first layouts exactly by branch and bound
(:mod:`.layout_bound`), so that any input it accepts answers within a second.

**Search** (:mod:`.layout_search`, which also says what is pruned and why): every divisor of
``G`` for ``t`` (up to twice a node), ``c`` and ``p``; ``D = G / (t c p)``; ``v`` from 1 up
to ``L / p``; ``ep`` every divisor of the experts (MoE only); ZeRO stage 0-3 over the ``D c``
ranks that hold the same weights (context ranks hold the same weights as data ranks; expert
weights over ``edp = D c t / ep``), ZeRO-3 also without resharding after forward (``reshard``
False: the gathered layers stay until their backward, one all-gather per layer and microbatch),
and ZeRO-1/2/3 hybrid-sharded (HSDP, ``replicas > 1``: sharded inside the largest group of
data ranks one node holds, replicated across nodes; :func:`.layout_types.hsdp_replicas`);
recompute ``none``/``selective``/``full``; sequence
parallelism on or off (``sp``: ``None`` = on wherever ``t`` divides ``s / c``, off elsewhere);
``m = global batch / (D b)`` microbatches.

**Rejected**, with the first reason that applies (:data:`REASONS`): ``divisibility``
(heads/K-V heads/FFN/vocabulary vs ``t``, sequence vs ``c`` and, with SP, ``s / c`` vs ``t``,
batch vs ``D b``, ``m % p`` for ``v > 1``, experts vs ``ep``); ``t beyond a node`` (a tensor
group must sit inside one aligned node); ``too many stages`` (``p v > L``); ``bubble too large``
(:func:`.pipeline.idle_fraction` above ``max_bubble``); ``out of memory`` (by how much).

**Memory** of the first and the last stage (the larger counts), term by term, through
:func:`.peak.predict_peak`: ``persistent`` = :func:`.memory.model_state` of the rank's
parameters (``ceil(L / (p v)) v`` layers, ``1/t`` of dense weights, ``1/ep`` of expert
weights; embedding on the first stage, head on the last, and with tied embeddings under
pipelining a copy of the embedding on the last; with ``embedding_in_split`` the first and
the last stage hold one layer fewer); ZeRO-3 gathers one layer at a time with one prefetched
(every layer of the stage when it does not reshard after forward); ``activations`` = :func:`.activations.activation_bytes_per_layer` of the model's
own layer (:attr:`.compute.ModelShape.activation_layer`) in the mode of its recompute and SP
setting (``tp_sp`` / ``tp_sp_selective`` / ``full_recompute`` with its input split ``t`` ways
under SP; without SP ``tp`` / ``tp_selective`` / ``full_recompute`` replicated) at the local
sequence ``s/c`` times the layers times the chunks in flight (:func:`inflight_chunks`). The
attention kernel assumed is one that **materializes the scores** (the ``a s^2 b`` term; a
flash kernel keeps them on chip, and "selective" is the closer model of it).
``recompute_scratch`` = one layer's recomputed tensors; ``backward_workspace`` =
:func:`.peak.logits_workspace` of the vocabulary-parallel logits on the last stage.

**Time** (:mod:`.gemm`, :mod:`.compute`): per microbatch a rank runs each GEMM of its layers
(and ``1/p`` of the head) at the efficiency its arithmetic intensity allows against the
device's ridge, capped at ``Cluster.efficiency`` (:func:`.gemm.gemm_efficiency`; with
``hbm_bandwidth=None`` every GEMM at the cap); attention FLOPs are halved when ``causal``
(the kernel skips the masked half; ``causal=False`` counts the full score matrix, as
Megatron-LM's and PaLM's FLOP counts do). Backward costs twice the forward, recomputation
the attention cores (selective) or the layers (full) again. Tensor-parallel collectives and
the MoE all-to-alls sit on the critical path (exposed); context-parallel K/V passes hide
behind the attention core (roofline); pipeline sends hide behind other microbatches except
along the fill and drain (``2 (p v - 1)`` transfers, counted in the bubble); the gradient
reduction hides behind one microbatch's compute (ZeRO-2: every backward; ZeRO-3's gathers
behind every microbatch; HSDP's all-reduce of the gradient shards across the replicas is
added to the same hidden traffic, on the replicas' link). Step = ``m`` microbatches + :func:`.pipeline.bubble_time` + exposed
traffic; MFU = :func:`.compute.mfu` of the model FLOPs, HFU of the model plus recomputed
FLOPs. Heads and embedding work is spread evenly over the stages.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from . import _validate as chk
from .compute import ModelShape
from .layout_bound import EXACT_WORK, bounded_search, work
from .layout_cost import cost_layouts
from .layout_search import (
    REASONS,
    check_size,
    chunk_rejection,
    ep_rejection,
    geometry_rejection,
    search_space,
)
from .layout_types import (
    AXES,
    DEFAULT_RESERVE,
    FIELDS,
    LLAMA3_CLUSTER,
    MAX_GPUS,
    MAX_LAYERS,
    RECOMPUTE_MODES,
    ZERO_LAYOUTS,
    Candidate,
    Cluster,
    Layout,
    Rejection,
    _check_opts,
    divisors,
    hsdp_replicas,
    inflight_chunks,
    recompute_scratch,
    zero_choices,
)

__all__ = [
    "AXES", "DEFAULT_RESERVE", "FIELDS", "LLAMA3_CLUSTER", "LLAMA3_CONFIGS", "MAX_GPUS", "MAX_LAYERS", "REASONS",
    "RECOMPUTE_MODES", "ZERO_LAYOUTS", "Candidate", "Cluster", "Layout", "Plan", "Rejection",
    "divisors", "evaluate", "inflight_chunks", "plan", "recompute_scratch",
]

# Llama 3 405B, Table 4 of the report: about 16M tokens per step at both context lengths
# (2,048 sequences of 8,192 tokens; 128 of 131,072) and the two meshes it used.
LLAMA3_CONFIGS = {
    "8k": {"seq_len": 8192, "global_batch": 2048, "layout": {"t": 8, "c": 1, "p": 16, "D": 128}},
    "128k": {"seq_len": 131072, "global_batch": 128, "layout": {"t": 8, "c": 16, "p": 16, "D": 8}},
}


def _check_inputs(model, cluster) -> None:
    if not isinstance(model, ModelShape):
        raise ValueError(f"model={model!r} must be a ModelShape")
    if not isinstance(cluster, Cluster):
        raise ValueError(f"cluster={cluster!r} must be a Cluster")
    check_size(model, cluster)


def evaluate(
    model: ModelShape,
    cluster: Cluster,
    layout: Layout,
    global_batch: int,
    microbatch: int = 1,
    recipe: str = "mixed-adam-16",
    reserve: float = DEFAULT_RESERVE,
    max_bubble: float = 0.25,
    q: float = 2,
    causal: bool = True,
    embedding_in_split: bool = False,
    offload: bool = False,
    pcie_bandwidth: float = 25e9,
    host_bandwidth: float = 100e9,
) -> Candidate | Rejection:
    """Check and cost one layout (module docstring); a :class:`Rejection` says why not.
    ``offload``, ``pcie_bandwidth``, ``host_bandwidth``: as in :func:`plan`.

    ``layout.m`` must equal ``global_batch / (D b)`` (the planner derives it); ``layout.sp``
    says whether sequence parallelism is on (``t = 1``: ignored). ``embedding_in_split``: the
    embedding and the head count as one layer each when the layers are split into stages."""
    _check_inputs(model, cluster)
    o = _check_opts(global_batch, microbatch, recipe, reserve, max_bubble, q, causal,
                    embedding_in_split, offload, pcie_bandwidth, host_bandwidth)
    lay = layout
    if not isinstance(lay, Layout):
        raise ValueError(f"layout={lay!r} must be a Layout")
    for name in ("D", "t", "p", "c", "ep", "zero", "m", "v"):
        chk.integer(name, getattr(lay, name), minimum=0 if name == "zero" else 1)
    chk.choice("zero", str(lay.zero), [str(z) for z in ZERO_LAYOUTS])
    chk.choice("recompute", lay.recompute, RECOMPUTE_MODES)
    sp = True if lay.t == 1 else chk.flag("sp", lay.sp)
    reshard = chk.flag("reshard", lay.reshard)
    if not reshard and lay.zero != 3:
        raise ValueError(f"reshard=False needs zero=3 (ZeRO-{lay.zero} gathers no parameters)")
    reps = chk.integer("replicas", lay.replicas, minimum=1)
    if reps > 1 and lay.zero == 0:
        raise ValueError(f"replicas={reps} needs zero 1, 2 or 3 (ZeRO-0 replicates everything)")
    if reps > 1 and lay.D % reps:
        raise ValueError(f"replicas={reps} must divide D={lay.D} (HSDP replicates whole "
                         "shard groups)")
    if lay.D * lay.t * lay.c * lay.p != cluster.gpus:
        return Rejection(lay, "divisibility",
                         f"D*t*c*p = {lay.D}*{lay.t}*{lay.c}*{lay.p} != G={cluster.gpus}")
    m = max(1, o.batch // (lay.D * o.b))
    if lay.m != m:
        raise ValueError(f"m={lay.m} but global_batch/(D*b) = {o.batch}/({lay.D}*{o.b}) gives {m}")
    rj = (geometry_rejection(model, cluster, lay.D, lay.t, lay.p, lay.c, o, sp)
          or chunk_rejection(model, lay.D, lay.t, lay.p, lay.c, lay.v, m, o, sp)
          or ep_rejection(model, lay.D, lay.t, lay.p, lay.c, lay.v, lay.ep, m, sp))
    if rj is not None:
        return Rejection(lay, rj.reason, rj.detail)
    zero = (lay.zero, reshard, reps)
    return cost_layouts(model, cluster, lay.D, lay.t, lay.p, lay.c, lay.v, lay.ep, (zero,),
                        (lay.recompute,), o, sp)[0]


@dataclass(frozen=True)
class Plan:
    """Feasible layouts ranked by predicted step time, and the rejected ones with reasons.

    A rejection whose layout has ``None`` fields covers every value of those fields (a
    tensor group beyond a node is rejected for every ZeRO stage and recompute mode).
    ``skipped``: the cells ``(D, t, p, c, sp, v, ep)`` a bounded search did not cost, every
    layout of which is slower than rank ``settings["bounded"]["ranked_exactly"]``
    (:mod:`.layout_bound`; empty for a full search)."""

    model: ModelShape
    cluster: Cluster
    global_batch: int
    feasible: tuple[Candidate, ...]
    rejected: tuple[Rejection, ...]
    settings: dict[str, object] = field(default_factory=dict)
    skipped: tuple[tuple, ...] = ()

    def find(self, **fields: object) -> list[Candidate]:
        """Feasible candidates whose layout matches every given field (e.g. ``t=8, p=16``)."""
        return [c for c in self.feasible
                if all(getattr(c.layout, k) == x for k, x in fields.items())]

    def find_rejected(self, **fields: object) -> list[Rejection]:
        """Rejections matching every given field (``None`` in a rejection matches anything)."""
        return [r for r in self.rejected
                if all(getattr(r.layout, k) in (x, None) for k, x in fields.items())]

    def find_skipped(self, **fields: object) -> list[Layout]:
        """Cells a bounded search did not cost that match every given field, as layouts with
        ``None`` for the fields they cover (ZeRO, recompute, resharding, replicas)."""
        out = []
        for D, t, p, c, sp, vv, ep in self.skipped:
            lay = Layout(D, t, p, c, ep, None, None, max(1, self.global_batch // (
                D * self.settings.get("microbatch", 1))), vv, sp, None, None)
            if all(getattr(lay, k) in (x, None) for k, x in fields.items()):
                out.append(lay)
        return out

    def rank_of(self, cand: Candidate) -> int:
        """1-based position of ``cand`` in the ranking (by identity first: comparing
        candidates field by field is slow on a long ranking)."""
        for i, c in enumerate(self.feasible):
            if c is cand:
                return i + 1
        return self.feasible.index(cand) + 1

    def rejected_counts(self) -> dict[str, int]:
        out = {r: 0 for r in REASONS}
        for rj in self.rejected:
            out[rj.reason] += 1
        return out

    def compare(self, better: Candidate, worse: Candidate) -> dict[str, float]:
        """Seconds per step by which each time term of ``worse`` exceeds ``better``'s."""
        keys = dict.fromkeys([*better.times, *worse.times])  # an evaluate() may add a term
        return {k: worse.times.get(k, 0.0) - better.times.get(k, 0.0) for k in keys}

    def explain(self, cand: Candidate, against: Candidate | None = None, terms: int = 3) -> str:
        """One sentence: where ``cand`` ranks and which time terms put ``against`` (default:
        the first-ranked layout) ahead of it, largest differences first."""
        top = self.feasible[0] if against is None else against
        rank = self.rank_of(cand)
        bounded = self.settings.get("bounded")
        of = (f"{len(self.feasible)}" if not bounded or rank <= bounded["ranked_exactly"] else
              f"the {len(self.feasible)} a bounded search costed (exact down to rank "
              f"{bounded['ranked_exactly']})")
        if top is cand:
            return f"{cand.layout.label} ranks 1 of {of}."
        diff = sorted(self.compare(top, cand).items(), key=lambda kv: -abs(kv[1]))[:terms]
        parts = ", ".join(f"{k.replace('_', ' ')} {d:+.2f} s" for k, d in diff if d)
        return (
            f"{cand.layout.label} ranks {rank} of {of} "
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
    reserve: float = DEFAULT_RESERVE,
    max_bubble: float = 0.25,
    q: float = 2,
    causal: bool = True,
    max_cp: int = 32,
    min_local_seq: int = 1024,
    sp: bool | None = None,
    embedding_in_split: bool = False,
    hsdp: bool = True,
    offload: bool = False,
    pcie_bandwidth: float = 25e9,
    host_bandwidth: float = 100e9,
    full: bool | None = None,
) -> Plan:
    """Enumerate, check and rank layouts of ``model`` on ``cluster`` (module docstring).

    ``global_batch`` sequences per step, ``microbatch`` sequences per microbatch, ``reserve``
    the fraction of GPU memory kept free for what the accounting leaves out, ``max_bubble``
    the largest pipeline idle fraction accepted, ``q`` bytes per communicated element,
    ``causal`` whether attention skips the masked half. The search bounds: ``c <= max_cp`` and
    ``s / c >= min_local_seq`` tokens per context rank; ``sp`` True/False forces sequence
    parallelism on/off, ``None`` takes it wherever ``t`` divides ``s / c``;
    ``embedding_in_split`` counts the embedding and the head as one layer each of the stage
    partition (the first and the last stage then hold one transformer layer fewer); ``hsdp``
    also costs each geometry's hybrid-sharded layouts (ZeRO-1/2/3 sharded inside a node);
    ``offload`` costs every ZeRO-1/2 layout with ZeRO-Offload: the master weights and moments
    of the rank's shard on the host (not in the device peak), and per step the gradient shard
    down and the weights up at ``pcie_bandwidth`` plus the update at ``host_bandwidth``
    instead of the device's (:func:`.hierarchical.offload_step`), added to the step as the
    ``offload`` time (ZeRO-0 and ZeRO-3 are costed as without it). ``full``: cost every
    layout (True), or only those a branch and bound cannot rule out of the first
    :data:`.layout_bound.RANKED_EXACTLY` ranks (False); ``None`` (default) decides by the size
    of the search, so that any search answers within a second (:mod:`.layout_bound`).
    """
    _check_inputs(model, cluster)
    o = _check_opts(global_batch, microbatch, recipe, reserve, max_bubble, q, causal,
                    embedding_in_split, offload, pcie_bandwidth, host_bandwidth)
    max_c = chk.positive_int("max_cp", max_cp)
    min_s = chk.positive_int("min_local_seq", min_local_seq)
    if sp is not None:
        chk.flag("sp", sp)
    hsdp = chk.flag("hsdp", hsdp)
    if full is not None:
        chk.flag("full", full)
    eps = divisors(model.experts) if model.experts > 1 else [1]
    recs = tuple(RECOMPUTE_MODES)
    # the rejections found before costing and the cells to cost, in the full search's order;
    # the search is bounded when its work is too large for a second (layout_bound)
    items, cells, is_bounded = search_space(
        model, cluster, o, max_c, min_s, sp, hsdp, eps,
        lambda n, splits: full is False or (full is None and work(n, splits) > EXACT_WORK))

    def zeros_of(i: int) -> tuple:
        return zero_choices(cells[i][0], cells[i][3], model.experts)

    def cost(i: int) -> list:
        D, t, p, c, spv, vv, ep = cells[i]
        zeros = zeros_of(i)
        reps = tuple(hsdp_replicas(D, c)) if hsdp else ()
        return cost_layouts(model, cluster, D, t, p, c, vv, ep, zeros, recs, o, spv, reps)

    bounded, skipped = None, []
    if is_bounded:
        done, bounded, skipped = bounded_search(model, cluster, o, cells, cost, zeros_of, hsdp)
    else:
        done = {i: cost(i) for i in range(len(cells))}
    feasible, rejected = [], []
    for item in items:
        if isinstance(item, Rejection):
            rejected.append(item)
            continue
        for r in done.get(item, ()):
            (feasible if isinstance(r, Candidate) else rejected).append(r)
    feasible.sort(key=lambda c: (c.step_time, c.peak))
    recipe_name = getattr(o.recipe, "name", o.recipe)
    settings = {"microbatch": o.b, "recipe": recipe_name, "reserve": o.reserve,
                "max_bubble": o.max_bubble, "q": o.q, "causal": o.causal, "max_cp": max_c,
                "min_local_seq": min_s, "sp": sp, "embedding_in_split": o.embedding_in_split,
                "hsdp": hsdp, "offload": o.offload,
                **({"pcie_bandwidth": o.pcie_bandwidth, "host_bandwidth": o.host_bandwidth}
                   if o.offload else {}),
                "budget_bytes": cluster.gpu_memory * (1 - o.reserve),
                **({"bounded": bounded} if bounded else {})}
    return Plan(model, cluster, o.batch, tuple(feasible), tuple(rejected), settings,
                tuple(cells[i] for i in skipped))
