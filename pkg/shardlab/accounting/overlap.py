"""Compute versus communication: when each layout's traffic can hide behind its compute.

For one parallelism at a time, :func:`ratio` puts the time of the bytes it must move (the
α–β model of :mod:`.comm`, with the volumes of :mod:`.comm` and :mod:`.context`) over the
time of the compute those bytes can overlap (the FLOPs of :mod:`.compute` at an achieved rate
``rate`` = peak x efficiency, in FLOP/s). ``r = T_comm / T_compute <= 1``: the traffic fits
behind the compute (a schedule must still overlap it); ``r > 1``: the axis is
communication-bound, and at least ``T_comm - T_compute`` of it is exposed.

What each traffic can hide behind, per step and rank (``T`` tokens on the rank, ``N`` its
parameters, ``P`` the matrix-multiply parameters of one layer, ``t`` the tensor degree):

* **DDP**: the gradient all-reduce behind the backward, ``4 N T`` FLOPs (the last bucket
  cannot: the bandwidth term is what scales). **ZeRO-1/2**: the reduce-scatter behind the
  backward and the parameter all-gather behind the next forward, ``6 N T``. **ZeRO-3/FSDP**:
  gathers and reduce-scatters layer by layer behind the neighbouring layer's compute,
  ``6 N T`` over a step. Volumes: :func:`.comm.step_volume`.
* **TP**: the four all-reduces of a layer's ``b s h`` activations (``8 q b s h (t-1)/t``
  bytes, :func:`.comm.tp_volume`) against the layer's own ``6 P b s / t`` FLOPs. In Megatron
  these collectives sit between the matrix products that need them (exposed); the ratio says
  how much they cost next to the compute, and the break-even width is where they stop
  dominating.
* **PP**: one ``b s h`` activation per microbatch forward and one gradient back per stage
  boundary against the stage's ``6 P L_s b s`` FLOPs.
* **CP**: the K/V ring passes (:func:`.context.cp_volume`, 3 units per step) against the
  attention core's ``3 x 4 b s^2 d / c`` FLOPs (halved when causal).
* **EP**: four all-to-alls per layer and step of ``top_k b s h`` activations against the
  experts' ``6 top_k M h f`` FLOPs per token (``M`` = 3 matrices gated, 2 not).

The closed-form thresholds (:func:`dp_break_even_tokens`, :func:`tp_break_even_hidden`,
:func:`ep_break_even_ffn`, :func:`cp_break_even_seq`) use the bandwidth term alone, where
the size that cancels out does (``N`` for DP, ``b s`` for TP and EP); at the returned size
the ratio is exactly 1 with ``alpha = 0``.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import _validate as v
from . import comm
from .context import cp_volume

LAYOUTS = ("ddp", "zero1", "zero2", "zero3")
_HIDE_PASSES = {"ddp": 4.0, "zero1": 6.0, "zero2": 6.0, "zero3": 6.0}  # FLOPs per param per token


@dataclass(frozen=True)
class Overlap:
    """One axis: seconds of traffic and of the compute it can hide behind, and their ratio."""

    axis: str
    comm_s: float
    compute_s: float

    @property
    def ratio(self) -> float:
        return self.comm_s / self.compute_s if self.compute_s else float("inf")

    @property
    def exposed_s(self) -> float:
        """Seconds that cannot hide however well the traffic is scheduled."""
        return max(0.0, self.comm_s - self.compute_s)

    @property
    def bound(self) -> str:
        return "communication" if self.ratio > 1 else "compute"


def _link(rate: float, beta: float, alpha: float) -> tuple[float, float, float]:
    return (v.number("rate", rate), v.number("beta", beta), v.nonneg_number("alpha", alpha))


def ratio(axis: str, comm_bytes: float, flops: float, rate: float, beta: float,
          alpha: float = 0.0, rounds: int = 0) -> Overlap:
    """:class:`Overlap` of ``comm_bytes`` (plus ``rounds`` latencies) against ``flops``."""
    rate, beta, alpha = _link(rate, beta, alpha)
    nb = v.nonneg_number("comm_bytes", comm_bytes)
    fl = v.nonneg_number("flops", flops)
    return Overlap(axis, rounds * alpha + nb / beta, fl / rate)


def dp(layout: str, n_params: float, dp_size: int, tokens: float, rate: float, beta: float,
       q: float = 2, alpha: float = 0.0) -> Overlap:
    """Data parallelism (``layout`` DDP or ZeRO-1/2/3) over ``dp_size`` ranks, ``tokens`` per
    rank per step: :func:`.comm.step_volume` against ``4 N T`` (DDP) or ``6 N T``."""
    lay = v.choice("layout", layout, LAYOUTS)
    n = v.number("n_params", n_params)
    volume = comm.step_volume(lay, max(1, round(n)), dp_size, q)
    return ratio(f"dp ({lay})", volume, _HIDE_PASSES[lay] * n * v.number("tokens", tokens),
                 rate, beta, alpha)


def dp_break_even_tokens(layout: str, dp_size: int, rate: float, beta: float,
                         q: float = 2) -> float:
    """Tokens per rank per step above which the layout's data-parallel traffic fits behind
    its compute (bandwidth term): ``volume per parameter x rate / (k beta)``, ``k`` = 4 or 6.
    DDP on many ranks with ``q = 2``: ``(D-1)/D x rate / beta``."""
    lay = v.choice("layout", layout, LAYOUTS)
    rate, beta, _ = _link(rate, beta, 0.0)
    per_param = comm.step_volume(lay, 10**6, dp_size, q) / 10**6
    return per_param * rate / (_HIDE_PASSES[lay] * beta)


def tp(h: int, t: int, tokens: float, rate: float, beta: float, q: float = 2,
       layer_params: float | None = None, sp: bool = False) -> Overlap:
    """One layer's tensor-parallel traffic (``tokens`` = b s of one microbatch) against its
    own ``6 P tokens / t`` FLOPs; ``layer_params`` defaults to a GPT layer's ``12 h^2``."""
    hh, tt = v.positive_int("h", h), v.positive_int("t", t)
    p = 12.0 * hh * hh if layer_params is None else v.number("layer_params", layer_params)
    tok = v.number("tokens", tokens)
    volume = comm.tp_volume(1, 1, hh, tt, q, sp=sp) * tok  # 8 q h (t-1)/t bytes per token
    return ratio("tp", volume, 6.0 * p * tok / tt, rate, beta)


def tp_break_even_hidden(t: int, rate: float, beta: float, q: float = 2) -> float:
    """Hidden width above which a GPT layer's ``12 h^2`` compute outweighs its tensor-parallel
    traffic: ``q (t-1) rate / (9 beta)`` (independent of batch and sequence)."""
    tt = v.positive_int("t", t)
    rate, beta, _ = _link(rate, beta, 0.0)
    return v.number("q", q) * (tt - 1) * rate / (9.0 * beta)


def pp(h: int, layers_per_stage: int, tokens: float, rate: float, beta: float, q: float = 2,
       layer_params: float | None = None) -> Overlap:
    """A stage boundary's activation and gradient (``2 q tokens h``) against the stage's
    ``6 P L_s tokens`` FLOPs."""
    hh, ls = v.positive_int("h", h), v.positive_int("layers_per_stage", layers_per_stage)
    p = 12.0 * hh * hh if layer_params is None else v.number("layer_params", layer_params)
    tok = v.number("tokens", tokens)
    return ratio("pp", 2.0 * v.number("q", q) * tok * hh, 6.0 * p * ls * tok, rate, beta)


def cp(b: int, s: int, heads: int, kv_heads: int, head_dim: int, c: int, rate: float,
       beta: float, q: float = 2, causal: bool = True) -> Overlap:
    """One layer's context-parallel K/V passes (:func:`.context.cp_volume`, step) against the
    attention core's ``3 x 4 b s (s / c) d`` FLOPs on a rank (halved when causal)."""
    volume = cp_volume(b, s, kv_heads, head_dim, c, q)
    d = v.positive_int("heads", heads) * v.positive_int("head_dim", head_dim)
    core = 3.0 * 4.0 * b * s * (s / c) * d * (0.5 if v.flag("causal", causal) else 1.0)
    return ratio("cp", volume, core, rate, beta)


def cp_break_even_seq(heads: int, kv_heads: int, c: int, rate: float, beta: float,
                      q: float = 2, causal: bool = True) -> float:
    """Sequence length above which the K/V ring passes fit behind the attention core:
    ``6 q (c-1) (kv_heads / heads) rate / (12 f beta)`` tokens, ``f`` = 1/2 when causal."""
    cc = v.positive_int("c", c)
    rate, beta, _ = _link(rate, beta, 0.0)
    frac = v.positive_int("kv_heads", kv_heads) / v.positive_int("heads", heads)
    f = 0.5 if v.flag("causal", causal) else 1.0
    return 6.0 * v.number("q", q) * (cc - 1) * frac * rate / (12.0 * f * beta)


def ep(h: int, ffn: int, top_k: int, ep_size: int, tokens: float, rate: float, beta: float,
       q: float = 2, gated: bool = True) -> Overlap:
    """One MoE layer's four all-to-alls per step (``4 q top_k tokens h (ep-1)/ep`` bytes)
    against its experts' ``6 top_k M h f tokens`` FLOPs."""
    hh, f = v.positive_int("h", h), v.positive_int("ffn", ffn)
    k, e = v.positive_int("top_k", top_k), v.positive_int("ep_size", ep_size)
    tok = v.number("tokens", tokens)
    mats = 3.0 if v.flag("gated", gated) else 2.0
    volume = 4.0 * v.number("q", q) * k * tok * hh * (e - 1) / e
    return ratio("ep", volume, 6.0 * k * mats * hh * f * tok, rate, beta)


def ep_break_even_ffn(ep_size: int, rate: float, beta: float, q: float = 2,
                      gated: bool = True) -> float:
    """Expert width above which the experts' compute outweighs the all-to-alls:
    ``2 q (ep-1)/ep x rate / (3 M beta)``."""
    e = v.positive_int("ep_size", ep_size)
    rate, beta, _ = _link(rate, beta, 0.0)
    mats = 3.0 if v.flag("gated", gated) else 2.0
    return 2.0 * v.number("q", q) * (e - 1) / e * rate / (3.0 * mats * beta)
