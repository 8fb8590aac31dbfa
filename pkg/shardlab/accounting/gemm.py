"""Per-GEMM efficiency: a roofline of each matrix product against the device's ridge, capped.

Williams, Waterman and Patterson, *Roofline* (2009); the book's chapter 0. A product of an
``m x k`` by a ``k x n`` matrix in ``q``-byte elements does ``F = 2 m k n`` FLOPs and moves at
least ``q (m k + k n + m n)`` bytes between HBM and the chip (each operand read once, the
result written once), so its **arithmetic intensity** is ``I = F / bytes`` FLOP/byte. The
device's **ridge** is ``peak / bandwidth``: below it the product waits for memory. The model::

    time = max(F / (cap x peak), bytes / bandwidth)
    efficiency = F / (time x peak) = min(cap, I / ridge)

The pieces are functions of their own: :func:`matmul_flops`, :func:`matmul_bytes`,
:func:`gemm_intensity`, :func:`ridge`, :func:`roofline_flops` (the attainable rate
``min(peak, I x bandwidth)``) and :func:`gemm_bound`; :func:`gemm_efficiency` is
``roofline_flops(I, cap x peak, bandwidth) / peak``.

``cap`` is the fraction of the dense peak the largest products reach inside a training step
(an assumption stated once, :data:`DEFAULT_CAP`; kernel launch, wave quantization and the
element-wise work between products are folded into it). ``I`` is symmetric in ``m, k, n``, so
the two backward products of a weight (input gradient, weight gradient) have the forward's
intensity: backward time is twice the forward's, product by product.

:func:`layer_gemms` lists the products of one transformer layer at one rank's shapes: the
``T = b s/c`` tokens of a microbatch (all of them: with sequence parallelism the products run
on the gathered sequence), weights split ``t`` ways, experts ``ep`` ways (each local expert
sees ``T top_k ep / experts`` tokens on average), and the attention core with **materialized
scores** (``Q K^T`` of ``s/c x d`` by ``d x s`` and ``P V`` per local head, as the memory
model's ``a s^2 b`` term assumes; a fused flash kernel keeps the scores on chip and would be
compute-bound instead).

Between the products run **element-wise kernels** (norms, residual adds with dropout, the MLP's
activation, softmax and dropout of the scores) whose intensity is near zero: they take the
bytes they move divided by the HBM bandwidth (:func:`elementwise_bytes`). Per layer forward, in
``q``-byte elements with 1-byte dropout masks (``d = 1`` with dropout)::

    outside the tensor-parallel region  s b h (10 q + 2 d)      two norms (read, write) and two
                                                                 fused dropout-adds (read x and
                                                                 residual, write, mask); split t
                                                                 ways only with SP
    MLP activation                      s b f (2 or 3) q / t     GeLU reads and writes f wide;
                                                                 SwiGLU reads two, writes one
    attention scores (materialized)     a s^2 b (2 q + d (2 q + 1)) / t   softmax, dropout

Backward moves about twice these bytes, as it does twice the FLOPs. Fused kernels (a flash
attention, fused norms) move less; this is the unfused count of a Megatron-style layer.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import _validate as v

DEFAULT_CAP = 0.6  # share of the dense peak the largest GEMMs reach in a training step


@dataclass(frozen=True)
class Device:
    """A GPU: memory (bytes, GB = 10^9), dense bf16 peak (FLOP/s), HBM bandwidth (bytes/s)."""

    name: str
    memory: float
    peak_flops: float
    hbm_bandwidth: float

    @property
    def ridge(self) -> float:
        """FLOP/byte at which a product turns from memory-bound to compute-bound."""
        return ridge(self.peak_flops, self.hbm_bandwidth)


# Data-sheet figures (dense bf16 Tensor Core peak = half the "with sparsity" figure):
# NVIDIA A100 Tensor Core GPU data sheet (2021): BF16 312 TFLOPS, HBM2 1,555 GB/s (40 GB SXM),
#   HBM2e 2,039 GB/s (80 GB SXM);
# NVIDIA H100 Tensor Core GPU data sheet (2023), H100 SXM: BF16 1,979 TFLOPS with sparsity,
#   80 GB, 3.35 TB/s;
# NVIDIA H200 Tensor Core GPU data sheet (2024), H200 SXM: BF16 1,979 TFLOPS with sparsity,
#   141 GB, 4.8 TB/s;
# NVIDIA HGX B200 / DGX B200 data sheets (2024): BF16 4.5 PFLOPS with sparsity per GPU,
#   1,440 GB and 64 TB/s over 8 GPUs (180 GB, 8 TB/s each).
DEVICES = {
    "a100-40gb": Device("A100 SXM 40 GB", 40e9, 312e12, 1555e9),
    "a100-80gb": Device("A100 SXM 80 GB", 80e9, 312e12, 2039e9),
    "h100": Device("H100 SXM 80 GB", 80e9, 989e12, 3.35e12),
    "h200": Device("H200 SXM 141 GB", 141e9, 989e12, 4.8e12),
    "b200": Device("B200 (HGX) 180 GB", 180e9, 2.25e15, 8e12),
}


def _mkn(m: float, k: float, n: float) -> tuple[float, float, float]:
    return tuple(v.number(name, x) for name, x in (("m", m), ("k", k), ("n", n)))


def matmul_flops(m: float, k: float, n: float) -> float:
    """FLOPs of an ``m x k`` by ``k x n`` product: ``2 m k n`` (one multiply, one add each)."""
    m, k, n = _mkn(m, k, n)
    return 2.0 * m * k * n


def matmul_bytes(m: float, k: float, n: float, q: float = 2) -> float:
    """Fewest bytes the product moves through memory in ``q``-byte elements:
    ``q (m k + k n + m n)`` (both operands read once, the result written once)."""
    m, k, n = _mkn(m, k, n)
    return v.number("q", q) * (m * k + k * n + m * n)


def gemm_intensity(m: float, k: float, n: float, q: float = 2) -> float:
    """FLOP per byte of an ``m x k`` by ``k x n`` product: ``2 m k n / (q (m k + k n + m n))``."""
    return matmul_flops(m, k, n) / matmul_bytes(m, k, n, q)


def ridge(peak_flops: float, bandwidth: float) -> float:
    """Machine balance in FLOP/byte, ``peak / bandwidth``: the intensity at which the time
    to move a product's bytes equals the time to do its FLOPs."""
    return v.number("peak_flops", peak_flops) / v.number("bandwidth", bandwidth)


def roofline_flops(intensity: float, peak_flops: float, bandwidth: float) -> float:
    """Attainable FLOP/s at an arithmetic intensity: ``min(peak, intensity x bandwidth)``
    (the roofline; below the ridge the bandwidth roof, above it the compute roof)."""
    i = v.number("intensity", intensity)
    return min(v.number("peak_flops", peak_flops), i * v.number("bandwidth", bandwidth))


def gemm_bound(intensity: float, ridge: float) -> str:
    """``"memory"`` below the ridge, ``"compute"`` at or above it."""
    return "memory" if v.number("intensity", intensity) < v.number("ridge", ridge) else "compute"


def gemm_efficiency(intensity: float, ridge: float, cap: float = DEFAULT_CAP) -> float:
    """Attained share of the peak: ``min(cap, intensity / ridge)`` (module docstring)."""
    i, r = v.number("intensity", intensity), v.number("ridge", ridge)
    c = v.number("cap", cap)
    if c > 1:
        raise ValueError(f"cap={cap!r} must be a fraction of the peak in (0, 1]")
    return min(c, i / r)


def gemm_time(m: float, k: float, n: float, peak_flops: float, bandwidth: float,
              cap: float = DEFAULT_CAP, q: float = 2, count: float = 1) -> float:
    """Seconds of ``count`` products ``m x k`` by ``k x n``: ``max(F/(cap peak), bytes/bw)``."""
    eff = gemm_efficiency(gemm_intensity(m, k, n, q), peak_flops / bandwidth, cap)
    return count * 2.0 * m * k * n / (eff * v.number("peak_flops", peak_flops))


@dataclass(frozen=True)
class Gemm:
    """``count`` products of ``m x k`` by ``k x n`` per microbatch forward on one rank."""

    name: str
    m: float
    k: float
    n: float
    count: float = 1.0

    @property
    def flops(self) -> float:
        return 2.0 * self.m * self.k * self.n * self.count


def layer_gemms(model, t: int, c: int, b: int, ep: int = 1) -> dict[str, list[Gemm]]:
    """One layer's forward products on one rank (module docstring), grouped ``"weights"``
    (projections, MLP, router) and ``"attention"`` (the core, before any causal saving),
    plus ``"head"`` (the output head, whole; the planner spreads it over the stages)."""
    h, d, s = model.hidden, model.head_dim, model.seq_len
    T = b * s / c  # tokens of one microbatch on this rank (gathered under SP)
    kv = model.kv_heads * d
    f_up = (2 if model.gated else 1) * model.ffn
    w = [Gemm("qkv", T, h, (h + 2 * kv) / t), Gemm("attn_out", T, h / t, h)]
    if model.experts == 1:
        w += [Gemm("mlp_up", T, h, f_up / t), Gemm("mlp_down", T, model.ffn / t, h)]
    else:
        tok = T / t  # routed tokens of this rank's sequence shard
        per_expert = tok * model.top_k * ep / model.experts
        local = model.experts / ep
        w += [Gemm("router", tok, h, model.experts),
              Gemm("expert_up", per_expert, h, f_up, local),
              Gemm("expert_down", per_expert, model.ffn, h, local)]
    heads = model.heads / t
    att = [Gemm("scores", s / c, d, s, b * heads), Gemm("context", s / c, s, d, b * heads)]
    return {"weights": w, "attention": att, "head": [Gemm("head", T, h, model.vocab / t)]}


def gemms_time(gemms: list[Gemm], peak_flops: float, bandwidth: float | None, cap: float,
               q: float = 2) -> float:
    """Seconds of a list of products; ``bandwidth=None``: every product at ``cap`` (no
    roofline, the constant-efficiency model)."""
    if bandwidth is None:
        return sum(g.flops for g in gemms) / (cap * peak_flops)
    return sum(gemm_time(g.m, g.k, g.n, peak_flops, bandwidth, cap, q, g.count) for g in gemms)


def elementwise_bytes(model, t: int, c: int, b: int, sp: bool = True, q: float = 2) -> dict:
    """Forward HBM bytes of one layer's element-wise kernels on one rank (module docstring):
    ``"layer"`` (norms, dropout-adds, MLP activation) and ``"attention"`` (softmax and dropout
    of the materialized scores, recomputed with the attention core)."""
    h, s_loc, d = model.hidden, model.seq_len / c, 1.0 if model.dropout else 0.0
    sbh = s_loc * b * h
    outside = sbh * (10 * q + 2 * d) / (t if sp else 1)
    act = s_loc * b * model.ffn * (3 if model.gated else 2) * q / t
    if model.experts > 1:
        act *= model.top_k
    scores = model.heads * s_loc * model.seq_len * b * (2 * q + d * (2 * q + 1)) / t
    return {"layer": outside + act, "attention": scores}
