"""The global batch: what the optimizer tolerates, and what a batch ramp does to a layout.

Nothing here is sharded; this is the one quantity every layout shares. Three facts tie it to
the mesh:

* **Tokens per step** = ``b m D s`` (microbatch sequences x accumulation steps x data-parallel
  ranks x sequence length; context ranks split ``s``, they do not multiply it). Every
  data-parallel rank needs at least one microbatch, so ``D <= B / b`` with ``B`` the global
  batch in sequences (:func:`max_data_parallel`): at a fixed batch the batch, not memory,
  bounds data parallelism.
* **What a step is worth** (McCandlish et al., *An Empirical Model of Large-Batch Training*,
  2018): to reach a given loss, the optimizer steps ``S`` and the tokens processed ``E`` trade
  off as ``(S / S_min - 1)(E / E_min - 1) = 1``. With the **critical batch**
  ``B_crit = E_min / S_min`` (in tokens), ``S(B) = S_min (1 + B_crit / B)`` and
  ``E(B) = S(B) B = S_min (B + B_crit)``: far below ``B_crit`` doubling the batch halves the
  steps at no extra tokens; at ``B = B_crit`` a run needs twice the minimum steps and twice
  the minimum tokens; far above it every doubling doubles the tokens for almost no fewer steps.
  Wall-clock time to the target is ``S(B)`` times the step time at ``B``
  (:func:`time_to_target`), which is what a layout is really chosen for.
* **The critical batch grows as the loss falls.** Kaplan et al. (2020) fit, for their
  language models, ``B_crit(L) = B* / L^(1 / alpha_B)`` with ``B* = 2e8`` tokens and
  ``alpha_B = 0.21`` (``L`` the loss in nats; :func:`critical_batch_kaplan`). A run whose loss
  falls from 4 to 2 nats sees ``B_crit`` grow about 27-fold -- the reason large runs start
  with a small batch and raise it (a **batch ramp**), and why each raise can change ``D``
  and the microbatches per step, and so the layout (:func:`ramp`).

These are fits of an optimizer's behaviour, not laws of a machine: the constants belong to the
models they were measured on, and the loss curve of one's own run decides. This module only
does their arithmetic, and the planner's (:func:`.planner.plan`) for each phase of a ramp.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from . import _validate as v
from .compute import ModelShape

KAPLAN_B_STAR = 2e8  # tokens (Kaplan et al. 2020, eq. 1.4 / Sec. 5.1)
KAPLAN_ALPHA_B = 0.21


def tokens_per_step(microbatch: int, microbatches: int, dp: int, seq_len: int) -> int:
    """``b m D s``: the tokens one optimizer step consumes."""
    b = v.positive_int("microbatch", microbatch)
    m = v.positive_int("microbatches", microbatches)
    d = v.positive_int("dp", dp)
    s = v.positive_int("seq_len", seq_len)
    return v.positive_int("tokens per step", b * m * d * s)


def max_data_parallel(global_batch: int, microbatch: int = 1) -> int:
    """The largest ``D`` a global batch of ``global_batch`` sequences allows: ``B // b``."""
    B = v.positive_int("global_batch", global_batch)
    b = v.positive_int("microbatch", microbatch)
    if b > B:
        raise ValueError(f"microbatch={b} exceeds global_batch={B}: no rank gets a microbatch")
    return B // b


def steps_to_target(batch_tokens: float, s_min: float, b_crit: float) -> float:
    """``S(B) = S_min (1 + B_crit / B)`` optimizer steps to the target loss."""
    B = v.number("batch_tokens", batch_tokens)
    return v.number("s_min", s_min) * (1 + v.number("b_crit", b_crit) / B)


def tokens_to_target(batch_tokens: float, s_min: float, b_crit: float) -> float:
    """``E(B) = S(B) B = S_min (B + B_crit)`` tokens processed to the target loss."""
    B = v.number("batch_tokens", batch_tokens)
    return v.number("s_min", s_min) * (B + v.number("b_crit", b_crit))


def time_to_target(batch_tokens: float, step_s: float, s_min: float, b_crit: float) -> float:
    """Seconds to the target: :func:`steps_to_target` x the step time at that batch."""
    return steps_to_target(batch_tokens, s_min, b_crit) * v.number("step_s", step_s)


def critical_batch_kaplan(loss: float, b_star: float = KAPLAN_B_STAR,
                          alpha_b: float = KAPLAN_ALPHA_B) -> float:
    """Kaplan et al.'s fit ``B_crit(L) = B* / L^(1/alpha_B)`` in tokens (``loss`` in nats)."""
    L = v.number("loss", loss)
    b, exponent = v.number("b_star", b_star), 1 / v.number("alpha_b", alpha_b)
    try:  # L^(1/alpha_B) leaves a float's range for a loss far from a few nats
        out = b / L**exponent
    except (OverflowError, ZeroDivisionError):  # L^x above 1e308, or 0 below 1e-308
        out = 0.0 if L > 1 else math.inf
    if not 0 < out <= v.MAX_REAL:
        size = ("less than the smallest float: too small" if out == 0 else
                f"{out:.3g} tokens, more than {v.MAX_REAL:g}: too large" if math.isfinite(out)
                else f"more than {v.MAX_REAL:g} tokens: too large")
        raise ValueError(f"loss={loss!r} gives a critical batch {b:g} / L^(1/{1 / exponent:g}) "
                         f"of {size} to compute with; Kaplan et al.'s fit is for losses of a "
                         "few nats")
    return out


@dataclass(frozen=True)
class Phase:
    """One phase of a run: ``tokens`` trained at ``global_batch`` sequences of ``seq_len``."""

    name: str
    tokens: float
    global_batch: int
    seq_len: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "tokens", v.number("tokens", self.tokens))
        object.__setattr__(self, "global_batch", v.positive_int("global_batch", self.global_batch))
        object.__setattr__(self, "seq_len", v.positive_int("seq_len", self.seq_len))

    @property
    def batch_tokens(self) -> int:
        return self.global_batch * self.seq_len

    @property
    def steps(self) -> float:
        """Optimizer steps the phase takes (its tokens over the tokens per step)."""
        return self.tokens / self.batch_tokens


@dataclass(frozen=True)
class PhasePlan:
    """The planner's answer for one phase: its best layout (``None``: nothing fits)."""

    phase: Phase
    best: object | None  # planner.Candidate
    feasible: int
    reshard: bool  # the best layout's mesh differs from the previous phase's

    @property
    def seconds(self) -> float | None:
        return None if self.best is None else self.phase.steps * self.best.step_time


def ramp(model: ModelShape, cluster, phases: list[Phase], **plan_kw) -> list[PhasePlan]:
    """Plan every phase of a run on the same cluster: the model at the phase's sequence
    length, the phase's global batch; ``plan_kw`` go to :func:`.planner.plan` unchanged.
    ``reshard`` is True where the best mesh ``(D, t, p, c)`` changes from the previous phase's
    (the model state must then be resharded, e.g. through a checkpoint read at the new
    degrees)."""
    from . import planner  # planner imports most of accounting; batch stays a leaf for it

    if not isinstance(model, ModelShape):
        raise ValueError(f"model={model!r} must be an accounting.compute.ModelShape")
    if not phases:
        raise ValueError("phases is empty: give at least one Phase")
    out, prev = [], None
    for ph in phases:
        if not isinstance(ph, Phase):
            raise ValueError(f"phase {ph!r} must be an accounting.batch.Phase")
        shaped = dataclasses.replace(model, seq_len=ph.seq_len)
        res = planner.plan(shaped, cluster, ph.global_batch, **plan_kw)
        best = res.feasible[0] if res.feasible else None
        mesh = None if best is None else (best.layout.D, best.layout.t, best.layout.p,
                                          best.layout.c)
        out.append(PhasePlan(ph, best, len(res.feasible), prev is not None and mesh != prev))
        prev = mesh
    return out
