"""Machine-independent verdicts for stored notebook outputs.

PyTorch picks its CPU kernels per machine (``torch.backends.cpu.get_cpu_capability()``:
default, AVX2, AVX512, ARM) and the intra-op thread count changes the order of reductions, so
the last bits of a matmul, a softmax or a sum differ from one laptop to the next. A stored
output that prints such a rounding-level number (``max |diff| = 3.3e-16``, ``7.3 ulps``) fails
nbval on the next machine although nothing is wrong. Cells therefore print the *verdict*
against the tolerance their code asserts — the same string on every machine while the result
is right, a different one (with the value) when it is not:

>>> within(2.4e-7, 1e-6)
'≤ 10⁻⁶ ✓'
>>> within(3e-6, 1e-6)
'3.0e-06 > 10⁻⁶ ✗'
>>> within_ulps(7.3, 64)
'≤ 64 ulps ✓'
>>> bitwise(True)
'bitwise ✓'

Bounds print in powers of ten (``10⁻⁶``, ``4×10⁻⁶``, :func:`sci`), so that no compared
output carries a number in the ``2.4e-07`` form measured rounding is printed in (the check
``tests/test_notebook_outputs_portable.py`` makes). Bytes, counts and formula values are exact
on every machine and stay printed as numbers.
"""

from __future__ import annotations

import math

__all__ = ["within", "within_ulps", "bitwise", "check", "sci"]

_SUP = str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹")


def sci(x: float) -> str:
    """A bound as the text shows it: ``1e-12`` -> ``10⁻¹²``, ``4e-6`` -> ``4×10⁻⁶``,
    ``0.0001`` -> ``0.0001`` (plain ``g`` formatting between 10⁻⁴ and 10⁵)."""
    if x == 0 or not math.isfinite(x) or 1e-4 <= abs(x) < 1e5:
        return f"{x:g}"
    e = math.floor(math.log10(abs(x)))
    m = round(x / 10**e, 3)
    power = f"10{str(e).translate(_SUP)}"
    return power if m == 1 else f"{m:g}×{power}"


def within(value: float, bound: float, unit: str = "") -> str:
    """``'≤ bound ✓'`` when ``value <= bound`` (NaN never is), else the value and ``✗``."""
    u = f" {unit}" if unit else ""
    if not math.isnan(value) and value <= bound:
        return f"≤ {sci(bound)}{u} ✓"
    return f"{value:.1e}{u} > {sci(bound)}{u} ✗"


def within_ulps(ulps: float, bound: float) -> str:
    """A difference counted in units in the last place, against its bound."""
    if not math.isnan(ulps) and ulps <= bound:
        return f"≤ {sci(bound)} ulps ✓"
    return f"{ulps:.1f} ulps > {sci(bound)} ✗"


def bitwise(equal: bool, note: str = "") -> str:
    """``'bitwise ✓'`` or ``'not bitwise ✗'`` (for results that must be exactly equal)."""
    extra = f" ({note})" if note else ""
    return ("bitwise ✓" if equal else "not bitwise ✗") + extra


def check(value: float, bound: float, what: str) -> str:
    """:func:`within`, and raise ``AssertionError`` naming ``what`` when the bound is missed
    (a cell that prints a verdict also stops on a wrong result)."""
    verdict = within(value, bound)
    assert verdict.endswith("✓"), f"{what}: {value:.3e} exceeds the bound {bound:g}"
    return verdict
