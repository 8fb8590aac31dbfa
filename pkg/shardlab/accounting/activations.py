"""Saved-activation bytes of a GPT-style transformer layer (Korthikanti et al., 2022).

Source: Korthikanti et al., *Reducing Activation Recomputation in Large Transformer Models*,
Sections 4-5 and Table 2; lecture 8, "Sequence parallelism removes a replicated activation
floor". The analysed block: standard multi-head attention, GeLU MLP with ``f = 4h``,
2-byte stored activations, 1-byte dropout masks, small buffers (e.g. LayerNorm statistics)
neglected. ``s`` sequence length, ``b`` microbatch size, ``h`` hidden width, ``a`` heads,
``t`` tensor-parallel degree. Bytes per layer:

=====================  =====================================  ===========================
mode                   formula                                 what it models
=====================  =====================================  ===========================
``none``               ``s b h (34 + 5 a s / h)``              no parallelism
``tp``                 ``s b h (10 + 24/t + 5 a s / (h t))``   tensor parallel; the 10 sbh
                                                               of LayerNorm/dropout inputs
                                                               stays replicated
``tp_sp``              ``s b h / t (34 + 5 a s / h)``          + sequence parallelism
``tp_sp_selective``    ``34 s b h / t``                        + selective recomputation of
                                                               the attention core
``full_recompute``     ``2 s b h``                             only each layer's input is
                                                               kept (bf16); everything
                                                               else is recomputed. Without
                                                               SP it is replicated on the
                                                               t ranks; with ``sp=True``
                                                               (Megatron's full recompute
                                                               under SP) ``2 s b h / t``
=====================  =====================================  ===========================

Korthikanti's Table 2 also has "tensor parallel + selective recompute" without SP,
``s b h (10 + 24/t)``: mode ``tp_selective`` (accepted by every function here; a row of
:func:`activation_table` only with ``extended=True``, which also adds full recomputation
with ``sp=True``, so that the default rows other tables show stay the five above).

With ``s=2048, b=1, h=4096, a=32, t=8``: 912, 184, 114 and 34 MiB exactly (and 16 MiB for
full recomputation, 2 MiB under SP; 104 MiB for ``tp_selective``). Under TP + SP full
recomputation (``2 s b h / t``) keeps 17 times less than selective (``34 s b h / t``) at
every ``t``; only the replicated checkpoint of full recomputation *without* SP is overtaken
by selective recomputation with SP (``t > 17``), a comparison of two different layouts. For ``L`` layers multiply by ``L`` (the paper's totals also add
embedding/output terms, which we leave out). These are modelled saved activations, not a
measured peak: see :mod:`.peak`.

One formula, the paper's constants as defaults. Each constant above is a sum over the saved
tensors, and the keyword-only arguments of :func:`activation_bytes_per_layer` change what one
term weighs, so that another layer (lab 06's fp32 block, for instance) is counted by the
same formula. With ``q`` bytes per stored element (``q``, default 2), ``p`` bytes per
dropout-mask element (``mask_bytes``, default 1), MLP width ``f`` (``ffn``, default ``4h``),
``d``/``d_a`` = 1 if hidden/attention dropout is on (``dropout``, ``attn_dropout``, default
on), the per-layer saved bytes are the sum of three groups::

    replicated  s b h (4 q + 2 p d)        LayerNorm inputs (2), inputs of the QKV and first
                + 2 n_s c b s              MLP projections (2), the two output-dropout masks;
                                           plus the norms' per-token statistics
    split       s b h (q (2 + 2 k/a)       Q and the output-projection input (2), K and V
                       + n_f q f / h)      (``k/a`` of Q's width each); ``n_f`` MLP tensors
                                           ``f`` wide: GeLU input and output (2), or for a
                                           gated MLP (``gated=True``, SwiGLU) the gate and up
                                           projections' outputs and their product (3)
    attention   a s^2 b (q + d_a (p + q))  softmax output; dropout mask and dropped scores

where ``n_s`` is the number of per-token statistics a norm keeps (``norm="layernorm"``: mean
and inverse standard deviation, 2; ``"rmsnorm"``: 1) and ``c`` their bytes
(``norm_stat_bytes``, default 0: the paper neglects them). Defaults give the constants 10
(replicated), 24 (split) and 5 (attention), so ``34 = 10 + 24``.

Llama-style layers (Grattafiori et al., 2024) differ in three of these parameters, and the
Korthikanti constants do not describe them: no dropout (``dropout=False``), RMSNorm
(``norm="rmsnorm"``), grouped-query attention with ``k = kv_heads`` K/V heads for ``a`` query
heads (``kv_heads=k``, default ``a``), and a gated SwiGLU MLP of width ``f``
(``gated=True, ffn=f``; Megatron's fused SwiGLU keeps its two inputs and recomputes the SiLU,
an unfused ``silu(x W_1) * (x W_3)`` in PyTorch would also save the SiLU output, a fourth
tensor not counted here). Under tensor parallelism with ``t > k`` each rank holds one K/V head
(``context.kv_heads_per_rank``), so K and V count as ``t`` heads before the division by ``t``.
:attr:`.compute.ModelShape.activation_layer` gives these arguments for a model. The modes
combine the groups:
``none`` all three; ``tp`` replicated + (split + attention)/t; ``tp_sp`` all three /t;
``tp_sp_selective`` (replicated + split)/t (the attention core is recomputed from Q, K, V);
``full_recompute`` only the layer input, ``q s b h`` (replicated; ``/t`` with ``sp=True``);
``tp_selective`` replicated + split/t.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import _validate as v

MODES = ("none", "tp", "tp_sp", "tp_sp_selective", "full_recompute")
EXTRA_MODES = ("tp_selective",)  # Korthikanti Table 2, TP + selective recompute without SP
NORMS = {"layernorm": 2, "rmsnorm": 1}  # per-token statistics saved for backward
MiB = 2**20


def _check(s: int, b: int, h: int, a: int, t: int, mode: str) -> tuple[int, int, int, int, int]:
    s, b, h, a, t = (
        v.positive_int(name, x) for name, x in (("s", s), ("b", b), ("h", h), ("a", a), ("t", t))
    )
    v.choice("mode", mode, MODES + EXTRA_MODES)
    if h % a != 0:
        raise ValueError(f"hidden width h={h} is not divisible by heads a={a}")
    if a % t != 0:
        raise ValueError(f"heads a={a} are not divisible by t={t}")
    if mode in ("tp_sp", "tp_sp_selective") and s % t != 0:
        raise ValueError(f"t={t} does not divide s={s} (sequence parallelism shards s)")
    return s, b, h, a, t


@dataclass(frozen=True)
class LayerTerms:
    """The three groups of a layer's saved bytes (see the module docstring), unsharded."""

    replicated: float  # kept whole on every rank under TP alone
    split: float  # divided by t under TP (heads / MLP columns)
    attention: float  # the a s^2 b scores term, divided by t under TP
    layer_input: float  # what full recomputation keeps

    def for_mode(self, mode: str, t: int, sp: bool = False) -> float:
        """Bytes per rank under ``mode``; ``sp`` splits full recomputation's input t ways."""
        if mode == "none":
            return self.replicated + self.split + self.attention
        if mode == "tp":
            return self.replicated + (self.split + self.attention) / t
        if mode == "tp_sp":
            return (self.replicated + self.split + self.attention) / t
        if mode == "tp_sp_selective":
            return (self.replicated + self.split) / t
        if mode == "tp_selective":
            return self.replicated + self.split / t
        return self.layer_input / t if sp else self.layer_input


def layer_terms(
    s: int,
    b: int,
    h: int,
    a: int,
    *,
    q: float = 2,
    mask_bytes: float = 1,
    ffn: int | None = None,
    dropout: bool = True,
    attn_dropout: bool | None = None,
    norm: str = "layernorm",
    norm_stat_bytes: float = 0,
    gated: bool = False,
    kv_heads: int | None = None,
) -> LayerTerms:
    """The replicated / split / attention groups of one layer (module docstring's table)."""
    qq = v.number("q", q)
    n_f = 3 if v.flag("gated", gated) else 2
    k = a if kv_heads is None else v.positive_int("kv_heads", kv_heads)
    if a % k:
        raise ValueError(f"kv_heads={k} does not divide heads a={a}")
    p = v.nonneg_number("mask_bytes", mask_bytes)
    f = 4 * h if ffn is None else v.positive_int("ffn", ffn)
    d = int(v.flag("dropout", dropout))
    da = d if attn_dropout is None else int(v.flag("attn_dropout", attn_dropout))
    n_stats = NORMS[v.choice("norm", norm, tuple(NORMS))]
    c = v.nonneg_number("norm_stat_bytes", norm_stat_bytes)
    sbh = s * b * h
    return LayerTerms(
        replicated=sbh * (4 * qq + 2 * p * d) + 2 * n_stats * c * b * s,
        split=sbh * qq * (2 + 2 * k / a + n_f * f / h),
        attention=a * s * s * b * (qq + da * (p + qq)),
        layer_input=qq * sbh,
    )


def activation_bytes_per_layer(
    s: int, b: int, h: int, a: int, t: int = 1, mode: str = "none", *, sp: bool = False,
    **layer,
) -> float:
    """Saved-activation bytes of one transformer layer under ``mode`` (see module table).

    ``layer``: the keyword-only arguments of :func:`layer_terms` (``q``, ``mask_bytes``,
    ``ffn``, ``dropout``, ``attn_dropout``, ``norm``, ``norm_stat_bytes``, ``gated``,
    ``kv_heads``); their defaults are the paper's layer. ``ffn`` must divide by ``t`` under
    any tensor-parallel mode; ``kv_heads`` and ``t`` must divide one another. ``sp``: only
    for ``full_recompute``, whose kept layer input sequence parallelism splits ``t`` ways
    (default ``False``, the replicated input lab 06 measures).
    """
    s, b, h, a, t = _check(s, b, h, a, t, mode)
    if v.flag("sp", sp) and mode == "full_recompute" and s % t:
        raise ValueError(f"t={t} does not divide s={s} (sequence parallelism shards s)")
    ffn = layer.get("ffn")
    tensor_parallel = mode not in ("none", "full_recompute")
    if ffn is not None and tensor_parallel and ffn % t != 0:
        raise ValueError(f"MLP width ffn={ffn} is not divisible by t={t}")
    kv = layer.get("kv_heads")
    if kv is not None and tensor_parallel and t > 1:
        kv = v.positive_int("kv_heads", kv)
        if kv % t and t % kv:
            raise ValueError(f"t={t} and kv_heads={kv}: one must divide the other")
        # t > kv: every rank holds one K/V head (replicated), i.e. t heads before dividing by t
        layer = {**layer, "kv_heads": max(kv, t)}
    return layer_terms(s, b, h, a, **layer).for_mode(mode, t, sp)


def activation_bytes(
    L: int, s: int, b: int, h: int, a: int, t: int = 1, mode: str = "none", **layer
) -> float:
    """Saved-activation bytes of ``L`` identical layers: ``L *`` the per-layer value."""
    layers = v.positive_int("L", L)
    return layers * activation_bytes_per_layer(s, b, h, a, t, mode, **layer)


@dataclass(frozen=True)
class ActivationRow:
    mode: str
    bytes_per_layer: float
    layers: int
    sp: bool = False  # full_recompute only: the kept input split t ways (sequence parallel)

    @property
    def key(self) -> str:
        """``mode``, with ``"_sp"`` appended for full recomputation under SP."""
        return f"{self.mode}_sp" if self.sp else self.mode

    @property
    def total(self) -> float:
        return self.bytes_per_layer * self.layers

    @property
    def mib_per_layer(self) -> float:
        return self.bytes_per_layer / MiB


EXTENDED_ROWS = (
    ("none", False), ("tp", False), ("tp_selective", False), ("tp_sp", False),
    ("tp_sp_selective", False), ("full_recompute", False), ("full_recompute", True),
)


def activation_table(
    s: int, b: int, h: int, a: int, t: int = 1, L: int = 1, *, extended: bool = False,
    **layer,
) -> list[ActivationRow]:
    """One :class:`ActivationRow` per mode, in ``MODES`` order (for tables and charts).

    ``extended=True``: the rows of ``EXTENDED_ROWS`` instead — Korthikanti's Table 2 in full
    (``tp_selective`` after ``tp``) and full recomputation both without and with SP.
    """
    layers = v.positive_int("L", L)
    rows = EXTENDED_ROWS if v.flag("extended", extended) else [(m, False) for m in MODES]
    return [
        ActivationRow(
            m, activation_bytes_per_layer(s, b, h, a, t, m, sp=sp, **layer), layers, sp
        )
        for m, sp in rows
    ]


def as_rows(table: list[ActivationRow]) -> list[dict[str, object]]:
    """Plain dict rows (mode, bytes/layer, MiB/layer, total bytes) of an activation table."""
    return [
        {
            "mode": r.mode,
            "bytes_per_layer": r.bytes_per_layer,
            "MiB_per_layer": r.mib_per_layer,
            "layers": r.layers,
            "total_bytes": r.total,
        }
        for r in table
    ]
