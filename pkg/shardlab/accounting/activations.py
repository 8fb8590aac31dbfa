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
                                                               kept (bf16, replicated: not
                                                               divided by t); everything
                                                               else is recomputed
=====================  =====================================  ===========================

With ``s=2048, b=1, h=4096, a=32, t=8``: 912, 184, 114 and 34 MiB exactly (and 16 MiB for
full recomputation). For ``L`` layers multiply by ``L`` (the paper's totals also add
embedding/output terms, which we leave out). These are modelled saved activations, not a
measured peak: see :mod:`.peak`.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import _validate as v

MODES = ("none", "tp", "tp_sp", "tp_sp_selective", "full_recompute")
MiB = 2**20


def _check(s: int, b: int, h: int, a: int, t: int, mode: str) -> tuple[int, int, int, int, int]:
    s, b, h, a, t = (
        v.positive_int(name, x) for name, x in (("s", s), ("b", b), ("h", h), ("a", a), ("t", t))
    )
    v.choice("mode", mode, MODES)
    if h % a != 0:
        raise ValueError(f"hidden width h={h} is not divisible by heads a={a}")
    if a % t != 0:
        raise ValueError(f"heads a={a} are not divisible by t={t}")
    if mode in ("tp_sp", "tp_sp_selective") and s % t != 0:
        raise ValueError(f"t={t} does not divide s={s} (sequence parallelism shards s)")
    return s, b, h, a, t


def activation_bytes_per_layer(
    s: int, b: int, h: int, a: int, t: int = 1, mode: str = "none"
) -> float:
    """Saved-activation bytes of one transformer layer under ``mode`` (see module table)."""
    s, b, h, a, t = _check(s, b, h, a, t, mode)
    sbh = s * b * h
    attn = 5 * a * s / h
    if mode == "none":
        return sbh * (34 + attn)
    if mode == "tp":
        return sbh * (10 + 24 / t + attn / t)
    if mode == "tp_sp":
        return sbh / t * (34 + attn)
    if mode == "tp_sp_selective":
        return 34 * sbh / t
    return 2.0 * sbh


def activation_bytes(
    L: int, s: int, b: int, h: int, a: int, t: int = 1, mode: str = "none"
) -> float:
    """Saved-activation bytes of ``L`` identical layers: ``L *`` the per-layer value."""
    layers = v.positive_int("L", L)
    return layers * activation_bytes_per_layer(s, b, h, a, t, mode)


@dataclass(frozen=True)
class ActivationRow:
    mode: str
    bytes_per_layer: float
    layers: int

    @property
    def total(self) -> float:
        return self.bytes_per_layer * self.layers

    @property
    def mib_per_layer(self) -> float:
        return self.bytes_per_layer / MiB


def activation_table(s: int, b: int, h: int, a: int, t: int = 1, L: int = 1) -> list[ActivationRow]:
    """One :class:`ActivationRow` per mode, in ``MODES`` order (for tables and charts)."""
    layers = v.positive_int("L", L)
    return [ActivationRow(m, activation_bytes_per_layer(s, b, h, a, t, m), layers) for m in MODES]


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
