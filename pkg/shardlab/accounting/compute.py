"""Compute model: FLOPs per token, recomputation, time at a peak rate, MFU, roofline of overlap.

Kaplan et al., *Scaling Laws* (2020), Sec. 2.1; Chowdhery et al., *PaLM* (2022), App. B
(model FLOPs utilization); Korthikanti et al. (2022), Sec. 5 (recomputation cost);
Narayanan et al., *Megatron-LM* (2021), Sec. 5.

**FLOPs per token.** A matrix multiply of a token's ``k``-vector by a ``k x n`` weight costs
``2 k n`` FLOPs (multiply + add), so the forward pass costs ``2 N_mm`` per token, ``N_mm`` being
the parameters that take part in a matrix multiply (every layer's weights and the output
head; not the embedding lookup, not the norms). Attention adds the work that has no weights:
``Q K^T`` and ``softmax(.) V`` cost ``2 s d`` each per token and layer, ``d`` = query heads x
head dimension::

    forward    2 N_mm + 4 L s d f          (f = 1, or 1/2 with causal = True: a causal kernel
                                            skips the masked half of the score matrix)
    backward   2 x forward                 (gradients of the inputs and of the weights)
    step       6 N_mm + 12 L s d f         (the "6N rule" plus the attention term)

PaLM's MFU counts the full score matrix (``f = 1``); :func:`attention_flops_per_token`
takes ``causal`` so a caller can count what the kernel really does.

**Recomputation** (extra forward work per token, :func:`recompute_flops_per_token`):
``"none"`` 0; ``"selective"`` the attention core's forward again (``4 L s d f``; the
softmax and dropout are negligible FLOPs), what Korthikanti et al. recompute;
``"full"`` every layer's forward again (``2 N_layers + 4 L s d f``; the head is not
recomputed). Model FLOPs (MFU) exclude recomputation; hardware FLOPs (HFU) include it.

**Time.** ``T = FLOPs / (peak x efficiency)`` (:func:`compute_time`): ``efficiency`` is the
achievable fraction of the peak for these kernels (an assumption, 0 < e <= 1). The planner
gives each matrix product its own efficiency instead (:mod:`.gemm`: a roofline of its
arithmetic intensity against the device's ridge, capped).
``MFU = model FLOPs of the step / (step time x G x peak)`` (:func:`mfu`).

**Roofline of a collective** (:func:`collective_roofline`, :func:`roofline`): a collective of
``T_comm`` seconds (``comm.collectives_time``, the alpha-beta model) can hide behind
``F`` FLOPs of independent compute lasting ``T_comp = compute_time(F)``. Hidden time
``min(T_comm, T_comp)``, exposed ``max(0, T_comm - T_comp)``; the pair is
*communication-bound* when ``T_comm > T_comp``. The arithmetic intensity ``F / bytes`` is
compared with the machine balance ``peak x efficiency / beta`` (FLOPs the GPU does while one
byte crosses the link): above it the bandwidth term is hidden.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import _validate as v
from .activations import NORMS
from .comm import collectives_time, sent_bytes

RECOMPUTE = ("none", "selective", "full")
PHASES = ("forward", "backward", "step")
_PHASE_FACTOR = {"forward": 1, "backward": 2, "step": 3}


def _causal(causal: bool) -> float:
    return 0.5 if v.flag("causal", causal) else 1.0


def attention_flops_per_token(
    layers: int, seq_len: int, attn_dim: int, causal: bool = False
) -> float:
    """Forward FLOPs per token of ``Q K^T`` and ``softmax V``: ``4 L s d`` (halved if causal)."""
    L = v.positive_int("layers", layers)
    s = v.positive_int("seq_len", seq_len)
    d = v.positive_int("attn_dim", attn_dim)
    return 4.0 * L * s * d * _causal(causal)


def flops_per_token(
    matmul_params: float,
    layers: int,
    seq_len: int,
    attn_dim: int,
    phase: str = "step",
    causal: bool = False,
) -> float:
    """FLOPs per token: forward ``2 N_mm + 4 L s d f``, backward twice that, step three times.

    ``matmul_params`` (``N_mm``) counts the weights used in matrix multiplies per token (for
    a mixture of experts, only the ``top_k`` experts a token visits).
    """
    n = v.number("matmul_params", matmul_params)
    ph = v.choice("phase", phase, PHASES)
    fwd = 2.0 * n + attention_flops_per_token(layers, seq_len, attn_dim, causal)
    return _PHASE_FACTOR[ph] * fwd


def six_n(n_params: float) -> float:
    """The 6N rule alone: ``6 N`` training FLOPs per token (no attention term)."""
    return 6.0 * v.number("n_params", n_params)


def recompute_flops_per_token(
    mode: str,
    layer_matmul_params: float,
    layers: int,
    seq_len: int,
    attn_dim: int,
    causal: bool = False,
) -> float:
    """Extra forward FLOPs per token spent recomputing (see the module docstring).

    ``layer_matmul_params``: matrix-multiply weights of all ``layers`` together (no head).
    """
    mode = v.choice("mode", mode, RECOMPUTE)
    n = v.nonneg_number("layer_matmul_params", layer_matmul_params)
    attn = attention_flops_per_token(layers, seq_len, attn_dim, causal)
    if mode == "none":
        return 0.0
    if mode == "selective":
        return attn
    return 2.0 * n + attn


def compute_time(flops: float, peak_flops: float, efficiency: float = 1.0) -> float:
    """Seconds for ``flops`` at ``peak_flops`` (FLOP/s) times the achievable ``efficiency``."""
    f = v.nonneg_number("flops", flops)
    peak = v.number("peak_flops", peak_flops)
    e = v.number("efficiency", efficiency)
    if e > 1:
        raise ValueError(f"efficiency={efficiency!r} must be a fraction of the peak in (0, 1]")
    return _compute_time(f, peak, e)


def _compute_time(flops: float, peak_flops: float, efficiency: float) -> float:
    # the formula of compute_time without its checks, for callers that checked the inputs
    # once (the planner's search calls it tens of thousands of times)
    return flops / (peak_flops * efficiency)


def mfu(model_flops: float, step_time: float, n_gpus: int, peak_flops: float) -> float:
    """Model FLOPs utilization: ``model_flops / (step_time * n_gpus * peak_flops)``.

    ``model_flops`` are the FLOPs of one step *without* recomputation (pass them with it
    to get the hardware FLOPs utilization instead).
    """
    f = v.nonneg_number("model_flops", model_flops)
    t = v.number("step_time", step_time)
    g = v.positive_int("n_gpus", n_gpus)
    peak = v.number("peak_flops", peak_flops)
    return _mfu(f, t, g, peak)


def _mfu(model_flops: float, step_time: float, n_gpus: int, peak_flops: float) -> float:
    # mfu without its checks (see _compute_time)
    return model_flops / (step_time * n_gpus * peak_flops)


@dataclass(frozen=True)
class Roofline:
    """A communication of ``comm_time`` s and ``bytes_sent`` bytes against ``flops`` of compute
    that can run meanwhile, lasting ``compute_time`` s. ``balance``: FLOPs per byte at which
    the bandwidth term equals the compute (``peak x efficiency / beta``)."""

    name: str
    comm_time: float
    compute_time: float
    bytes_sent: float
    flops: float
    balance: float

    @property
    def hidden(self) -> float:
        """Seconds of communication that overlap compute: ``min(T_comm, T_comp)``."""
        return min(self.comm_time, self.compute_time)

    @property
    def exposed(self) -> float:
        """Seconds of communication left on the critical path: ``max(0, T_comm - T_comp)``."""
        return max(0.0, self.comm_time - self.compute_time)

    @property
    def overlap(self) -> float:
        """Hidden share of the communication (1.0 when there is none)."""
        return self.hidden / self.comm_time if self.comm_time else 1.0

    @property
    def intensity(self) -> float:
        """FLOPs available per byte sent (``inf`` when nothing is sent)."""
        return self.flops / self.bytes_sent if self.bytes_sent else float("inf")

    @property
    def bound(self) -> str:
        """``"communication"`` if the transfer outlasts the compute it hides behind."""
        return "communication" if self.comm_time > self.compute_time else "compute"

    def as_row(self) -> dict[str, object]:
        return {
            "name": self.name,
            "comm_time": self.comm_time,
            "compute_time": self.compute_time,
            "hidden": self.hidden,
            "exposed": self.exposed,
            "overlap": self.overlap,
            "bytes_sent": self.bytes_sent,
            "flops": self.flops,
            "intensity": self.intensity,
            "balance": self.balance,
            "bound": self.bound,
        }


def roofline(
    name: str,
    comm_time: float,
    bytes_sent: float,
    hide_flops: float,
    peak_flops: float,
    efficiency: float = 1.0,
    beta: float | None = None,
) -> Roofline:
    """:class:`Roofline` of an already timed communication (e.g. ``comm.p2p_time``) against
    ``hide_flops`` of compute. ``beta`` (bytes/s) gives the machine balance (else ``inf``)."""
    if not isinstance(name, str):
        raise ValueError(f"name={name!r} must be a string")
    tc = v.nonneg_number("comm_time", comm_time)
    nb = v.nonneg_number("bytes_sent", bytes_sent)
    compute_time(hide_flops, peak_flops, efficiency)  # checks the compute side
    if beta is not None:
        v.number("beta", beta)
    return _roofline(name, tc, nb, hide_flops, peak_flops, efficiency, beta)


def _roofline(name, comm_time, bytes_sent, hide_flops, peak_flops, efficiency, beta) -> Roofline:
    # roofline without its checks (see _compute_time)
    comp = _compute_time(hide_flops, peak_flops, efficiency)
    balance = float("inf") if beta is None else peak_flops * efficiency / beta
    return Roofline(name, float(comm_time), comp, float(bytes_sent), float(hide_flops), balance)


def collective_roofline(
    op: str,
    nbytes_each: float,
    group_size: int,
    count: int,
    alpha: float,
    beta: float,
    hide_flops: float,
    peak_flops: float,
    efficiency: float = 1.0,
    algo: str = "ring",
    name: str | None = None,
) -> Roofline:
    """``count`` collectives ``op`` of ``nbytes_each`` (``comm.collectives_time``) against
    ``hide_flops`` of compute at ``peak_flops x efficiency``."""
    t = collectives_time(op, nbytes_each, group_size, count, alpha, beta, algo)
    nb = int(count) * sent_bytes(op, nbytes_each, group_size, algo)
    return roofline(name or op, t, nb, hide_flops, peak_flops, efficiency, beta)


@dataclass(frozen=True)
class ModelShape:
    """A decoder-only transformer: the shape the compute model and the planner read.

    The defaults describe a Llama-style layer (gated SwiGLU MLP, no dropout, RMSNorm); a
    GPT-style layer as Korthikanti et al. analyse it is ``gated=False, dropout=True,
    norm="layernorm"`` with ``ffn = 4 h`` and ``kv_heads = heads``.

    Parameters per layer: attention ``2 h^2 + 2 h h_kv`` (``W_Q``, ``W_O``; ``W_K``, ``W_V``
    with ``h_kv = kv_heads * h / heads``), MLP ``k h f`` per expert (``k = 3`` gated/SwiGLU,
    ``2`` for a GeLU MLP), a router of ``h E`` when ``experts > 1``, two norms of ``h``.
    Plus the embedding ``V h``, the output head ``V h`` unless tied, and the final norm.
    Llama 3 405B (``L=126, h=16384, heads=128, kv_heads=8, f=53248, V=128256``) has
    405.8e9.
    """

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    seq_len: int
    gated: bool = True
    experts: int = 1
    top_k: int = 1
    tied_embeddings: bool = False
    dropout: bool = False
    norm: str = "rmsnorm"

    def __post_init__(self) -> None:
        for name in ("layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "seq_len",
                     "experts", "top_k"):
            object.__setattr__(self, name, v.positive_int(name, getattr(self, name)))
        v.flag("gated", self.gated)
        v.flag("tied_embeddings", self.tied_embeddings)
        v.flag("dropout", self.dropout)
        v.choice("norm", self.norm, tuple(NORMS))
        if self.hidden % self.heads:
            raise ValueError(f"hidden={self.hidden} is not divisible by heads={self.heads}")
        if self.heads % self.kv_heads:
            raise ValueError(f"kv_heads={self.kv_heads} does not divide heads={self.heads}")
        if self.top_k > self.experts:
            raise ValueError(f"top_k={self.top_k} exceeds experts={self.experts}")

    @property
    def activation_layer(self) -> dict[str, object]:
        """Keyword arguments of :func:`.activations.activation_bytes_per_layer` for this layer:
        its MLP width, whether the MLP is gated (a SwiGLU MLP saves three ``f``-wide tensors, a
        GeLU MLP two), its K/V heads (grouped-query attention saves K and V ``kv_heads/heads``
        as wide as Q), dropout and norm. The Korthikanti constants are the GPT-style case
        (``gated=False``, ``kv_heads=heads``, dropout, LayerNorm, ``ffn = 4 h``)."""
        return {"ffn": self.ffn, "gated": self.gated, "kv_heads": self.kv_heads,
                "dropout": self.dropout, "norm": self.norm}

    def check_gpt_style(self, who: str) -> None:
        """Refuse, in one sentence naming ``who``, a shape a GPT-style model cannot build: a
        gated MLP, grouped K/V heads, experts or RMSNorm (the labs' models have a GeLU MLP,
        full multi-head attention, one MLP per layer and LayerNorm)."""
        want = {"gated": False, "kv_heads": self.heads, "experts": 1, "norm": "layernorm"}
        bad = [f"{k}={getattr(self, k)!r}" for k, x in want.items() if getattr(self, k) != x]
        if bad:
            raise ValueError(
                f"{who} builds a GPT-style layer (gated=False, kv_heads=heads={self.heads}, "
                f"experts=1, norm='layernorm'); this shape has {', '.join(bad)}."
            )

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def attn_params(self) -> int:
        """``W_Q, W_K, W_V, W_O`` of one layer."""
        return 2 * self.hidden**2 + 2 * self.hidden * self.kv_heads * self.head_dim

    @property
    def mlp_params(self) -> int:
        """One expert's (or the dense) MLP of one layer."""
        return (3 if self.gated else 2) * self.hidden * self.ffn

    @property
    def router_params(self) -> int:
        return self.hidden * self.experts if self.experts > 1 else 0

    @property
    def layer_params(self) -> int:
        """All parameters of one layer (every expert, the norms)."""
        return (
            self.attn_params + self.experts * self.mlp_params + self.router_params + 2 * self.hidden
        )

    @property
    def embedding_params(self) -> int:
        return self.vocab * self.hidden

    @property
    def head_params(self) -> int:
        return 0 if self.tied_embeddings else self.vocab * self.hidden

    @property
    def n_params(self) -> int:
        """Every parameter: layers, embedding, head (unless tied), final norm."""
        return (self.layers * self.layer_params + self.embedding_params + self.head_params
                + self.hidden)

    @property
    def layer_matmul_params(self) -> int:
        """Matrix-multiply weights one token meets in one layer (``top_k`` experts)."""
        return self.attn_params + self.top_k * self.mlp_params + self.router_params

    @property
    def matmul_params(self) -> int:
        """``N_mm`` of the 6N rule: every layer's active matmul weights plus the head."""
        return self.layers * self.layer_matmul_params + self.vocab * self.hidden

    def flops_per_token(self, phase: str = "step", causal: bool = False) -> float:
        """:func:`flops_per_token` of this model at its ``seq_len`` (model FLOPs)."""
        return flops_per_token(
            self.matmul_params, self.layers, self.seq_len, self.hidden, phase, causal
        )

    def recompute_flops_per_token(self, mode: str, causal: bool = False) -> float:
        """:func:`recompute_flops_per_token` of this model."""
        return recompute_flops_per_token(
            mode, self.layers * self.layer_matmul_params, self.layers, self.seq_len,
            self.hidden, causal,
        )


LLAMA3_405B = dict(
    layers=126, hidden=16384, heads=128, kv_heads=8, ffn=53248, vocab=128256, seq_len=8192
)
